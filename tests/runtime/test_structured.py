"""Constrained decoding: whatever the model's logits (random here), the output matches the
request's JSON schema, JSON object, regex or grammar, and ends when it is complete."""

import json
import re
import subprocess
import sys

import jsonschema
import numpy as np
import pytest

from ingot.runtime import SamplingParams
from ingot.runtime.structured import InvalidConstraint, Matcher, StructuredOutput, ll_tokenizer

from fixtures import write_tokenizer
from generator_support import RandomSession, V, fake_generator

EOS = 1

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "age", "ok"],
    "additionalProperties": False,
}


def _generator(tokenizer, **options):
    options = {"eos_token_ids": (EOS,), "max_seq_len": 256, "vocab_size": V, **options}
    return fake_generator(RandomSession, tokenizer, num_blocks=256, **options)


def _params(kind, spec=None, **options):
    options = {"max_tokens": 200, "temperature": 1.0, **options}
    return SamplingParams(structured=StructuredOutput(kind, spec), **options)


@pytest.mark.parametrize("seed", range(4))
def test_json_schema_output_parses_and_validates(tokenizer, seed):
    gen = _generator(tokenizer)
    [c] = gen.generate([[5, 6]], _params("json_schema", SCHEMA, seed=seed))
    assert c.finish_reason == "stop", c.text
    jsonschema.validate(json.loads(c.text), SCHEMA)


def test_the_schema_can_be_json_text_and_greedy_works_too(tokenizer):
    gen = _generator(tokenizer)
    [c] = gen.generate([[9]], _params("json_schema", json.dumps(SCHEMA), temperature=0))
    assert c.finish_reason == "stop"
    jsonschema.validate(json.loads(c.text), SCHEMA)


def test_unconstrained_random_logits_are_not_json(tokenizer):
    # What the mask is up against: without it these logits give no JSON at all.
    gen = _generator(tokenizer)
    [c] = gen.generate([[5, 6]], SamplingParams(max_tokens=40, seed=0, ignore_eos=True))
    with pytest.raises(json.JSONDecodeError):
        json.loads(c.text)


@pytest.mark.parametrize("seed", range(3))
def test_json_object_is_any_json_object(tokenizer, seed):
    gen = _generator(tokenizer)
    # Penalties and a bias toward '"' ride along: the mask still has the last word.
    quote = tokenizer.encode('"')[0]
    [c] = gen.generate(
        [[7]], _params("json_object", seed=seed, presence_penalty=1.0, logit_bias={quote: 5.0})
    )
    assert c.finish_reason == "stop", c.text
    assert isinstance(json.loads(c.text), dict)


def test_regex_and_grammar(tokenizer):
    gen = _generator(tokenizer)
    [c] = gen.generate([[7]], _params("regex", r"(cat|dog)-[0-9]{2,4}", seed=1))
    assert re.fullmatch(r"(cat|dog)-[0-9]{2,4}", c.text) and c.finish_reason == "stop"
    lark = 'start: "yes" | "no" | "maybe " NUMBER\nNUMBER: /[0-9]+/'
    for seed in range(3):
        [c] = gen.generate([[7]], _params("grammar", lark, seed=seed, max_tokens=40))
        assert re.fullmatch(r"yes|no|maybe [0-9]+", c.text), c.text
    gbnf = 'root ::= "x" [0-9] "y"'
    [c] = gen.generate([[7]], _params("grammar", gbnf, seed=0))
    assert re.fullmatch(r"x[0-9]y", c.text) and c.finish_reason == "stop"


def test_a_complete_match_ends_the_request_with_stop(tokenizer):
    gen = _generator(tokenizer)
    # Nothing can follow "ab": finished without sampling EOS, even with EOS ignored.
    [c] = gen.generate([[7]], _params("regex", "ab", seed=0, ignore_eos=True))
    assert c.text == "ab" and c.finish_reason == "stop" and c.stop_reason is None
    assert EOS not in c.token_ids
    # Here EOS may end it or more digits come: either way the text matches.
    [c] = gen.generate([[7]], _params("regex", "[0-9]+", seed=0, max_tokens=30))
    assert re.fullmatch(r"[0-9]+", c.text)


def test_max_tokens_still_ends_a_long_structure(tokenizer):
    gen = _generator(tokenizer)
    [c] = gen.generate([[7]], _params("json_schema", SCHEMA, seed=0, max_tokens=3))
    assert c.finish_reason == "length" and len(c.token_ids) == 3 and c.text.startswith("{")


@pytest.mark.parametrize(
    ("kind", "spec", "message"),
    [
        ("json_schema", {"type": "objectx"}, "invalid json_schema"),
        ("json_schema", "{not json", "not valid JSON"),
        ("json_schema", [1, 2], "must be a JSON object"),
        ("regex", "((", "invalid regex"),
        ("regex", "", "non-empty string"),
        ("grammar", "start: foo", "invalid grammar"),
        ("json_object", {"type": "object"}, "takes no spec"),
        ("xml", None, "kind must be one of"),
    ],
)
def test_invalid_constraints_are_invalid_constraint_errors(kind, spec, message):
    # No field name in the message: the server prefixes the field that was sent.
    with pytest.raises(InvalidConstraint, match=f"^[^:]*{message}"):
        StructuredOutput(kind, spec)


