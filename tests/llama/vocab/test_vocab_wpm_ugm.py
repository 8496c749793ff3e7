"""WPM (BERT) and UGM (T5) vocabularies on tiny hand-made vocabularies, with ids computed by
hand from llama.cpp's algorithms; the UGM charsmap is built here by an independent encoder of
SentencePiece's XOR-compressed double array, and both are also read back from GGUF files."""
from __future__ import annotations

import gguf
import numpy as np
import pytest

from ggmlpy.gguf import GGUFFile
from llama.vocab import Vocab, VocabError
from llama.vocab.ugm import CharsMap

S = "\u2581"
NORMAL, UNKNOWN, CONTROL, USER, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def make_md(model: str, rows: list[tuple[str, float, int]], **keys) -> dict:
    md = {"tokenizer.ggml.model": model,
          "tokenizer.ggml.tokens": [r[0] for r in rows],
          "tokenizer.ggml.scores": np.array([r[1] for r in rows], dtype=np.float32),
          "tokenizer.ggml.token_type": np.array([r[2] for r in rows], dtype=np.int32)}
    md.update({"tokenizer.ggml." + k: v for k, v in keys.items()})
    return md


# -- WPM -----------------------------------------------------------------------------------------

WPM_ROWS = [("[PAD]", 0, CONTROL), ("[UNK]", 0, UNKNOWN), ("[CLS]", 0, CONTROL),
            ("[SEP]", 0, CONTROL), ("[MASK]", 0, CONTROL),            # 0-4
            (S + "hello", 0, NORMAL), (S + "world", 0, NORMAL),        # 5, 6
            (S + ",", 0, NORMAL), (S + "!", 0, NORMAL),                # 7, 8
            (S + "un", 0, NORMAL), ("aff", 0, NORMAL), ("able", 0, NORMAL),  # 9-11
            (S + "u", 0, NORMAL), ("n", 0, NORMAL), ("affable", 0, NORMAL),  # 12-14
            (S + "cafe", 0, NORMAL), (S + "caf", 0, NORMAL), ("é", 0, NORMAL),  # 15-17
            (S + "模", 0, NORMAL), (S + "型", 0, NORMAL), (S + "+", 0, NORMAL),  # 18-20
            (S + "5€", 0, NORMAL), (S + "ab", 0, NORMAL), (S + "Hello", 0, NORMAL)]  # 21-23

WPM_IDS = dict(bos_token_id=2, seperator_token_id=3, unknown_token_id=1, padding_token_id=0,
               mask_token_id=4)


def wpm_vocab(**keys) -> Vocab:
    return Vocab.from_metadata(make_md("bert", WPM_ROWS, **{**WPM_IDS, **keys}))


def test_wpm_defaults():
    v = Vocab.from_metadata(make_md("bert", [(f"t{i}", 0, NORMAL) for i in range(110)]))
    assert (v.bos_id, v.eos_id, v.unk_id) == (101, None, 100)
    assert (v.sep_id, v.pad_id, v.mask_id) == (102, 0, 103)
    assert v.add_bos and v.flags.add_sep and v.flags.clean_spaces and not v.flags.add_space_prefix
    assert v.linefeed_id == 0


def test_wpm_words_and_longest_match():
    v = wpm_vocab()
    # lower-cased, punctuation split off; [CLS] ... [SEP] around
    assert v.tokenize("Hello, world!") == [2, 5, 7, 6, 8, 3]
    # greedy longest match from the left: ▁un (not ▁u + n), then affable (not aff + able)
    assert v.tokenize("unaffable", add_special=False) == [9, 14]
    # a word that cannot be covered completely is one [UNK], partial matches discarded
    assert v.tokenize("unaffablez hello", add_special=False) == [1, 5]
    # whitespace of every kind separates words
    assert v.tokenize("hello\tworld\nhello\u3000world", add_special=False) == [5, 6, 5, 6]


