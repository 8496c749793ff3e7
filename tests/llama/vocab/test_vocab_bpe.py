"""BPE vocabulary against llama.cpp: SmolLM2's golden tokenization, hand-made vocabularies,
and independent re-implementations of llama.cpp's hand-written GPT-2 / LLaMA-3 splitters."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest
import regex
from hypothesis import given, settings, strategies as st

from llama.vocab import TokenAttr, TokenType, Vocab, VocabError
from llama.vocab.bpe import BYTE_TO_UNICODE, merge_heap, merge_simple, parse_merges
from llama.vocab.pretokenizers import GPT2, LLAMA3, REGEX_SETS, PreTokenizer
from llama.vocab.vocab import clean_spaces


def load_gguf_metadata(path) -> dict:
    """GGUF metadata as GGUF readers return it: ggmlpy's own reader, else the `gguf` package
    (strings as str, string arrays as lists, numeric arrays as numpy, scalars as Python)."""
    try:
        from ggmlpy.gguf import GGUFFile
    except ImportError:
        GGUFFile = None
    if GGUFFile is not None:
        return dict(GGUFFile(path).metadata)
    from gguf import GGUFReader, GGUFValueType
    md = {}
    for key, field in GGUFReader(path).fields.items():
        value = field.contents()
        if field.types[0] == GGUFValueType.ARRAY and field.types[-1] != GGUFValueType.STRING:
            value = np.asarray(value)
        md[key] = value
    return md


# -- SmolLM2 against llama.cpp's golden data ---------------------------------------------------

@pytest.fixture(scope="module")
def smollm2(smollm2_path) -> Vocab:
    return Vocab.from_metadata(load_gguf_metadata(smollm2_path))


@pytest.fixture(scope="module")
def golden(golden_dir) -> dict:
    return json.loads((golden_dir / "smollm2-135m-q4_1" / "tokenize.json").read_text())


def test_smollm2_every_golden_case(smollm2, golden):
    assert len(golden["cases"]) == 100
    for case in golden["cases"]:
        ids = smollm2.tokenize(case["text"], case["add_special"], case["parse_special"])
        assert ids == case["ids"], case


def test_smollm2_every_golden_piece(smollm2, golden):
    for tid, hexed in golden["pieces_hex"].items():
        assert smollm2.token_to_piece(int(tid), special=True).hex() == hexed, tid


def test_smollm2_special_ids(smollm2, golden_dir):
    meta = json.loads((golden_dir / "smollm2-135m-q4_1" / "meta.json").read_text())
    assert smollm2.n_vocab == meta["n_vocab"] == 49152
    assert smollm2.add_bos is meta["add_bos"] is False
    assert smollm2.add_eos is False
    assert (smollm2.bos_id, smollm2.eos_id, smollm2.unk_id, smollm2.pad_id) == (1, 2, 0, 2)
    # llama.cpp logs "EOG: 0 '<|endoftext|>', 2 '<|im_end|>', 4 '<reponame>'" (FIM repo token)
    assert smollm2.eog_ids == {0, 2, 4}
    assert smollm2.eot_id == 0 and smollm2.special.fim_rep == 4
    assert smollm2.is_eog(2) and not smollm2.is_eog(1) and not smollm2.is_eog(None)
    assert smollm2.linefeed_id == 198
    assert smollm2.token_type(1) == TokenType.CONTROL and smollm2.token_type(198) == TokenType.NORMAL
    assert smollm2.is_control(16) and not smollm2.is_control(17)
    assert len(smollm2.special_order) == 17  # llama.cpp: "special tokens cache size = 17"


def test_smollm2_round_trips(smollm2, golden):
    for case in golden["cases"]:
        ids = smollm2.tokenize(case["text"], case["add_special"], case["parse_special"])
        assert smollm2.detokenize(ids, unparse_special=True) == case["text"]
    ids = smollm2.tokenize("<|im_start|>user\nHi<|im_end|>", parse_special=True)
    assert smollm2.detokenize(ids) == "user\nHi"  # control tokens are hidden by default
    assert smollm2.token_to_piece(2) == b"" and smollm2.token_to_piece(2, special=True) == b"<|im_end|>"
    # a character split across tokens: the bytes are exact, the str has U+FFFD
    ids = smollm2.tokenize("模")
    assert len(ids) == 2 and smollm2.detokenize(ids[:1]) == "\ufffd"
    assert b"".join(smollm2.token_to_piece(i) for i in ids) == "模".encode()


def test_smollm2_bad_input(smollm2):
    with pytest.raises(VocabError, match="out of range"):
        smollm2.token_to_piece(49152)
    with pytest.raises(VocabError, match="out of range"):
        smollm2.detokenize([5, -1])
    with pytest.raises(TypeError, match="must be str"):
        smollm2.tokenize(b"bytes")
    # lone surrogates (undecodable input bytes) are read as U+FFFD, as llama.cpp reads bad UTF-8
    assert smollm2.tokenize("a\udcff") == smollm2.tokenize("a\ufffd")


# -- tiny hand-made vocabularies ---------------------------------------------------------------

def tiny_md(extra: list[tuple[str, int]], merges: list[str], pre: str = "gpt-2",
            bytes_first: bool = True, **keys) -> dict:
    """A BPE vocab: (optionally) the 256 byte characters as ids 0..255, then `extra` tokens."""
    tokens, types = [], []
    if bytes_first:
        tokens += BYTE_TO_UNICODE
        types += [1] * 256
    for text, ttype in extra:
        tokens.append(text)
        types.append(ttype)
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
          "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": np.array(types, np.int32),
          "tokenizer.ggml.merges": merges}
    md.update(keys)
    return md


def b(ch: str) -> int:
    """Id of a single byte's token in tiny_md vocabularies (bytes_first)."""
    return ch.encode()[0]


