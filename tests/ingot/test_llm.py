"""`from ingot import LLM, SamplingParams`: offline generation end to end on a tiny artifact."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ingot import LLM, SamplingParams
from ingot.llm import RequestOutput

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


def test_chat_renders_the_artifacts_template(llm):
    messages = [{"role": "user", "content": "hi"}]
    [out] = llm.chat(messages, GREEDY)
    assert out.prompt == "<|user|>hi</s><|assistant|>"
    assert out.prompt_token_ids == llm.get_tokenizer().encode(out.prompt, add_special_tokens=False)
    both = llm.chat([messages, [{"role": "user", "content": "bye"}]], GREEDY)
    assert both[0].outputs[0].token_ids == out.outputs[0].token_ids and len(both) == 2


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
