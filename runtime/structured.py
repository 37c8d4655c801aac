"""Constrained decoding with llguidance: a request's output follows a JSON schema, any JSON
object, a regular expression or a grammar (Lark, or llama.cpp's GBNF).

`StructuredOutput` is the request's constraint (validated when made, so a bad one is refused
before anything runs); `Matcher` is one request's state: before each token the logits of every
token the grammar does not allow become -inf (runtime/logits.py), after it the matcher
consumes the token, and once it `is_finished` the request ends with finish_reason "stop".
The matcher works on token ids, so it is built over the artifact's own tokenizer
(`ll_tokenizer`, cached: building one walks the whole vocabulary). llguidance is imported
on first use: requests without a constraint never load it.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np

from ingot.common import IngotError
from ingot.runtime.tokenizer import InvalidText, TextTokenizer, check_text

if TYPE_CHECKING:
    import llguidance

__all__ = [
    "JSON_WHITESPACE",
    "InvalidConstraint",
    "Matcher",
    "StructuredOutput",
    "StructuredOutputKind",
    "ll_tokenizer",
]

log = logging.getLogger(__name__)

StructuredOutputKind = Literal["json_object", "json_schema", "regex", "grammar"]

# The whitespace JSON output may put between two tokens by default: one space or tab, or one
# line break and up to 32 spaces or tabs of indentation (compact JSON, `json.dumps`' ", " and
# ": ", and pretty-printed JSON nested up to 16 levels at indent 2 all fit). llguidance allows
# one such run between tokens. Unbounded whitespace (llguidance's and vLLM's default) lets a
# model that favours "\n" pad an object until max_tokens: JSON that never parses.
JSON_WHITESPACE = r"[\x20\x09]|\x0D?\x0A[\x20\x09]{0,32}"


class InvalidConstraint(IngotError, ValueError):
    """A constraint llguidance cannot follow: a bad schema, regex or grammar, or text with a
    lone surrogate. The message says what is wrong, not which request field held it (the
    server prefixes the field that was sent)."""


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """What the output must match (the OpenAI API's `response_format`, vLLM's guided_*).

    kind "json_object": any JSON object (spec None); "json_schema": spec is the JSON schema
    (a dict, or its JSON text); "regex": spec is the pattern (Rust regex syntax, matching the
    whole output); "grammar": spec is a Lark grammar or a GBNF grammar (llguidance converts
    GBNF). Invalid constraints raise InvalidConstraint.
    """

    kind: StructuredOutputKind
    spec: str | dict[str, Any] | None = None
    # JSON only: a bounded run of whitespace between tokens (JSON_WHITESPACE), or none beyond
    # llguidance's fixed separators "," and ":" (vLLM's disable_any_whitespace).
    any_whitespace: bool = True

    def __post_init__(self) -> None:
        import llguidance  # on first use: requests without a constraint never load it

        _check_unicode(self.spec, self.kind)
        # Without a tokenizer: what can be refused before the request reaches the generator.
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(self.grammar())
        if is_error:
            error = messages[0] if messages else "unknown error"
            raise InvalidConstraint(f"invalid {self.kind}: {error.strip()}")

    def grammar(self) -> str:
        """The llguidance grammar (its JSON text) of this constraint."""
        import llguidance  # on first use: requests without a constraint never load it

        kind, spec = self.kind, self.spec
        if kind not in get_args(StructuredOutputKind):
            raise InvalidConstraint(
                f"kind must be one of {list(get_args(StructuredOutputKind))}, got {kind!r}"
            )
        if kind == "json_object":
            if spec is not None:
                raise InvalidConstraint("json_object takes no spec")
            options = _json_options({}, self.any_whitespace)
            return llguidance.LLMatcher.grammar_from_json_schema(
                {"type": "object"}, defaults=options
            )
        if kind == "json_schema":
            schema = _json_schema(spec)
            options = _json_options(schema, self.any_whitespace)
            try:
                return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=options)
            except (ValueError, TypeError) as e:
                raise InvalidConstraint(f"invalid json_schema: {e}") from e
        if not isinstance(spec, str) or not spec:
            raise InvalidConstraint(f"{kind} needs a non-empty string, got {spec!r}")
        if kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(spec)
        try:
            return llguidance.grammar_from("grammar", spec)  # Lark, or GBNF converted to Lark
        except ValueError as e:
            raise InvalidConstraint(f"invalid grammar: {e}") from e


def _json_options(schema: dict[str, Any] | bool, any_whitespace: bool) -> dict[str, Any]:
    """llguidance's JSON options: the whitespace default, unless the schema's own top-level
    "x-guidance" options set whitespace (they win, as llguidance's defaults let them)."""
    own = schema.get("x-guidance") if isinstance(schema, dict) else None
    if isinstance(own, dict) and own.keys() & {"whitespace_flexible", "whitespace_pattern"}:
        return {}
    if any_whitespace:
        return {"whitespace_pattern": JSON_WHITESPACE}
    return {"whitespace_flexible": False}


def _json_schema(spec: object) -> dict[str, Any] | bool:
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as e:
            raise InvalidConstraint(f"json_schema is not valid JSON: {e}") from e
        _check_unicode(spec, "json_schema")  # its escapes can hold lone surrogates
    if not isinstance(spec, dict | bool):
        raise InvalidConstraint(f"json_schema must be a JSON object, got {spec!r}")
    return spec


def _check_unicode(spec: object, where: str) -> None:
    """InvalidConstraint for a lone surrogate anywhere in `spec` (a JSON "\\ud800" escape can
    put one there): such text has no UTF-8 form, so llguidance could only fail on it with a
    codec error. `where` is the path so far, e.g. `json_schema["enum"][0]`."""
    try:
        if isinstance(spec, str):
            check_text(spec, where)
        elif isinstance(spec, dict):
            for key, value in spec.items():
                if isinstance(key, str):
                    check_text(key, f"a key of {where}")
                _check_unicode(value, f"{where}[{key!r}]")
        elif isinstance(spec, list):
            for i, value in enumerate(spec):
                _check_unicode(value, f"{where}[{i}]")
    except InvalidText as e:
        raise InvalidConstraint(str(e)) from None


class Matcher:
    """One request's position in its grammar."""

    __slots__ = ("_matcher", "_vocab_size")

    def __init__(self, tokenizer: llguidance.LLTokenizer, structured: StructuredOutput) -> None:
        import llguidance  # on first use: requests without a constraint never load it

        self._matcher = llguidance.LLMatcher(tokenizer, structured.grammar(), log_level=0)
        if self._matcher.is_error():
            raise InvalidConstraint(
                f"invalid {structured.kind}: {self._matcher.get_error().strip()}"
            )
        self._vocab_size = tokenizer.vocab_size

    def allowed(self, vocab_size: int) -> np.ndarray:
        """bool [vocab_size]: the tokens the grammar allows next (ids past the tokenizer's
        vocabulary never are)."""
        bits = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)  # [ceil(V'/32)*4]
        allowed = np.unpackbits(bits, bitorder="little").astype(bool)  # [>= V'], bit t = token t
        allowed = allowed[: min(self._vocab_size, vocab_size)]
        if len(allowed) < vocab_size:
            allowed = np.concatenate([allowed, np.zeros(vocab_size - len(allowed), bool)])
        return allowed

    def consume(self, token: int) -> None:
        """Advance past the sampled `token` (one the mask allowed)."""
        if not self._matcher.consume_token(token):
            # Only a grammar hitting llguidance's limits gets here (the mask allowed the
            # token): the matcher is now stopped and the request ends.
            log.warning("structured output stopped: %s", self._matcher.get_error().strip())

    @property
    def is_finished(self) -> bool:
        """Nothing but EOS can follow (the output is complete), or the matcher failed."""
        return self._matcher.is_stopped()

    @property
    def is_accepting(self) -> bool:
        """The output so far is a complete match (EOS is allowed)."""
        return self._matcher.is_accepting()