def test_wpm_normalizer_options():
    # lowercase (default) implies strip_accents: "Café" -> "cafe"
    assert wpm_vocab().tokenize("Café", add_special=False) == [15]
    # lowercase without stripping accents: "café" -> ▁caf + é
    v = wpm_vocab(**{"normalizer.strip_accents": False})
    assert v.tokenize("Café", add_special=False) == [16, 17]
    # neither: "Hello" stays upper-case
    v = wpm_vocab(**{"normalizer.lowercase": False})
    assert v.tokenize("Hello", add_special=False) == [23]
    assert v.tokenize("café", add_special=False) == [16, 17]  # accents kept too
    assert v.tokenize("Café", add_special=False) == [1]  # no "▁Caf": the word is unknown


def test_wpm_character_classes():
    v = wpm_vocab()
    # CJK ideographs are words of their own, ASCII symbols too; a non-ASCII symbol is not
    assert v.tokenize("模型", add_special=False) == [18, 19]
    assert v.tokenize("a+b", add_special=False) == [1, 20, 1]
    assert v.tokenize("5€", add_special=False) == [21]
    # control and format characters (U+200D) vanish, joining the word around them
    assert v.tokenize("a\u200db", add_special=False) == [22]
    # a lone combining accent is dropped when stripping accents
    assert v.tokenize("a\u0301b", add_special=False) == [22]


def test_wpm_special_tokens_and_pieces():
    v = wpm_vocab()
    assert v.tokenize("hello [MASK]", parse_special=True) == [2, 5, 4, 3]
    # add_special adds [CLS]/[SEP] whatever add_bos / add_sep say (llama.cpp's WPM branch)
    v = wpm_vocab(add_bos_token=False, add_sep_token=False)
    assert v.tokenize("hello") == [2, 5, 3]
    assert v.token_to_piece(5) == b" hello" and v.token_to_piece(10) == b"aff"
    assert v.token_to_piece(2) == b"" and v.token_to_piece(2, special=True) == b"[CLS]"
    # clean_spaces: " hello , world !" loses the spaces before the punctuation
    assert v.detokenize([2, 5, 7, 6, 8, 3]) == " hello, world!"


# -- UGM: a charsmap built from scratch ----------------------------------------------------------

def build_charsmap(mapping: dict[str, str]) -> bytes:
    """SentencePiece's precompiled charsmap for `mapping`, written independently of the reader:
    a byte trie laid out as a double array where every node owns a 256-entry block, so a child
    for byte c of a node whose block starts at B sits at B + c (= B ^ c), and an entry's BASE
    is (its index XOR its own block). A key's end is a LEAF node whose block slot 0 holds the
    replacement offset with bit 31 set."""
    repl = bytearray()
    trie: dict = {}
    for key, value in mapping.items():
        node = trie
        for b in key.encode():
            node = node.setdefault(b, {})
        node[-1] = len(repl)
        repl += value.encode() + b"\0"
    entries: dict[int, int] = {}
    blocks = [256]  # next free block; block 0 holds the root entry (index 0)

    def lay_out(node: dict, index: int) -> int:
        """Give the node at `index` a block, fill its children; return its BASE."""
        block = blocks[0]
        blocks[0] += 256
        if -1 in node:
            entries[block] = (1 << 31) | node[-1]
        for b, child in node.items():
            if b == -1:
                continue
            child_index = block + b
            base = lay_out(child, child_index)
            leaf = 1 if -1 in child else 0
            entries[child_index] = (base << 10) | (leaf << 8) | b
        return index ^ block

    root_base = lay_out(trie, 0)
    entries[0] = root_base << 10
    size = blocks[0]  # whole blocks, as darts-clone sizes its arrays: any index ^ c is inside
    assert size < (1 << 21)
    xcda = np.zeros(size, dtype="<u4")
    for i, packed in entries.items():
        xcda[i] = packed
    return len(xcda.tobytes()).to_bytes(4, "little") + xcda.tobytes() + bytes(repl)


CHARSMAP = {"\uff21": "a",        # fullwidth A -> a
            "\ufb01": "bc",       # the ligature "ﬁ" -> bc (any replacement will do)
            "xy": "X", "x": "Y",  # overlapping keys: the longest wins
            "\u00a0": " ",        # no-break space -> space
            "\u00ad": ""}         # soft hyphen -> deleted

