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

from ggmlpy.gguf import GGUFFile, GGUFValueType
from ggmlpy.gguf.writer import GGUFWriter


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="GGUF file whose matrices the importance matrix covers")
    ap.add_argument("out", help="the importance matrix to write (GGUF)")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    w = GGUFWriter()
    w.add_string("general.type", "imatrix")
    w.add_array("imatrix.datasets", ["synthetic"], GGUFValueType.STRING)
    w.add_uint32("imatrix.chunk_count", 1)
    w.add_uint32("imatrix.chunk_size", 512)
    n = 0
    with GGUFFile(args.model) as f:
        for name, t in f.tensors.items():
            ne = [int(d) for d in t.ne]
            if len(ne) < 2 or not name.endswith(".weight") or name == "token_embd.weight":
                continue
            mats = ne[2] if len(ne) > 2 else 1   # one row of sums per expert
            w.add_tensor(f"{name}.in_sum2", (np.exp(rng.standard_normal((mats, ne[0])) * 0.5) * 10).astype(np.float32))
            w.add_tensor(f"{name}.counts", np.full((mats, 1), 10, np.float32))
            n += 1
    w.write(args.out)
    print(f"{args.out}: {n} matrices")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
