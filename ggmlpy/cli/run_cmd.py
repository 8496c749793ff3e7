"""`ggmlpy run -p PROMPT`: generate text the way llama-cli does and report its timings.

The generated text streams to stdout as it is produced (nothing else goes there, so it can
be piped); llama.cpp-style timings go to stderr at the end. `--json` prints one object
(model, prompt, ids, text, stop reason, seed, timings) instead. Sampling defaults are
llama.cpp's (temp 0.8, top-k 40, top-p 0.95, min-p 0.05, random seed); --temp 0 is greedy.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from ggmlpy.cli.cache_args import add_cache_args, cache_kwargs
from ggmlpy.cli.lora_args import add_lora_args
from ggmlpy.cli.placement_args import add_placement_args, load_kwargs
from ggmlpy.hub import DEFAULT_MODEL, KNOWN_MODELS
from llama.context import Context
from llama.generate import Generation, GenerationError, stream
from llama.model import Model
from llama.sampling import Dist, SamplerChain, make_sampler
from llama.sampling.dry import DEFAULT_BREAKERS, Breakers, model_breakers

DEFAULT_N_PREDICT = 128
DEFAULT_N_CTX = 4096  # llama-cli's default context


def add_model_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", default=DEFAULT_MODEL,
                   help=f"a GGUF file, or a known model name ({', '.join(sorted(KNOWN_MODELS))}; "
                        f"default {DEFAULT_MODEL})")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "run", help="generate text from a prompt",
        description="Generate text from a prompt and print llama.cpp-style timings on stderr.")
    add_model_arg(p)
    add_lora_args(p)
    p.add_argument("-p", "--prompt", required=True, help="the prompt (special tokens are parsed)")
    p.add_argument("-n", "--n-predict", type=int, default=DEFAULT_N_PREDICT,
                   help=f"tokens to generate; -1 = until end of generation or a full context "
                        f"(default {DEFAULT_N_PREDICT})")
    s = p.add_argument_group("sampling (llama.cpp defaults)")
    s.add_argument("--temp", type=float, default=0.8, help="temperature; 0 = greedy (default 0.8)")
    s.add_argument("--top-k", type=int, default=40, help="top-k, <= 0 off (default 40)")
    s.add_argument("--top-p", type=float, default=0.95, help="top-p, 1 off (default 0.95)")
    s.add_argument("--min-p", type=float, default=0.05, help="min-p, 0 off (default 0.05)")
    s.add_argument("--repeat-penalty", type=float, default=1.0, help="1 off (default 1.0)")
    s.add_argument("--repeat-last-n", type=int, default=64,
                   help="tokens the repeat penalty looks back over (default 64)")
    s.add_argument("--seed", type=int, default=-1, help="sampling seed; -1 = random (default)")
    s.add_argument("--mirostat", type=int, default=0, choices=(0, 1, 2),
                   help="Mirostat sampling after the temperature, instead of top-k/top-p/min-p: "
                        "0 off (default), 1 Mirostat, 2 Mirostat 2.0")
    s.add_argument("--mirostat-lr", type=float, default=0.1, help="Mirostat learning rate, eta (default 0.1)")
    s.add_argument("--mirostat-ent", type=float, default=5.0, help="Mirostat target entropy, tau (default 5.0)")
    s.add_argument("--dry-multiplier", type=float, default=0.0, help="DRY penalty multiplier, 0 off (default 0)")
    s.add_argument("--dry-base", type=float, default=1.75, help="DRY penalty base (default 1.75)")
    s.add_argument("--dry-allowed-length", type=int, default=2,
                   help="repeats longer than this are penalised by DRY (default 2)")
    s.add_argument("--dry-penalty-last-n", type=int, default=64,
                   help="tokens DRY scans for repeats, 0 off (default 64)")
    s.add_argument("--dry-sequence-breaker", action="append", metavar="STRING", default=None,
                   help="a DRY sequence breaker (repeatable; replaces the defaults '\\n', ':', "
                        "'\"', '*'; \"none\": no breakers)")
    order = s.add_mutually_exclusive_group()
    order.add_argument("--samplers", default=None, metavar="NAMES",
                       help="the samplers' order, names separated by ';', e.g. top_k;temperature "
                            "(default: llama.cpp's, as --sampling-seq edskypmxt)")
    order.add_argument("--sampling-seq", "--sampler-seq", default=None, metavar="LETTERS",
                       help="the samplers' order as letters (default edskypmxt)")
    g = p.add_argument_group("structured output (llama-cli's options)").add_mutually_exclusive_group()
    g.add_argument("--json-schema", dest="json_schema_file", type=Path, metavar="FILE", default=None,
                   help="a JSON schema file: the output is JSON valid under it")
    g.add_argument("--grammar-file", type=Path, metavar="FILE", default=None,
                   help="a GBNF grammar file (llama.cpp's format): the output follows it")
    c = p.add_argument_group("context")
    c.add_argument("-c", "--n-ctx", type=int, default=DEFAULT_N_CTX,
                   help=f"context size in tokens; 0 = the model's (default {DEFAULT_N_CTX})")
    c.add_argument("-t", "--threads", type=int, default=2, help="threads (default 2)")
    c.add_argument("--backend", default=None,
                   help="compute backend by name (default: the best available)")
    add_cache_args(p)
    add_placement_args(p)
    p.add_argument("--json", action="store_true",
                   help="print one JSON object at the end instead of streaming text")
    p.set_defaults(func=run)


def dry_breakers(args: argparse.Namespace, model: Model) -> Breakers | None:
    """llama-cli's --dry-sequence-breaker: the defaults unless given, "none" for none."""
    if not args.dry_multiplier:
        return None
    strings = args.dry_sequence_breaker or list(DEFAULT_BREAKERS)
    return model_breakers(model, [] if strings == ["none"] else strings)


