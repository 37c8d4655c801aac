"""Tokenizer quirks of real checkpoints, handled as llama.cpp's converter and vLLM handle them,
and what cannot work refused before any stage (pipeline/vocabulary_fit.py).

The issue's example builds: a Qwen2 checkpoint whose tokenizer has `<|endoftext|>` added at id
3072 with vocab_size 3072 and `interop: [compressed-tensors, gguf]` (the GGUF leaves the token
out, llama.cpp loads it; the runtime refuses a prompt holding it, naming it). The same
checkpoint whose config.json makes that token its EOS is refused in the preflight. The
checkpoints: a Qwen2-style byte-level BPE trained to exactly `bpe` tokens on the demo text,
added tokens after them, config.json's vocab_size anywhere around.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ingot.pipeline.build import build
from ingot.pipeline.cache import StageCache
from ingot.pipeline.interop.gguf import GGUF_FILE
from ingot.pipeline.interop.gguf_vocab import gguf_vocabulary, write_gguf_tokenizer
from ingot.pipeline.model.config import ModelConfig
from ingot.pipeline.recipe import RecipeError
from ingot.pipeline.stages.prepare import prepare
from ingot.runtime import LoadedModel, SamplingParams
from ingot.runtime.generate import RequestError

from fixtures import make_checkpoint, write_recipe

gguf = pytest.importorskip("gguf")

DEMO_TEXT = Path(__file__).resolve().parents[2] / "recipes" / "demo" / "pydoc-heldin.txt"
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
EOT = "<|endoftext|>"


def write_qwen2_tokenizer(path: Path, bpe: int, added: tuple[str, ...] = (EOT,)) -> None:
    """tokenizer.json: Qwen2's pre-tokenizer, `bpe` BPE tokens, then `added` (special) at ids
    bpe, bpe + 1, ...; tokenizer_config.json naming the first added token EOS (Qwen2's)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=bpe, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train([str(DEMO_TEXT)], trainer)
    assert tok.get_vocab_size() == bpe
    tok.add_special_tokens(list(added))
    tok.save(str(path / "tokenizer.json"))
    config = {"eos_token": added[0] if added else None, "pad_token": None, "bos_token": None}
    (path / "tokenizer_config.json").write_text(json.dumps(config))


def quirky_checkpoint(
    path: Path, *, bpe: int = 3072, vocab_size: int = 3072, added=(EOT,), **config
) -> Path:
    """A random tiny Qwen2 (transformers' own) with vocab_size `vocab_size` and the tokenizer
    of `write_qwen2_tokenizer`; `config`: config.json overrides (eos_token_id=None: none)."""
    config = {"bos_token_id": None, "eos_token_id": None, **config}
    make_checkpoint(path, "qwen2", vocab_size=vocab_size, **config)
    write_qwen2_tokenizer(path, bpe, tuple(added))
    return path


def edit_json(file: Path, **updates) -> None:
    data = json.loads(file.read_text())
    data.update(updates)
    file.write_text(json.dumps(data))


@pytest.fixture(scope="module")
def issue_example(tmp_path_factory) -> Path:
    """The issue's checkpoint: `<|endoftext|>` added at id 3072, vocab_size 3072."""
    return quirky_checkpoint(tmp_path_factory.mktemp("quirks") / "qwen2")


@pytest.fixture(scope="module")
def built(issue_example, tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("build")
    recipe = write_recipe(work / "r.yaml", issue_example, interop=["compressed-tensors", "gguf"])
    return build(recipe, work / "art", cache=StageCache(work / "cache")).artifact


def _refused(tmp_path: Path, source: Path, **recipe) -> str:
    """The preflight's lines for a build of `source`; fails if any stage started."""
    started: list[str] = []
    path = write_recipe(tmp_path / "r.yaml", source, **recipe)
    with pytest.raises(RecipeError) as err:
        build(path, tmp_path / "art", cache=StageCache(tmp_path / "c"), on_stage=started.append)
    assert started == []
    return str(err.value)


def _copy(source: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(source, tmp_path / "ckpt"))


# -- the issue's example: handled ---------------------------------------------------------------


def test_the_gguf_leaves_out_the_token_past_vocab_size(built, issue_example, caplog):
    reader = gguf.GGUFReader(built / "interop" / "gguf" / GGUF_FILE)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    assert len(tokens) == 3072 and EOT not in tokens
    assert reader.fields["qwen2.vocab_size"].contents() == 3072
    vocab = gguf_vocabulary(issue_example, ModelConfig.from_dir(issue_example))
    assert vocab.dropped == {3072: EOT}
    assert f"1 token(s) past config.json vocab_size 3072 left out (no embedding row): {EOT!r}" in (
        caplog.text
    )


def test_llama_cpp_loads_it_and_tokenizes_as_tokenizer_json(built, issue_example):
    llama_cpp = pytest.importorskip("llama_cpp")
    from tokenizers import Tokenizer

    llm = llama_cpp.Llama(
        model_path=str(built / "interop" / "gguf" / GGUF_FILE), n_ctx=64, verbose=False
    )
    assert llm.n_vocab() == 3072
    text = "def tokenize(text):\n    return text.split()  # words"
    want = Tokenizer.from_file(str(issue_example / "tokenizer.json")).encode(text).ids
    assert llm.tokenize(text.encode(), add_bos=False) == want


def test_transformers_loads_the_compressed_tensors_export(built):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = built / "interop" / "compressed-tensors"
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.convert_tokens_to_ids(EOT) == 3072  # the tokenizer as it was
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.get_input_embeddings().num_embeddings == 3072


def test_the_runtime_refuses_a_prompt_holding_it_naming_it(built):
    generator = LoadedModel.load(built).generator()
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    [done] = generator.generate(["def add(a, b):"], params)
    assert len(done.token_ids) == 4
    with pytest.raises(RequestError) as err:
        generator.generate([f"def add(a, b):{EOT}"], params)
    assert f"prompt token id 3072 is {EOT!r}, a token of the tokenizer" in str(err.value)
    assert "[0, 3072)" in str(err.value)


# -- what cannot work: refused before any stage ---------------------------------------------------


def test_an_eos_past_vocab_size_is_refused(issue_example, tmp_path):
    source = _copy(issue_example, tmp_path)
    edit_json(source / "config.json", eos_token_id=3072)
    line = _refused(tmp_path, source, interop=["gguf"])
    assert line == (
        f"{source / 'config.json'}: eos_token_id 3072 ({EOT!r}, beyond config.json vocab_size "
        "3072) has no embedding row or logit, so the model could never end its output; "
        "expected an id below 3072 (tokens added to the tokenizer without resizing the "
        "model's embeddings)"
    )


def test_a_generation_config_eos_past_vocab_size_is_refused(issue_example, tmp_path):
    source = _copy(issue_example, tmp_path)
    (source / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 3072]}))
    line = _refused(tmp_path, source)
    assert line.startswith(f"{source / 'generation_config.json'}: eos_token_id 3072 ({EOT!r}")


