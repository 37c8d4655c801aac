from pathlib import Path

import pytest
from tokenizers import Tokenizer

from ingot.artifacts import ArtifactError, TokenizerInfo
from ingot.runtime.tokenizer import ChatTemplateError, TextTokenizer, add_config_tokens

from fixtures import CHAT_TEMPLATE, write_tokenizer


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    write_tokenizer(path, 320)
    (path / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return path


@pytest.fixture(scope="module")
def tok(tok_dir):
    info = TokenizerInfo(
        path="tokenizer.json",
        chat_template="chat_template.jinja",
        bos_token="<s>",
        eos_token="</s>",
    )
    return TextTokenizer.from_artifact(tok_dir, info)


def test_encode_decode_round_trip(tok):
    text = "def add(a, b):\n    return a + b\n"
    ids = tok.encode(text)
    assert ids and all(isinstance(i, int) for i in ids)
    assert tok.decode(ids) == text
    assert tok.vocab_size == 320


def test_special_tokens_are_skipped_when_decoding(tok):
    assert tok.decode([0, *tok.encode("fox"), 1]) == "fox"
    assert tok.decode([0, 1], skip_special_tokens=False) == "<s></s>"


def test_incremental_decoder_emits_only_complete_characters(tok):
    text = "The quick 🦊 jumps: héllo 世界!"
    ids = tok.encode(text)
    decoder = tok.incremental_decoder()
    deltas = [decoder.step(i) for i in ids]
    assert "".join(deltas) == text
    assert not any("\ufffd" in d for d in deltas)
    # The fox is four byte tokens: the first three complete nothing.
    fox = tok.encode("🦊")
    assert len(fox) == 4
    decoder = tok.incremental_decoder()
    assert [decoder.step(i) for i in fox] == ["", "", "", "🦊"]


def test_incremental_decoder_with_prompt_context_and_flush(tok):
    prompt = tok.encode("The quick")
    out = tok.encode(" brown fox")
    decoder = tok.incremental_decoder(prompt)
    assert "".join(decoder.step(i) for i in out) == " brown fox"
    decoder = tok.incremental_decoder()
    partial = tok.encode("🦊")[:2]
    assert [decoder.step(i) for i in partial] == ["", ""]
    assert decoder.flush() == "\ufffd"  # an unfinished character is only released at the end


def test_chat_template(tok):
    messages = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(messages) == "<|user|>hi</s><|assistant|>"
    assert tok.apply_chat_template(messages, add_generation_prompt=False) == "<|user|>hi</s>"


def test_chat_template_is_sandboxed_and_can_refuse(tok_dir):
    mutate = TextTokenizer(tok_dir / "tokenizer.json", "{{ messages.append(1) }}")
    with pytest.raises(ChatTemplateError, match="failed to render"):
        mutate.apply_chat_template([])
    refuse = TextTokenizer(tok_dir / "tokenizer.json", "{{ raise_exception('no system role') }}")
    with pytest.raises(ChatTemplateError, match="no system role"):
        refuse.apply_chat_template([])
    with pytest.raises(ArtifactError, match="does not parse"):
        TextTokenizer(tok_dir / "tokenizer.json", "{% for %}")


def test_no_chat_template_is_a_clear_error(tok_dir):
    tok = TextTokenizer.from_artifact(tok_dir, TokenizerInfo(path="tokenizer.json"))
    assert not tok.has_chat_template
    with pytest.raises(ChatTemplateError, match="no chat template") as caught:
        tok.apply_chat_template([{"role": "user", "content": "hi"}])
    # Both ways to give one: the server's flag and the Python API's argument.
    assert "ingot serve --chat-template FILE" in str(caught.value)
    assert "LLM(model, chat_template=" in str(caught.value)


def test_artifact_paths_are_checked(tok_dir):
    with pytest.raises(ArtifactError, match="unsafe path"):
        TextTokenizer.from_artifact(tok_dir, TokenizerInfo(path="../tokenizer.json"))


# -- tokens only in a checkpoint's tokenizer_config.json (added_tokens_decoder) ----------------


def _checkpoint_with(tmp_path, added_tokens_decoder: dict) -> Path:
    import json
    import shutil

    path = tmp_path / "ckpt"
    path.mkdir()
    write_tokenizer(path, 320)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"] = added_tokens_decoder
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    shutil.copy(path / "tokenizer.json", tmp_path / "tokenizer.json")  # no config beside it
    return path


def test_a_checkpoints_config_tokens_are_added_as_transformers_adds_them(tmp_path):
    from transformers import AutoTokenizer

    last = Tokenizer.from_file(str(_fixture_file(tmp_path))).id_to_token(300)
    added = {
        "0": {"content": "<s>", "special": True},
        "320": {"content": "<|im_end|>", "special": True},  # not in tokenizer.json at all
        "300": {"content": last, "special": True},  # a vocabulary entry marked special
    }
    path = _checkpoint_with(tmp_path, added)
    ours = TextTokenizer(path / "tokenizer.json")
    theirs = AutoTokenizer.from_pretrained(path)
    text = f"the fox{'<|im_end|>'} jumps"
    assert ours.encode(text, add_special_tokens=False) == theirs.encode(
        text, add_special_tokens=False
    )
    assert ours.token(320) == "<|im_end|>" and ours.vocab_size == len(theirs) == 321
    ids = ours.encode(text)
    assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
    plain = TextTokenizer(tmp_path / "tokenizer.json")  # an artifact's: nothing beside it
    assert plain.vocab_size == 320 and plain.token(320) is None


def test_a_config_token_that_lands_elsewhere_is_named(tmp_path):
    path = _checkpoint_with(tmp_path, {"325": {"content": "<|im_end|>", "special": True}})
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    problems = add_config_tokens(tokenizer, {"325": {"content": "<|im_end|>", "special": True}})
    assert problems == [
        "added_tokens_decoder puts '<|im_end|>' at id 325; tokenizer.json gives it id 320"
    ]


def _fixture_file(tmp_path) -> Path:
    path = tmp_path / "plain"
    path.mkdir()
    write_tokenizer(path, 320)
    return path / "tokenizer.json"
