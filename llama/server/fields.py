"""Request bodies -> the keyword arguments of `prepare_chat` / `prepare_completion`.

Only the fields ggmlpy implements are read (others, such as OpenAI's `user`, are ignored,
as llama-server does); a field of the wrong type is a 400 naming it. Defaults are the
server's (`--temp`, `--seed`, `-n`), not llama-cpp-python's, as llama-server's are.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llama.sampling.dry import DEFAULT_BREAKERS
from llama.sampling.order import parse_order
from llama.server.config import ServerConfig
from llama.server.errors import bad_request

if TYPE_CHECKING:
    from llama.vocab.vocab import Vocab

NUMBER = (int, float)
MAX_DRY_BREAKERS = 64   # a request's DRY breakers (llama-server sets no bound)


def field(body: dict, name: str, kinds: tuple, default: Any = None) -> Any:
    """body[name] if present and of one of `kinds` (bool is never a number here)."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in kinds:
        raise bad_request(f"'{name}' must be {_kind_names(kinds)}, got a boolean")
    if not isinstance(value, kinds):
        raise bad_request(f"'{name}' must be {_kind_names(kinds)}, got {type(value).__name__}")
    return value


def _kind_names(kinds: tuple) -> str:
    names = {int: "an integer", float: "a number", str: "a string", list: "an array",
             dict: "an object", bool: "a boolean"}
    return " or ".join(dict.fromkeys(names[k] for k in kinds))


def max_tokens(body: dict, config: ServerConfig) -> int | None:
    """max_completion_tokens / max_tokens / n_predict; -1 means "up to the context's end"
    (llama-server's bound for each of them), below that is refused."""
    for name in ("max_completion_tokens", "max_tokens", "n_predict"):
        value = field(body, name, (int,))
        if value is None:
            continue
        if value < -1:
            raise bad_request(f"'{name}' must be -1 (no limit) or more, got {value}")
        return None if value == -1 else value
    return None if config.n_predict < 0 else config.n_predict


def embd_normalize(body: dict) -> int:
    """llama-server's embd_normalize (-1 none, 0 max absolute, 1 taxicab, 2 Euclidean, the
    default, p > 2 the p-norm); applied to pooled embeddings only."""
    value = field(body, "embd_normalize", (int,), 2)
    if value < -1:
        raise bad_request(f"'embd_normalize' must be -1 or more, got {value}")
    return value


def stop_strings(body: dict) -> list[str] | None:
    stop = body.get("stop")
    if stop is None or isinstance(stop, str):
        return stop
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return stop
    raise bad_request("'stop' must be a string or an array of strings")


def logit_bias(body: dict, vocab: "Vocab | None") -> dict[int, float] | None:
    """llama-server's forms: OpenAI's {"token id": bias}, [[id, bias], ...], and either with
    a text in place of the id (each of its tokens gets the bias); `false` bans a token (-inf).
    As llama-server, entries it cannot read are skipped and ids outside the vocabulary left
    out. `ignore_eos` adds -inf for every end-of-generation token (llama-server's way).
    Without a vocabulary (the settings a request reports) there are none."""
    raw = body.get("logit_bias")
    if vocab is None:
        return None
    if raw is not None and not isinstance(raw, (dict, list)):
        raise bad_request("'logit_bias' must be an object or an array of [token, bias] pairs")
    pairs = raw.items() if isinstance(raw, dict) else [p for p in raw or [] if isinstance(p, list) and len(p) == 2]
    bias: dict[int, float] = {}
    for key, value in pairs:
        if value is False:
            value = float("-inf")
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        for tok in _bias_tokens(key, vocab, isinstance(raw, dict)):
            bias[tok] = float(value)
    if field(body, "ignore_eos", (bool,), False):
        bias.update({t: float("-inf") for t in vocab.eog_ids})
    return bias or None


def _bias_tokens(key, vocab: "Vocab", from_object: bool) -> list[int]:
    """A logit_bias key's tokens: an id (an object's keys are strings of digits), or a text."""
    if from_object and isinstance(key, str) and key.lstrip("-").isdigit():
        key = int(key)
    if isinstance(key, int) and not isinstance(key, bool):
        return [key] if 0 <= key < vocab.n_vocab else []
    if isinstance(key, str):
        return vocab.tokenize(key, add_special=False)
    return []