def test_merge_rank_order_decides():
    extra = [("ab", 1), ("bc", 1), ("abc", 1)]
    v1 = Vocab.from_metadata(tiny_md(extra, ["b c", "a b", "ab c"]))
    v2 = Vocab.from_metadata(tiny_md(extra, ["a b", "b c", "ab c"]))
    ab, bc, abc = 256, 257, 258
    assert v1.tokenize("abc") == [b("a"), bc]  # (b,c) has the lower rank; (a,bc) is no merge
    assert v2.tokenize("abc") == [abc]  # (a,b) first, then (ab,c)
    assert v2.tokenize("abcab") == [258, ab]


def test_merge_ties_go_left():
    v = Vocab.from_metadata(tiny_md([("aa", 1), ("aaaa", 1)], ["a a", "aa aa"]))
    assert v.tokenize("aaa") == [256, b("a")]
    assert v.tokenize("aaaa") == [257]
    assert v.tokenize("aaaaa") == [257, b("a")]
    # first duplicate merge line wins; a line without a space is the pair ("", "")
    assert parse_merges(["a b", "x", "a b", "c d"]) == {("a", "b"): 0, ("", ""): 1, ("c", "d"): 3}
    assert parse_merges([" a b"]) == {(" a", "b"): 0}
    assert list(parse_merges(["c d", "a b", "c d"])) == [("c", "d"), ("a", "b")]   # file order kept
    with pytest.raises(VocabError, match=r"merges\[1\] is int, expected str"):
        parse_merges(["a b", 5, "c d"])


def test_merge_sides_share_the_token_strings():
    """With the vocabulary's tokens, a side that is a token is that token's string object
    (one copy in memory); the ranks are the same either way."""
    tokens = ["".join(["a", "b"]), "".join(["c", "d"])]   # built at run time: not interned
    lines = ["a b", "ab cd", "ab x", "x"]
    shared = parse_merges(lines, tokens)
    assert shared == parse_merges(lines)
    pairs = list(shared)
    assert pairs[1][0] is tokens[0] and pairs[1][1] is tokens[1] and pairs[2][0] is tokens[0]
    assert pairs[0][0] is not tokens[0]   # "a" is no token: the merge's own string


def test_space_and_newline_are_byte_characters():
    v = Vocab.from_metadata(tiny_md([("Ġa", 1), ("ĊĊ", 1)], ["Ġ a", "Ċ Ċ"]))
    assert v.tokenize("a a\n\n") == [b("a"), 256, 257]
    assert v.token_to_piece(256) == b" a" and v.token_to_piece(257) == b"\n\n"


