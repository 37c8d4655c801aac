"""`from ingot import LLM, SamplingParams`: offline generation end to end on a tiny artifact."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ingot import LLM, SamplingParams
from ingot.llm import RequestOutput, load_chat_template
from ingot.runtime.structured import StructuredOutput
from ingot.runtime.tokenizer import ChatTemplateError

from fixtures import make_checkpoint, write_recipe

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    from ingot.pipeline.build import build
    from ingot.pipeline.cache import StageCache

    tmp = tmp_path_factory.mktemp("llm")
    recipe = write_recipe(tmp / "r.yaml", make_checkpoint(tmp / "ckpt", "llama"))
    artifact = build(recipe, tmp / "art", cache=StageCache(tmp / "cache")).artifact
    return LLM(artifact, kv_cache_memory=1 << 20, max_num_seqs=4)


def test_generate_returns_vllm_shaped_outputs_in_order(llm):
    prompts = ["def add(a, b):", "import os", "The quick brown fox"]
    outputs = llm.generate(prompts, GREEDY)
    assert [o.prompt for o in outputs] == prompts
    tokenizer = llm.get_tokenizer()
    for out, prompt in zip(outputs, prompts, strict=True):
        assert isinstance(out, RequestOutput) and out.finished
        assert out.prompt_token_ids == tokenizer.encode(prompt)
        [completion] = out.outputs
        assert len(completion.token_ids) == 8 and completion.finish_reason == "length"
        assert completion.text == tokenizer.decode(completion.token_ids)
        # Batched equals alone.
        [single] = llm.generate(prompt, GREEDY)
        assert single.outputs[0].token_ids == completion.token_ids
    assert len({o.request_id for o in outputs}) == 3


def test_priority_scheduling_changes_no_greedy_token(llm):
    # Prompts of 40-70 tokens in a pool of one full-length sequence: requests are preempted.
    prompts = [{"prompt_token_ids": [(7 * i + j) % 90 + 3 for j in range(40 + 10 * i)]}
               for i in range(4)]  # fmt: skip
    expected = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    small = LLM(
        llm.model.root, kv_cache_memory=64 << 10, max_num_seqs=4, scheduling_policy="priority"
    )
    outputs = small.generate(prompts, GREEDY, priority=[2, 0, 1, -5])
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert small.generator.stats().num_preemptions > 0
    with pytest.raises(ValueError, match="3 priorities for 4 prompts"):
        small.generate(prompts, GREEDY, priority=[0, 1, 2])


def test_per_prompt_params_logprobs_and_token_prompts(llm):
    ids = llm.get_tokenizer().encode("import os")
    params = [GREEDY, SamplingParams(max_tokens=3, temperature=0, logprobs=2)]
    plain, scored = llm.generate([{"prompt_token_ids": ids}, "import os"], params)
    assert plain.prompt is None and plain.prompt_token_ids == ids
    assert plain.outputs[0].logprobs is None
    completion = scored.outputs[0]
    assert completion.token_ids == plain.outputs[0].token_ids[:3]
    assert len(completion.logprobs) == 3
    for token, top in zip(completion.token_ids, completion.logprobs, strict=True):
        assert token in top and 2 <= len(top) <= 3  # greedy: the sampled token is the top one
        assert max(top, key=top.get) == token
    assert completion.cumulative_logprob == pytest.approx(
        sum(top[t] for t, top in zip(completion.token_ids, completion.logprobs, strict=True))
    )


def test_n_samples_are_seeded_per_sample_and_differ(llm):
    params = SamplingParams(n=3, seed=11, max_tokens=8, temperature=1.0, ignore_eos=True)
    [out] = llm.generate("import os", params)
    assert [c.index for c in out.outputs] == [0, 1, 2]
    samples = [c.token_ids for c in out.outputs]
    assert len({tuple(t) for t in samples}) == 3
    [again] = llm.generate("import os", params)
    assert [c.token_ids for c in again.outputs] == samples
    # Sample i is seeded seed + i: the same as a lone request with that seed.
    [lone] = llm.generate("import os", SamplingParams(seed=12, max_tokens=8, ignore_eos=True))
    assert lone.outputs[0].token_ids == samples[1]
    for c in out.outputs:
        assert c.finish_reason == "length" and c.stop_reason is None
        # n samples are all returned, none ranked: no cumulative logprob unless asked (vLLM).
        assert c.cumulative_logprob is None and c.logprobs is None


def test_best_of_returns_the_n_highest_cumulative_logprobs(llm):
    base = {"seed": 5, "max_tokens": 6, "temperature": 1.0, "ignore_eos": True}
    [every] = llm.generate("The quick", SamplingParams(n=5, logprobs=0, **base))
    ranked = sorted(every.outputs, key=lambda c: -c.cumulative_logprob)
    [best] = llm.generate("The quick", SamplingParams(n=2, best_of=5, **base))
    assert [c.token_ids for c in best.outputs] == [c.token_ids for c in ranked[:2]]
    assert [c.index for c in best.outputs] == [0, 1]
    assert best.outputs[0].cumulative_logprob >= best.outputs[1].cumulative_logprob
    # The order of n samples is not the ranking (else this test could not tell).
    assert [c.token_ids for c in every.outputs[:2]] != [c.token_ids for c in ranked[:2]]


def test_stop_reason_and_structured_output_through_llm(llm):
    [greedy] = llm.generate("import os", GREEDY)
    tokens = greedy.outputs[0].token_ids
    params = SamplingParams(max_tokens=8, temperature=0, stop_token_ids=[tokens[2]])
    [out] = llm.generate("import os", params)
    assert out.outputs[0].stop_reason == tokens[2] and out.outputs[0].finish_reason == "stop"
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "required": ["a"],
        "additionalProperties": False,
    }
    params = SamplingParams(
        n=2, seed=0, max_tokens=100, structured=StructuredOutput("json_schema", schema)
    )
    [out] = llm.generate("import os", params)
    for completion in out.outputs:
        assert completion.finish_reason == "stop" and completion.stop_reason is None
        assert isinstance(json.loads(completion.text)["a"], int)


def test_chat_renders_the_artifacts_template(llm):
    messages = [{"role": "user", "content": "hi"}]
    [out] = llm.chat(messages, GREEDY)
    assert out.prompt == "<|user|>hi</s><|assistant|>"
    assert out.prompt_token_ids == llm.get_tokenizer().encode(out.prompt, add_special_tokens=False)
    both = llm.chat([messages, [{"role": "user", "content": "bye"}]], GREEDY)
    assert both[0].outputs[0].token_ids == out.outputs[0].token_ids and len(both) == 2


def test_chat_template_text_or_file_replaces_the_artifacts(llm, tmp_path):
    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}>"
    file = tmp_path / "t.jinja"
    file.write_text(template)
    messages = [{"role": "user", "content": "hi"}]
    for given in (template, file, str(file)):  # text; a Path; a str naming a file
        custom = LLM(llm.model.root, kv_cache_memory=1 << 20, chat_template=given)
        [out] = custom.chat(messages, GREEDY)
        assert out.prompt == "[user] hi\n>", given


def test_a_bad_chat_template_fails_when_given(tmp_path):
    # Before any model loads (load_chat_template runs first), naming what was given.
    with pytest.raises(ChatTemplateError, match=r"^chat_template: chat template does not parse"):
        LLM(tmp_path / "no-artifact", chat_template="{% for %}")
    missing = str(tmp_path / "missing.jinja")
    with pytest.raises(ChatTemplateError, match="not a template .* and not a readable UTF-8 file"):
        LLM(tmp_path / "no-artifact", chat_template=missing)
    with pytest.raises(ChatTemplateError, match=r"^chat_template '.*missing\.jinja': not a"):
        load_chat_template(Path(missing))  # a Path is always a file, whatever it holds


def test_context_length_error_and_unsupported_references(llm):
    with pytest.raises(ValueError, match=r"^This model's maximum context length is 128 tokens"):
        llm.generator.validate([1] * 100, SamplingParams(max_tokens=29))
    with pytest.raises(ValueError, match="name a tag"):  # oci:// pulls: tests/artifacts/registry
        LLM("oci://registry.example/models/tiny")


def test_import_ingot_llm_does_not_import_torch():
    check = (
        "import sys\nfrom ingot import LLM, SamplingParams\nimport ingot.llm\n"
        "assert not [m for m in ('torch', 'transformers', 'onnx') if m in sys.modules]"
    )
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