def mirostat_version(body: dict) -> int:
    """llama-server's `mirostat`: 0 (off), 1 or 2."""
    version = field(body, "mirostat", (int,), 0)
    if version not in (0, 1, 2):
        raise bad_request(f"'mirostat' must be 0, 1 or 2, got {version}")
    return version


def dry(body: dict) -> dict:
    """llama-server's DRY fields: a dry_base below 1 takes the default (as llama-server
    does); dry_penalty_last_n -1 is the slot's context."""
    base = float(field(body, "dry_base", NUMBER, 1.75))
    allowed = int(field(body, "dry_allowed_length", (int,), 2))
    if allowed < 0:
        raise bad_request(f"'dry_allowed_length' must not be negative, got {allowed}")
    breakers = field(body, "dry_sequence_breakers", (list,), list(DEFAULT_BREAKERS))
    if not breakers or not all(isinstance(b, str) and b for b in breakers):
        raise bad_request("'dry_sequence_breakers' must be a non-empty array of non-empty strings")
    if len(breakers) > MAX_DRY_BREAKERS:  # each is searched for in the whole vocabulary
        raise bad_request(f"'dry_sequence_breakers' takes at most {MAX_DRY_BREAKERS} strings, "
                          f"got {len(breakers)}")
    return {"dry_multiplier": float(field(body, "dry_multiplier", NUMBER, 0.0)),
            "dry_base": base if base >= 1.0 else 1.75, "dry_allowed_length": allowed,
            "dry_penalty_last_n": int(field(body, "dry_penalty_last_n", (int,), 64)),
            "dry_sequence_breakers": breakers}


def sampler_order(body: dict) -> str | tuple[str, ...] | None:
    """llama-server's `samplers`: an array of sampler names or a string of their letters."""
    order = field(body, "samplers", (list, str))
    if isinstance(order, list):
        if not all(isinstance(name, str) for name in order):
            raise bad_request("'samplers' must be an array of sampler names or a string")
        return tuple(order)
    return order


def sampling(body: dict, config: ServerConfig, vocab: "Vocab | None") -> dict:
    """The sampling fields shared by every generation endpoint."""
    seed = field(body, "seed", (int,), config.seed)
    out = {
        "temperature": float(field(body, "temperature", NUMBER, config.temp)),
        "top_p": float(field(body, "top_p", NUMBER, 0.95)),
        "top_k": int(field(body, "top_k", (int,), 40)),
        "min_p": float(field(body, "min_p", NUMBER, 0.05)),
        "typical_p": float(field(body, "typical_p", NUMBER, 1.0)),
        "presence_penalty": float(field(body, "presence_penalty", NUMBER, 0.0)),
        "frequency_penalty": float(field(body, "frequency_penalty", NUMBER, 0.0)),
        "repeat_penalty": float(field(body, "repeat_penalty", NUMBER, 1.0)),
        "seed": None if seed is None or seed < 0 else seed,
        "stop": stop_strings(body),
        "max_tokens": max_tokens(body, config),
        "logit_bias": logit_bias(body, vocab),
        "grammar": field(body, "grammar", (str,)),
        # llama-server's names; the OpenAI endpoints take them as extra fields too
        "mirostat_mode": mirostat_version(body),
        "mirostat_tau": float(field(body, "mirostat_tau", NUMBER, 5.0)),
        "mirostat_eta": float(field(body, "mirostat_eta", NUMBER, 0.1)),
        "repeat_last_n": int(field(body, "repeat_last_n", (int,), 64)),
        "min_keep": int(field(body, "min_keep", (int,), 1)),
        "dynatemp_range": float(field(body, "dynatemp_range", NUMBER, 0.0)),
        "dynatemp_exponent": float(field(body, "dynatemp_exponent", NUMBER, 1.0)),
        "top_n_sigma": float(field(body, "top_n_sigma", NUMBER, -1.0)),
        "xtc_probability": float(field(body, "xtc_probability", NUMBER, 0.0)),
        "xtc_threshold": float(field(body, "xtc_threshold", NUMBER, 0.1)),
        **dry(body),
        "samplers": sampler_order(body),
    }
    return out


def n_choices(body: dict, n_slots: int) -> int:
    """OpenAI's `n` (llama-server's `n_cmpl`): choices generated from one prompt, each in a
    slot of its own, so at most the server's slots, as llama-server allows."""
    name = "n_cmpl" if "n_cmpl" in body else "n"
    n = field(body, name, (int,), 1)
    if not 1 <= n <= n_slots:
        raise bad_request(f"'{name}' must be between 1 and the server's {n_slots} slots, got {n}")
    return n


