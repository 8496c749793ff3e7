"""llama.cpp's vocabulary test files, the data of tests/llama/vocab/test_vocab_llama_cpp_cases.py.

llama.cpp's models/ggml-vocab-*.gguf hold a tokenizer and no tensors; with their .inp/.out
cases they are what llama.cpp's test-tokenizer-0 runs. Each one that comes with cases and
whose tokenizer ggmlpy supports is stored xz-compressed (63 MB -> 13.6 MB for the 15),
with its .inp and .out as they are.

--strip rewrites a file with ggmlpy's GGUF writer keeping only what llama.cpp's vocabulary
reads (every tokenizer.* key; general.architecture, which llama.cpp needs to load the file
and which picks some token attributes; general.name, which picks phi-3's) before
compressing. It saves nothing on today's files (the tokenizer is all they hold: 2.5 kB of
12 MB), so they are stored whole and `llama.Model.load` still finds their hyperparameters;
it is there for a vocabulary file that carries more. --check shows that llama.cpp reads
a stored file as the original either way.

    # write data/ (all such vocabularies, or the named files)
    .venv/bin/python -m tests.tools.vocab_cases LLAMA_CPP/models [--strip] [NAMES...]
    # llama.cpp reads each stored file as the original: the same tokens for every case
    # (all four add_special/parse_special settings), attributes, EOG set, special ids
    PEER/bin/python -m tests.tools.vocab_cases --check LLAMA_CPP/models
    # llama.cpp's detokenization of every case's .out tokens -> data/detokenized.json
    PEER/bin/python -m tests.tools.vocab_cases --detok LLAMA_CPP/models

Not a test and not a dependency. PEER is an environment with llama-cpp-python 0.3.36 (the
llama.cpp the cases come from); --check and --detok import nothing from ggmlpy.
"""
from __future__ import annotations

import argparse
import json
import lzma
import shutil
import sys
import tempfile
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "llama" / "vocab" / "data"
KEEP_GENERAL = ("general.architecture", "general.name")
SEP = "\n__ggml_vocab_test__\n"


def kept(key: str) -> bool:
    return key.startswith("tokenizer.") or key in KEEP_GENERAL


def read_cases(inp: Path) -> list[str]:
    """The .inp texts as test-tokenizer-0 splits them (the last may lack its separator)."""
    raw = inp.read_bytes().decode("utf-8")
    texts = raw.split(SEP)
    if texts and texts[-1] == "":
        texts.pop()
    return texts


def vocab_files(models: Path) -> list[Path]:
    """llama.cpp's vocabularies that come with cases."""
    return [p for p in sorted(models.glob("ggml-vocab-*.gguf"))
            if p.with_name(p.name + ".inp").exists() and p.with_name(p.name + ".out").exists()]


# --- writing ---------------------------------------------------------------------------------

def stripped_bytes(path: Path) -> bytes:
    """The file rewritten with only the kept keys, in their order and declared types."""
    from ggmlpy.gguf import GGUFFile
    from ggmlpy.gguf.writer import GGUFWriter

    with tempfile.TemporaryDirectory() as tmp, GGUFFile(path) as f:
        w = GGUFWriter(version=f.version)
        for key, fl in f.fields.items():
            if kept(key):
                w.add_key_value(key, fl.value, fl.type, fl.element_type)
        return w.write(Path(tmp) / path.name).read_bytes()


def supported(path: Path) -> str | None:
    """None when ggmlpy builds the vocabulary, else why not."""
    from ggmlpy.gguf import GGUFFile
    from llama.vocab import Vocab, VocabError

    with GGUFFile(path) as f:
        try:
            Vocab.from_metadata(dict(f.metadata))
        except VocabError as e:
            return str(e)
    return None


def write_data(models: Path, names: list[str], strip: bool) -> None:
    DATA.mkdir(parents=True, exist_ok=True)
    total = 0
    for path in vocab_files(models):
        if names and path.name not in names:
            continue
        why = supported(path)
        if why is not None:
            print(f"{path.name}: skipped ({why})")
            continue
        raw = stripped_bytes(path) if strip else path.read_bytes()
        packed = lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME)
        (DATA / f"{path.name}.xz").write_bytes(packed)
        for ext in (".inp", ".out"):
            shutil.copyfile(path.with_name(path.name + ext), DATA / (path.name + ext))
        total += len(packed)
        print(f"{path.name}: {path.stat().st_size} -> {len(packed)} bytes")
    print(f"{total} bytes written to {DATA}")


# --- checking with llama.cpp -----------------------------------------------------------------

