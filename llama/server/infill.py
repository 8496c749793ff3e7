"""llama-server's `/infill`: fill-in-the-middle prompts for code completion (llama.vim,
llama.vscode), built as its format_prompt_infill builds them.

The prompt is the repo-level FIM pattern (https://arxiv.org/pdf/2409.12186):

    [FIM_REP]myproject\\n [FIM_SEP]filename0\\n extra 0 ... [FIM_SEP]filename\\n
    [FIM_PRE]prefix prompt [FIM_SUF]suffix [FIM_MID]

(suffix first with --spm-infill; without FIM_REP/FIM_SEP tokens the extra chunks are
joined by a "--- snippet ---" line). To fit a batch, the prefix keeps its last 3/4·n_batch
tokens and the suffix its first n_batch/4 − 2 − len(prompt); the extra chunks fill what the
slot has left after n_batch and twice the server's n_predict, keeping their end.
"""
from __future__ import annotations

from typing import Any

from llama.server.errors import APIError, bad_request

SNIPPET = "\n\n--- snippet ---\n\n"   # llama-server's separator where there is no FIM_SEP


def check_supported(vocab) -> None:
    """llama-server's 501 for a model without the three FIM tokens."""
    s = vocab.special
    missing = [f"{what} token is missing. " for what, tok in
               (("prefix", s.fim_pre), ("suffix", s.fim_suf), ("middle", s.fim_mid)) if tok is None]
    if missing:
        raise APIError(501, "Infill is not supported by this model: " + "".join(missing),
                       type="not_supported_error")


def request_parts(body: dict) -> tuple[Any, Any, list[dict], str]:
    """(input_prefix, input_suffix, input_extra, prompt), checked as llama-server checks them."""
    prompt = body.get("prompt", "")
    if not isinstance(prompt, str):
        raise bad_request('"prompt" must be a string')
    for name in ("input_prefix", "input_suffix"):
        if name not in body:
            raise bad_request(f'"{name}" is required')
        _check_mixed(body[name], name)
    extra = body.get("input_extra", [])
    if not isinstance(extra, list):
        raise bad_request('"input_extra" must be an array of {"filename": string, "text": string}')
    for chunk in extra:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise bad_request('extra_context chunk must contain a "text" field with a string value')
        if "filename" in chunk and not isinstance(chunk["filename"], str):
            raise bad_request('extra_context chunk\'s "filename" field must be a string')
    return body["input_prefix"], body["input_suffix"], extra, prompt


def _check_mixed(value: Any, name: str) -> None:
    """A string, or an array of strings and token ids (llama-server's tokenize_mixed)."""
    if isinstance(value, str):
        return
    if isinstance(value, list) and all(isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool))
                                       for v in value):
        return
    raise bad_request(f'"{name}" must be a string or an array of strings and token ids')


def _tokens(model, value: Any, parse_special: bool = False) -> list[int]:
    if isinstance(value, str):
        return model.tokenize(value, add_special=False, parse_special=parse_special)
    out: list[int] = []
    for v in value:
        out += [v] if isinstance(v, int) else model.tokenize(v, add_special=False, parse_special=parse_special)
    return out


def infill_prompt(model, prefix: Any, suffix: Any, extra: list[dict], prompt: str, *,
                  n_batch: int, n_predict: int, n_ctx: int, spm: bool) -> list[int]:
    """The token ids llama-server's format_prompt_infill gives for these parts."""
    vocab = model.vocab
    s = vocab.special
    prompt_tokens = model.tokenize(prompt, add_special=False, parse_special=True) if prompt else []
    tokens_prefix, tokens_suffix = _tokens(model, prefix), _tokens(model, suffix)
    extra_tokens: list[int] = []
    if s.fim_rep is not None:
        extra_tokens += [s.fim_rep] + _tokens(model, "myproject\n")
    for chunk in extra:
        if s.fim_sep is not None:
            extra_tokens += [s.fim_sep] + _tokens(model, chunk.get("filename", "tmp") + "\n")
        else:
            extra_tokens += _tokens(model, SNIPPET)
        extra_tokens += _tokens(model, chunk["text"])
    if s.fim_sep is not None:
        extra_tokens += [s.fim_sep] + _tokens(model, "filename\n")

    n_prefix_take = min(len(tokens_prefix), 3 * (n_batch // 4))
    n_suffix_take = min(len(tokens_suffix), max(0, n_batch // 4 - (2 + len(prompt_tokens))))
    n_extra_take = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_tokens))

    tokens_prefix = [s.fim_pre] + tokens_prefix[len(tokens_prefix) - n_prefix_take:] + prompt_tokens
    tokens_suffix = [s.fim_suf] + tokens_suffix[:n_suffix_take]
    first, last = (tokens_suffix, tokens_prefix) if spm else (tokens_prefix, tokens_suffix)
    bos = [s.bos] if vocab.add_bos and s.bos is not None else []
    kept_extra = extra_tokens[len(extra_tokens) - n_extra_take:] if n_extra_take else []
    return kept_extra + bos + first + last + [s.fim_mid]