def response_format(body: dict) -> dict | None:
    fmt = field(body, "response_format", (dict,))
    schema = field(body, "json_schema", (dict,))  # llama-server's own field
    if schema is not None:
        if fmt is not None:
            raise bad_request("give either 'json_schema' or 'response_format', not both")
        return {"type": "json_object", "schema": schema}
    return fmt


def _null_content(message: Any) -> Any:
    """A message's `"content": null` (what OpenAI clients send beside tool_calls) read as an
    empty text, as llama-server's message parser does: some templates (SmolLM2's) read
    message.content unconditionally, and the API layer drops None values as transformers does."""
    if isinstance(message, dict) and "content" in message and message["content"] is None:
        return {**message, "content": ""}
    return message


def chat_kwargs(body: dict, config: ServerConfig, vocab: "Vocab") -> dict:
    messages = field(body, "messages", (list,))
    if not messages:
        raise bad_request("'messages' is required and must be a non-empty array")
    kwargs = sampling(body, config, vocab)
    kwargs.update(
        messages=[_null_content(m) for m in messages],
        tools=field(body, "tools", (list,)),
        tool_choice=field(body, "tool_choice", (str, dict)),
        parallel_tool_calls=field(body, "parallel_tool_calls", (bool,)),
        response_format=response_format(body),
        logprobs=field(body, "logprobs", (bool,)),
        top_logprobs=field(body, "top_logprobs", (int,)),
        stream_options=field(body, "stream_options", (dict,)),
        chat_template_kwargs={**config.chat_template_kwargs, **field(body, "chat_template_kwargs", (dict,), {})},
        reasoning_format=field(body, "reasoning_format", (str,), config.reasoning_format),
        reasoning=config.reasoning,
        reasoning_effort=field(body, "reasoning_effort", (str,)),
        reasoning_budget=reasoning_budget(body, config),
        reasoning_budget_message=field(body, "reasoning_budget_message", (str,), config.reasoning_budget_message),
        add_generation_prompt=field(body, "add_generation_prompt", (bool,), True),
        continue_final_message=field(body, "continue_final_message", (bool, str)),
    )
    if kwargs["grammar"] is not None and kwargs["response_format"] is not None:
        raise bad_request("give either 'grammar' or 'response_format', not both")
    return kwargs


def reasoning_budget(body: dict, config: ServerConfig) -> int:
    """llama-server's `reasoning_budget_tokens` (or `thinking_budget_tokens`): -1 takes the
    server's `--reasoning-budget`."""
    value = field(body, "reasoning_budget_tokens", (int,), field(body, "thinking_budget_tokens", (int,), -1))
    if value < -1:
        raise bad_request("'reasoning_budget_tokens' must be -1 (none) or a number of tokens")
    return config.reasoning_budget if value == -1 else value


def prompts(body: dict, vocab: "Vocab | None" = None) -> list:
    """The prompts of one completion request, each its own request body, as llama-server's
    tokenize_input_prompts reads `prompt`: an array holding no token id is several prompts
    (each a string, an array of ids or of ids and strings, or an object with
    `prompt_string`); anything else is one."""
    prompt = body.get("prompt")
    several = isinstance(prompt, list) and len(prompt) > 1 and not any(_is_id(p) for p in prompt)
    return [{**body, "prompt": one_prompt(p, vocab)} for p in prompt] if several else [body]


def one_prompt(prompt, vocab: "Vocab | None"):
    """One prompt as a string or an array of token ids: an array of ids and strings is
    tokenized as llama-server's tokenize_mixed (the first element's text with the special
    tokens the vocabulary adds, the others without); an object gives its `prompt_string`."""
    if isinstance(prompt, dict):
        if "multimodal_data" in prompt:
            raise bad_request("Multimodal data provided, but model does not support multimodal requests.")
        prompt = prompt.get("prompt_string")
        if not isinstance(prompt, (str, list)):
            raise bad_request("a prompt object needs a 'prompt_string'")
    if isinstance(prompt, list) and any(isinstance(p, str) for p in prompt) and vocab is not None:
        tokens: list[int] = []
        for i, part in enumerate(prompt):
            if isinstance(part, str):
                tokens += vocab.tokenize(part, add_special=i == 0, parse_special=True)
            elif _is_id(part):
                tokens.append(part)
            else:
                raise bad_request("'prompt' elements must be strings or token ids")
        return tokens
    return prompt


