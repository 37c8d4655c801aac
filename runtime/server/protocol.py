"""Request and response bodies of the OpenAI API (the subset ingot serves), as pydantic models.

Field names, defaults and shapes follow OpenAI's API and vLLM's extensions (top_k, ignore_eos,
stop_token_ids, min_tokens, repetition_penalty, include_stop_str_in_output, guided_*). Unknown
fields are ignored, as vLLM does; known fields that ingot cannot honour (suffix, tools, echo
with logprobs) are refused with a 400 naming the field.

Types are strict, as vLLM's values are: a bool is not a number, a string is not a number, a
prompt list holds integers or strings only. The sampling fields carry their types only: their
ranges are SamplingParams' (runtime/sampling_checks.py), which the server builds from each
request, so the Python API and the server accept the same values.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
)
from pydantic_core import PydanticCustomError

from ingot.runtime.sampling_checks import MAX_INT
from ingot.runtime.structured import InvalidConstraint, StructuredOutput
from ingot.runtime.tokenizer import InvalidText, check_text

__all__ = [
    "APIError",
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "ErrorResponse",
    "ModelCard",
    "ModelList",
    "RequestModel",
    "ResponseFormat",
    "StreamOptions",
    "StructuredOutputs",
    "Usage",
    "model_not_found",
    "random_id",
]

# Choices a request may ask for (prompts x n, or best_of): the server's limit, not a value's.
MAX_CHOICES = 128


class APIError(Exception):
    """An error the API reports as OpenAI's error object with an HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",  # noqa: A002 - OpenAI's field name
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        error = ErrorInfo(message=self.message, type=self.type, param=self.param, code=self.code)
        return ErrorResponse(error=error).model_dump()


def model_not_found(requested: str) -> APIError:
    """OpenAI's 404 for a model id this server does not serve."""
    return APIError(
        404, f"The model `{requested}` does not exist.", param="model", code="model_not_found"
    )


