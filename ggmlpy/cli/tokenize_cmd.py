"""`ggmlpy tokenize TEXT`: a model's tokens for a text, printed like llama-tokenize.

Default output is one line per token, `id -> 'piece'`; `--ids` prints only the id list
(llama-tokenize's `--ids`) and `--json` a JSON list of ids. Only the vocabulary is loaded
(vocab_only), so this is fast for any model size. Pieces are shown with special tokens
rendered, as llama-tokenize does; bytes that are not valid UTF-8 on their own (one part of
a multi-byte character) are shown as \\x escapes.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ggmlpy.cli.run_cmd import add_model_arg
from llama.model import Model


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "tokenize", help="show how a model tokenizes a text",
        description="Tokenize a text with a model's vocabulary and print the tokens.")
    add_model_arg(p)
    p.add_argument("text", help="the text to tokenize ('-' reads standard input)")
    p.add_argument("--no-bos", "--no-special", dest="add_special", action="store_false",
                   help="do not add the vocabulary's BOS/EOS tokens")
    p.add_argument("--parse-special", action="store_true",
                   help="turn special-token text such as <|im_start|> into its token")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--ids", action="store_true", help="print only the list of ids")
    fmt.add_argument("--json", action="store_true", help="print a JSON list of ids")
    p.add_argument("--show-count", action="store_true", help="also print the number of tokens")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    text = sys.stdin.read() if args.text == "-" else args.text
    model = Model.load(args.model, vocab_only=True)
    try:
        ids = model.tokenize(text, add_special=args.add_special, parse_special=args.parse_special)
        out = sys.stdout
        if args.json:
            out.write(json.dumps(ids) + "\n")
        elif args.ids:
            out.write("[" + ", ".join(str(i) for i in ids) + "]\n")
        else:
            for tok in ids:
                out.write(f"{tok:6d} -> '{piece_text(model, tok)}'\n")
        if args.show_count:
            out.write(f"Total number of tokens: {len(ids)}\n")
    finally:
        model.close()
    return 0


def piece_text(model: Model, token: int) -> str:
    return model.token_to_piece(token, special=True).decode("utf-8", "backslashreplace")
