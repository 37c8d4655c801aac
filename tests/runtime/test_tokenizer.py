import pytest

from ingot.artifacts import ArtifactError, TokenizerInfo
from ingot.runtime.tokenizer import ChatTemplateError, TextTokenizer

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