def llama_cpp_view(path: Path, texts: list[str]) -> dict:
    """What llama.cpp makes of a vocabulary file: attributes, EOG set, special ids, flags,
    and the tokens of every text under every add_special/parse_special setting."""
    import llama_cpp as L

    params = L.llama_model_default_params()
    params.vocab_only = True
    model = L.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise SystemExit(f"llama.cpp cannot load {path}")
    try:
        v = L.llama_model_get_vocab(model)
        n = L.llama_vocab_n_tokens(v)

        def tokenize(text: str, add: bool, parse: bool) -> list[int]:
            raw = text.encode("utf-8")
            size = len(raw) + 8
            buf = (L.llama_token * size)()
            got = L.llama_tokenize(v, raw, len(raw), buf, size, add, parse)
            if got < 0:
                size = -got
                buf = (L.llama_token * size)()
                got = L.llama_tokenize(v, raw, len(raw), buf, size, add, parse)
            return list(buf[:got])

        # the special ids llama-cpp-python binds (it has no llama_vocab_eom)
        ids = ("bos", "eos", "eot", "sep", "nl", "pad", "mask", "fim_pre", "fim_suf",
               "fim_mid", "fim_pad", "fim_rep", "fim_sep")
        return {
            "attrs": [int(L.llama_vocab_get_attr(v, i)) for i in range(n)],
            "eog": [i for i in range(n) if L.llama_vocab_is_eog(v, i)],
            "ids": [int(getattr(L, f"llama_vocab_{k}")(v)) for k in ids],
            "flags": [bool(L.llama_vocab_get_add_bos(v)), bool(L.llama_vocab_get_add_eos(v))],
            "tokens": [tokenize(t, a, p) for t in texts for a in (False, True) for p in (False, True)],
            "cases": [tokenize(t, False, False) for t in texts],
        }
    finally:
        L.llama_model_free(model)


_QUIET = None  # llama.cpp's log callback, kept alive while llama.cpp may call it


def check(models: Path) -> int:
    global _QUIET
    import llama_cpp as L

    _QUIET = L.llama_log_callback(lambda *_: None)
    L.llama_log_set(_QUIET, None)
    L.llama_backend_init()
    failed = 0
    for packed in sorted(DATA.glob("ggml-vocab-*.gguf.xz")):
        name = packed.name[:-3]
        texts = read_cases(DATA / f"{name}.inp")
        outs = read_outs(name, len(texts))
        with tempfile.TemporaryDirectory() as tmp:
            small = Path(tmp) / name
            small.write_bytes(lzma.decompress(packed.read_bytes()))
            mine = llama_cpp_view(small, texts)
        ref = llama_cpp_view(models / name, texts)
        same = mine == ref
        right = sum(got == want for got, want in zip(mine["cases"], outs))
        failed += not same or right != len(texts)
        print(f"{name}: stored file read {'as' if same else 'DIFFERENTLY from'} the original; "
              f"{right}/{len(texts)} cases as the .out")
    return 1 if failed else 0


def read_outs(name: str, n: int) -> list[list[int]]:
    lines = (DATA / f"{name}.out").read_bytes().decode("utf-8").split("\n")[:n]
    return [[int(x) for x in line.split()] for line in lines]


def write_detok() -> None:
    """llama.cpp's text of each case's expected tokens, as test-tokenizer-0 prints it
    (remove_special=False, unparse_special=True), then with the two flags the other way."""
    import ctypes

    import llama_cpp as L

    global _QUIET
    _QUIET = L.llama_log_callback(lambda *_: None)
    L.llama_log_set(_QUIET, None)
    L.llama_backend_init()
    out: dict[str, list[list[str]]] = {}
    for packed in sorted(DATA.glob("ggml-vocab-*.gguf.xz")):
        name = packed.name[:-3]
        outs = read_outs(name, len(read_cases(DATA / f"{name}.inp")))
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            path.write_bytes(lzma.decompress(packed.read_bytes()))
            params = L.llama_model_default_params()
            params.vocab_only = True
            model = L.llama_model_load_from_file(str(path).encode(), params)
            v = L.llama_model_get_vocab(model)

            def detok(ids: list[int], remove: bool, unparse: bool) -> str:
                arr = (L.llama_token * max(1, len(ids)))(*ids)
                size = 16 + 32 * len(ids)
                buf = ctypes.create_string_buffer(size)
                got = L.llama_detokenize(v, arr, len(ids), buf, size, remove, unparse)
                assert got >= 0, "buffer too small"
                return buf.raw[:got].decode("utf-8", "surrogateescape")

            out[name] = [[detok(ids, False, True), detok(ids, True, False)] for ids in outs]
            L.llama_model_free(model)
    # one case a line, so that a change shows as the cases it touches
    blocks = [f" {json.dumps(name)}: [\n" + ",\n".join(f"  {json.dumps(pair)}" for pair in pairs) + "]"
              for name, pairs in out.items()]
    (DATA / "detokenized.json").write_text("{\n" + ",\n".join(blocks) + "\n}\n", encoding="ascii")
    print(f"{sum(map(len, out.values()))} cases of {len(out)} vocabularies -> {DATA / 'detokenized.json'}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", type=Path, help="llama.cpp's models/ folder")
    ap.add_argument("names", nargs="*", help="only these files (e.g. ggml-vocab-gemma-4.gguf)")
    ap.add_argument("--strip", action="store_true", help="keep only the keys llama.cpp's vocabulary reads")
    ap.add_argument("--check", action="store_true", help="compare the stored files with the originals in llama.cpp")
    ap.add_argument("--detok", action="store_true", help="write llama.cpp's detokenization of the cases")
    args = ap.parse_args(argv)
    if args.check:
        return check(args.models)
    if args.detok:
        write_detok()
        return 0
    write_data(args.models, args.names, args.strip)
    return 0


if __name__ == "__main__":
    sys.exit(main())
