"""The high-level API's cost, side by side in one run (JSON on stdout):

- `ggmlpy bench`'s tg128 (decode alone) against `Llama.create_completion` over 128 tokens,
  greedy and with the default sampler chain: what the API layer costs per token;
- the same with a JSON schema active (llguidance's mask, computed while the decode runs);
- a chat's second turn against the same prompt from scratch (prompt-cache reuse), with the
  tokens it decoded;
- with --peer PYTHON (a venv with llama-cpp-python 0.3.36): the same measurements of
  llama_cpp.Llama, and whether both count the same prompt tokens for the same chat.

    python bench/bench_api.py [-m MODEL] [-t THREADS] [--peer /path/to/venv/bin/python]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from api_measure import CHAT, FOLLOW_UP, measure, timed_chat  # noqa: E402

from ggmlpy.cli.bench_run import run_bench  # noqa: E402
from ggmlpy.hub import resolve_model  # noqa: E402
from llama import Llama  # noqa: E402


def ours(model: str, threads: int) -> dict:
    llm = Llama(model, n_ctx=2048, n_threads=threads, verbose=False)
    result = measure(llm)
    # what the second turn decoded, from the engine's own count
    llm.reset()
    first, _ = timed_chat(llm, CHAT, 24)
    before = llm.engine.n_prompt_decoded
    turn2 = CHAT + [first["choices"][0]["message"], {"role": "user", "content": FOLLOW_UP}]
    timed_chat(llm, turn2, 1)
    result["turn2_tokens_decoded"] = llm.engine.n_prompt_decoded - before
    return result


def peer(python: str, path: str, threads: int) -> dict:
    script = Path(__file__).resolve().parent / "api_measure.py"
    res = subprocess.run([python, str(script), "llama_cpp", path, str(threads)], capture_output=True,
                         text=True, timeout=1800)
    if res.returncode != 0:
        return {"error": res.stderr.strip().splitlines()[-1] if res.stderr else f"exit {res.returncode}"}
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--peer", default=None, help="python of a venv with llama-cpp-python")
    args = ap.parse_args()
    path = str(resolve_model(args.model))
    bench = run_bench(path, threads=args.threads, n_prompt=64, n_gen=128, reps=3, start_times=False)
    api = ours(path, args.threads)
    bench2 = run_bench(path, threads=args.threads, n_prompt=64, n_gen=128, reps=3, start_times=False)
    # ggmlpy bench's decode alone, before and after the API runs (the neighbours move)
    tg = (bench["tg128_tok_s"] + bench2["tg128_tok_s"]) / 2
    out = {"model": Path(path).name, "threads": args.threads,
           "bench_tg128_tok_s": [bench["tg128_tok_s"], bench2["tg128_tok_s"]], "ggmlpy": api,
           # the API against plain decodes, in the same interleaved rounds
           "completion_vs_decode_greedy": round(api["completion_tg128_greedy_tok_s"]
                                                / api["completion_tg128_decode_only_tok_s"], 3),
           "completion_vs_decode_sampled": round(api["completion_tg128_sampled_tok_s"]
                                                 / api["completion_tg128_decode_only_tok_s"], 3),
           "completion_vs_bench_greedy": round(api["completion_tg128_greedy_tok_s"] / tg, 3),
           "completion_vs_bench_sampled": round(api["completion_tg128_sampled_tok_s"] / tg, 3),
           "json_schema_vs_unconstrained": round(api["completion_tg128_json_schema_tok_s"]
                                                 / api["completion_tg128_sampled_tok_s"], 3),
           "turn2_vs_from_scratch_ms": round(api["turn2_ms"] / api["turn2_from_scratch_ms"], 3),
           "turn2_decoded_vs_prompt_tokens": round(api["turn2_tokens_decoded"] / api["turn2_prompt_tokens"], 3)}
    if args.peer:
        p = peer(args.peer, path, args.threads)
        out["llama_cpp_python"] = p
        if "error" not in p:
            out["same_chat_prompt_tokens"] = (p["turn1_prompt_tokens"] == api["turn1_prompt_tokens"]
                                              and p["turn2_prompt_tokens"] == api["turn2_prompt_tokens"])
            for name in ("greedy", "sampled", "json_schema"):
                key = f"completion_tg128_{name}_tok_s"
                out[f"ggmlpy_vs_peer_{name}"] = round(api[key] / p[key], 3)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
