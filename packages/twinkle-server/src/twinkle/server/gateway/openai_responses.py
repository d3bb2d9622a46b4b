"""The OpenAI-compatible API's answers: completions, their log-probs, and the event stream.

Built from the sampler's results (``{"prompt_tokens", "sequences": [{"tokens", "logprobs",
"text", "stop_reason", "topk_logprobs"}]}`` per prompt); ``tokenizer`` turns token ids into the
token strings OpenAI's log-probs show.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from twinkle.server.gateway.openai_protocol import ChatCompletionRequest, CompletionRequest


def _usage(results: list[dict[str, Any]]) -> dict[str, int]:
    prompt = sum(len(r["prompt_tokens"]) for r in results)
    completion = sum(len(s["tokens"]) for r in results for s in r["sequences"])
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _finish(seq: dict[str, Any]) -> str:
    return "length" if seq["stop_reason"] == "length" else "stop"


def _token_text(tokenizer: Any, token: int) -> str:
    return tokenizer.decode([int(token)])


def _chat_logprobs(seq: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    def entry(token: int, logprob: float) -> dict[str, Any]:
        text = _token_text(tokenizer, token)
        return {"token": text, "logprob": float(logprob), "bytes": list(text.encode("utf-8"))}

    topk = seq.get("topk_logprobs") or [[] for _ in seq["tokens"]]
    return {
        "content": [
            {**entry(t, lp), "top_logprobs": [entry(int(a), b) for a, b in alts]}
            for t, lp, alts in zip(seq["tokens"], seq["logprobs"], topk)
        ],
        "refusal": None,
    }


def _text_logprobs(seq: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    tokens = [_token_text(tokenizer, t) for t in seq["tokens"]]
    offsets, at = [], 0
    for text in tokens:
        offsets.append(at)
        at += len(text)
    topk = seq.get("topk_logprobs")
    return {
        "tokens": tokens,
        "token_logprobs": [float(lp) for lp in seq["logprobs"]],
        "top_logprobs": [
            {_token_text(tokenizer, int(a)): float(b) for a, b in alts} for alts in topk
        ]
        if topk
        else None,
        "text_offset": offsets,
    }


def _head(kind: str, model: str) -> dict[str, Any]:
    prefix = "chatcmpl" if kind.startswith("chat") else "cmpl"
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
    }


def chat_response(
    req: ChatCompletionRequest, results: list[dict[str, Any]], tokenizer: Any
) -> dict[str, Any]:
    (result,) = results
    choices = [
        {
            "index": i,
            "message": {"role": "assistant", "content": seq["text"]},
            "logprobs": _chat_logprobs(seq, tokenizer) if req.logprobs else None,
            "finish_reason": _finish(seq),
        }
        for i, seq in enumerate(result["sequences"])
    ]
    return {**_head("chat.completion", req.model), "choices": choices, "usage": _usage(results)}


def completion_response(
    req: CompletionRequest, results: list[dict[str, Any]], prompts: list[str], tokenizer: Any
) -> dict[str, Any]:
    choices = []
    for result, prompt in zip(results, prompts):
        for seq in result["sequences"]:
            choices.append(
                {
                    "index": len(choices),
                    "text": (prompt if req.echo else "") + seq["text"],
                    "logprobs": _text_logprobs(seq, tokenizer)
                    if req.logprobs is not None
                    else None,
                    "finish_reason": _finish(seq),
                }
            )
    return {**_head("text_completion", req.model), "choices": choices, "usage": _usage(results)}


def stream_events(response: dict[str, Any], include_usage: bool) -> AsyncIterator[str]:
    """A finished response as OpenAI's stream: per choice its text, then its finish reason;
    the usage chunk when asked for; then ``[DONE]``."""
    chat = response["object"] == "chat.completion"
    head = {**response, "object": "chat.completion.chunk" if chat else "text_completion"}
    head.pop("choices"), head.pop("usage")

    def chunk(choice: dict[str, Any]) -> str:
        body = {**head, "choices": [choice]}
        if include_usage:
            body["usage"] = None
        return f"data: {json.dumps(body)}\n\n"

    async def events() -> AsyncIterator[str]:
        for c in response["choices"]:
            if chat:
                delta = {"role": "assistant", "content": c["message"]["content"]}
                yield chunk(
                    {
                        "index": c["index"],
                        "delta": delta,
                        "logprobs": c["logprobs"],
                        "finish_reason": None,
                    }
                )
                yield chunk(
                    {
                        "index": c["index"],
                        "delta": {},
                        "logprobs": None,
                        "finish_reason": c["finish_reason"],
                    }
                )
            else:
                yield chunk({**c, "finish_reason": None})
                yield chunk(
                    {
                        "index": c["index"],
                        "text": "",
                        "logprobs": None,
                        "finish_reason": c["finish_reason"],
                    }
                )
        if include_usage:
            yield f"data: {json.dumps({**head, 'choices': [], 'usage': response['usage']})}\n\n"
        yield "data: [DONE]\n\n"

    return events()


__all__ = ["chat_response", "completion_response", "stream_events"]
