"""OpenAI's endpoints: /v1/chat/completions, /v1/completions, /v1/responses, /v1/embeddings,
/v1/models (and the same without /v1, but for /completions and /embeddings, which are
llama-server's own shapes there), and Anthropic's /v1/messages, answered with llama.api's
jobs and response shapes."""
from __future__ import annotations


from fastapi import FastAPI, Request

from llama.api import responses
from llama.api.chat_completion import prepare_chat
from llama.api.completion import ContextOverflowError, prepare_completion
from llama.api.embedding import embed_each, normalize
from llama.pooling import PoolingType
from llama.server import fields
from llama.server import anthropic_api
from llama.server import responses_api as responses_api_
from llama.server.bridge import run_call
from llama.server.errors import APIError, bad_request, context_overflow
from llama.server.generate import read_body, serve, serve_choices
from llama.server.state import ServerState
from llama.server.timings import TimedChunks, verbose_answer, with_timings


def check_model(body: dict, state: ServerState) -> None:
    """The request's `model`, a name, is not checked against the server's: llama-server
    serves its one model under any name (clients send `gpt-3.5-turbo`), and answers with its
    own name. Only a `model` that is not a string is refused."""
    name = body.get("model")
    if name is not None and not isinstance(name, str):
        raise APIError(400, "'model' must be a string", type="invalid_request_error")


def not_embedding(state: ServerState) -> None:
    if state.config.embedding:
        raise APIError(501, "This server does not support completions. Start it without "
                       "`--embeddings`", type="not_supported_error")


def prepare(fn, llm, kwargs: dict, state: ServerState):
    try:
        return fn(llm, **kwargs, model=state.config.model_name, n_ctx=state.n_ctx_slot,
                  context_shift=state.config.context_shift)
    except ContextOverflowError as e:
        raise context_overflow(e.n_prompt, e.n_ctx) from None
    except (ValueError, TypeError) as e:  # template, grammar ...
        raise bad_request(str(e)) from None