def run(args: argparse.Namespace) -> int:
    t_start = time.perf_counter()
    if args.n_predict < -1:
        raise ValueError(f"-n must be >= 0, or -1 for no limit, got {args.n_predict}")
    where = load_kwargs(args)
    model = Model.load(args.model, **where)
    sampler = make_sampler(n_vocab=model.n_vocab, temp=args.temp, top_k=args.top_k,
                           top_p=args.top_p, min_p=args.min_p, repeat_penalty=args.repeat_penalty,
                           repeat_last_n=args.repeat_last_n, seed=args.seed,
                           grammar=grammar_sampler(args, model), mirostat=args.mirostat,
                           mirostat_tau=args.mirostat_ent, mirostat_eta=args.mirostat_lr,
                           dry_multiplier=args.dry_multiplier, dry_base=args.dry_base,
                           dry_allowed_length=args.dry_allowed_length,
                           dry_penalty_last_n=args.dry_penalty_last_n,
                           dry_breakers=dry_breakers(args, model),
                           samplers=(args.samplers.split(";") if args.samplers is not None
                                     else args.sampling_seq))
    ctx = Context(model, n_ctx=args.n_ctx, n_threads=args.threads, backend=args.backend, **cache_kwargs(args))
    for path, scale in args.lora:   # llama-cli's: every adapter on the whole generation
        ctx.set_adapter_lora(model.load_lora(path), scale)
    if args.lora:
        ctx.reserve_lora_graphs()
    load_ms = (time.perf_counter() - t_start) * 1000
    max_tokens = ctx.n_ctx if args.n_predict == -1 else args.n_predict

    gen = Generation([])
    out = sys.stdout
    try:
        for piece in stream(ctx, args.prompt, max_tokens=max_tokens, sampler=sampler,
                            parse_special=True, result=gen):
            if not args.json:
                out.write(piece)
                out.flush()
    except GenerationError as e:
        print(f"ggmlpy run: error: {e}", file=sys.stderr)
        return 1
    total_ms = (time.perf_counter() - t_start) * 1000
    timings = run_timings(gen, load_ms, total_ms)

    if args.json:
        json.dump({
            "model": str(model.path), "backend": ctx.backend_name, "n_ctx": ctx.n_ctx,
            "devices": where["devices"] or [], "n_gpu_layers": where["n_gpu_layers"],
            "seed": sampler_seed(sampler), "prompt": args.prompt, "prompt_ids": gen.prompt_tokens,
            "ids": gen.tokens, "text": gen.text, "stop_reason": gen.stop_reason,
            "timings": timings, "compile": ctx.compile_report(),
        }, out, ensure_ascii=False)
        out.write("\n")
    else:
        out.write("\n")
        out.flush()
        seed = sampler_seed(sampler)
        sys.stderr.write(f"\nggmlpy: {model.path.name}, backend {ctx.backend_name}, n_ctx {ctx.n_ctx}, "
                         f"{'seed ' + str(seed) if seed is not None else 'greedy'}, "
                         f"stop: {gen.stop_reason}\n")
        sys.stderr.write(format_timings(timings))
        sys.stderr.write(format_compile(ctx.compile_report()))
    return 0


