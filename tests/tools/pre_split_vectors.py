"""llama.cpp's tokens for the pre-tokenizers that have no vocabulary test file in llama.cpp's
models/, for tests/llama/vocab/test_pre_split_llama_cpp.py.

For each pre-tokenizer in CASES, ggmlpy.testing.models.write_pair_vocab writes a
vocabulary whose merges join every adjacent byte pair of the texts, so the tokens show where
the text was cut; llama-cpp-python's `Llama(path, vocab_only=True).tokenize` gives llama.cpp's
tokens. Not a test and not a dependency; rerun it with llama-cpp-python 0.3.36 when the
texts change:

    PYTHONPATH=. PEER/bin/python -m tests.tools.pre_split_vectors > tests/llama/vocab/data/pre_split.json
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from ggmlpy.testing.models import write_pair_vocab

# Kimi K2: Han runs apart from other letters, letters of any case in one run, contractions
# in either case, digits in threes, punctuation runs with their newlines, whitespace runs
KIMI_K2_TEXTS = [
    "Hello World", "HelloWorld 中文字符abc", "I'm here, they'RE 12345 ok", "  lots   of\n\n spaces\t",
    "naïve café", " 中国", "你好world!!!\n\nx", "ΑΒΓ αβγ Привет мир", "日本語のテキスト と カタカナ",
    "x = f(a, b) + 3.14159;\r\n\treturn y", "'s 't 'Ll 've", "한국어 텍스트 123abc", "㐀𠀀丽 mixed",
]
CASES = {"kimi-k2": KIMI_K2_TEXTS}


def main() -> None:
    from llama_cpp import Llama

    out = {}
    with tempfile.TemporaryDirectory() as d:
        for pre, texts in CASES.items():
            llm = Llama(str(write_pair_vocab(Path(d) / f"{pre}.gguf", pre, texts)), vocab_only=True, verbose=False)
            out[pre] = [{"text": t, "tokens": llm.tokenize(t.encode(), add_bos=False, special=False)} for t in texts]
    json.dump(out, sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
