"""OpenAI's response objects, built in one place so every front end returns the same shapes.

`Llama`, the HTTP server and its streams all build their dicts here: `text_completion`,
`chat.completion`, `chat.completion.chunk`, and the `list` of `embedding` objects.
"""
from __future__ import annotations

import time
import uuid
from base64 import b64encode

import numpy as np


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4()}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion(cid: str, created: int, model: str, text: str, finish_reason: str | None,
               logprobs: dict | None, use: dict | None, *, with_usage_field: bool = False) -> dict:
    out = {"id": cid, "object": "text_completion", "created": created, "model": model,
           "choices": [{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish_reason}]}
    if use is not None or with_usage_field:  # a stream's chunks with include_usage: "usage": null
        out["usage"] = use
    return out


def chat_completion(cid: str, created: int, model: str, message: dict, finish_reason: str,
                    logprobs: dict | None, use: dict) -> dict:
    return {"id": cid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": logprobs,
                         "finish_reason": finish_reason}],
            "usage": use}


def chat_chunk(cid: str, created: int, model: str, delta: dict, finish_reason: str | None = None,
               logprobs: dict | None = None, *, with_usage_field: bool = False) -> dict:
    out = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
           "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}]}
    if with_usage_field:  # stream_options.include_usage: every chunk carries "usage": null
        out["usage"] = None
    return out


def usage_chunk(cid: str, created: int, model: str, use: dict,
                object_: str = "chat.completion.chunk") -> dict:
    """The last chunk of a stream with include_usage: no choices, the usage (OpenAI's shape;
    `object_` "text_completion" for a text completion's stream)."""
    return {"id": cid, "object": object_, "created": created, "model": model,
            "choices": [], "usage": use}


def embeddings(vectors: list, model: str, prompt_tokens: int, base64: bool = False) -> dict:
    """OpenAI's embeddings list; with `base64`, each vector as the base64 of its float32
    little-endian bytes (OpenAI's encoding_format "base64", which its Python client asks for)."""
    def item(i: int, v) -> dict:
        if base64:
            raw = np.asarray(v, dtype="<f4").tobytes()
            return {"object": "embedding", "embedding": b64encode(raw).decode("ascii"), "index": i,
                    "encoding_format": "base64"}
        return {"object": "embedding", "embedding": np.asarray(v).tolist(), "index": i}
    return {"object": "list", "data": [item(i, v) for i, v in enumerate(vectors)],
            "model": model, "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}


def now() -> int:
    return int(time.time())
