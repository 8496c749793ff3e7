"""`/rerank` (also `/reranking`, `/v1/rerank`, `/v1/reranking`) as llama-server answers it
with `--reranking`: each document scored against the query by the model's rank pooling
(llama/pooling.py: the score is the pooled vector's first value), in Jina's shape
(`documents` -> `results` of `index` and `relevance_score`, with usage) or, when the body
has `texts`, in Hugging Face TEI's (a list of `index` and `score`, `text` with
`return_text`); best first, cut to `top_n`.

The pair's prompt is the file's `tokenizer.chat_template.rerank` with `{query}` and
`{document}` replaced, else llama-server's default: [BOS] query [EOS] [SEP] document [EOS],
each special token where the vocabulary adds it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI, Request

from llama.api.embedding import embed_each
from llama.server.bridge import run_call
from llama.server.errors import APIError, bad_request
from llama.server.generate import read_body
from llama.server.state import ServerState

if TYPE_CHECKING:
    from llama.vocab import Vocab

RERANK_TEMPLATE = "tokenizer.chat_template.rerank"


def rerank_tokens(vocab: "Vocab", template: str | None, query: str, document: str) -> list[int]:
    """The tokens of one (query, document) pair."""
    if template is not None:
        text = template.replace("{query}", query).replace("{document}", document)
        return vocab.tokenize(text, add_special=False, parse_special=True)
    eos = vocab.eos_id if vocab.eos_id is not None else vocab.sep_id
    flags = vocab.flags
    out: list[int] = []
    if flags.add_bos and vocab.bos_id is not None:
        out.append(vocab.bos_id)
    out += vocab.tokenize(query, add_special=False)
    if flags.add_eos and eos is not None:
        out.append(eos)
    if flags.add_sep and vocab.sep_id is not None:
        out.append(vocab.sep_id)
    out += vocab.tokenize(document, add_special=False)
    if flags.add_eos and eos is not None:
        out.append(eos)
    return out


def rank_answer(body: dict, model: str, scores: list[float], n_tokens: int, documents: list[str]):
    """The answer's JSON from the scores, in the request's shape (TEI when it has `texts`)."""
    tei = "texts" in body
    label = "score" if tei else "relevance_score"
    top_n = body.get("top_n", len(documents))
    if not isinstance(top_n, int) or isinstance(top_n, bool):
        raise bad_request("'top_n' must be an integer")
    results = []
    for i, score in enumerate(scores):
        item: dict = {"index": i, label: score}
        if tei and body.get("return_text") is True:
            item["text"] = documents[i]
        results.append(item)
    results.sort(key=lambda r: -r[label])
    results = results[:max(top_n, 0)]
    if tei:
        return results
    return {"model": body.get("model", model), "object": "list",
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}, "results": results}


def register(app: FastAPI, state: ServerState) -> None:
    cfg = state.config

    @app.post("/rerank")
    @app.post("/reranking")
    @app.post("/v1/rerank")
    @app.post("/v1/reranking")
    async def rerank(request: Request):
        if not cfg.reranking:
            raise APIError(501, "This server does not support reranking. Start it with `--reranking`",
                           type="not_supported_error")
        body = await read_body(request, cfg.body_limit)
        llm, sched = state.ready()
        query = body.get("query")
        if "query" not in body:
            raise bad_request('"query" must be provided')
        if not isinstance(query, str):
            raise bad_request('"query" must be a string')
        documents = body.get("documents", body.get("texts"))
        if not isinstance(documents, list) or not documents or not all(isinstance(d, str) for d in documents):
            raise bad_request('"documents" must be a non-empty string array')
        template = llm.model.gguf.metadata.get(RERANK_TEMPLATE)
        pairs = [rerank_tokens(llm.model.vocab, template, query, d) for d in documents]
        vectors, n_tokens = await run_call(request, sched, lambda: embed_each(llm, pairs))
        scores = [float(v[0]) for v in vectors]
        return rank_answer(body, cfg.model_name, scores, n_tokens, documents)