UGM_ROWS = [("<pad>", 0.0, CONTROL), ("</s>", 0.0, CONTROL), ("<unk>", 0.0, UNKNOWN),  # 0-2
            (S, -1.0, NORMAL), (S + "a", -2.0, NORMAL), (S + "ab", -3.5, NORMAL),      # 3-5
            ("a", -2.5, NORMAL), ("b", -2.5, NORMAL), ("c", -2.5, NORMAL),             # 6-8
            ("bc", -2.0, NORMAL), ("abc", -4.0, NORMAL),                               # 9, 10
            (S + "hi", -100.0, USER), (S + "h", -1.0, NORMAL), ("i", -1.0, NORMAL),    # 11-13
            ("X", -1.0, NORMAL), ("Y", -1.0, NORMAL), ("<xy>", 0.0, USER)]              # 14-16


def ugm_vocab(charsmap: dict[str, str] | None = CHARSMAP, **keys) -> Vocab:
    if charsmap is not None:
        keys["precompiled_charsmap"] = np.frombuffer(build_charsmap(charsmap), dtype=np.uint8)
    keys.setdefault("add_space_prefix", True)
    keys.setdefault("remove_extra_whitespaces", True)
    return Vocab.from_metadata(make_md("t5", UGM_ROWS, **keys))


def test_charsmap_reader_walks_the_double_array():
    cm = CharsMap(build_charsmap(CHARSMAP))
    data = "xyx\uff21".encode()
    n, off = cm.longest_match(data, 0)
    assert n == 2 and cm.replacement(off) == b"X"
    n, off = cm.longest_match(data, 2)
    assert n == 1 and cm.replacement(off) == b"Y"
    n, off = cm.longest_match(data, 3)
    assert n == 3 and cm.replacement(off) == b"a"
    assert cm.longest_match(b"q", 0) == (0, 0)


def test_ugm_defaults():
    v = ugm_vocab()
    assert (v.bos_id, v.eos_id, v.unk_id, v.pad_id) == (None, 1, 2, 0)
    assert not v.add_bos and v.add_eos


def test_ugm_viterbi_picks_the_best_total_score():
    v = ugm_vocab()
    # "▁abc": ▁a+bc = -4.0 beats ▁+abc = -5.0, ▁ab+c = -6.0, ▁+a+bc = -5.5; then </s>
    assert v.tokenize("abc") == [4, 9, 1]
    assert v.tokenize("ab", add_special=False) == [5]  # ▁ab -3.5 beats ▁a+b -4.5
    # z has no token: unknown scored min normal score - 10 = -14; ▁ab + <unk>
    assert v.tokenize("abz", add_special=False) == [5, 2]
    # consecutive unknowns collapse into one
    assert v.tokenize("zzab", add_special=False) == [3, 2, 6, 7]


def test_ugm_charsmap_normalisation_in_tokenize():
    v = ugm_vocab()
    assert v.tokenize("\uff21\ufb01", add_special=False) == [4, 9]  # -> "▁abc"
    assert v.tokenize("xyx", add_special=False) == [3, 14, 15]     # -> "▁XY"
    assert v.model.normalize("a\u00a0\u00adb") == f"{S}a{S}b".encode()


def test_ugm_whitespace_options():
    text = "  a   b  "
    cases = {(True, True): f"{S}a{S}b",
             (True, False): f"{S}{S}{S}a{S}{S}{S}b{S}{S}",  # prefix still added before "a"
             (False, True): f"{S}a{S}b",                     # merging adds one before each word
             (False, False): f"{S}{S}a{S}{S}{S}b{S}{S}"}
    for (prefix, merge), expected in cases.items():
        v = ugm_vocab(add_space_prefix=prefix, remove_extra_whitespaces=merge)
        assert v.model.normalize(text) == expected.encode(), (prefix, merge)