def test_byte_fallback_of_symbols_missing_from_the_vocab():
    # only some byte characters exist: x, y and Ã (the first byte character of "é" = "Ã©")
    extra = [("x", 1), ("y", 1), ("Ã", 1), ("z", 1)]
    v = Vocab.from_metadata(tiny_md(extra, ["x y"], bytes_first=False))
    x, y, a_tilde, z = range(4)
    assert v.tokenize("xy") == [x, y]  # merged "xy" is no token: its ASCII bytes are
    assert v.tokenize("é") == [a_tilde]  # "©" is C2 A9 in UTF-8: no one-byte tokens, dropped
    # a raw-byte token (GGUF text b"\xc2", decoded with surrogateescape) is found byte-wise
    v = Vocab.from_metadata(tiny_md(extra + [("\udcc2", 1)], ["x y"], bytes_first=False))
    raw_c2 = 4
    assert v.tokenize("é") == [a_tilde, raw_c2]
    assert v.tokenize("©z") == [raw_c2, z]  # "Â©": Â is C3 82, © is C2 A9
    # its piece: llama.cpp decodes the invalid byte as U+FFFD, which has no byte character
    assert v.token_to_piece(raw_c2) == b"[UNK_BYTE_0xefbfbd\xc2]"


def test_ignore_merges_and_bos_for_llama3_pre():
    extra = [("ab", 1), ("bc", 1), ("abc", 1), ("<|begin_of_text|>", 3), ("<|eot_id|>", 3)]
    md = tiny_md(extra, ["b c", "a b"], pre="llama-bpe", **{"tokenizer.ggml.bos_token_id": 259})
    v = Vocab.from_metadata(md)
    assert v.add_bos is True  # llama.cpp's default for llama3 pre-tokenizers
    assert v.tokenize("abc") == [259, 258]  # whole word is a token: merges are skipped
    assert v.tokenize("abc", add_special=False) == [258]
    assert v.tokenize("abcd", add_special=False) == [b("a"), 257, b("d")]
    md["tokenizer.ggml.add_bos_token"] = False
    md["tokenizer.ggml.add_eos_token"] = True
    md["tokenizer.ggml.eos_token_id"] = 260
    v = Vocab.from_metadata(md)
    assert v.tokenize("abc") == [258, 260]
    assert v.eog_ids == {260}


def test_special_token_partitioning():
    extra = [("<|im_end|>", 3), ("<u>", 4), ("<|endoftext|>", 1)]
    v = Vocab.from_metadata(tiny_md(extra, []))
    end, user, eot = 256, 257, 258
    assert v.tokenize("a<u>b<|im_end|>", parse_special=True) == [b("a"), user, b("b"), end]
    as_text = [b(c) for c in "<|"] + [b("i"), b("m"), b("_"), b("e"), b("n"), b("d")] + [b("|"), b(">")]
    assert v.tokenize("a<u>b<|im_end|>") == [b("a"), user, b("b")] + as_text
    # "<|endoftext|>" was NORMAL in the file; llama.cpp makes EOG-looking tokens CONTROL
    assert v.token_type(eot) == TokenType.NORMAL and v.token_attr(eot) & TokenAttr.CONTROL
    # no eos key: BPE's default EOS is id 11 (in range here), and it ends generation too
    assert v.eos_id == 11 and v.eog_ids == {11, end, eot} and v.eot_id == end
    assert v.tokenize("<|endoftext|><u>", parse_special=True) == [eot, user]
    assert v.tokenize("", add_special=True) == []