def _is_id(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def completion_kwargs(body: dict, config: ServerConfig, vocab: "Vocab") -> dict:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list, dict)):
        prompt = prompt[0]  # OpenAI's batch of one prompt
    prompt = one_prompt(prompt, vocab)
    if isinstance(prompt, list):
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise bad_request("'prompt' must be a string or an array of token ids")
    elif not isinstance(prompt, str):
        raise bad_request("'prompt' is required and must be a string or an array of token ids")
    kwargs = sampling(body, config, vocab)
    logprobs = field(body, "logprobs", (int,))
    n_probs = field(body, "n_probs", (int,))  # llama-server's field
    if n_probs:
        logprobs = n_probs
    if logprobs is not None and logprobs < 0:
        raise bad_request("'logprobs' must not be negative")
    echo = field(body, "echo", (bool,), False)
    if echo and logprobs is not None:
        raise bad_request("echo with logprobs is not supported by the server")
    kwargs.update(prompt=prompt, logprobs=logprobs, echo=echo, suffix=field(body, "suffix", (str,)),
                  stream_options=field(body, "stream_options", (dict,)))
    schema = field(body, "json_schema", (dict,))
    if schema is not None:
        if kwargs["grammar"] is not None:
            raise bad_request("give either 'grammar' or 'json_schema', not both")
        from llama.grammar import Grammar, GrammarError
        try:
            kwargs["grammar"] = Grammar.from_response_format({"type": "json_object", "schema": schema})
        except GrammarError as e:
            raise bad_request(f"'json_schema': {e}") from None
    return kwargs


@dataclass
class ResponseOptions:
    """llama-server's fields that shape /completion's answer rather than the generation."""
    return_tokens: bool = False        # the generated ids in `tokens` (else empty)
    timings_per_token: bool = False    # `timings` in every streamed chunk, not only the last
    response_fields: list[str] | None = None   # keep only these (paths like "timings/prompt_n")
    n_probs: int = 0                   # `completion_probabilities`: the top n_probs per token
    post_sampling_probs: bool = False  # ... as the chain's final probabilities ("prob")
    return_progress: bool = False      # streamed prompt_progress chunks while the prompt decodes


def response_options(body: dict) -> ResponseOptions:
    wanted = field(body, "response_fields", (list,))
    if wanted is not None and not all(isinstance(w, str) for w in wanted):
        raise bad_request("'response_fields' must be an array of strings")
    return ResponseOptions(field(body, "return_tokens", (bool,), False),
                           field(body, "timings_per_token", (bool,), False), wanted or None,
                           field(body, "n_probs", (int,), 0),
                           field(body, "post_sampling_probs", (bool,), False),
                           field(body, "return_progress", (bool,), False))


def n_indent(body: dict) -> int:
    """llama-server's n_indent: the least indentation of a line after the first (0 or
    less: off); see llama/api/text_stream.py."""
    return field(body, "n_indent", (int,), 0)


def time_limit_ms(body: dict) -> float:
    """llama-server's t_max_predict_ms (0: none)."""
    value = field(body, "t_max_predict_ms", (int,), 0)
    if value < 0:
        raise bad_request(f"'t_max_predict_ms' must not be negative, got {value}")
    return float(value)


def nested_fields(paths: list[str], answer: dict) -> dict:
    """llama-server's json_get_nested_values: each path ("a/b" reaches into "a") that
    exists, under the path as its name; the others are left out."""
    out = {}
    for path in paths:
        value, ok = answer, True
        for key in path.split("/"):
            if isinstance(value, dict) and key in value:
                value = value[key]
            else:
                ok = False
                break
        if ok:
            out[path] = value
    return out


def ping_interval(body: dict, config: ServerConfig) -> float | None:
    """llama-server's sse_ping_interval (the server's --sse-ping-interval by default): the
    seconds a stream may stay silent before a ":" comment line; None: never."""
    seconds = field(body, "sse_ping_interval", (int,), config.sse_ping_interval)
    return float(seconds) if seconds > 0 else None


