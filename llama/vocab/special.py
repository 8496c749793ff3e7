"""Special tokens: llama.cpp's text-based detection rules and the partitioning of input text.

llama.cpp does not trust GGUF files to name every end-of-turn or fill-in-the-middle token,
so after loading it looks tokens up by their text. The tables below are those rules as data
(llama_vocab::impl::load). llama.cpp walks an unordered map, so when several tokens match
one rule the winner is whichever its hash order meets first; we take the lowest id (for
SmolLM2 that is also what libstdc++'s order gives: EOT = 0 '<|endoftext|>').
"""
from __future__ import annotations

from llama.vocab.common import SpecialIds, TokenAttr

# special id slot -> token texts that fill it when the GGUF leaves it unset
DETECT_BY_TEXT: list[tuple[str, tuple[str, ...]]] = [
    ("eot", ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
             "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<\uff5cend\u2581of\u2581sentence\uff5c>",
             "<end_of_utterance>")),
    ("eom", ("<|eom_id|>",)),
    ("fim_pre", ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>",
                 "<PRE>", "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>")),
    ("fim_suf", ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>",
                 "<SUF>", "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>")),
    ("fim_mid", ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>",
                 "<MID>", "\u2581<MID>", "<|code_middle|>", "<|middle|>")),
    ("fim_pad", ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")),
    ("fim_rep", ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")),
    ("fim_sep", ("<|file_sep|>",)),
]

# token texts that end generation
EOG_TEXTS = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
))

# gpt-oss: always rendered, so forced to USER_DEFINED
FORCE_USER_DEFINED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")

_C_SPACES = " \t\n\v\f\r"  # C isspace() in the "C" locale


def detect_special_ids(ids: SpecialIds, token_to_id: dict[str, int], attrs: list[int]) -> None:
    """Fill unset EOT/EOM/FIM ids from token texts; a detected token becomes CONTROL."""
    for slot, texts in DETECT_BY_TEXT:
        if getattr(ids, slot) is not None:
            continue
        found = [token_to_id[t] for t in texts if t in token_to_id]
        if found:
            tid = min(found)
            setattr(ids, slot, tid)
            attrs[tid] |= TokenAttr.CONTROL


def mark_unused(tokens: list[str], attrs: list[int]) -> None:
    """Control tokens whose text contains "unused" are also UNUSED."""
    control = int(TokenAttr.CONTROL)  # plain ints: IntFlag arithmetic is slow on 262k tokens
    for tid, text in enumerate(tokens):
        if attrs[tid] & control and "unused" in text:
            attrs[tid] |= TokenAttr.UNUSED


def eog_ids(ids: SpecialIds, tokens: list[str], token_to_id: dict[str, int],
            attrs: list[int]) -> set[int]:
    """The end-of-generation set, with llama.cpp's model-specific exceptions."""
    eog = {i for i in (ids.fim_pad, ids.fim_rep, ids.fim_sep) if i is not None}
    for text in EOG_TEXTS:
        tid = token_to_id.get(text)
        if tid is not None:
            eog.add(tid)
            attrs[tid] |= TokenAttr.CONTROL
    for text in FORCE_USER_DEFINED:
        tid = token_to_id.get(text)
        if tid is not None:
            attrs[tid] = TokenAttr.USER_DEFINED
    eog.update(i for i in (ids.eos, ids.eot, ids.eom) if i is not None)

    by_text = {tokens[i]: i for i in eog if 0 <= i < len(tokens)}
    # o200k_harmony / solar-open: "<|end|>" ends a message, not the generation
    has_call = "<|call|>" in by_text or "<|calls|>" in by_text
    if "<|end|>" in by_text and has_call and ("<|return|>" in by_text or "<|flush|>" in by_text):
        end = by_text["<|end|>"]
        eog.discard(end)
        attrs[end] = TokenAttr.USER_DEFINED
    # gemma4 / plamo: "</s>" is a normal token there, not paddleocr's end of generation
    if ("<|tool_response>" in by_text or "<|plamo:eos|>" in by_text) and "</s>" in by_text:
        s = by_text["</s>"]
        eog.discard(s)
        attrs[s] = TokenAttr.NORMAL
    return eog


def special_token_order(tokens: list[str], attrs: list[int]) -> list[int]:
    """Control, user-defined and unknown tokens, longest UTF-8 text first (ties: lower id)."""
    mask = int(TokenAttr.CONTROL | TokenAttr.USER_DEFINED | TokenAttr.UNKNOWN)
    ids = [i for i, a in enumerate(attrs) if a & mask]
    return sorted(ids, key=lambda i: -len(tokens[i].encode("utf-8", "surrogateescape")))


def apply_strip_attrs(md: dict, tokens: list[str], token_to_id: dict[str, int],
                      attrs: list[int], special_order: list[int]) -> None:
    """LSTRIP/RSTRIP flags llama.cpp sets by model name (phi-3, jina-v2, modern-bert)."""
    name = str(md.get("general.name", "")).lower()
    pre = str(md.get("tokenizer.ggml.pre", ""))
    arch = str(md.get("general.architecture", ""))

    def set_attr(text: str, flag: TokenAttr, value: bool) -> None:
        tid = token_to_id.get(text)
        if tid is not None:
            attrs[tid] = attrs[tid] | flag if value else attrs[tid] & ~flag

    if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or \
            any(s in arch for s in ("nomic-bert-moe", "jina-bert-v3")):
        set_attr("<mask>", TokenAttr.LSTRIP, True)
    elif "phi-3" in name or "phi3" in name:
        for tid in special_order:
            attrs[tid] |= TokenAttr.RSTRIP
        set_attr("</s>", TokenAttr.RSTRIP, True)
        for text in ("<unk>", "<s>", "<|endoftext|>"):
            set_attr(text, TokenAttr.RSTRIP, False)
    elif "modern-bert" in name:
        set_attr("[MASK]", TokenAttr.LSTRIP, True)


def partition(text: str, specials: list[tuple[int, str, int]], parse_special: bool) -> list[str | int]:
    """Cut special-token texts out of `text` (llama.cpp's tokenizer_st_partition).

    `specials` are (id, text, attr) longest first. Each special token in turn splits every
    remaining text fragment at all its occurrences, left to right. Control and unknown tokens
    only take part when parse_special is set; user-defined tokens always do.
    """
    frags: list[str | int] = [text]
    # plain ints: IntFlag arithmetic costs microseconds, and this runs per special token
    skip = int(TokenAttr.CONTROL | TokenAttr.UNKNOWN)
    lstrip, rstrip = int(TokenAttr.LSTRIP), int(TokenAttr.RSTRIP)
    for tid, ttext, attr in specials:
        if not parse_special and attr & skip:
            continue
        if ttext not in text:  # cannot occur in any fragment either
            continue
        out: list[str | int] = []
        for frag in frags:
            if isinstance(frag, int) or ttext not in frag:
                out.append(frag)
                continue
            start = 0
            while True:
                m = frag.find(ttext, start)
                if m < 0:
                    if start < len(frag):
                        out.append(frag[start:])
                    break
                left = frag[start:m]
                if attr & lstrip:
                    left = left.rstrip(_C_SPACES)
                if left:
                    out.append(left)
                out.append(tid)
                start = m + len(ttext)
                if attr & rstrip:
                    while start < len(frag) and frag[start] in _C_SPACES:
                        start += 1
        frags = out
    return frags