def test_partitioning_matches_gemma3_golden(gemma3_path, golden_dir):
    """Gemma3 is SPM (not this module), but its special tokens are cut out of the text by the
    shared partitioning: the control/user-defined ids of every golden case (e.g. its "\\t"
    user-defined token, always on; "<start_of_turn>" only with parse_special) must be exactly
    the token fragments of the partition."""
    from llama.vocab import special as sp
    from llama.vocab.common import ATTR_OF_TYPE, SpecialIds
    md = load_gguf_metadata(gemma3_path)
    tokens = list(md["tokenizer.ggml.tokens"])
    attrs = [int(ATTR_OF_TYPE.get(int(t), 0)) for t in np.asarray(md["tokenizer.ggml.token_type"])]
    sp.detect_special_ids(SpecialIds(), {t: i for i, t in enumerate(tokens)}, attrs)
    specials = [(i, tokens[i], attrs[i]) for i in sp.special_token_order(tokens, attrs)]
    bos = md["tokenizer.ggml.bos_token_id"]
    mask = TokenAttr.CONTROL | TokenAttr.USER_DEFINED | TokenAttr.UNKNOWN
    cases = json.loads((golden_dir / "gemma3-270m-q4_k_m" / "tokenize.json").read_text())["cases"]
    n_user = 0
    for case in cases:
        frags = sp.partition(case["text"], specials, case["parse_special"])
        expected = [i for i in case["ids"] if attrs[i] & mask]
        if case["add_special"] and expected[:1] == [bos]:
            expected = expected[1:]
        assert [f for f in frags if isinstance(f, int)] == expected, case
        n_user += sum(1 for i in expected if attrs[i] & TokenAttr.USER_DEFINED)
    assert n_user > 0


def test_phi3_special_tokens_eat_following_spaces():
    extra = [("<|end|>", 3), ("<|endoftext|>", 3)]
    v = Vocab.from_metadata(tiny_md(extra, [], **{"general.name": "Phi-3 mini"}))
    assert v.token_attr(256) & TokenAttr.RSTRIP and not v.token_attr(257) & TokenAttr.RSTRIP
    assert v.tokenize("<|end|> \n x", parse_special=True) == [256, b("x")]
    assert v.tokenize("<|endoftext|> x", parse_special=True) == [257, b(" "), b("x")]


def test_eog_and_fim_detection():
    extra = [("<|fim_prefix|>", 1), ("<|fim_pad|>", 3), ("<|repo_name|>", 3), ("<|file_sep|>", 3),
             ("<|im_end|>", 3), ("<|eom_id|>", 3), ("<unused0>", 3)]
    v = Vocab.from_metadata(tiny_md(extra, [], **{"tokenizer.ggml.eos_token_id": 256 + 4}))
    assert v.special.fim_pre == 256 and v.token_attr(256) & TokenAttr.CONTROL
    assert v.eom_id == 261
    assert v.eog_ids == {257, 258, 259, 260, 261}
    assert v.is_unused(262) and not v.is_unused(260)


def test_pieces_of_each_token_kind():
    extra = [("<ctl>", 3), ("<usr>", 4), ("<0x41>", 6), ("<gone>", 5), ("€x", 1), ("<unk>", 2)]
    v = Vocab.from_metadata(tiny_md(extra, []))
    assert v.token_to_piece(256) == b"" and v.token_to_piece(256, special=True) == b"<ctl>"
    assert v.token_to_piece(257) == b"<usr>"
    assert v.token_to_piece(258) == b"A"
    assert v.token_to_piece(259, special=True) == b""
    # a character outside GPT-2's byte table: llama_decode_text's marker
    assert v.token_to_piece(260) == b"[UNK_BYTE_0xe282ac\xe2\x82\xacx]x"
    assert v.token_to_piece(261) == b"" and v.token_to_piece(261, special=True) == b"<unk>"
    assert v.token_to_piece(b(" ")) == b" "  # token "Ġ"
    assert v.token_to_piece(0x20, lstrip=1) == b""


def test_detokenize_cleans_spaces_like_llama_cpp():
    assert clean_spaces(b"Hello , world !") == b"Hello, world!"
    assert clean_spaces(b"a ' b") == b"a'b"
    # the second pass writes NUL over the removed space; the next quote then keeps its spaces
    assert clean_spaces(b"a ' ' b") == b"a'' b"
    assert clean_spaces(b"I 'm he 's they 're we 've it 'll do 'd don 't") == \
        b"I'm he's they're we've it 'll do 'd don 't"
    assert clean_spaces(b"") == b"" and clean_spaces(b" ,") == b","
    v = Vocab.from_metadata(tiny_md([], []))  # gpt-2 pre: clean_spaces on
    assert v.flags.clean_spaces and v.detokenize(v.tokenize("x , y")) == "x, y"