# Built LLTokenizers by (tokenizer, vocab size, EOS ids); the entry holds the TextTokenizer so
# its id stays unique while cached. Bounded: a process serves one artifact, tests a few.
_CACHE: OrderedDict[tuple[int, int, tuple[int, ...]], tuple[TextTokenizer, Any]] = OrderedDict()
_CACHE_SIZE = 4
_CACHE_LOCK = threading.Lock()


def ll_tokenizer(
    tokenizer: TextTokenizer, vocab_size: int | None = None, eos_token_ids: Sequence[int] = ()
) -> llguidance.LLTokenizer:
    """The llguidance tokenizer of `tokenizer` (cached per tokenizer, vocab size and EOS ids).

    `vocab_size`: the model's (its logits' width; default the tokenizer's). `eos_token_ids`:
    the tokens that end a request, allowed once the output matches (default the tokenizer's
    EOS token).
    """
    n_vocab = max(vocab_size or 0, tokenizer.vocab_size)
    eos = [int(t) for t in eos_token_ids]
    backend = tokenizer._tok  # the tokenizers.Tokenizer: llguidance reads its JSON
    if not eos and tokenizer.eos_token is not None:
        eos_id = backend.token_to_id(tokenizer.eos_token)
        eos = [] if eos_id is None else [eos_id]
    key = (id(tokenizer), n_vocab, tuple(eos))
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            return hit[1]
    import llguidance  # on first use: requests without a constraint never load it

    built = llguidance.LLTokenizer(backend.to_str(), n_vocab=n_vocab, eos_token=eos or None)
    with _CACHE_LOCK:
        _CACHE[key] = (tokenizer, built)
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return built