def register(app: FastAPI, state: ServerState) -> None:
    cfg = state.config

    async def generate(request: Request, prepare_job, request_kwargs, chunk_object: str,
                       other_api=None):
        """A chat or text completion: the request's fields -> a job in a slot -> its answer.
        other_api: a module with `chat_body` and an answer class (the Responses API's, the
        Anthropic Messages API's): its request runs as the chat it converts to and is
        answered in its shapes."""
        body = await read_body(request, cfg.body_limit)
        if other_api is not None:
            body = other_api.chat_body(body)
        llm, sched = state.ready()
        not_embedding(state)
        check_model(body, state)
        bodies = fields.prompts(body, state.vocab) if request_kwargs is fields.completion_kwargs else [body]
        slot_options = fields.slot_options(body, cfg, state.lora_scales)
        n = fields.n_choices(body, cfg.parallel)
        stream = fields.field(body, "stream", (bool,), False)
        jobs = []
        for one in bodies:   # each prompt's n choices
            kwargs = request_kwargs(one, cfg, state.vocab)
            for i in range(n):   # choice i draws with seed + i (a random seed each without one)
                seed = None if kwargs["seed"] is None else (kwargs["seed"] + i) % 2**32
                jobs.append(prepare(prepare_job, llm, dict(kwargs, seed=seed), state))
                jobs[-1].seq.t_max_predict_ms = fields.time_limit_ms(body)
                jobs[-1].seq.n_indent = fields.n_indent(body)
        shift, ping_every = fields.shift_options(body), fields.ping_interval(body, cfg)
        progress = None
        if fields.field(body, "return_progress", (bool,), False):
            def progress(task, info: dict) -> dict:   # llama-server's, with no choices
                cid, created, model = jobs[0].meta
                return {"id": cid, "object": chunk_object, "created": created, "model": model,
                        "choices": [], "prompt_progress": info}
        if other_api is not None:
            if n > 1:
                raise bad_request("this API gives one answer per request ('n' must be 1)")
            job, answers = jobs[0], {}

            telemetry = fields.field(body, "timings_per_token", (bool,), False)

            def answer(task):   # one per task, shared by its response and its stream
                return answers.setdefault(id(task), other_api.ANSWER(job, task, cfg.model_name,
                                                                     timings_per_token=telemetry))
            return await serve(request, sched, job.seq, response=lambda t: answer(t).response(),
                               chunks=answer, stream=stream, slot=slot_options, done_marker=False,
                               shift=shift, ping_every=ping_every,
                               progress=(lambda t, info: answer(t).progress(info)) if progress else None)
        if len(jobs) > 1:
            return await serve_choices(request, sched, jobs, stream=stream,
                                       slot=slot_options, shift=shift,
                                       ping_every=ping_every, progress=progress, per_prompt=n)
        job = jobs[0]

        def respond(task) -> dict:
            answer = with_timings(job.response(), task)
            if fields.field(body, "verbose", (bool,), cfg.verbose):
                prompt_text = llm.detokenize(job.seq.prompt, special=True).decode("utf-8", "replace")
                answer["__verbose"] = verbose_answer(task, prompt_text)
            return answer
        return await serve(request, sched, job.seq, response=respond,
                           chunks=lambda t: TimedChunks(job.chunks(), t), stream=stream,
                           slot=slot_options, done_marker=True,
                           shift=shift, ping_every=ping_every, progress=progress)

    async def chat(request: Request):
        return await generate(request, prepare_chat, fields.chat_kwargs, "chat.completion.chunk")

    async def responses_create(request: Request):
        return await generate(request, prepare_chat, fields.chat_kwargs, "response", responses_api_)

    async def anthropic_messages(request: Request):
        return await generate(request, prepare_chat, fields.chat_kwargs, "message", anthropic_api)

    async def input_tokens(request: Request, other_api=None) -> int:
        """How many tokens the chat a request is (or converts to) renders to."""
        body = await read_body(request, cfg.body_limit)
        if other_api is not None:
            body = other_api.chat_body(body)
        llm, _ = state.ready()
        job = prepare(prepare_chat, llm, fields.chat_kwargs(body, cfg, state.vocab), state)
        return len(job.seq.prompt)

    async def anthropic_count_tokens(request: Request):
        return {"input_tokens": await input_tokens(request, anthropic_api)}

    async def chat_input_tokens(request: Request):   # llama-server's, in its shape
        return {"input_tokens": await input_tokens(request), "object": "response.input_tokens"}

    async def responses_input_tokens(request: Request):
        return {"input_tokens": await input_tokens(request, responses_api_),
                "object": "response.input_tokens"}

    async def completions(request: Request):
        return await generate(request, prepare_completion, fields.completion_kwargs, "text_completion")

    async def embeddings(request: Request):
        body = await read_body(request, cfg.body_limit)
        llm, sched = state.ready()
        check_model(body, state)
        if not cfg.embedding:
            raise APIError(501, "This server does not support embeddings. Start it with "
                           "`--embeddings`", type="not_supported_error")
        if llm.ctx.pooling_type == PoolingType.NONE:
            raise bad_request("Pooling type 'none' is not OAI compatible. Please use a different "
                              "pooling type")
        inputs = embedding_input(body.get("input", body.get("content")))
        embd_normalize = fields.embd_normalize(body)
        encoding = fields.field(body, "encoding_format", (str,), "float")
        if encoding not in ("float", "base64"):
            raise bad_request("'encoding_format' must be \"float\" or \"base64\"")
        vectors, n_tokens = await run_call(request, sched, lambda: embed_each(llm, inputs))
        vectors = [normalize(v, embd_normalize) for v in vectors]
        model = body.get("model") if isinstance(body.get("model"), str) else cfg.model_name
        return responses.embeddings(vectors, model, n_tokens, base64=encoding == "base64")

    async def models(request: Request):
        meta = {}
        if state.llm is not None:
            llm = state.llm
            meta = {"n_vocab": llm.n_vocab(), "n_ctx_train": llm.model.hparams.n_ctx_train,
                    "n_embd": llm.n_embd()}
        return {"object": "list",
                "data": [{"id": cfg.model_name, "object": "model", "created": responses.now(),
                          "owned_by": "ggmlpy", "aliases": cfg.aliases, "tags": cfg.tag_list, "meta": meta}]}

    # as llama-server's routes: /completions and /embeddings without /v1 are its own shapes
    # (routes_llama), the others the same with or without the prefix
    app.add_api_route("/v1/completions", completions, methods=["POST"])
    app.add_api_route("/v1/embeddings", embeddings, methods=["POST"])
    for prefix in ("/v1", ""):
        app.add_api_route(f"{prefix}/chat/completions", chat, methods=["POST"])
        app.add_api_route(f"{prefix}/responses", responses_create, methods=["POST"])
        app.add_api_route(f"{prefix}/chat/completions/input_tokens", chat_input_tokens, methods=["POST"])
        app.add_api_route(f"{prefix}/responses/input_tokens", responses_input_tokens, methods=["POST"])
        app.add_api_route(f"{prefix}/models", models, methods=["GET"])
    app.add_api_route("/v1/messages", anthropic_messages, methods=["POST"])
    app.add_api_route("/v1/messages/count_tokens", anthropic_count_tokens, methods=["POST"])


def embedding_input(value) -> str | list:
    """A string, token ids, or a list of strings, lists of token ids and multimodal-style
    objects whose `content` is a string or text parts (joined as they are, as llama-server
    joins them; a model without a projector takes no other part)."""
    def ok_tokens(x) -> bool:
        return isinstance(x, list) and bool(x) and all(isinstance(t, int) and not isinstance(t, bool)
                                                       for t in x)
    if isinstance(value, str) and value:
        return value
    if ok_tokens(value):
        return value
    if isinstance(value, list) and value:
        items = [_content_text(v) if isinstance(v, dict) else v for v in value]
        if all((isinstance(v, str) and v) or ok_tokens(v) for v in items):
            return items
    raise bad_request("'input' must be a non-empty string, array of strings or of token ids")


def _content_text(item: dict) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise bad_request("an input object needs a 'content' string or array of parts")
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise bad_request(f"input content part type {kind!r} is not supported: the model is text-only")
    return "".join(part["text"] for part in content)
