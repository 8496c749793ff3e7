"""Resumable streams (llama-server's `X-Conversation-Id`, `GET/DELETE /v1/stream`,
`POST /v1/streams/lookup`) on a real server: the replay is the stream's own bytes, a stream
outlives its client, a stop ends the generation and forgets the session."""
from __future__ import annotations

import json
import uuid

import httpx

CHAT = {"messages": [{"role": "user", "content": "Write a long story about a cat."}], "stream": True,
        "temperature": 0, "max_tokens": 48}


def _content(sse: bytes) -> str:
    text = []
    for line in sse.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            choices = json.loads(line[6:]).get("choices") or [{}]
            text.append(choices[0].get("delta", {}).get("content") or "")
    return "".join(text)


def _post(client: httpx.Client, conv: str | None, **extra) -> bytes:
    headers = {"X-Conversation-Id": conv} if conv else {}
    with client.stream("POST", "/v1/chat/completions", json={**CHAT, **extra}, headers=headers) as r:
        assert r.status_code == 200
        return r.read()


def test_a_finished_stream_replays_its_bytes_and_is_stopped(server):
    conv = f"conv-{uuid.uuid4()}"
    with server.client() as c:
        sent = _post(c, conv)
        assert sent.endswith(b"data: [DONE]\n\n") and _content(sent)
        replay = c.get("/v1/stream", params={"conv_id": conv, "from": 0})
        assert replay.status_code == 200 and replay.headers["content-type"].startswith("text/event-stream")
        assert replay.content == sent
        assert c.get("/v1/stream", params={"conv_id": conv, "from": 10}).content == sent[10:]
        (info,) = c.post("/v1/streams/lookup", json={"conversation_ids": [conv, "other"]}).json()
        assert info["conversation_id"] == conv and info["is_done"] and info["total_bytes"] == len(sent)
        assert info["completed_at"] >= info["started_at"] > 0
        assert c.delete("/v1/stream", params={"conv_id": conv}).status_code == 204
        assert c.get("/v1/stream", params={"conv_id": conv, "from": 0}).status_code == 404
        assert c.delete("/v1/stream", params={"conv_id": conv}).status_code == 204   # idempotent
        assert c.post("/v1/streams/lookup", json={"conversation_ids": [conv]}).json() == []


def test_the_generation_goes_on_after_the_client_leaves(server):
    """The client reads one event and disconnects; the replay then holds the whole reply,
    the same text as a stream read to the end."""
    conv = f"conv-{uuid.uuid4()}"
    with server.client() as c:
        whole = _content(_post(c, None, max_tokens=96))
        with c.stream("POST", "/v1/chat/completions", json={**CHAT, "max_tokens": 96},
                      headers={"X-Conversation-Id": conv}) as r:
            assert b"[DONE]" not in next(r.iter_raw())   # left with the reply still to come
        replay = c.get("/v1/stream", params={"conv_id": conv, "from": 0}, timeout=120)
        assert replay.content.endswith(b"data: [DONE]\n\n")
        assert _content(replay.content) == whole
        c.delete("/v1/stream", params={"conv_id": conv})


def test_a_stop_ends_the_generation(server):
    conv = f"conv-{uuid.uuid4()}"
    with server.client() as c:
        with c.stream("POST", "/v1/chat/completions", json={**CHAT, "max_tokens": 400},
                      headers={"X-Conversation-Id": conv}) as r:
            chunks = r.iter_raw()
            got = next(chunks)
            assert c.delete("/v1/stream", params={"conv_id": conv}).status_code == 204
            got += b"".join(chunks)     # the stream ends early
        assert not got.endswith(b"data: [DONE]\n\n")
        assert len(_content(got)) < len(_content(_post(c, None, max_tokens=400)))
        assert c.get("/v1/stream", params={"conv_id": conv, "from": 0}).status_code == 404


def test_a_new_request_replaces_the_session_and_bad_requests_are_named(server):
    conv = f"conv-{uuid.uuid4()}"
    with server.client() as c:
        first = _post(c, conv, max_tokens=4)
        second = _post(c, conv, max_tokens=8)
        assert c.get("/v1/stream", params={"conv_id": conv, "from": 0}).content == second != first
        assert c.get("/v1/stream", params={"from": 0}).status_code == 400
        assert "from" in c.get("/v1/stream", params={"conv_id": conv, "from": "x"}).json()["error"]["message"]
        assert c.post("/v1/streams/lookup", json={"conversation_ids": "x"}).status_code == 400
        _post(c, None)   # without the header nothing is kept
        c.delete("/v1/stream", params={"conv_id": conv})
