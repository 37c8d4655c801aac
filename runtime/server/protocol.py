"""Request and response bodies of the OpenAI API (the subset ingot serves), as pydantic models.

Field names, defaults and shapes follow OpenAI's API and vLLM's extensions (top_k, ignore_eos,
stop_token_ids). Unknown fields are ignored, as vLLM does; known fields that ingot cannot honour
(n > 1, echo, best_of, penalties, ...) are refused with a 400 naming the field.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ingot.runtime.sampling import MAX_LOGPROBS

__all__ = [
    "APIError",
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "ErrorResponse",
    "ModelCard",
    "ModelList",
    "StreamOptions",
    "Usage",
    "random_id",
]

# Bounds keep every field representable (no int overflow in numpy, no absurd allocations).
_MAX_INT = 2**31 - 1


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


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = Field(None, description="Served model name; omitted means the served one")
    temperature: Annotated[float, Field(ge=0, le=2)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    top_k: Annotated[int, Field(ge=-1, le=_MAX_INT)] = Field(
        0, description="vLLM extension: 0 or -1 = off"
    )
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0, le=_MAX_INT)]] | None = None
    ignore_eos: bool = False
    n: Annotated[int, Field(ge=1, le=128)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    def unsupported(self) -> tuple[str, str] | None:
        """(field, reason) of the first field set to something ingot does not serve."""
        if self.n != 1:
            return "n", "only n=1 is supported"
        if self.presence_penalty or self.frequency_penalty:
            field = "presence_penalty" if self.presence_penalty else "frequency_penalty"
            return field, "penalties are not supported"
        if self.logit_bias:
            return "logit_bias", "logit_bias is not supported"
        if self.stream_options is not None and not self.stream:
            return "stream_options", "stream_options is only allowed when stream is true"
        if "" in self.stop_list():
            return "stop", "stop strings must not be empty"
        return None

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class CompletionRequest(_Request):
    prompt: str | Annotated[list[Annotated[int, Field(ge=0, le=_MAX_INT)]], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1, le=_MAX_INT)] | None = 16
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    echo: bool = False
    best_of: Annotated[int, Field(ge=1, le=128)] | None = None
    suffix: str | None = None

    def unsupported(self) -> tuple[str, str] | None:
        if self.echo:
            return "echo", "echo is not supported"
        if self.best_of not in (None, 1):
            return "best_of", "only best_of=1 is supported"
        if self.suffix:
            return "suffix", "suffix is not supported"
        return super().unsupported()


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

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
    max_tokens: Annotated[int, Field(ge=1, le=_MAX_INT)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1, le=_MAX_INT)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
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
        return self.max_completion_tokens or self.max_tokens


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
