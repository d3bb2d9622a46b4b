"""The OpenAI-compatible API's wire types: request bodies, and the error body OpenAI clients read.

Requests are strict (``extra="forbid"``): a field this server does not know is a 400 naming it,
rather than a silently ignored option. Fields OpenAI defines that change nothing here (``user``,
``metadata``, ...) are accepted; those asking for something this server cannot do (tools,
penalties, ``logit_bias``, ...) are accepted only at their neutral value (see
:func:`unsupported_fields`). ``top_k`` and ``repetition_penalty`` are extensions, as in vLLM.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: ``max_tokens`` when a request gives none (the sampler's own default).
DEFAULT_MAX_TOKENS = 256
#: Most stop strings one request may give.
MAX_STOP_STRINGS = 16


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StreamOptions(_Strict):
    include_usage: bool = False


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ImageUrl(_Strict):
    url: str
    detail: Literal["auto", "low", "high"] | None = None

    @field_validator("url")
    @classmethod
    def _inline_only(cls, url: str) -> str:
        if not url.startswith("data:image/"):
            raise ValueError(
                "must be a data:image/...;base64, URL: the server fetches nothing and reads no "
                f"files (got {url[:40]!r})"
            )
        return url


class ImagePart(_Strict):
    """An image as a ``data:image/...;base64,`` URL; the server fetches nothing."""

    type: Literal["image_url"]
    image_url: ImageUrl


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class ChatMessage(BaseModel):
    """One turn. Tolerant of extra keys, so that a client can send back an assistant message
    as it received it (``refusal``, ``annotations``, ...)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    def to_twinkle(self) -> dict[str, Any]:
        """The turn as a ``twinkle.data_format.Message`` dict (``developer`` reads as
        ``system``; image URLs become image parts)."""
        content: str | list[dict[str, Any]]
        if isinstance(self.content, list):
            content = [
                {"type": "text", "text": p.text}
                if isinstance(p, TextPart)
                else {"type": "image", "image": p.image_url.url}
                for p in self.content
            ]
        else:
            content = self.content or ""
        message: dict[str, Any] = {
            "role": "system" if self.role == "developer" else self.role,
            "content": content,
        }
        for key in ("name", "tool_calls", "tool_call_id", "reasoning_content"):
            if getattr(self, key) is not None:
                message[key] = getattr(self, key)
        return message


class _Sampling(_Strict):
    """What chat and text completions share."""

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int = Field(1, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # Extensions (vLLM's names).
    top_k: int | None = Field(None, ge=-1)
    repetition_penalty: float | None = Field(None, gt=0)

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)


def unsupported_fields(req: _Sampling) -> list[tuple[str, str]]:
    """``(field, why)`` for each option given at a value this server cannot honour."""
    found = []
    if req.presence_penalty or req.frequency_penalty:
        name = "presence_penalty" if req.presence_penalty else "frequency_penalty"
        found.append((name, "only 0 is supported; repetition_penalty is"))
    if req.logit_bias:
        found.append(("logit_bias", "is not supported"))
    if len(req.stop_strings()) > MAX_STOP_STRINGS:
        found.append(("stop", f"gives more than {MAX_STOP_STRINGS} strings"))
    if isinstance(req, ChatCompletionRequest):
        if req.tools:
            found.append(("tools", "is not supported: replies are text, tool calls not parsed"))
        if req.tool_choice not in (None, "none", "auto"):
            found.append(("tool_choice", "is not supported"))
        if req.response_format and req.response_format.get("type") != "text":
            found.append(("response_format", "only {'type': 'text'} is supported"))
        if req.top_logprobs and not req.logprobs:
            found.append(("top_logprobs", "needs logprobs=true"))
    if isinstance(req, CompletionRequest):
        if req.suffix:
            found.append(("suffix", "is not supported"))
        if req.best_of is not None and req.best_of != req.n:
            found.append(("best_of", "must equal n (every sample is returned)"))
        if req.echo and req.logprobs is not None:
            found.append(("echo", "cannot be combined with logprobs"))
    return found


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error JSON: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON schema with its ``$defs`` written in place, so that it stands alone
    inside an OpenAPI document (whose ``#/...`` references start at the document's root)."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                return inline(defs[ref.rsplit("/", 1)[1]])
            out = {k: inline(v) for k, v in node.items()}
            if isinstance(out.get("discriminator"), dict):
                # Its mapping names $defs too; the oneOf says the same without it.
                out["discriminator"] = {"propertyName": out["discriminator"]["propertyName"]}
            return out
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    return inline(schema)


_BRANCHES = {"str", "int", "float", "bool", "list", "dict", "none"}


def pick_error(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """The pydantic error that says the most: a validator's own message, else the deepest
    (of a union's branches, the one that got furthest)."""
    checked = [e for e in errors if e["type"] == "value_error"]
    return checked[0] if checked else max(errors, key=lambda e: len(e["loc"]))


def error_param(loc: tuple[Any, ...]) -> str | None:
    """The field a pydantic error location points at, as ``messages.0.content.0.image_url.url``
    (union branch names and a tagged union's tag left out)."""
    parts: list[str] = []
    for part in (str(p) for p in loc):
        if "[" in part or part in _BRANCHES or (parts and parts[-1] == part):
            continue
        parts.append(part)
    return ".".join(parts) or None


__all__ = [
    "DEFAULT_MAX_TOKENS",
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "error_body",
    "error_param",
    "inline_schema",
    "pick_error",
    "unsupported_fields",
]
