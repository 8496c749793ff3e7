"""llama-quantize's outputs on the inputs of tests/llama/quantize/cases.py, as sha256 per case,
for tests/llama/quantize/test_llama_cpp_identity.py (ggmlpy's quantize must write the same
bytes).

Writes every input (seeded, so the same bytes every time; their sha256 goes with the
vectors; split inputs part by part), runs `llama-quantize OPTIONS IN out/out.gguf MIX 2` on
each case in a scratch folder (the importance matrix is passed as a relative path:
llama-quantize records the path it was given), and records the output's sha256 (with
--keep-split, each file's name and sha256), or the error line when llama-quantize refuses. With
--smollm2 it also records SmolLM2-135M (the Q4_1 file of ggmlpy.hub) made F16 and that F16
made Q4_K_M. Not a test and not a dependency; rerun it with the llama.cpp that
llama-cpp-python 0.3.36 vendors when the reference or the inputs change:

    .venv/bin/python -m tests.tools.quantize_vectors PATH/TO/llama-quantize [--smollm2]
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.llama.quantize.cases import (
    CASES, DATA, FILES, SPLIT_FILES, case_id, sha256, write_file, write_imatrix, write_split_file, written,
)


def run(binary: str, folder: Path, options: list[str], inp: str, out: str, mix: str) -> tuple[int, str, float]:
    t0 = time.perf_counter()
    p = subprocess.run([binary, *options, inp, out, mix, "2"], cwd=folder, capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr, time.perf_counter() - t0


def error_line(log: str) -> str:
    """The line that says why llama-quantize stopped."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for ln in lines:
        if "failed to quantize:" in ln:
            return ln.split("failed to quantize:", 1)[1].strip()
    return next((ln for ln in reversed(lines) if "error" in ln.lower()), lines[-1] if lines else "")


def smollm2(binary: str, folder: Path) -> dict:
    from ggmlpy.hub import resolve_model
    q4_1 = resolve_model("smollm2-135m")
    f16, q4km = folder / "smollm2-f16.gguf", folder / "smollm2-q4_k_m.gguf"
    rc, log, t_f16 = run(binary, folder, ["--allow-requantize"], str(q4_1), str(f16), "F16")
    assert rc == 0, log
    rc, log, t_q = run(binary, folder, [], str(f16), str(q4km), "Q4_K_M")
    assert rc == 0, log
    return {"input_sha256": sha256(q4_1), "f16_sha256": sha256(f16), "q4_k_m_sha256": sha256(q4km),
            "llama_quantize_seconds": {"f16": round(t_f16, 2), "q4_k_m": round(t_q, 2)}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("llama_quantize", help="path of the llama-quantize binary")
    ap.add_argument("--smollm2", action="store_true", help="also record SmolLM2-135M F16 and Q4_K_M")
    ap.add_argument("-o", "--output", type=Path, default=DATA)
    args = ap.parse_args()
    old = json.loads(args.output.read_text()) if args.output.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        files = {name: sha256(write_file(name, folder)) for name in FILES}
        for name in SPLIT_FILES:
            files.update({p.name[:-len(".gguf")]: sha256(p) for p in write_split_file(name, folder)})
        imatrix = sha256(write_imatrix(folder))
        imatrix_dense = sha256(write_imatrix(folder, dense=True))
        cases = {}
        out = folder / "out"
        for file, options, mix in CASES:
            out.mkdir()
            rc, log, _ = run(args.llama_quantize, folder, options, f"{file}.gguf", "out/out.gguf", mix)
            key = case_id(file, options, mix)
            outputs = written(out)
            if rc != 0:
                cases[key] = {"error": error_line(log)}
            elif list(outputs) == ["out.gguf"]:
                cases[key] = {"sha256": outputs["out.gguf"]}
            else:
                cases[key] = {"outputs": outputs}
            shutil.rmtree(out)
            print(f"{key}: {cases[key]}", file=sys.stderr)
        result = {"files": files, "imatrix": imatrix, "imatrix_dense": imatrix_dense, "cases": cases}
        result["smollm2"] = smollm2(args.llama_quantize, folder) if args.smollm2 else old.get("smollm2")
    args.output.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