def test_a_bos_the_post_processor_adds_past_vocab_size_is_refused(issue_example, tmp_path):
    source = _copy(issue_example, tmp_path)
    spec = json.loads((source / "tokenizer.json").read_text())
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": EOT, "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
        ],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {EOT: {"id": EOT, "ids": [3072], "tokens": [EOT]}},
    }
    (source / "tokenizer.json").write_text(json.dumps(spec))
    line = _refused(tmp_path, source)
    assert f"post_processor adds {EOT!r} (id 3072) to every prompt" in line


def test_a_chat_template_writing_it_is_refused(issue_example, tmp_path):
    source = _copy(issue_example, tmp_path)
    template = (  # one refusing a system turn, as some do: the check renders without one
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no') }}"
        "{% endif %}{{ m['content'] }}{{ eos_token }}{% endfor %}"
    )
    edit_json(source / "tokenizer_config.json", chat_template=template)
    line = _refused(tmp_path, source)
    assert line.startswith(
        f"{source / 'tokenizer_config.json'}: the chat template writes {EOT!r} (tokenizer.json "
        "id 3072), beyond config.json vocab_size 3072"
    )


def test_evaluation_text_holding_it_is_refused(issue_example, tmp_path):
    text = tmp_path / "eval.txt"
    text.write_text(("The quick brown fox. " * 40 + EOT) * 8)
    evaluate = {"perplexity": {"dataset": str(text), "seq_len": 32}}
    line = _refused(tmp_path, issue_example, evaluate=evaluate)
    assert line.startswith(f"evaluate.perplexity.dataset: the text holds {EOT!r} (id 3072")


