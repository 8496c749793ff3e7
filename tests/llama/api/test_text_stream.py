"""TextStream: what a stream releases is final (never a partial stop string, never half a
UTF-8 character) and concatenates to the non-streamed text."""
from hypothesis import given, settings
from hypothesis import strategies as st

from llama.api.text_stream import TextStream, complete_utf8_end


def _reference(pieces: list[bytes], stops: list[str]) -> str:
    """Generation stops at the first token after which a stop string is in the text; the
    text ends where the earliest of the stop strings found then begins."""
    data = b""
    for piece in pieces:
        data += piece
        hits = [data.find(s.encode()) for s in stops if s and s.encode() in data]
        if hits:
            return data[:min(hits)].decode("utf-8", "replace")
    return data.decode("utf-8", "replace")


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    cuts = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *cuts, len(data)]
    return [data[a:b] for a, b in zip(edges, edges[1:])]


texts = st.text(alphabet=st.sampled_from(list("ab.<|>\n é漢🙂")), max_size=40)


@settings(max_examples=300, deadline=None)
@given(texts, st.lists(st.text(alphabet=st.sampled_from(list("ab.<|>é🙂")), min_size=1, max_size=4),
                       max_size=3), st.lists(st.integers(0, 200), max_size=12))
def test_stream_concatenates_to_the_text_and_never_leaks_a_stop(text, stops, cuts):
    stream = TextStream(stops)
    out = []
    pieces = _chunks(text.encode(), cuts)
    for piece in pieces:
        released = stream.push(piece)
        out.append(released)
        shown = "".join(out)
        assert "\ufffd" not in released  # only whole characters (the input is valid UTF-8)
        assert not any(s in shown for s in stops)
        if stream.stopped:
            break
    out.append(stream.finish())
    assert "".join(out) == _reference(pieces, stops) == stream.text()


def test_a_partial_stop_is_held_back_until_it_cannot_match():
    s = TextStream(["</s>"])
    assert s.push(b"Hello <") == "Hello "
    assert s.push(b"/") == ""
    assert s.push(b"b") == "</b"
    assert s.push(b" </s> tail") == " "
    assert s.stopped and s.text() == "Hello </b "


def test_split_characters_are_held_until_complete():
    data = "é🙂".encode()
    s = TextStream()
    assert s.push(data[:1]) == ""
    assert s.push(data[1:3]) == "é"
    assert s.push(data[3:5]) == ""
    assert s.push(data[5:]) == "🙂"


def test_invalid_bytes_are_released_as_replacement_characters():
    s = TextStream()
    assert s.push(b"\xe2") == ""  # could still become a character
    assert s.push(b"a") == "\ufffda"
    assert s.finish() == ""
    assert complete_utf8_end(b"ab\xf0\x9f", 4) == 2
    assert complete_utf8_end(b"\x80\x80", 2) == 2


def test_tokens_reached_follow_the_released_bytes():
    """A token counts once a byte of it is out; once a stop string cut the text, only the
    tokens that start before the cut do (the stop string's own tokens are not text)."""
    s = TextStream(["s.\n"])
    s.push(b"one ")
    assert s.tokens_reached() == 1
    s.push(b" Paris")         # " Pari" out, "s" held back: the token is reached
    assert s.released == 9 and s.tokens_reached() == 2
    s.push(b".")
    assert s.tokens_reached() == 2
    s.push(b"\n")
    assert s.stopped and s.tokens_reached(finished=True) == 2
    t = TextStream([])
    for piece in (b"a", b"", b"\xf0\x9f"):
        t.push(piece)
    assert t.tokens_reached() == 1     # the empty piece and the split character's first half wait
    t.push(b"\x8c\x9f")
    assert t.tokens_reached() == 4
    u = TextStream([])
    u.push(b"\xf0\x9f")
    assert u.tokens_reached() == 0 and u.finish() == "\ufffd" and u.tokens_reached(finished=True) == 1


def _indent_reference(data: bytes, n_indent: int) -> int | None:
    """Where llama-server's n_indent ends the text: the first character other than a space
    or tab (its newline, for an empty line) of the first line after the first one indented
    by fewer than n_indent."""
    start = data.find(b"\n") + 1
    while start > 0:
        rest = data[start:]
        body = rest.lstrip(b" \t")
        if body and len(rest) - len(body) < n_indent:
            return start + len(rest) - len(body)
        nxt = data.find(b"\n", start)
        start = nxt + 1 if nxt >= 0 else 0
    return None


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab \t\né")), max_size=40), st.integers(1, 4),
       st.lists(st.integers(0, 200), max_size=12))
def test_n_indent_cuts_at_the_first_short_line_and_never_streams_it(text, n_indent, cuts):
    stream = TextStream()
    stream.n_indent = n_indent
    out = []
    pieces = _chunks(text.encode(), cuts)
    for piece in pieces:
        out.append(stream.push(piece))
        if stream.stopped:
            break
    out.append(stream.finish())
    cut = _indent_reference(text.encode(), n_indent)
    want = text.encode() if cut is None else text.encode()[:cut]
    assert "".join(out) == want.decode() == stream.text()
    assert stream.cut_by_indent == (cut is not None) == stream.stopped


def test_n_indent_holds_a_line_start_back_until_its_indentation_is_known():
    stream = TextStream()
    stream.n_indent = 4
    assert stream.push(b"def f():\n  ") == "def f():\n"
    assert stream.push(b"  x = 1\n") == "    x = 1\n"
    assert stream.push(b"  ") == ""
    assert stream.push(b"y = 2") == "  " and stream.cut_by_indent   # 2 < 4: the text ends
    assert stream.text() == "def f():\n    x = 1\n  "
