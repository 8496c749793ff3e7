"""An importance matrix for every matrix of a GGUF file, in llama-imatrix's GGUF layout, with
log-normal values: what llama-quantize needs to write the very low-bit types (IQ2_XXS, IQ2_XS,
IQ1_S, ...) of a file for the speed benchmarks, whose figures do not depend on the values
(a real matrix comes from llama-imatrix over a text).

Usage: python bench/make_imatrix.py MODEL.gguf OUT.gguf
then:  llama-quantize --allow-requantize --imatrix OUT.gguf MODEL.gguf MODEL-iq2_xs.gguf IQ2_XS
"""
from __future__ import annotations

import argparse

import numpy as np

from ggmlpy.gguf import GGUFFile
from llama.quantize.imatrix import write_imatrix


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="GGUF file whose matrices the importance matrix covers")
    ap.add_argument("out", help="the importance matrix to write (GGUF)")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    sums = {}
    with GGUFFile(args.model) as f:
        for name, t in f.tensors.items():
            ne = [int(d) for d in t.ne]
            if len(ne) < 2 or not name.endswith(".weight") or name == "token_embd.weight":
                continue
            mats = ne[2] if len(ne) > 2 else 1   # one row of sums per expert
            sums[name] = (np.exp(rng.standard_normal((mats, ne[0])) * 0.5) * 10, np.full(mats, 10.0))
    write_imatrix(args.out, sums, ["synthetic"], 1, 512)
    print(f"{args.out}: {len(sums)} matrices")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