def test_a_gguf_vocabulary_llama_cpp_cannot_run_fails_before_any_stage(issue_example, tmp_path):
    source = _copy(issue_example, tmp_path)
    edit_json(source / "tokenizer.json", normalizer={"type": "Lowercase"})
    line = _refused(tmp_path, source, interop=["gguf"])
    assert line.startswith("interop gguf:") and "Lowercase normalizer" in line
    prepare(write_recipe(tmp_path / "plain.yaml", source))  # without GGUF: nothing to refuse


# -- a vocabulary padded past the tokenizer, special tokens only in tokenizer_config.json -------

IM_END = "<|im_end|>"


def _special(tokens: dict[int, str]) -> dict[str, dict]:
    """tokenizer_config.json's added_tokens_decoder of special `tokens` {id: content}."""
    return {str(i): {"content": content, "special": True} for i, content in tokens.items()}


@pytest.fixture(scope="module")
def padded(tmp_path_factory) -> tuple[Path, Path]:
    """(checkpoint, artifact): tokenizer.json holds 3000 BPE tokens and <|endoftext|> (3000);
    tokenizer_config.json adds <|im_end|> (3001, special) as older checkpoints do; vocab_size
    3072 pads 70 ids past the tokenizer."""
    work = tmp_path_factory.mktemp("padded")
    source = quirky_checkpoint(work / "ckpt", bpe=3000, vocab_size=3072, eos_token_id=3000)
    added = _special({3000: EOT, 3001: IM_END})
    edit_json(source / "tokenizer_config.json", added_tokens_decoder=added)
    recipe = write_recipe(work / "r.yaml", source, interop=["compressed-tensors", "gguf"])
    return source, build(recipe, work / "art", cache=StageCache(work / "c")).artifact


def test_padded_ids_and_config_tokens_in_the_gguf_and_llama_cpp(padded):
    _, artifact = padded
    path = artifact / "interop" / "gguf" / GGUF_FILE
    reader = gguf.GGUFReader(path)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    assert tokens[3000:3002] == [EOT, IM_END]
    assert types[3000:3002] == [gguf.TokenType.CONTROL] * 2
    assert tokens[3002:] == [f"[PAD{i}]" for i in range(3002, 3072)]
    assert set(types[3002:]) == {gguf.TokenType.UNUSED}
    assert reader.fields["tokenizer.ggml.eos_token_id"].contents() == 3000
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, verbose=False)
    assert llm.n_vocab() == 3072 and llm.token_eos() == 3000
    assert llm.tokenize(f"a{IM_END}".encode(), add_bos=False, special=True)[-1] == 3001


def test_padded_ids_and_config_tokens_in_transformers(padded):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = padded[1] / "interop" / "compressed-tensors"
    assert AutoTokenizer.from_pretrained(folder).convert_tokens_to_ids(IM_END) == 3001
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.get_input_embeddings().num_embeddings == 3072


