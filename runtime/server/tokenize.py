"""vLLM's /tokenize and /detokenize: the served model's tokenizer over HTTP, so a client can
count tokens against max_model_len without a tokenizer of its own.

    POST /tokenize    {model?, prompt | messages, add_special_tokens?, add_generation_prompt?,
                       return_token_strs?}  ->  {count, max_model_len, tokens, token_strs}
    POST /detokenize  {model?, tokens}      ->  {prompt}

/tokenize is bounded as completions are: a prompt of more tokens than the server's limit
(`ServedModel.tokenize_limit`: max_model_len, or `ingot serve --max-tokenize-tokens`) is a
400, refused before tokenizing when its length alone proves it (`fewest_tokens`), so the work
and the memory a request costs stay in proportion to the context, not to the body; so is a
/detokenize of more ids. (vLLM's /tokenize counts any length; here a 9 MB prompt cost 20-30 s
of both cores and 2 GB of resident memory that the allocator kept.)

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
    """The request's tokens; 400 for invalid text, a template that fails, or more tokens than
    `model.tokenize_limit`."""
    param = "messages" if body.messages else "prompt"
    try:
        tokens, strs = await asyncio.to_thread(_tokenize, model, body, param)
    except InvalidText as e:
        raise APIError(400, str(e), param=param) from e
    except ChatTemplateError as e:
        raise APIError(400, str(e), param="messages") from e
    return TokenizeResponse(
        count=len(tokens), max_model_len=model.max_model_len, tokens=tokens, token_strs=strs
    )


def _tokenize(
    model: ServedModel, body: TokenizeRequest, param: str
) -> tuple[list[int], list[str] | None]:
    """In a worker thread: the token ids, and their strings if asked for."""
    tokenizer = model.tokenizer
    if body.messages is None:
        text = body.prompt or ""
        _refuse_before(model, text, param)
        special = True if body.add_special_tokens is None else body.add_special_tokens
    else:
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        # The template only adds to the contents: their bound holds for the rendered text.
        _refuse_before(model, "".join(m["content"] for m in messages), param)
        text = tokenizer.apply_chat_template(messages, body.add_generation_prompt)
        special = bool(body.add_special_tokens)
    tokens = tokenizer.encode(text, add_special_tokens=special)
    if len(tokens) > model.tokenize_limit:
        raise _too_many(model, param, f"{len(tokens)} tokens")
    strs = None
    if body.return_token_strs:
        strs = [tokenizer.decode([t], skip_special_tokens=False) for t in tokens]
    return tokens, strs


def _refuse_before(model: ServedModel, text: str, param: str) -> None:
    """400 for text that holds more tokens than the limit whatever it tokenizes to: refused
    in microseconds, before the tokenizer spends seconds and gigabytes on it."""
    fewest = model.tokenizer.fewest_tokens(text)
    if fewest > model.tokenize_limit:
        raise _too_many(model, param, f"{len(text)} characters, at least {fewest} tokens")


def _too_many(model: ServedModel, param: str, holds: str) -> APIError:
    limit = model.tokenize_limit
    source = "the model's max_model_len" if model.max_tokenize_tokens is None else "its limit"
    return APIError(
        400,
        f"`{param}` holds {holds}; this server tokenizes at most {limit} tokens ({source}; "
        f"ingot serve --max-tokenize-tokens sets it). Please shorten `{param}`.",
        param=param,
    )


async def detokenize(model: ServedModel, body: DetokenizeRequest) -> DetokenizeResponse:
    """The tokens' text; 400 for an id out of the vocabulary or more ids than
    `model.tokenize_limit`."""
    if len(body.tokens) > model.tokenize_limit:
        raise _too_many(model, "tokens", f"{len(body.tokens)} token ids")
    vocab = model.tokenizer.vocab_size
    bad = next((t for t in body.tokens if not 0 <= t < vocab), None)
    if bad is not None:
        raise APIError(400, f"token id {bad} is out of range [0, {vocab})", param="tokens")
    text = await asyncio.to_thread(model.tokenizer.decode, body.tokens, False)
    return DetokenizeResponse(prompt=text)
