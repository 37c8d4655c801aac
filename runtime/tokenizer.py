"""Text <-> token ids with the artifact's tokenizer.json, and its chat template."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jinja2 import Template, TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer

from ingot.artifacts import ArtifactError, TokenizerInfo, safe_relative_path
from ingot.common.errors import IngotError

__all__ = [
    "ChatTemplateError",
    "IncrementalDecoder",
    "InvalidText",
    "TextTokenizer",
    "add_config_tokens",
    "check_chat_template",
    "check_text",
    "load_tokenizer",
]

# Invalid UTF-8 decodes to U+FFFD: a token that ends mid-character (byte-level BPE splits
# multi-byte characters) shows up as a trailing replacement character until the rest arrives.
_REPLACEMENT = "\ufffd"

# Tokens of the prompt re-decoded with the output: tokenizers that drop a leading space at
# the start of a decode (SentencePiece's Metaspace) then space the first output token right.
_CONTEXT_TOKENS = 5


class ChatTemplateError(IngotError, ValueError):
    """The artifact has no chat template, or rendering it failed."""


class InvalidText(IngotError, ValueError):
    """Text that is not valid Unicode (a lone surrogate, which JSON's "\\ud800" escapes and
    surrogateescape'd argv can carry): it has no UTF-8 form, so no tokens. A request error."""


def check_text(text: str, what: str = "prompt") -> None:
    """Raise InvalidText unless `text` can be encoded as UTF-8 (the tokenizer's own check is a
    TypeError deep in Rust; this one names the place)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidText(
            f"{what} is not valid Unicode text: lone surrogate at index {e.start}"
        ) from None


class TextTokenizer:
    """A `tokenizers.Tokenizer` plus the artifact's special tokens and chat template."""

    __slots__ = ("_tok", "_template", "bos_token", "eos_token", "_longest_token")

    def __init__(
        self,
        tokenizer_file: Path | str,
        chat_template: str | None = None,
        bos_token: str | None = None,
        eos_token: str | None = None,
    ) -> None:
        self._tok = load_tokenizer(tokenizer_file)
        self._template = None if chat_template is None else _compile(chat_template)
        self._longest_token: int | None = None
        self.bos_token = bos_token
        self.eos_token = eos_token

    @classmethod
    def from_artifact(
        cls, root: Path | str, info: TokenizerInfo, chat_template: str | None = None
    ) -> TextTokenizer:
        """The tokenizer of a verified artifact at `root` described by `manifest.tokenizer`;
        `chat_template` (source), if given, replaces the artifact's template."""
        root = Path(root)
        template = chat_template
        if template is None and info.chat_template is not None:
            template = safe_relative_path(root, info.chat_template).read_text(encoding="utf-8")
        return cls(safe_relative_path(root, info.path), template, info.bos_token, info.eos_token)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token(self, token_id: int) -> str | None:
        """The token with id `token_id` (None: no token has it), for messages."""
        return self._tok.id_to_token(token_id)

    def fewest_tokens(self, text: str) -> int:
        """A lower bound on the tokens `text` encodes to, without encoding it: no token covers
        more than the vocabulary's longest token string (bytes, for byte-level BPE, which are
        at least as many as characters). Halved, against normalizers that shorten the text.
        A server refuses a prompt that cannot fit the context before paying to tokenize it."""
        if self._longest_token is None:
            self._longest_token = max(map(len, self._tok.get_vocab(with_added_tokens=True)))
        return len(text) // (2 * max(1, self._longest_token))

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids; with special tokens, the tokenizer's post-processor adds BOS if it has one.

        Encode a rendered chat template with add_special_tokens=False: templates write the
        BOS token into the text themselves. Text with a lone surrogate raises InvalidText.
        """
        check_text(text)
        # encode_batch lets go of the GIL while it works (encode holds it): a server thread
        # tokenizing a huge prompt does not stall the event loop.
        [encoding] = self._tok.encode_batch([text], add_special_tokens=add_special_tokens)
        return encoding.ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def incremental_decoder(self, prompt_ids: Sequence[int] = ()) -> IncrementalDecoder:
        return IncrementalDecoder(self, prompt_ids)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True
    ) -> str:
        """The prompt text for `messages` ([{"role": ..., "content": ...}, ...]); a message
        with a lone surrogate raises InvalidText naming it."""
        for i, message in enumerate(messages):
            for key, value in message.items():
                if isinstance(value, str):
                    check_text(value, f"messages[{i}].{key}")
        if self._template is None:
            raise ChatTemplateError(
                "this artifact has no chat template (manifest tokenizer.chat_template is "
                "null); send a plain prompt instead of chat messages, or give a template: "
                "ingot serve --chat-template FILE, or LLM(model, chat_template=FILE or text)"
            )
        try:
            return self._template.render(
                messages=messages,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
                add_generation_prompt=add_generation_prompt,
            )
        except TemplateError as e:
            raise ChatTemplateError(f"chat template failed to render: {e}") from e


def load_tokenizer(tokenizer_file: Path | str) -> Tokenizer:
    """tokenizer.json as transformers loads it: in a checkpoint, the tokenizer_config.json
    beside it may list in `added_tokens_decoder` tokens that tokenizer.json lacks or does not
    mark special (older checkpoints), which transformers' fast tokenizers add on loading and
    vLLM and llama.cpp's converter therefore see; so does this. An artifact's tokenizer.json
    has them already (the build writes it so) and has no tokenizer_config.json beside it."""
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    config = Path(tokenizer_file).with_name("tokenizer_config.json")
    if config.is_file():
        added = json.loads(config.read_text(encoding="utf-8")).get("added_tokens_decoder")
        if isinstance(added, Mapping):
            add_config_tokens(tokenizer, added)
    return tokenizer


def add_config_tokens(tokenizer: Tokenizer, added_tokens_decoder: Mapping[str, Any]) -> list[str]:
    """Add to `tokenizer` each token of a tokenizer_config.json's `added_tokens_decoder`
    ({"id": {"content": ..., "special": ...}}) it does not hold as such (transformers'
    PreTrainedTokenizerFast does the same); one line per token that ends up at another id
    than the config says (a new token takes the next free id), [] when all agree."""
    held = tokenizer.get_added_tokens_decoder()
    problems = []
    for key, entry in sorted(added_tokens_decoder.items(), key=lambda item: int(item[0])):
        token_id, content = int(key), entry["content"]
        special = bool(entry.get("special"))
        have = held.get(token_id)
        if have is None or have.content != content or have.special != special:
            token = AddedToken(
                content,
                single_word=bool(entry.get("single_word", False)),
                lstrip=bool(entry.get("lstrip", False)),
                rstrip=bool(entry.get("rstrip", False)),
                normalized=bool(entry.get("normalized", not special)),
                special=special,
            )
            add = tokenizer.add_special_tokens if special else tokenizer.add_tokens
            add([token])
        given = tokenizer.token_to_id(content)
        if given != token_id:
            problems.append(
                f"added_tokens_decoder puts {content!r} at id {token_id}; tokenizer.json "
                f"gives it id {given}"
            )
    return problems


def check_chat_template(source: str) -> None:
    """Raise ChatTemplateError unless `source` compiles as a chat template (in the sandbox the
    runtime renders it in): for a template from the user (--chat-template, a recipe)."""
    _compile(source, ChatTemplateError)


def _compile(source: str, error: type[Exception] = ArtifactError) -> Template:
    # Sandboxed and immutable: the template comes from the artifact, i.e. from whoever built it.
    # trim_blocks / lstrip_blocks / loopcontrols / raise_exception: what HF templates expect.
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.globals["raise_exception"] = _raise_exception
    try:
        return env.from_string(source)
    except TemplateError as e:
        raise error(f"chat template does not parse: {e}") from e


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"chat template refused the messages: {message}")


class IncrementalDecoder:
    """Turns output tokens one at a time into text, yielding only complete characters.

    Each step decodes a short window of recent tokens (from `prefix` on) and emits what the
    new token added to it, so the cost per token stays constant however long the output.
    """

    __slots__ = ("_tokenizer", "_ids", "_prefix", "_read")

    def __init__(self, tokenizer: TextTokenizer, prompt_ids: Sequence[int] = ()) -> None:
        self._tokenizer = tokenizer
        self._ids = list(prompt_ids[-_CONTEXT_TOKENS:])
        self._prefix = 0  # start of the decode window
        self._read = len(self._ids)  # tokens up to here have been emitted as text

    def step(self, token_id: int) -> str:
        """The text `token_id` completes ("" while a character is still incomplete)."""
        self._ids.append(token_id)
        emitted = self._tokenizer.decode(self._ids[self._prefix : self._read])
        text = self._tokenizer.decode(self._ids[self._prefix :])
        if len(text) <= len(emitted) or text.endswith(_REPLACEMENT):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(emitted) :]

    def flush(self) -> str:
        """Whatever is held back at the end of the output, incomplete characters included."""
        emitted = self._tokenizer.decode(self._ids[self._prefix : self._read])
        text = self._tokenizer.decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return text[len(emitted) :]