def test_ugm_user_defined_tokens():
    v = ugm_vocab()
    # "▁hi" is user-defined: it scores 0 in the Viterbi pass, beating ▁h + i (-2)
    assert v.tokenize("hi", add_special=False) == [11]
    # user-defined texts are cut out first, and their text is not normalised
    assert v.tokenize("a<xy>b", add_special=False) == [4, 16, 3, 7]
    # the user-defined prefix walk goes as far as the trie does ("<xy" of "<xy>"), whole
    # token or not, and leaves those bytes alone: that "xy" is not mapped, the later one is
    assert v.model.normalize("<xy xy") == f"{S}<xy{S}X".encode()
    # ... even when it stops inside a character: "\u200b" (E2 80 8B) shares its first byte
    # with "▁hi" (E2 96 81), so E2 is kept alone and the two bytes left are invalid (U+FFFD)
    assert v.model.normalize("\u200b") == S.encode() + b"\xe2" + "\ufffd\ufffd".encode()


def test_ugm_pieces_and_linefeed():
    v = ugm_vocab()
    assert v.token_to_piece(4) == b" a" and v.token_to_piece(2, special=True) == b"<unk>"
    assert v.detokenize(v.tokenize("abc")) == "abc"  # prefix space dropped, </s> empty
    assert v.linefeed_id == 3  # "\n" -> "▁" + <unk>: the first token


def test_ugm_without_charsmap():
    v = ugm_vocab(charsmap=None)
    assert v.tokenize("\uff21", add_special=False) == [3, 2]  # not mapped: ▁ + <unk>
    assert v.tokenize("xy", add_special=False) == [3, 2]


def test_ugm_bad_charsmap_is_a_clear_error():
    with pytest.raises(VocabError, match="too small"):
        ugm_vocab(charsmap=None, precompiled_charsmap=np.zeros(3, np.uint8))
    with pytest.raises(VocabError, match="out of array bounds"):
        blob = (100).to_bytes(4, "little") + bytes(8)
        ugm_vocab(charsmap=None, precompiled_charsmap=np.frombuffer(blob, np.uint8))
    with pytest.raises(VocabError, match="invalid type"):
        ugm_vocab(charsmap=None, precompiled_charsmap=np.zeros(8, np.float32))
    # a replacement offset past the strings only shows when the text reaches it
    blob = bytearray(build_charsmap({"q": "Q"}))
    xcda_size = int.from_bytes(blob[:4], "little")
    blob = blob[:4 + xcda_size] + b"\0"  # empty replacement area: offset 0 is still valid
    v = ugm_vocab(charsmap=None, precompiled_charsmap=np.frombuffer(bytes(blob), np.uint8))
    assert v.model.normalize("q") == b""  # "q" -> "": no word, so no prefix space either
    blob = blob[:-1] + b"Q"  # no terminating NUL
    v = ugm_vocab(charsmap=None, precompiled_charsmap=np.frombuffer(bytes(blob), np.uint8))
    with pytest.raises(VocabError, match="Unterminated"):
        v.tokenize("q")


# -- both from real GGUF files -------------------------------------------------------------------

def write_gguf(path, model: str, rows, charsmap: bytes | None = None, **extra) -> dict:
    w = gguf.GGUFWriter(str(path), "t5" if model == "t5" else "bert")
    w.add_tokenizer_model(model)
    w.add_token_list([r[0] for r in rows])
    w.add_token_scores([float(r[1]) for r in rows])
    w.add_token_types([r[2] for r in rows])
    if charsmap is not None:
        w.add_precompiled_charsmap(charsmap)
    for key, value in extra.items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        else:
            w.add_uint32(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dict(GGUFFile(path).metadata)


def test_from_gguf_files(tmp_path):
    md = write_gguf(tmp_path / "t5.gguf", "t5", UGM_ROWS, build_charsmap(CHARSMAP),
                    **{"tokenizer.ggml.add_space_prefix": True,
                       "tokenizer.ggml.remove_extra_whitespaces": True})
    v = Vocab.from_metadata(md)
    assert v.tokenize("\uff21\ufb01") == [4, 9, 1]
    md = write_gguf(tmp_path / "bert.gguf", "bert", WPM_ROWS,
                    **{"tokenizer.ggml." + k: val for k, val in WPM_IDS.items()},
                    **{"tokenizer.ggml.normalizer.lowercase": False})
    v = Vocab.from_metadata(md)
    assert v.tokenize("Hello, world!") == [2, 23, 7, 6, 8, 3]