def shift_options(body: dict) -> tuple[int, int]:
    """llama-server's n_keep (prompt tokens kept when the context shifts, -1 all of them)
    and n_discard (tokens dropped then, 0 half of what is not kept)."""
    n_keep = field(body, "n_keep", (int,), 0)
    n_discard = field(body, "n_discard", (int,), 0)
    if n_keep < -1:
        raise bad_request(f"'n_keep' must be >= -1, got {n_keep}")
    if n_discard < 0:
        raise bad_request(f"'n_discard' must not be negative, got {n_discard}")
    return n_keep, n_discard


@dataclass(frozen=True)
class SlotOptions:
    """How a request uses the slots' caches: llama-server's `cache_prompt`, `id_slot` and
    `n_cache_reuse` (chunks of at least that many cached tokens moved, not decoded again;
    0: off), and the scale of every LoRA adapter (`lora`)."""

    cache_prompt: bool = True
    id_slot: int = -1
    n_cache_reuse: int = 0
    lora: tuple[float, ...] = ()


def slot_options(body: dict, config: ServerConfig, server_lora: tuple[float, ...]) -> SlotOptions:
    cache_prompt = field(body, "cache_prompt", (bool,), True)
    id_slot = field(body, "id_slot", (int,), -1)
    if id_slot >= config.parallel:
        raise bad_request(f"'id_slot' {id_slot} is not a slot (there are {config.parallel})")
    return SlotOptions(cache_prompt, id_slot, field(body, "n_cache_reuse", (int,), config.cache_reuse),
                       lora_scales(body, server_lora))


def lora_scales(body: dict, server_scales: tuple[float, ...]) -> tuple[float, ...]:
    """A request's adapter scales, by adapter id: llama-server's `lora` field, where an
    adapter left out gets 0; without the field, the server's (--lora, POST /lora-adapters)."""
    if body.get("lora") is None:
        return server_scales
    return parse_lora_list(body["lora"], len(server_scales), "lora")


def parse_lora_list(value: Any, n_adapters: int, name: str) -> tuple[float, ...]:
    """[{"id": 0, "scale": 0.5}, ...] -> the scale of every adapter (0 where left out).
    llama-server skips an unknown id; here it is a 400 naming the entry."""
    if not isinstance(value, list):
        raise bad_request(f"'{name}' must be an array of objects with 'id' and 'scale' fields")
    scales = [0.0] * n_adapters
    for i, entry in enumerate(value):
        if not isinstance(entry, dict):
            raise bad_request(f"'{name}[{i}]' must be an object with 'id' and 'scale' fields")
        adapter_id, scale = entry.get("id"), entry.get("scale", 0.0)
        if isinstance(adapter_id, bool) or not isinstance(adapter_id, int):
            raise bad_request(f"'{name}[{i}].id' must be an integer, got {adapter_id!r}")
        if not 0 <= adapter_id < n_adapters:
            raise bad_request(f"'{name}[{i}].id' {adapter_id} is not a loaded LoRA adapter "
                              f"(the server has {n_adapters})")
        if isinstance(scale, bool) or not isinstance(scale, NUMBER) or not math.isfinite(scale):
            raise bad_request(f"'{name}[{i}].scale' must be a finite number, got {scale!r}")
        scales[adapter_id] = float(scale)
    return tuple(scales)


def lora_json(scales: tuple[float, ...]) -> list[dict]:
    return [{"id": i, "scale": s} for i, s in enumerate(scales)]


def generation_settings(body: dict, config: ServerConfig, server_lora: tuple[float, ...] = (),
                        vocab: "Vocab | None" = None) -> dict:
    """A request's sampling settings by llama-server's names (its answers'
    `generation_settings`; `/props` gives those of an empty request). The logit biases
    (with `vocab`) as llama-server lists them, -inf written as null."""
    out = {k: v for k, v in sampling(body, config, None).items()
           if k not in ("stop", "max_tokens", "logit_bias", "grammar", "seed")}
    out["mirostat"] = out.pop("mirostat_mode")
    out["samplers"] = list(parse_order(out["samplers"]))
    n_predict = max_tokens(body, config)
    return {"n_predict": -1 if n_predict is None else n_predict,
            "seed": field(body, "seed", (int,), config.seed), **out,
            "stop": stop_strings(body) or [], "n_indent": n_indent(body),
            "lora": lora_json(lora_scales(body, server_lora)),
            "logit_bias": [{"bias": None if math.isinf(b) else b, "token": t}
                           for t, b in sorted((logit_bias(body, vocab) or {}).items())]}