def test_bad_metadata_is_named():
    with pytest.raises(VocabError, match="'rwkv'.*not supported yet"):
        Vocab.from_metadata({**tiny_md([], []), "tokenizer.ggml.model": "rwkv"})
    with pytest.raises(VocabError, match="unknown tokenizer model 'foo'"):
        Vocab.from_metadata({**tiny_md([], []), "tokenizer.ggml.model": "foo"})
    with pytest.raises(VocabError, match="unknown pre-tokenizer type 'nope'"):
        Vocab.from_metadata(tiny_md([], [], pre="nope"))
    with pytest.raises(VocabError, match="merges"):
        md = tiny_md([], [])
        del md["tokenizer.ggml.merges"]
        Vocab.from_metadata(md)
    with pytest.raises(VocabError, match="duplicate token"):
        Vocab.from_metadata(tiny_md([("a", 1)], []))
    with pytest.raises(VocabError, match="token_type"):
        Vocab.from_metadata({**tiny_md([], []), "tokenizer.ggml.token_type": np.ones(3, np.int32)})
    with pytest.raises(VocabError, match="bos_token_id is not set"):
        Vocab.from_metadata(tiny_md([], [], bytes_first=False, **{
            "tokenizer.ggml.tokens": ["a"], "tokenizer.ggml.token_type": np.ones(1, np.int32),
            "tokenizer.ggml.add_bos_token": True}))


# -- merging: the plain loop and llama.cpp's heap agree ------------------------------------------

@settings(max_examples=300, deadline=None)
@given(st.data())
def test_merge_simple_equals_heap(data):
    rng = random.Random(data.draw(st.integers(0, 2**32)))
    alphabet = "abc"
    pieces = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 3))) for _ in range(12)]
    merges = [f"{rng.choice(pieces)} {rng.choice(pieces)}" for _ in range(rng.randint(0, 20))]
    ranks = parse_merges(merges)
    word = list(data.draw(st.text(alphabet=alphabet, max_size=80)))
    assert merge_simple(word, ranks) == merge_heap(word, ranks)


# -- pre-tokenizers ----------------------------------------------------------------------------

def test_named_splits_by_hand():
    text = "Hello world's 12345!!\n\n  x"
    assert PreTokenizer([GPT2]).split(text) == \
        ["Hello", " world", "'s", " 12345", "!!", "\n\n ", " x"]
    assert PreTokenizer([LLAMA3]).split(text) == \
        ["Hello", " world", "'s", " ", "123", "45", "!!\n\n", " ", " x"]
    assert PreTokenizer.named("qwen2").split("ab 123") == ["ab", " ", "1", "2", "3"]
    assert PreTokenizer.named("starcoder").split("x12 y") == ["x", "1", "2", " y"]
    assert PreTokenizer.named("tiny-aya").split("12345") == ["12", "345"]
    # std::regex's \d is ASCII: Arabic-Indic digits wait for the collapsed \p{N}{1,3}
    assert PreTokenizer.named("tiny-aya").split("١٢٣٤٥") == ["١٢٣", "٤٥"]
    # llama.cpp's collapsed \p{S} has no '~' (Unicode has): "!~" falls apart
    assert PreTokenizer.named("deepseek-v3").split("!~") == ["!", "~"]
    assert PreTokenizer.named("superbpe").split("1234567") == ["1", "234", "567"]


@pytest.mark.parametrize("name", sorted(REGEX_SETS))
def test_every_regex_set_covers_the_text(name):
    text = "Hi there,  I'M 1234567 ok\n\r\n\t\u00a0naïve café ~$ 中文字 Ünï 🦙! ١٢٣ "
    words = PreTokenizer.named(name).split(text)
    assert "".join(words) == text and all(words)


def _cat(ch: str | None) -> tuple[bool, bool, bool]:
    if ch is None:
        return False, False, False
    return (bool(regex.match(r"\p{L}", ch)), bool(regex.match(r"\p{N}", ch)),
            bool(regex.match(r"\s", ch)))


