"""vLLM's /tokenize and /detokenize: the served model's tokenizer over HTTP, so a client can
count tokens against max_model_len without a tokenizer of its own.

    POST /tokenize    {model?, prompt | messages, add_special_tokens?, add_generation_prompt?,
                       return_token_strs?}  ->  {count, max_model_len, tokens, token_strs}
    POST /detokenize  {model?, tokens}      ->  {prompt}

Tokenizing runs in a worker thread (`asyncio.to_thread`): a long prompt must not stall the
event loop that streams everyone else's tokens.
"""

from __future__ import annotations

import asyncio

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ingot.runtime.server.protocol import APIError, ChatMessage, RequestModel
from ingot.runtime.server.stream import ServedModel
from ingot.runtime.tokenizer import ChatTemplateError, InvalidText

__all__ = [
    "DetokenizeRequest",
    "DetokenizeResponse",
    "TokenizeRequest",
    "TokenizeResponse",
    "detokenize",
    "tokenize",
]


class TokenizeRequest(RequestModel):
    """A prompt (vLLM's TokenizeCompletionRequest) or chat messages (TokenizeChatRequest)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: bool | None = Field(
        None, description="Default: true for a prompt, false for messages (the template adds BOS)"
    )
    add_generation_prompt: bool = True
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _prompt_or_messages(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give either prompt or messages")
        return self


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(RequestModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str


async def tokenize(model: ServedModel, body: TokenizeRequest) -> TokenizeResponse:
    try:
        tokens = await asyncio.to_thread(_tokenize, model, body)
    except InvalidText as e:
        raise APIError(400, str(e), param="messages" if body.messages else "prompt") from e
    except ChatTemplateError as e:
        raise APIError(400, str(e), param="messages") from e
    strs = None
    if body.return_token_strs:
        strs = [model.tokenizer.decode([t], skip_special_tokens=False) for t in tokens]
    return TokenizeResponse(
        count=len(tokens), max_model_len=model.max_model_len, tokens=tokens, token_strs=strs
    )


def _tokenize(model: ServedModel, body: TokenizeRequest) -> list[int]:
    tokenizer = model.tokenizer
    if body.messages is None:
        special = True if body.add_special_tokens is None else body.add_special_tokens
        return tokenizer.encode(body.prompt or "", add_special_tokens=special)
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    text = tokenizer.apply_chat_template(messages, body.add_generation_prompt)
    return tokenizer.encode(text, add_special_tokens=bool(body.add_special_tokens))


async def detokenize(model: ServedModel, body: DetokenizeRequest) -> DetokenizeResponse:
    vocab = model.tokenizer.vocab_size
    bad = next((t for t in body.tokens if not 0 <= t < vocab), None)
    if bad is not None:
        raise APIError(400, f"token id {bad} is out of range [0, {vocab})", param="tokens")
    text = await asyncio.to_thread(model.tokenizer.decode, body.tokens, False)
    return DetokenizeResponse(prompt=text)
