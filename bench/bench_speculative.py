"""Speculative decoding in the server: ggmlpy serve vs llama-server, each with and without
a draft, alternated in one run, JSON out.

Each configuration starts its server with the same flags (`--spec-type ngram-simple` and
its sizes, or `-md DRAFT --spec-type draft-simple`), then sends the same `/completion`
requests (greedy, `n_predict` tokens) in turn. Reported per server and configuration: the
generated tokens a second (`timings.predicted_per_second`, medians over the requests and
rounds), the drafted and accepted tokens, and whether the tokens equal the run without a
draft (they must, for ggmlpy). The default prompts ask to repeat and edit text the prompt
holds, where n-gram lookup pays.

    python bench/bench_speculative.py --llama-server PATH/llama-server [-m MODEL] [--rounds 3]
    python bench/bench_speculative.py --llama-server PATH -m TARGET --draft DRAFT   # draft-simple
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_server import start  # noqa: E402  (the same start and health wait)

from ggmlpy.hub import resolve_model  # noqa: E402

CODE = "\n".join(f"def field_{i}(record):\n    return record.get('field_{i}', None)\n" for i in range(12))
PROMPTS = [
    f"Here is a Python module:\n\n{CODE}\nRewrite the whole module unchanged, then add a docstring "
    "to nothing else.\n\n",
    "Copy this list exactly, one per line: " + ", ".join(f"item number {i}" for i in range(30)) + ".\n",
]


def run_server(name: str, cmd: list[str], url: str, n_predict: int) -> list[dict]:
    proc = start(cmd, url)
    try:
        out = []
        for prompt in PROMPTS:
            body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "top_k": 1,
                    "cache_prompt": False, "return_tokens": True}
            r = httpx.post(url + "/completion", json=body, timeout=600).json()
            t = r["timings"]
            out.append({"tok_s": t["predicted_per_second"], "n": t["predicted_n"],
                        "draft_n": t.get("draft_n", 0), "accepted": t.get("draft_n_accepted", 0),
                        "tokens": r.get("tokens", [])})
        return out
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default=None, help="a draft model: draft-simple instead of ngram-simple")
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--port", type=int, default=8093)
    ap.add_argument("--ngram", default="12,48", help="ngram-simple's size-n,size-m")
    args = ap.parse_args()
    model = str(resolve_model(args.model))
    n, m = args.ngram.split(",")
    spec = (["-md", str(resolve_model(args.draft)), "--spec-type", "draft-simple"] if args.draft else
            ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", n, "--spec-ngram-simple-size-m", m])
    url = f"http://127.0.0.1:{args.port}"
    common = ["-m", model, "--port", str(args.port), "-np", "1", "-c", "4096", "-t", str(args.threads)]
    servers = {"ggmlpy": [sys.executable, "-m", "ggmlpy", "serve", *common],
               "llama.cpp": [args.llama_server, *common, "-tb", str(args.threads)]}
    runs: dict[str, list[list[dict]]] = {f"{s} {c}": [] for s in servers for c in ("plain", "spec")}
    for _ in range(args.rounds):
        for server, base in servers.items():
            for config, extra in (("plain", []), ("spec", spec)):
                runs[f"{server} {config}"].append(run_server(server, base + extra, url, args.n_predict))
    report = {"model": args.model, "draft": args.draft, "spec": spec, "n_predict": args.n_predict,
              "threads": args.threads, "rounds": args.rounds, "results": {}}
    for key, rounds in runs.items():
        flat = [r for one in rounds for r in one]
        plain = [r for one in runs[key.split()[0] + " plain"] for r in one]
        report["results"][key] = {
            "tok_s_median": round(statistics.median(r["tok_s"] for r in flat), 2),
            "tok_s_per_request": [round(r["tok_s"], 2) for r in flat],
            "draft_n": sum(r["draft_n"] for r in flat), "accepted": sum(r["accepted"] for r in flat),
            "same_tokens_as_plain": all(a["tokens"] == b["tokens"] for a, b in zip(flat, plain))}
    res = report["results"]
    speed = {key: res[key]["tok_s_median"] for key in runs}
    for server in servers:
        res[f"{server} speed-up"] = round(speed[f"{server} spec"] / speed[f"{server} plain"], 3)
    res["ggmlpy spec / llama.cpp spec"] = round(speed["ggmlpy spec"] / speed["llama.cpp spec"], 3)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