def port_gpt2(text: str) -> list[str]:
    """llama.cpp's unicode_regex_split_custom_gpt2, transcribed code point by code point."""
    n, out, pos, prev = len(text), [], 0, 0
    at = lambda p: text[p] if 0 <= p < n else None  # noqa: E731

    def cut(end):
        nonlocal prev
        if end > prev:
            out.append(text[prev:end])
        prev = end
    while pos < n:
        c = text[pos]
        if c == "'" and pos + 1 < n:
            if at(pos + 1) in "stmd":
                pos += 2; cut(pos); continue  # noqa: E702
            if pos + 2 < n and text[pos + 1:pos + 3] in ("re", "ve", "ll"):
                pos += 3; cut(pos); continue  # noqa: E702
        f2 = _cat(at(pos + 1)) if c == " " else _cat(c)
        if f2[0] or f2[1]:
            k = 0 if f2[0] else 1
            pos += c == " "
            while _cat(at(pos))[k]:
                pos += 1
            cut(pos); continue  # noqa: E702
        if at(pos + 1 if c == " " else pos) is not None and not any(f2):
            pos += c == " "
            while at(pos) is not None and not any(_cat(at(pos))):
                pos += 1
            cut(pos); continue  # noqa: E702
        ws = 0
        while _cat(at(pos + ws))[2]:
            ws += 1
        if ws > 1 and at(pos + ws) is not None:
            pos += ws - 1
        elif ws > 0:
            pos += ws
        else:
            pos += 1
        cut(pos)
    return out


def port_llama3(text: str) -> list[str]:
    """llama.cpp's unicode_regex_split_custom_llama3, transcribed code point by code point."""
    n, out, pos, prev = len(text), [], 0, 0
    at = lambda p: text[p] if 0 <= p < n else None  # noqa: E731

    def cut(end):
        nonlocal prev
        if end > prev:
            out.append(text[prev:end])
        prev = end
    while pos < n:
        c = text[pos]
        f = _cat(c)
        if c == "'" and pos + 1 < n:
            if text[pos + 1].lower() in "stmd":
                pos += 2; cut(pos); continue  # noqa: E702
            if pos + 2 < n and text[pos + 1:pos + 3].lower() in ("re", "ve", "ll"):
                pos += 3; cut(pos); continue  # noqa: E702
        if c not in "\r\n" and not f[1] and (f[0] or _cat(at(pos + 1))[0]):
            pos += 1
            while _cat(at(pos))[0]:
                pos += 1
            cut(pos); continue  # noqa: E702
        if f[1]:
            start = pos
            while _cat(at(pos))[1]:
                pos += 1
                if pos - start >= 3:
                    cut(pos)
                    start = pos
            cut(pos); continue  # noqa: E702
        f2 = _cat(at(pos + 1)) if c == " " else f
        if not any(f2) and at(pos + 1 if c == " " else pos) is not None:
            pos += c == " "
            while at(pos) is not None and not any(_cat(at(pos))):
                pos += 1
            while at(pos) is not None and at(pos) in "\r\n":
                pos += 1
            cut(pos); continue  # noqa: E702
        ws, last_nl = 0, 0
        while _cat(at(pos + ws))[2]:
            if at(pos + ws) in "\r\n":
                last_nl = pos + ws + 1
            ws += 1
        if last_nl:
            pos = last_nl
        elif ws > 1 and at(pos + ws) is not None:
            pos += ws - 1
        elif ws > 0:
            pos += ws
        else:
            pos += 1
        cut(pos)
    return out


_ALPHABET = "aZéЖ中0٣²'sStTlLeEvVmMdD \t\n\r\u00a0\u3000.,!?-$~€\u0301🦙\x1c"


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=_ALPHABET, max_size=40))
def test_gpt2_and_llama3_regexes_equal_llama_cpp_matchers(text):
    assert PreTokenizer([GPT2]).split(text) == port_gpt2(text)
    assert PreTokenizer([LLAMA3]).split(text) == port_llama3(text)


def test_piece_cache_encodes_each_piece_once_and_drops_the_oldest():
    from llama.vocab.model import PieceCache

    cache, calls = PieceCache(2), []

    def encode_piece(piece: str) -> tuple[int, ...]:
        calls.append(piece)
        return (len(piece),)

    assert cache.encode(["a", "bb", "a"], encode_piece) == [1, 2, 1]
    assert calls == ["a", "bb"]
    cache.encode(["ccc"], encode_piece)        # full: "a", the oldest, goes
    assert cache.encode(["bb", "a"], encode_piece) == [2, 1]
    assert calls == ["a", "bb", "ccc", "a"]
