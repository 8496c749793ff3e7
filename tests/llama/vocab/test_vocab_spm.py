"""SPM vocabulary against llama.cpp: Gemma 3's golden tokenization and pieces, hand-made tiny
vocabularies with hand-computed ids, and the chunked merge against a whole-text reference."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from llama.vocab import TokenAttr, Vocab, VocabError
from llama.vocab.spm import merge_heap, merge_simple
from tests.llama.vocab.test_vocab_bpe import load_gguf_metadata

S = "\u2581"  # SentencePiece's escaped space

# -- Gemma 3 against llama.cpp's golden data -----------------------------------------------------


@pytest.fixture(scope="module")
def gemma3(gemma3_path) -> Vocab:
    return Vocab.from_metadata(load_gguf_metadata(gemma3_path))


@pytest.fixture(scope="module")
def golden(golden_dir) -> dict:
    return json.loads((golden_dir / "gemma3-270m-q4_k_m" / "tokenize.json").read_text())


def test_gemma3_every_golden_case(gemma3, golden):
    assert len(golden["cases"]) == 100
    for case in golden["cases"]:
        ids = gemma3.tokenize(case["text"], case["add_special"], case["parse_special"])
        assert ids == case["ids"], case


def test_gemma3_every_golden_piece(gemma3, golden):
    assert len(golden["pieces_hex"]) == 226
    for tid, hexed in golden["pieces_hex"].items():
        assert gemma3.token_to_piece(int(tid), special=True).hex() == hexed, tid


def test_gemma3_round_trips(gemma3, golden):
    for case in golden["cases"]:
        ids = gemma3.tokenize(case["text"], case["add_special"], case["parse_special"])
        text = gemma3.detokenize(ids, remove_special=True, unparse_special=case["parse_special"])
        assert text == case["text"], case


def test_gemma3_flags_and_special_ids(gemma3, golden_dir):
    meta = json.loads((golden_dir / "gemma3-270m-q4_k_m" / "meta.json").read_text())
    assert gemma3.n_vocab == meta["n_vocab"] == 262144
    assert gemma3.add_bos is meta["add_bos"] is True
    assert gemma3.flags.add_space_prefix is False and gemma3.add_eos is False
    assert (gemma3.bos_id, gemma3.eos_id, gemma3.unk_id, gemma3.pad_id) == (2, 1, 3, 0)
    assert gemma3.eot_id == 106  # "<end_of_turn>", found by its text
    assert gemma3.eog_ids == {1, 106, 212}  # <eos>, <end_of_turn>, "</s>" (llama.cpp's list)
    assert gemma3.linefeed_id == 248 and gemma3.token_text(248) == "<0x0A>"
    # "\n" is a user-defined token, so it is cut out before SPM sees the text
    assert gemma3.is_user_defined(107) and gemma3.tokenize("a\nb", False) == [236746, 107, 236763]


def test_gemma3_byte_fallback_and_pieces(gemma3):
    # U+10FFFF has no token: its four UTF-8 bytes come out as byte tokens <0xF4><0x8F><0xBF><0xBF>
    ids = gemma3.tokenize("\U0010ffff", add_special=False)
    assert [gemma3.token_text(i) for i in ids] == ["<0xF4>", "<0x8F>", "<0xBF>", "<0xBF>"]
    assert ids == [238 + 0xF4, 238 + 0x8F, 238 + 0xBF, 238 + 0xBF]
    assert b"".join(gemma3.token_to_piece(i) for i in ids) == "\U0010ffff".encode()
    assert gemma3.token_to_piece(2) == b"" and gemma3.token_to_piece(2, special=True) == b"<bos>"
    assert gemma3.token_to_piece(26352) == b" Hello"  # "▁Hello": normal, ▁ back to a space


# -- tiny hand-made vocabularies -----------------------------------------------------------------

NORMAL, UNKNOWN, CONTROL, USER, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def spm_vocab(entries: list[tuple[str, float, int]], byte_tokens: bool = False, **keys) -> Vocab:
    """A vocabulary from (text, score, type) rows: <unk> 0, <s> 1, </s> 2, then the rows, then
    (optionally) the 256 byte tokens. Extra GGUF keys as keyword arguments (dots as '__')."""
    rows = [("<unk>", 0.0, UNKNOWN), ("<s>", 0.0, CONTROL), ("</s>", 0.0, CONTROL)] + entries
    if byte_tokens:
        rows += [(f"<0x{b:02X}>", 0.0, BYTE) for b in range(256)]
    md = {"tokenizer.ggml.model": "llama",
          "tokenizer.ggml.tokens": [r[0] for r in rows],
          "tokenizer.ggml.scores": np.array([r[1] for r in rows], dtype=np.float32),
          "tokenizer.ggml.token_type": np.array([r[2] for r in rows], dtype=np.int32)}
    md.update({"tokenizer.ggml." + k: v for k, v in keys.items()})
    return Vocab.from_metadata(md)


def ids_of(vocab: Vocab, *texts: str) -> list[int]:
    return [vocab.text_to_token(t) for t in texts]


def test_defaults_are_llama_cpps():
    v = spm_vocab([("a", -1.0, NORMAL)])
    assert (v.bos_id, v.eos_id, v.unk_id) == (1, 2, 0)
    assert v.add_bos and not v.add_eos and v.flags.add_space_prefix and not v.flags.clean_spaces


def test_merge_order_follows_scores():
    chars = [(c, -10.0, NORMAL) for c in "abc"]
    # "bc" scores higher than "ab": b merges to the right although "ab" comes first
    v = spm_vocab(chars + [("ab", -2.0, NORMAL), ("bc", -1.0, NORMAL)], add_space_prefix=False)
    assert v.tokenize("abc", add_special=False) == ids_of(v, "a", "bc") == [3, 7]
    v = spm_vocab(chars + [("ab", -1.0, NORMAL), ("bc", -2.0, NORMAL)], add_space_prefix=False)
    assert v.tokenize("abc", add_special=False) == ids_of(v, "ab", "c") == [6, 5]
    # equal scores: the leftmost pair first
    v = spm_vocab(chars + [("ab", -1.0, NORMAL), ("bc", -1.0, NORMAL)], add_space_prefix=False)
    assert v.tokenize("abc", add_special=False) == [6, 5]


def test_merges_chain_through_intermediate_tokens():
    # ▁ h e l l o: "ll" (-1) first, then "he" (-2), then "llo" (-3), then "▁he" (-4); "hello"
    # (-5) would need "he", which "▁he" took, so ▁he + llo
    rows = [(c, -20.0, NORMAL) for c in [S, "h", "e", "l", "o"]]
    rows += [("ll", -1.0, NORMAL), ("he", -2.0, NORMAL), ("llo", -3.0, NORMAL),
             (S + "he", -4.0, NORMAL), ("hello", -5.0, NORMAL)]
    v = spm_vocab(rows)
    assert v.tokenize("hello", add_special=False) == ids_of(v, S + "he", "llo") == [11, 10]
    assert v.tokenize("hello") == [1, 11, 10]  # BOS by default
    # without the space prefix: he + llo -> hello
    v = spm_vocab(rows, add_space_prefix=False)
    assert v.tokenize("hello", add_special=False) == ids_of(v, "hello") == [12]


def test_byte_fallback_for_unknown_characters():
    v = spm_vocab([(S, -1.0, NORMAL), ("a", -1.0, NORMAL)], byte_tokens=True)
    # "é" is no token: its UTF-8 bytes C3 A9 as <0xC3> <0xA9> (byte tokens start at id 5)
    assert v.tokenize("aé\n", add_special=False) == [3, 4, 5 + 0xC3, 5 + 0xA9, 5 + 0x0A]
    assert v.linefeed_id == 5 + 0x0A
    # the prefix space is dropped from the first token only: after a BOS it stays (llama.cpp)
    assert v.detokenize(v.tokenize("aé\n", add_special=False)) == "aé\n"
    assert v.detokenize(v.tokenize("aé\n")) == " aé\n"


def test_one_byte_tokens_are_the_second_fallback():
    # llama.cpp's byte_to_token tries "<0xNN>", then the raw one-byte text
    rows = [("a", -1.0, NORMAL), ("\udcc3", 0.0, NORMAL), ("<0xA9>", 0.0, BYTE)]
    v = spm_vocab(rows, add_space_prefix=False)
    assert v.tokenize("é", add_special=False) == [4, 5]
    assert v.linefeed_id is None  # neither "<0x0A>" nor "\n": llama.cpp's pad default, none


def test_unknown_token_when_no_byte_tokens_exist():
    v = spm_vocab([(S, -1.0, NORMAL), ("a", -1.0, NORMAL)])
    # one unknown token per character that is neither a token nor byte-encodable
    assert v.tokenize("a€€a", add_special=False) == [3, 4, 0, 0, 4]


def test_add_space_prefix_on_off_and_after_special_tokens():
    rows = [(S, -5.0, NORMAL), ("a", -5.0, NORMAL), ("b", -5.0, NORMAL), (S + "a", -1.0, NORMAL),
            (S + "b", -1.0, NORMAL), ("<sep>", 0.0, CONTROL), ("<u>", 0.0, USER)]
    on = spm_vocab(rows)
    off = spm_vocab(rows, add_space_prefix=False)
    a, b, sa, sb, sep, u = ids_of(on, "a", "b", S + "a", S + "b", "<sep>", "<u>")
    assert on.tokenize("a b") == [1, sa, sb] and off.tokenize("a b") == [1, a, sb]
    # a space goes in front of text after a special token (parsed control, or user-defined)
    assert on.tokenize("a<sep>b", add_special=False, parse_special=True) == [sa, sep, sb]
    assert on.tokenize("a<u>b", add_special=False) == [sa, u, sb]
    assert off.tokenize("a<u>b", add_special=False) == [a, u, b]
    # unparsed, "<sep>" is plain text: "<", "s", ... have no tokens and fall back to <unk>
    assert on.tokenize("<sep>", add_special=False) == [3] + [0] * 5
    # detokenize drops the prefix space again (only the first one)
    assert on.detokenize([sa, sb]) == "a b" and off.detokenize([sa, sb]) == " a b"
    assert on.detokenize([1, sa], remove_special=True) == " a"  # BOS removed: space stays


def test_add_eos_and_bos_flags():
    rows = [("a", -1.0, NORMAL)]
    v = spm_vocab(rows, add_space_prefix=False, add_bos_token=False, add_eos_token=True)
    assert v.tokenize("a") == [3, 2]
    assert v.tokenize("") == [2] and v.tokenize("", add_special=False) == []


def test_token_to_piece_by_type():
    rows = [(S + "a" + S, -1.0, NORMAL), ("<ctl>", 0.0, CONTROL), ("<u>", 0.0, USER),
            ("<unused>", 0.0, UNUSED), ("<0x41>", 0.0, BYTE)]
    v = spm_vocab(rows)
    assert v.token_to_piece(3) == b" a "  # normal: ▁ -> space
    assert v.token_to_piece(4) == b"" and v.token_to_piece(4, special=True) == b"<ctl>"
    assert v.token_to_piece(5) == b"<u>"  # user-defined: always its text
    assert v.token_to_piece(6) == b"" and v.token_to_piece(6, special=True) == b""  # unused
    assert v.token_to_piece(7) == b"A"  # byte token
    assert v.token_to_piece(0) == b"" and v.token_to_piece(0, special=True) == b"<unk>"
    assert v.token_to_piece(3, lstrip=1) == b"a "
    assert v.token_attr(4) == TokenAttr.CONTROL


def test_bad_metadata_is_a_clear_error():
    with pytest.raises(VocabError, match="duplicate token"):
        spm_vocab([("a", 0.0, NORMAL), ("a", 0.0, NORMAL)])
    v = spm_vocab([("<0xZZ>", 0.0, BYTE)])
    with pytest.raises(VocabError, match="byte token"):
        v.token_to_piece(3)


# -- the chunked merge is the whole-text merge ---------------------------------------------------

def reference_encode(vocab: Vocab, text: str) -> list[int]:
    """llama.cpp's SPM on one fragment, written the slow, obvious way: the whole escaped text,
    merge the best-scoring adjacent pair (leftmost on ties) until none forms a token."""
    syms = list(text.replace(" ", S))
    while True:
        best = None
        for i in range(len(syms) - 1):
            tid = vocab.token_to_id.get(syms[i] + syms[i + 1])
            if tid is not None and (best is None or vocab.scores[tid] > vocab.scores[best[1]]):
                best = (i, tid)
        if best is None:
            break
        i = best[0]
        syms[i:i + 2] = [syms[i] + syms[i + 1]]
    out: list[int] = []
    for s in syms:
        tid = vocab.token_to_id.get(s)
        if tid is not None:
            out.append(tid)
        else:
            out.extend(vocab.token_to_id[f"<0x{b:02X}>"] for b in s.encode())
    return out


@pytest.mark.parametrize("seed", range(6))
def test_chunked_merge_equals_whole_text_merge(seed):
    """Random vocabularies over a small alphabet, some tokens with "▁" inside (so the cut
    points must respect them), random texts with long space-free runs (heap path)."""
    rnd = random.Random(seed)
    texts = {"a", "b", "c", ">", S, S + S}
    while len(texts) < 60:
        word = "".join(rnd.choice("abc>") for _ in range(rnd.randint(1, 4)))
        texts.add(rnd.choice(["", S]) + word)
    for _ in range(3):  # "▁" inside a token, after ">" only: no cut may fall there
        texts.add(">" + S + "".join(rnd.choice("abc") for _ in range(rnd.randint(0, 2))))
    rows = [(t, float(np.float32(rnd.choice([-1.0, -2.0, -3.0, rnd.uniform(-9, 0)]))), NORMAL)
            for t in sorted(texts)]
    v = spm_vocab(rows, byte_tokens=True, add_space_prefix=False)
    for _ in range(40):
        words = ["".join(rnd.choice("abc>é") for _ in range(rnd.randint(1, 70)))
                 for _ in range(rnd.randint(1, 8))]
        text = (" " * rnd.randint(1, 3)).join(words)
        assert v.tokenize(text, add_special=False) == reference_encode(v, text), text


def test_heap_and_rescan_merges_agree():
    rnd = random.Random(7)
    texts = sorted({"".join(rnd.choice("ab") for _ in range(rnd.randint(2, 4))) for _ in range(12)})
    token_to_id = {t: i for i, t in enumerate(texts)}
    scores = [rnd.choice([-1.0, -2.0, -2.5]) for _ in texts]
    for _ in range(200):
        chars = [rnd.choice("ab") for _ in range(rnd.randint(0, 30))]
        assert merge_heap(chars, token_to_id, scores) == merge_simple(chars, token_to_id, scores)