def test_matcher_mask_and_tokenizer_cache(tokenizer):
    lltok = ll_tokenizer(tokenizer, V, (EOS,))
    assert ll_tokenizer(tokenizer, V, (EOS,)) is lltok  # built once
    matcher = Matcher(lltok, StructuredOutput("regex", "ab"))
    allowed = matcher.allowed(V + 5)  # a model vocabulary wider than the tokenizer's
    assert allowed.shape == (V + 5,) and not allowed[V:].any()
    assert tokenizer.decode(np.flatnonzero(allowed).tolist()).startswith("a")
    assert not allowed[EOS] and not matcher.is_finished
    for token in tokenizer.encode("ab"):
        matcher.consume(token)
    assert matcher.is_finished and matcher.is_accepting


def test_structured_and_plain_requests_batch_together(tokenizer):
    gen = _generator(tokenizer)
    plain = SamplingParams(max_tokens=10, seed=3, ignore_eos=True)
    constrained = _params("json_schema", SCHEMA, seed=1)
    together = gen.generate([[5], [5, 6], [8]], [plain, constrained, plain])
    jsonschema.validate(json.loads(together[1].text), SCHEMA)
    [alone] = gen.generate([[5, 6]], constrained)
    assert alone.token_ids == together[1].token_ids
    [alone] = gen.generate([[8]], plain)
    assert alone.token_ids == together[2].token_ids


def test_structured_output_loads_no_torch(tmp_path):
    # llguidance ships torch and transformers helpers (llguidance.torch, .hf): never imported.
    check = f"""
import sys
from ingot.runtime.structured import Matcher, StructuredOutput, ll_tokenizer
from ingot.runtime.tokenizer import TextTokenizer
tok = TextTokenizer({str(tmp_path / "tokenizer.json")!r})
matcher = Matcher(ll_tokenizer(tok, {V}, [1]), StructuredOutput("json_object"))
assert matcher.allowed({V}).any()
heavy = [m for m in ("torch", "transformers", "onnx") if m in sys.modules]
assert "llguidance" in sys.modules and not heavy, heavy
"""
    write_tokenizer(tmp_path, V)
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def _matches(tokenizer, structured: StructuredOutput, text: str) -> bool:
    """Whether `structured` allows exactly `text` (each token allowed, then complete)."""
    matcher = Matcher(ll_tokenizer(tokenizer, V, (EOS,)), structured)
    for token in tokenizer.encode(text, add_special_tokens=False):
        if not matcher.allowed(V)[token]:
            return False
        matcher.consume(token)
    return matcher.is_accepting


WHITESPACE_SCHEMA = {"type": "object", "properties": {"a": {"type": "array"}, "b": {}}}
WHITESPACE_VALUE = {"a": [1, 2], "b": {"c": None}}


@pytest.mark.parametrize(
    ("text", "default", "none"),
    [
        (json.dumps(WHITESPACE_VALUE, separators=(",", ":")), True, True),  # compact
        (json.dumps(WHITESPACE_VALUE), True, False),  # ", " and ": "
        (json.dumps(WHITESPACE_VALUE, indent=2), True, False),
        (json.dumps(WHITESPACE_VALUE, indent="\t"), True, False),
        ('{ "a" : [ 1 , 2 ] }', True, False),  # one space at every gap
        ('{\r\n  "a": []\r\n}', True, False),
        ('{"a":  [1]}', False, False),  # two spaces
        ('{"a":\n\n[1]}', False, False),  # two line breaks
        ('{"a": [1]' + "\n" + " " * 33 + "}", False, False),  # indented past 32
        (' {"a": []}', False, False),  # nothing before the object
    ],
)
def test_json_whitespace_is_bounded_by_default(tokenizer, text, default, none):
    # The default: one space or tab, or one line break and up to 32 spaces or tabs, between
    # two tokens; a model cannot pad an object with whitespace until max_tokens.
    # disable_any_whitespace (any_whitespace=False): none at all.
    assert _matches(tokenizer, StructuredOutput("json_schema", WHITESPACE_SCHEMA), text) is default
    assert _matches(tokenizer, StructuredOutput("json_object"), text) is default
    compact = StructuredOutput("json_schema", WHITESPACE_SCHEMA, any_whitespace=False)
    assert _matches(tokenizer, compact, text) is none


def test_a_schemas_own_x_guidance_overrides_the_whitespace_default(tokenizer):
    schema = {**WHITESPACE_SCHEMA, "x-guidance": {"whitespace_flexible": True}}
    assert _matches(tokenizer, StructuredOutput("json_schema", schema), '{"a":\n\n\n  []}')
