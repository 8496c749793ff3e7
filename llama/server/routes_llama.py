"""llama-server's own endpoints: /health, /completion, /infill, /tokenize, /detokenize,
/apply-template, /embedding, /props, /slots, /slots/{id}, /lora-adapters, /metrics, with
its shapes."""
from __future__ import annotations

import math
import time

from fastapi import FastAPI, Request
from starlette.responses import Response

from llama.api.completion import prepare_completion
from llama.api.embedding import embed_each, normalize
from llama.api.sequence import Step
from llama.pooling import PoolingType
from llama.server import fields, slot_files
from llama.server import infill as infill_api
from llama.server.bridge import run_call
from llama.server.errors import APIError, bad_request
from llama.server.generate import read_body, serve, serve_all
from llama.server.metrics import make_registry, render, samples, without_rates
from llama.server.routes_openai import embedding_input, not_embedding, prepare
from llama.server.scheduler import Task
from llama.server.slots import base_cells, shared_cells
from llama.server.state import ServerState, safe_slot_file
from llama.server.timings import progress_timings, timings


FLOAT_LOWEST = -3.4028234663852886e38   # what llama-server sends for log(0)


def utf8_prefix(piece: bytes) -> str:
    """The piece's text up to a split character (llama-server's validate_utf8)."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError as e:
        return piece[:e.start].decode("utf-8")


class LlamaCompletion:
    """llama-server's /completion answer and stream ({"content", "stop", ...}), shaped by
    the request's `fields.ResponseOptions`."""

    def __init__(self, job, task: Task, model: str, options: fields.ResponseOptions,
                 settings: dict, prompt_text: str):
        self.job, self.task, self.model = job, task, model
        self.options, self.settings = options, settings
        self.prompt_text = prompt_text

    def start(self) -> list[dict]:
        return []

    def feed(self, step: Step) -> list[dict]:
        if not step.text and step.finish_reason is None:
            return []
        tokens = [step.token] if step.token >= 0 else []   # always, as llama-server's partial results
        chunk = {"index": 0, "content": step.text, "tokens": tokens, "stop": False,
                 "id_slot": self.task.slot, "tokens_predicted": step.n_tokens,
                 "tokens_evaluated": len(self.job.seq.prompt)}
        if self.options.timings_per_token:
            chunk["timings"] = self.timings()
        if self.options.n_probs > 0 and step.logprobs:
            chunk["completion_probabilities"] = self.probabilities(step.logprobs)
        return [chunk]

    def probabilities(self, entries) -> list[dict]:
        """llama-server's completion_probabilities: per token its probability (or, with
        post_sampling_probs, the chain's final one) and the top n_probs."""
        post = self.options.post_sampling_probs
        key = "prob" if post else "logprob"

        def one(token: int, piece: bytes, logprob: float) -> dict:
            value = math.exp(logprob) if post else max(logprob, FLOAT_LOWEST)  # log(0): lowest float
            return {"id": token, "token": utf8_prefix(piece), "bytes": list(piece), key: value}

        return [{**one(e.token, e.piece, e.logprob),
                 "top_probs" if post else "top_logprobs": [one(*t) for t in e.top]} for e in entries]

    def progress(self, info: dict) -> dict:
        """A chunk of llama-server's prompt processing progress (return_progress)."""
        chunk = {"index": 0, "content": "", "tokens": [], "stop": False, "id_slot": self.task.slot,
                 "prompt_progress": info}
        if self.options.timings_per_token:
            chunk["timings"] = progress_timings(info)
        return chunk

    def end(self) -> list[dict]:
        final = self.response(streamed=True)
        final["content"] = ""
        return [final]

    def timings(self) -> dict:
        return timings(self.task)

    def response(self, streamed: bool = False) -> dict:
        seq, task = self.job.seq, self.task
        stop_type = "limit" if seq.finish_reason == "length" else (
            "word" if seq.text.stopped else "eos")
        answer = {"index": 0, "content": seq.completion_text(),
                  "tokens": list(seq.tokens) if self.options.return_tokens else [],
                  "id_slot": task.slot, "stop": True, "model": self.model,
                  "tokens_predicted": len(seq.tokens), "tokens_evaluated": len(seq.prompt),
                  "generation_settings": self.settings,
                  "prompt": self.prompt_text, "has_new_line": "\n" in seq.completion_text(),
                  "truncated": task.n_shifts > 0, "stop_type": stop_type, "stopping_word": seq.text.stop_word or "",
                  "tokens_cached": task.n_cached, "timings": self.timings()}
        if self.options.n_probs > 0 and not streamed:   # a stream sent them with its chunks
            answer["completion_probabilities"] = self.probabilities(seq.logprobs)
        if self.options.response_fields:
            return fields.nested_fields(self.options.response_fields, answer)
        return answer