class ErrorInfo(BaseModel):
    """OpenAI's error object. Its text is made encodable here, the one place every error body
    passes (JSON response, stream event, 413): a message may echo what the client sent, and a
    lone surrogate from a JSON "\\ud800" escape has no UTF-8 form, so it is written as the
    escape's text instead of failing the response."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None

    @field_validator("message", "type", "param", "code")
    @classmethod
    def _encodable(cls, text: str | None) -> str | None:
        return None if text is None else text.encode("utf-8", "backslashreplace").decode()


class ErrorResponse(BaseModel):
    error: ErrorInfo


class RequestModel(BaseModel):
    """A request body: strict types (no bool or string where a number goes), unknown fields
    ignored."""

    model_config = ConfigDict(extra="ignore", strict=True)


class _Request(RequestModel):
    model: str | None = Field(None, description="Served model name; omitted means the served one")
    temperature: float = Field(1.0, description=">= 0; below 1e-5 is greedy")
    top_p: float = Field(1.0, description="in (0, 1]")
    top_k: int = Field(0, description="vLLM extension: 0 or -1 = no limit")
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    n: Annotated[int, Field(le=MAX_CHOICES)] = 1
    best_of: Annotated[int, Field(le=MAX_CHOICES)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(0.0, description="in [-2, 2]")
    frequency_penalty: float = Field(0.0, description="in [-2, 2]")
    repetition_penalty: float = Field(
        1.0, description="vLLM extension: > 1 discourages tokens of the prompt and output"
    )
    logit_bias: dict[str, float] | None = None
    min_tokens: int = Field(
        0, description="vLLM extension: no EOS, stop token or stop string before this many"
    )
    include_stop_str_in_output: bool = Field(False, description="vLLM extension")
    response_format: ResponseFormat | None = None
    guided_json: dict[str, Any] | str | None = Field(None, description="vLLM extension")
    guided_regex: str | None = Field(None, description="vLLM extension")
    guided_grammar: str | None = Field(None, description="vLLM extension (Lark or GBNF)")
    guided_choice: list[str] | None = Field(None, description="vLLM extension")
    structured_outputs: StructuredOutputs | None = Field(None, description="vLLM extension")
    priority: int = Field(
        0,
        ge=-(2**63),
        le=2**63 - 1,
        description="vLLM extension: lower is served first under --scheduling-policy "
        "priority; ignored under fcfs (as vLLM does)",
    )
    user: str | None = None

    def unsupported(self) -> tuple[str, str] | None:
        """(field, reason) of the first field set to something ingot does not serve (values
        out of range are SamplingParams' to refuse)."""
        if self.stream and (self.best_of or self.n) > self.n:
            return "best_of", "best_of > n cannot stream: the best are known only at the end"
        if self.stream_options is not None and not self.stream:
            return "stream_options", "stream_options is only allowed when stream is true"
        guided = [f for f in _GUIDED if getattr(self, f) is not None]
        if self.response_format is not None and self.response_format.type != "text":
            guided.append("response_format")
        if self.structured_outputs is not None:
            given = self.structured_outputs.constraints()
            if len(given) > 1:
                return f"structured_outputs.{given[1]}", "give one of " + ", ".join(given)
            guided += [f"structured_outputs.{name}" for name in given]
        if len(guided) > 1:
            return guided[1], f"only one output constraint at a time (got {', '.join(guided)})"
        return None

    def structured(self) -> StructuredOutput | None:
        """The output constraint the request asks for, if any; an invalid one is a 400 naming
        the field that was sent (e.g. `structured_outputs.regex`)."""
        found = self._constraint()
        if found is None:
            return None
        field, kind, spec = found
        options = self.structured_outputs or StructuredOutputs()
        try:
            if kind == "choice":
                kind, spec = "regex", _choice_regex(spec)
            return StructuredOutput(kind, spec, not options.disable_any_whitespace)
        except (InvalidConstraint, InvalidText) as e:
            raise APIError(400, f"{field}: {e}", param=field) from e

    def _constraint(self) -> tuple[str, str, Any] | None:
        """(the field that set it, kind, spec) of the request's output constraint, if any
        (`unsupported` has refused more than one)."""
        response_format = self.response_format
        if response_format is not None and response_format.type == "json_object":
            return "response_format", "json_object", None
        if response_format is not None and response_format.type == "json_schema":
            schema = response_format.json_schema
            if schema is None or schema.schema_ is None:
                field = "response_format.json_schema.schema"
                raise APIError(400, f"{field} is required", param=field)
            return "response_format", "json_schema", schema.schema_
        options = self.structured_outputs or StructuredOutputs()
        for guided, option, kind in _CONSTRAINTS:
            if getattr(self, guided) is not None:
                return guided, kind, getattr(self, guided)
            if getattr(options, option) is not None:
                return f"structured_outputs.{option.rstrip('_')}", kind, getattr(options, option)
        if options.json_object:
            return "structured_outputs.json_object", "json_object", None
        return None

    def request_field(self, sampling_field: str) -> str:
        """The request's name for a SamplingParams field (the field a 400 names)."""
        return sampling_field

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


_GUIDED = ("guided_json", "guided_regex", "guided_grammar", "guided_choice")
# (vLLM's older field, structured_outputs' attribute, kind) of each constraint given as text.
_CONSTRAINTS = (
    ("guided_json", "json_", "json_schema"),
    ("guided_regex", "regex", "regex"),
    ("guided_grammar", "grammar", "grammar"),
    ("guided_choice", "choice", "choice"),
)


def _choice_regex(choice: list[str]) -> str:
    """A regex matching exactly one of the options (InvalidConstraint: none, InvalidText: an
    option with a lone surrogate)."""
    if not choice:
        raise InvalidConstraint("a choice needs at least one option")
    for i, option in enumerate(choice):
        check_text(option, f"option {i}")
    return "|".join(_regex_literal(option) for option in choice)


def _regex_literal(text: str) -> str:
    """`text` as a regex matching exactly it (llguidance's Rust regex syntax)."""
    return "".join(f"\\{c}" if c in r"\.+*?()|[]{}^$#&-~" else c for c in text)


class StreamOptions(RequestModel):
    include_usage: bool = False
    continuous_usage_stats: bool = Field(
        False, description="vLLM extension: usage so far in every chunk (with include_usage)"
    )


class StructuredOutputs(RequestModel):
    """vLLM's `structured_outputs`: one constraint, and how JSON may be laid out."""

    model_config = ConfigDict(populate_by_name=True)

    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False

    def constraints(self) -> list[str]:
        named = {"json": self.json_, "regex": self.regex, "choice": self.choice}
        named |= {"grammar": self.grammar, "json_object": self.json_object or None}
        return [name for name, value in named.items() if value is not None]


class JsonSchemaFormat(RequestModel):
    model_config = ConfigDict(populate_by_name=True)

    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(RequestModel):
    """OpenAI's `response_format`: plain text, any JSON object, or JSON matching a schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


TokenIds = Annotated[list[Annotated[int, Field(ge=0, le=MAX_INT)]], Field(min_length=1)]


def _one_of_the_prompt_shapes(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """One error for a prompt of none of the shapes, not one per shape it is not."""
    try:
        return handler(value)
    except ValidationError:
        raise PydanticCustomError(
            "prompt_shape",
            "Input should be a string, a list of token ids (integers in [0, {max_int}]), a list "
            "of strings, or a list of lists of token ids, none of them empty",
            {"max_int": MAX_INT},
        ) from None


# One prompt (text or token ids) or a batch of them, as OpenAI's completions API takes it.
Prompt = Annotated[
    str
    | TokenIds
    | Annotated[list[str], Field(min_length=1)]
    | Annotated[list[TokenIds], Field(min_length=1)],
    WrapValidator(_one_of_the_prompt_shapes),
]


class CompletionRequest(_Request):
    prompt: Prompt
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None

    def unsupported(self) -> tuple[str, str] | None:
        if self.echo and self.logprobs is not None:
            return "echo", "echo with logprobs is not supported (prompt logprobs are not kept)"
        if self.suffix:
            return "suffix", "suffix is not supported"
        if len(self.prompts()) * self.n > MAX_CHOICES:
            return "n", f"at most {MAX_CHOICES} choices per request (prompts x n)"
        return super().unsupported()

    def prompts(self) -> list[str | list[int]]:
        """The batch: one entry per prompt, text or token ids."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        return list(p)


class TextPart(RequestModel):
    type: Literal["text"]
    text: str


class ChatMessage(RequestModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_Request):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = Field(True, description="vLLM extension")

    def unsupported(self) -> tuple[str, str] | None:
        if self.tools:
            return "tools", "tool calling is not supported"
        if self.top_logprobs and not self.logprobs:
            return "top_logprobs", "top_logprobs requires logprobs to be true"
        return super().unsupported()

    def output_limit(self) -> int | None:
        """max_completion_tokens (the current name) over max_tokens (deprecated)."""
        return self.max_tokens if self.max_completion_tokens is None else self.max_completion_tokens

    def request_field(self, sampling_field: str) -> str:
        if sampling_field == "logprobs":
            return "top_logprobs"
        if sampling_field == "max_tokens" and self.max_completion_tokens is not None:
            return "max_completion_tokens"
        return sampling_field


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> Usage:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "ingot"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


_Request.model_rebuild()
CompletionRequest.model_rebuild()
ChatCompletionRequest.model_rebuild()