def grammar_sampler(args: argparse.Namespace, model: Model):
    """The grammar of --json-schema or --grammar-file, as the chain's first sampler. A file
    that cannot be read or parsed is a ValueError naming it (one line, no traceback)."""
    path = args.json_schema_file or args.grammar_file
    if path is None:
        return None
    from llama.grammar import Grammar, GrammarError, GrammarSampler
    try:
        text = path.read_text(encoding="utf-8")
        grammar = Grammar.from_json_schema(text) if args.json_schema_file else Grammar.from_gbnf(text)
        return GrammarSampler(model.vocab, grammar)
    except (OSError, UnicodeDecodeError, GrammarError) as e:
        raise ValueError(f"{path}: {e}") from None


def format_compile(report: dict) -> str:
    """One line: graph compile time, or that the object cache served it."""
    hits = sum(v for k, v in report.items() if k.endswith("_object_cache_hits"))
    misses = sum(v for k, v in report.items() if k.endswith("_object_cache_misses"))
    how = "object cache hit" if hits and not misses else f"{misses} compiled, {hits} from the object cache"
    return (f"ggmlpy:     graph compile = {report['compile_ms']:10.2f} ms "
            f"({report['graphs']} graphs: {how})\n")


def sampler_seed(sampler: SamplerChain) -> int | None:
    """The seed the chain's Dist drew with (the random one when -1 was asked), None if greedy."""
    for s in sampler.samplers:
        if isinstance(s, Dist):
            return int(s.seed_cur)
    return None


def eval_runs(gen: Generation) -> int:
    """Single-token decodes after the prompt (llama.cpp's n_eval): every generated token is
    fed back, except the last one when generation stopped on length or a full context."""
    if gen.stop_reason == "eog":
        return len(gen.tokens)
    return max(len(gen.tokens) - 1, 0)


def run_timings(gen: Generation, load_ms: float, total_ms: float) -> dict[str, float]:
    n_eval = eval_runs(gen)
    t = gen.timings()
    t.update({
        "load_ms": round(load_ms, 3),
        "eval_runs": n_eval,
        "eval_ms": round(gen.gen_ms, 3),
        "eval_tok_s": round(n_eval / gen.gen_ms * 1000, 3) if gen.gen_ms and n_eval else 0.0,
        "total_ms": round(total_ms, 3),
    })
    return t


def _rate(ms: float, n: int) -> str:
    per = ms / n if n else 0.0
    per_s = n / ms * 1000 if ms and n else 0.0
    return f"({per:8.2f} ms per token, {per_s:8.2f} tokens per second)"


def format_timings(t: dict[str, float]) -> str:
    """llama_perf_context_print's lines: load, prompt eval, eval and total time."""
    n_p, n_e = int(t["prompt_tokens"]), int(t["eval_runs"])
    return (
        f"ggmlpy:        load time = {t['load_ms']:10.2f} ms\n"
        f"ggmlpy: prompt eval time = {t['prompt_ms']:10.2f} ms / {n_p:5d} tokens "
        f"{_rate(t['prompt_ms'], n_p)}\n"
        f"ggmlpy:        eval time = {t['eval_ms']:10.2f} ms / {n_e:5d} runs   "
        f"{_rate(t['eval_ms'], n_e)}\n"
        f"ggmlpy:       total time = {t['total_ms']:10.2f} ms / {n_p + n_e:5d} tokens\n"
    )