def register(app: FastAPI, state: ServerState) -> None:
    cfg = state.config
    def metric_samples():
        """The metrics now; while the model sleeps, those taken as it fell asleep (their
        throughput reported once)."""
        if state.sleeping:
            taken = state.metrics_snapshot
            state.metrics_snapshot = without_rates(taken or [])
            return taken
        return samples(state.scheduler) if state.scheduler is not None else None
    registry = make_registry(metric_samples)

    @app.get("/health")
    @app.get("/v1/health")
    async def health():
        state.ready(wake=False)
        return {"status": "ok"}

    @app.post("/completion")
    @app.post("/completions")
    async def completion(request: Request):
        body = await read_body(request, cfg.body_limit)
        state.ready()
        not_embedding(state)
        return await complete(request, body)

    @app.post("/infill")
    async def infill(request: Request):
        """llama-server's fill-in-the-middle completion (llama/server/infill.py); the
        answer is /completion's."""
        body = await read_body(request, cfg.body_limit)
        llm, _ = state.ready()
        not_embedding(state)
        infill_api.check_supported(llm.model.vocab)
        prefix, suffix, extra, prompt = infill_api.request_parts(body)
        tokens = infill_api.infill_prompt(llm.model, prefix, suffix, extra, prompt,
                                          n_batch=cfg.batch_size, n_predict=cfg.n_predict,
                                          n_ctx=state.n_ctx_slot, spm=cfg.spm_infill)
        return await complete(request, {**body, "prompt": tokens})

    async def complete(request: Request, body: dict):
        llm, sched = state.ready()
        slot_options = fields.slot_options(body, cfg, state.lora_scales)
        if fields.n_choices(body, cfg.parallel) > 1:
            raise bad_request("several completions of one prompt (n_cmpl > 1) are served by "
                              "/v1/completions and /v1/chat/completions (n), not /completion")
        bodies = fields.prompts(body, state.vocab)
        if len(bodies) > 1:
            return await complete_several(request, bodies, slot_options)
        kwargs = fields.completion_kwargs(body, cfg, state.vocab)
        options = fields.response_options(body)
        job = prepare(prepare_completion, llm, kwargs, state)   # checks the fields first
        job.seq.t_max_predict_ms = fields.time_limit_ms(body)
        job.seq.n_indent = fields.n_indent(body)
        job.seq.post_sampling_probs = options.post_sampling_probs
        settings = fields.generation_settings(body, cfg, state.lora_scales, state.vocab)
        # a prompt of token ids (an /infill's) reads as llama-server shows it: special tokens included
        prompt_text = (llm.model.detokenize(job.seq.prompt, unparse_special=True)
                       if isinstance(kwargs["prompt"], list) else job.prompt_text)

        def answer(task: Task) -> LlamaCompletion:
            return LlamaCompletion(job, task, cfg.model_name, options, settings, prompt_text)

        return await serve(request, sched, job.seq,
                           response=lambda t: answer(t).response(), chunks=answer,
                           shift=fields.shift_options(body),
                           ping_every=fields.ping_interval(body, cfg),
                           progress=(lambda t, info: answer(t).progress(info))
                           if options.return_progress else None,
                           stream=fields.field(body, "stream", (bool,), False),
                           slot=slot_options, done_marker=False)

    async def complete_several(request: Request, bodies: list[dict], slot_options):
        """llama-server's /completion with several prompts: an array of answers, in order, or
        (streamed) every answer's chunks with its prompt's index."""
        llm, sched = state.ready()
        options = fields.response_options(bodies[0])
        settings = fields.generation_settings(bodies[0], cfg, state.lora_scales, state.vocab)
        jobs = [prepare(prepare_completion, llm, fields.completion_kwargs(b, cfg, state.vocab), state) for b in bodies]

        def answer(job):
            prompt_text = (llm.model.detokenize(job.seq.prompt, unparse_special=True)
                           if isinstance(job.seq.prompt, list) else job.prompt_text)
            return lambda task: LlamaCompletion(job, task, cfg.model_name, options, settings, prompt_text)

        return await serve_all(request, sched, [j.seq for j in jobs], [answer(j) for j in jobs], slot_options,
                               shift=fields.shift_options(bodies[0]),
                               stream=fields.field(bodies[0], "stream", (bool,), False),
                               ping_every=fields.ping_interval(bodies[0], cfg))

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = await read_body(request, cfg.body_limit)
        llm, _ = state.ready()
        content = fields.field(body, "content", (str,), "")
        add_special = fields.field(body, "add_special", (bool,), False)
        parse_special = fields.field(body, "parse_special", (bool,), True)
        ids = llm.model.tokenize(content, add_special=add_special, parse_special=parse_special)
        if not fields.field(body, "with_pieces", (bool,), False):
            return {"tokens": ids}
        out = []
        for t in ids:
            piece = llm.model.vocab.token_to_piece(t, special=True)   # control tokens' text too
            try:
                out.append({"id": t, "piece": piece.decode("utf-8")})
            except UnicodeDecodeError:
                out.append({"id": t, "piece": list(piece)})
        return {"tokens": out}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = await read_body(request, cfg.body_limit)
        llm, _ = state.ready()
        tokens = fields.field(body, "tokens", (list,), [])
        try:
            for t in tokens:
                if not isinstance(t, int) or isinstance(t, bool):
                    raise ValueError(f"token {t!r} is not an integer")
                llm.model.vocab.check_token(t)
        except ValueError as e:
            raise bad_request(str(e)) from None
        return {"content": llm.detokenize(tokens).decode("utf-8", "replace")}

    @app.post("/apply-template")
    async def apply_template(request: Request):
        body = await read_body(request, cfg.body_limit)
        llm, _ = state.ready()
        try:
            kwargs = fields.chat_kwargs(body, cfg, state.vocab)
            prompt = llm.apply_chat_template(
                kwargs["messages"], tools=kwargs["tools"] or None, reasoning=kwargs["reasoning"],
                reasoning_effort=kwargs["reasoning_effort"], add_generation_prompt=kwargs["add_generation_prompt"],
                continue_final_message=kwargs["continue_final_message"], **kwargs["chat_template_kwargs"])
        except ValueError as e:
            raise bad_request(str(e)) from None
        return {"prompt": prompt}

    @app.post("/embedding")
    @app.post("/embeddings")
    async def embedding(request: Request):
        body = await read_body(request, cfg.body_limit)
        llm, sched = state.ready()
        if not cfg.embedding:
            raise APIError(501, "This server does not support embeddings. Start it with "
                           "`--embeddings`", type="not_supported_error")
        inputs = embedding_input(body.get("content", body.get("input")))
        embd_normalize = fields.embd_normalize(body)
        vectors, _ = await run_call(request, sched, lambda: embed_each(llm, inputs))
        if llm.ctx.pooling_type == PoolingType.NONE:   # per-token rows, never normalised (llama-server)
            return [{"index": i, "embedding": v} for i, v in enumerate(vectors)]
        return [{"index": i, "embedding": [normalize(v, embd_normalize).tolist()]}
                for i, v in enumerate(vectors)]

    @app.get("/props")
    async def props():
        state.ready(wake=False)
        template = state.template_source
        return {"default_generation_settings": {"n_ctx": state.n_ctx_slot,
                                                "params": fields.generation_settings(
                                                    {}, cfg, state.lora_scales)},
                "total_slots": cfg.parallel, "model_path": cfg.model, "model_alias": cfg.model_name,
                "chat_template": template, "chat_template_caps": state.template_caps,
                "modalities": {"vision": False, "audio": False},
                "build_info": "ggmlpy", "is_sleeping": state.sleeping}

    @app.post("/props")
    async def change_props():
        """llama-server's: with --props it answers success and changes nothing."""
        if not cfg.props:
            raise APIError(501, "This server does not support changing global properties. Start it with "
                           "`--props`", type="not_supported_error")
        return {"success": True}

    @app.get("/slots")
    async def slots():
        _, sched = state.ready()
        if not cfg.slots:
            raise APIError(501, "This server does not support slots endpoint. Start it with "
                           "`--slots`", type="not_supported_error")
        cells = base_cells(sched.engine)
        out = []
        for slot in sched.pool.slots:
            task = slot.task
            out.append({"id": slot.id, "id_task": task.id if task else -1, "n_ctx": slot.n_ctx,
                        "speculative": sched.drafter is not None, "is_processing": slot.busy,
                        "n_past": sched.engine.n_past(slot.id),
                        "n_prompt_tokens": len(task.seq.prompt) if task else 0,
                        "n_decoded": len(task.seq.tokens) if task else 0,
                        "n_shared_prefix": slot.n_shared_in,
                        "n_shared_cells": shared_cells(cells, slot.id),
                        "lora": fields.lora_json(slot.lora)})
        return out

    @app.get("/lora-adapters")
    async def lora_adapters():
        llm, _ = state.ready()
        return [{"id": a.id, "path": str(a.path), "scale": s, "task_name": a.task_name,
                 "prompt_prefix": a.prompt_prefix}
                for a, s in zip(llm.model.loras, state.lora_scales)]

    @app.post("/lora-adapters")
    async def set_lora_adapters(request: Request):
        """The server's scales for the requests that come after (an adapter left out gets
        0, as llama-server's); requests already running keep theirs."""
        body = await read_body(request, cfg.body_limit, array=True)
        _, sched = state.ready()
        if not isinstance(body, list):
            raise bad_request("Request body must be an array")
        scales = fields.parse_lora_list(body, len(state.lora_scales), "body")
        await run_call(request, sched, lambda: state.set_lora_scales(scales))
        return {"success": True}

    @app.post("/slots/{slot_id}")
    async def slot_action(slot_id: int, request: Request, action: str = ""):
        _, sched = state.ready()
        if not 0 <= slot_id < cfg.parallel:
            raise bad_request(f"slot {slot_id} does not exist")
        if action not in ("save", "restore", "erase"):
            raise bad_request("action must be save, restore or erase")
        body = await read_body(request, cfg.body_limit) if action != "erase" else {}
        path = safe_slot_file(cfg, body.get("filename")) if action != "erase" else None
        slot = sched.pool.slots[slot_id]

        def work() -> dict:
            if slot.busy:
                raise APIError(400, f"slot {slot_id} is busy")
            t0 = time.perf_counter()
            if action == "erase":
                return {"id_slot": slot_id, "n_erased": sched.pool.erase(slot)}
            fn = slot_files.save if action == "save" else slot_files.restore
            out = fn(sched.engine, slot_id, path)
            if action == "restore":
                slot.lora = ()  # scales unknown: a request with adapters reuses none of it
            ms = (time.perf_counter() - t0) * 1000
            return {"id_slot": slot_id, "filename": path.name, **out,
                    "timings": {f"{action}_ms": ms}}

        return await run_call(request, sched, work)

    @app.get("/metrics")
    async def metrics():
        if not cfg.metrics:
            raise APIError(501, "This server does not support metrics endpoint. Start it with "
                           "`--metrics`", type="not_supported_error")
        state.ready(wake=False)
        response = Response(render(registry), media_type="text/plain; version=0.0.4")
        # spelled as llama-server does (Starlette's `headers=` would lower-case it)
        response.raw_headers.append((b"Process-Start-Time-Unix", str(state.started).encode()))
        return response