def test_padded_ids_and_config_tokens_in_the_runtime(padded):
    source, artifact = padded
    shipped = json.loads((artifact / "tokenizer.json").read_text())["added_tokens"]
    assert [(t["id"], t["content"], t["special"]) for t in shipped] == [
        (3000, EOT, True),
        (3001, IM_END, True),
    ]
    tokenizer = LoadedModel.load(artifact).tokenizer
    assert (tokenizer.bos_token, tokenizer.eos_token) == (None, EOT)  # tokenizer_config.json's
    assert tokenizer.encode(f"a{IM_END}")[-1] == 3001
    assert tokenizer.decode([100, 3001, 3050, 101]) == tokenizer.decode([100, 101])
    decoder = tokenizer.incremental_decoder()
    assert [decoder.step(t) for t in (3050, 3071)] == ["", ""]  # padded ids: no text
    # the checkpoint's own tokenizer.json (read alone) lacks it: what the build added
    plain = json.loads((source / "tokenizer.json").read_text())["added_tokens"]
    assert [t["content"] for t in plain] == [EOT]


def test_a_config_token_the_tokenizer_puts_elsewhere_is_refused(issue_example, tmp_path):
    source = _copy(issue_example, tmp_path)
    added = _special({3072: EOT, 3080: IM_END})
    edit_json(source / "tokenizer_config.json", added_tokens_decoder=added)
    line = _refused(tmp_path, source)
    assert line == (
        f"{source / 'tokenizer_config.json'}: added_tokens_decoder puts {IM_END!r} at id 3080; "
        "tokenizer.json gives it id 3073 (its next free id); expected the ids to agree, or the "
        "model's embedding rows would mean other tokens"
    )


def test_gguf_token_types_are_the_converters(issue_example, tmp_path):
    """Added tokens: CONTROL when special or looking special (<|...|>, the converter's rule
    for checkpoints that forget the flag), else USER_DEFINED; the constants are gguf's."""
    source = _copy(issue_example, tmp_path)
    edit_json(source / "config.json", vocab_size=3080)
    plain = {"special": False}
    added = {"3073": {"content": "<|im_start|>", **plain}, "3074": {"content": "fancy", **plain}}
    edit_json(source / "tokenizer_config.json", added_tokens_decoder=added)
    vocab = gguf_vocabulary(source, ModelConfig.from_dir(source))
    assert vocab.tokens[3072:3075] == [EOT, "<|im_start|>", "fancy"]
    kinds = gguf.TokenType
    assert vocab.types[3072:3076] == [
        kinds.CONTROL,
        kinds.CONTROL,
        kinds.USER_DEFINED,
        kinds.UNUSED,
    ]
    assert vocab.types[100] == kinds.NORMAL and vocab.dropped == {}


def test_an_unreadable_tokenizer_config_json_is_one_line(issue_example, tmp_path):
    source = _copy(issue_example, tmp_path)
    (source / "tokenizer_config.json").write_text("{not json")
    line = _refused(tmp_path, source)
    assert line.startswith(f"{source / 'tokenizer_config.json'}: cannot read it (JSONDecodeError")


def test_a_gguf_eos_named_by_a_token_only_in_tokenizer_config_json(issue_example, tmp_path):
    """gguf's SpecialVocab looks tokenizer_config.json's eos_token up in tokenizer.json's added
    tokens only; one its added_tokens_decoder adds still gets its id."""
    source = _copy(issue_example, tmp_path)
    edit_json(source / "config.json", vocab_size=3080)
    added = _special({3072: EOT, 3073: IM_END})
    edit_json(source / "tokenizer_config.json", eos_token=IM_END, added_tokens_decoder=added)
    cfg = ModelConfig.from_dir(source)
    writer = gguf.GGUFWriter(tmp_path / "vocab.gguf", "qwen2")
    write_gguf_tokenizer(writer, gguf_vocabulary(source, cfg), source, cfg)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    reader = gguf.GGUFReader(tmp_path / "vocab.gguf")
    assert reader.fields["tokenizer.ggml.eos_token_id"].contents() == 3073
