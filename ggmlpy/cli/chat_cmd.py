"""`ggmlpy chat`: an interactive chat with the model's template, streamed as it is generated.

Each line typed is a user message; the reply streams to stdout and joins the history, so
the next turn re-reads nothing already in the KV cache (the Llama prompt cache). `/exit`
(or end of input) leaves; `/reset` starts a new conversation. Works with piped input too,
which is how it is tested. llama-cli's speculative decoding flags (`--spec-type`, `-md`, the
draft's limits) draft as `ggmlpy serve` does; the replies are the same tokens.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ggmlpy.cli.cache_args import add_cache_args, cache_kwargs
from ggmlpy.cli.placement_args import add_placement_args, load_kwargs
from ggmlpy.cli.run_cmd import add_model_arg
from ggmlpy.cli.speculative_args import add_speculative_args, spec_type_names

PROMPT = "> "


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("chat", help="chat with a model interactively",
                              description="An interactive chat using the model's chat template.")
    add_model_arg(p)
    p.add_argument("--system", default=None, help="a system message to start with")
    p.add_argument("--chat-format", default=None,
                   help="a built-in format (chatml, llama3, gemma, ...) instead of the file's template")
    p.add_argument("--chat-template-file", type=Path, default=None,
                   help="a jinja chat template to use instead of the file's")
    p.add_argument("-n", "--n-predict", type=int, default=512,
                   help="most tokens per reply; -1 = until the context is full (default 512)")
    p.add_argument("--temp", type=float, default=0.8, help="temperature; 0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=-1, help="sampling seed; -1 = random (default)")
    p.add_argument("-c", "--n-ctx", type=int, default=4096, help="context size (default 4096)")
    p.add_argument("-t", "--threads", type=int, default=2, help="threads (default 2)")
    p.add_argument("--backend", default=None, help="compute backend by name")
    add_cache_args(p)
    add_placement_args(p)
    add_speculative_args(p.add_argument_group("speculative decoding (llama-cli's)"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from llama.api.llama import Llama
    from llama.chat import ChatTemplateError
    from llama.chat.builtin import BUILTIN_FORMATS, builtin_source
    from llama.speculative.kinds import SpecDraft

    template = args.chat_template_file.read_text(encoding="utf-8") if args.chat_template_file else None
    chat_format = args.chat_format
    if template is None and chat_format in BUILTIN_FORMATS:   # llama.cpp's names, as llama-cli's
        template, chat_format = builtin_source(chat_format), None
    where = load_kwargs(args)
    draft = SpecDraft.from_options(
        spec_type_names(args), args.model_draft,
        n_max=args.spec_draft_n_max, n_min=args.spec_draft_n_min, p_min=args.spec_draft_p_min,
        ngram_size_n=args.spec_ngram_simple_size_n, ngram_size_m=args.spec_ngram_simple_size_m)
    llm = Llama(args.model, n_ctx=args.n_ctx, n_threads=args.threads, backend=args.backend,
                chat_format=chat_format, chat_template=template, verbose=False,
                seed=args.seed, draft_model=draft, **cache_kwargs(args), **where)
    interactive = sys.stdin.isatty()
    history: list[dict] = [{"role": "system", "content": args.system}] if args.system else []
    n_system = len(history)
    out = sys.stdout
    while True:
        if interactive:
            out.write(PROMPT)
            out.flush()
        line = sys.stdin.readline()
        if not line:
            break
        text = line.rstrip("\n")
        if text.strip() == "/exit":
            break
        if text.strip() == "/reset":
            del history[n_system:]
            continue
        if not text.strip():
            continue
        history.append({"role": "user", "content": text})
        reply = []
        try:
            for chunk in llm.create_chat_completion(
                    history, stream=True, max_tokens=None if args.n_predict < 0 else args.n_predict,
                    temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p):
                piece = chunk["choices"][0]["delta"].get("content") or ""
                reply.append(piece)
                out.write(piece)
                out.flush()
        except ChatTemplateError as e:
            print(f"ggmlpy chat: error: {e}", file=sys.stderr)
            return 1
        out.write("\n")
        out.flush()
        history.append({"role": "assistant", "content": "".join(reply)})
    return 0
