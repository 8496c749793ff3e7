"""Pre-tokenizers: the regex sets that cut text into words before BPE, per `tokenizer.ggml.pre`.

llama.cpp (`llm_tokenizer_bpe` in llama-vocab.cpp, `unicode_regex_split` in unicode.cpp) runs
a list of regexes one after the other; each one re-splits every piece the previous ones left,
and the text between matches stays a piece of its own. How a regex is run decides its exact
behaviour, and llama.cpp has three ways, which this module reproduces:

* "unicode": the GPT-2, LLaMA-3 and Kimi K2 regexes have hand-written matchers in llama.cpp whose
  character classes come from tables generated with Python's `regex` module (`\\s`, `\\p{L}`,
  `\\p{N}`). Running the same regex with `regex` on the original text gives the same pieces
  (tests/llama/vocab/test_vocab_bpe.py checks this against a transcription of those matchers); only
  characters whose category differs between the two Unicode versions could split otherwise.
* "collapsed": any other regex that uses `\\p{..}` runs in `std::regex` on a copy of the text
  where every non-ASCII character is replaced by one placeholder byte per category (letter,
  number, punctuation, mark, symbol, other; whitespace becomes `\\v`), and each `\\p{X}` in the
  regex becomes `[placeholder + the ASCII members llama.cpp lists]`. The ASCII lists are not
  Unicode's: `~` is not a symbol there, and `\\s`, `\\d`, `\\b` are ASCII-only. We build the
  same collapsed text and regex and run them with `regex.ASCII`.
* "wide": a regex without `\\p{..}` runs in `std::wregex` on the code points, with non-ASCII
  whitespace replaced by `\\v` (so `\\s` still sees it); again ASCII-only classes.
"""
from __future__ import annotations

from dataclasses import dataclass

import regex

from llama.vocab.common import VocabError

# --- regex texts, exactly as llama.cpp writes them (C escapes undone) -----------------------

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_ORIGINAL = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
JAIS2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)"
         r"|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}")
# Upper/lower-case runs spelled with look-aheads, because llama.cpp's collapsed classes cannot
# tell \p{Lu} from \p{Ll}: non-ASCII letters count as both cases.
_UPPER_LOWER = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
                r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*")
TEKKEN = _UPPER_LOWER + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
GPT4O = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + _CONTRACTIONS + "?"
         r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + _CONTRACTIONS + "?"
         r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GRANITE_EMB_MULTI = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+" + _CONTRACTIONS
    + r"?|[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))+((?=[\p{L}\p{M}])([^A-Z]))*"
    + _CONTRACTIONS + r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_CASED = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
          + _CONTRACTIONS + r"?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
          r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + _CONTRACTIONS + "?")
TINY_AYA = _CASED + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
BAILINGMOE = (r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+")
SEED_CODER = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
UFAKZEKA = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
EXAONE_MOE = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+")
MINICPM5 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_ASCII_PUNCT_WORD = r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+"""
DEEPSEEK3 = (_ASCII_PUNCT_WORD + r"|[^" "\r\n" r"\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
             r"| ?[\p{P}\p{S}]+[" "\r\n" r"]*|\s*[" "\r\n" r"]+|\s+(?!\S)|\s+")
SPARK2_5 = (_ASCII_PUNCT_WORD + r"|[^" "\r\n" r"\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
            r"| ?[\p{P}\p{S}]+|[" "\r\n" r"]|\s+(?!\S)|\s+")
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_KANA_HAN = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
# DeepSeek-LLM's explicit list of cased-letter ranges (Latin, Greek, Cyrillic, ...).
_DEEPSEEK_LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
    "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c"
    "\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5"
    "\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
    "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59"
    "\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc"
    "\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
    "\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee"
    "\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e"
    "\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a"
    "\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
    "\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943")
_DEEPSEEK_PUNCT = "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+"
_PORO = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"

# runs of non-newlines and runs of newlines: SPM-style BPE cuts text only here
LINES = "[^\\n]+|[\\n]+"

# Kimi K2: llama.cpp's hand-written matcher (unicode_regex_split_custom_kimi_k2) rather than
# the tiktoken pattern it stands for: runs of Han characters (its unicode_cpt_is_han ranges),
# then any non-Han letters as one run whatever their case, with a contraction
_HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002a6df\U0002a700-\U0002ebef\U0002f800-\U0002fa1f"
KIMI_K2 = ("[" + _HAN + r"]+|[^\r\n\p{L}\p{N}]?[\p{L}--[" + _HAN + "]]+" + _CONTRACTIONS
           + r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

DEFAULT_SET = ["[\\p{P}\\$\\+<=>\\^~\\|]+", GPT2, "\\p{N}+", "[0-9][0-9][0-9]"]

# regex set name -> the regexes, in the order llama.cpp applies them
REGEX_SETS: dict[str, list[str]] = {
    "default": DEFAULT_SET,
    "gpt2": [GPT2],
    "llama3": [LLAMA3],
    "jais2": [JAIS2],
    "deepseek-llm": ["[\r\n]", "\\s?[" + _DEEPSEEK_LETTERS + "]+", _DEEPSEEK_PUNCT,
                     "\\s+$", _CJK, "\\p{N}+"],
    "deepseek-coder": ["[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", _CJK, "\\p{N}"],
    "deepseek-v3": ["\\p{N}{1,3}", _KANA_HAN, DEEPSEEK3],
    "spark2_5": ["\\p{N}{1,3}", _KANA_HAN, SPARK2_5, "\\p{N}"],
    "falcon": ["[\\p{P}\\$\\+<=>\\^~\\|`]+", GPT2, "[0-9][0-9][0-9]"],
    "starcoder": ["\\p{N}", GPT2],
    "qwen2": [QWEN2],
    "qwen35": [QWEN35],
    "poro": [_PORO],
    "viking": [_PORO, "\\p{N}"],
    "tekken": [TEKKEN],
    "chameleon": ["<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
                  "([\\t\\n]|    |  )", "\\p{N}", "[\\p{P}!-/:-@\\[-`{-~]", GPT2],
    "gpt-4o": [GPT4O],
    "granite-emb-multi": [GRANITE_EMB_MULTI],
    "tiny-aya": ["\\d{1,3}(?=(?:\\d{3})*\\b)", TINY_AYA],
    "superbpe": ["\\p{N}+", "(?=(\\d{3})+(?!\\d))"],
    "bailingmoe": [BAILINGMOE],
    "seed-coder": [SEED_CODER],
    "ufakzeka": [UFAKZEKA],
    "exaone-moe": [EXAONE_MOE],
    "laguna": [LINES, QWEN2],
    "lines": [LINES],
    "minicpm5": ["\\p{N}{1,3}", MINICPM5],
    "kimi-k2": [KIMI_K2],
}


@dataclass(frozen=True)
class PreSpec:
    """What a `tokenizer.ggml.pre` name selects: the regex set and the flags llama.cpp sets."""
    regex_set: str
    clean_spaces: bool = True
    ignore_merges: bool = False
    add_bos: bool = False
    add_sep: bool = False
    null_bos: bool = False  # chatglm: no BOS token at all
    # SPM-style BPE (gemma4, sarvam-moe): spaces written as U+2581 before merging, merges over
    # raw UTF-8 characters (no GPT-2 byte characters), <0xXX> tokens for bytes no token
    # covers, U+2581 back to a space in pieces
    spm_style: bool = False
    # llama.cpp's Gemma 4 fixes: a run of newlines that is a token is that token whatever the
    # merges say, and add_bos is forced on even when the file says false
    gemma4: bool = False


def _specs() -> dict[str, PreSpec]:
    """`tokenizer.ggml.pre` values -> PreSpec, transcribed from llama_vocab::impl::load."""
    table: dict[str, PreSpec] = {"default": PreSpec("default")}

    def add(names: str, spec: PreSpec) -> None:
        for name in names.split():
            table[name] = spec

    add("llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano",
        PreSpec("llama3", ignore_merges=True, add_bos=True))
    add("dbrx smaug-bpe", PreSpec("llama3"))
    add("deepseek-llm", PreSpec("deepseek-llm", clean_spaces=False))
    add("deepseek-coder", PreSpec("deepseek-coder", clean_spaces=False))
    add("deepseek-v3 hunyuan-dense hy_v4 joyai-llm", PreSpec("deepseek-v3", clean_spaces=False))
    add("spark2_5", PreSpec("spark2_5", clean_spaces=False))
    add("falcon", PreSpec("falcon"))
    add("mpt olmo jais gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de "
        "a.x-4.0 mellum modern-bert exaone4", PreSpec("gpt2"))
    add("trillion granite-docling", PreSpec("gpt2", clean_spaces=False))
    add("jina-v1-en jina-v2-code roberta-bpe", PreSpec("gpt2", add_sep=True))
    add("jais-2", PreSpec("jais2"))
    add("starcoder refact codeshell exaone minerva-7b mellum2", PreSpec("starcoder"))
    add("command-r smollm", PreSpec("starcoder", clean_spaces=False))
    add("qwen2 deepseek-r1-qwen kormo f2llmv2 hunyuan solar-open grok-2",
        PreSpec("qwen2", clean_spaces=False))
    add("stablelm2 megrez", PreSpec("qwen2"))
    add("qwen35", PreSpec("qwen35", clean_spaces=False))
    add("poro-chat", PreSpec("poro", clean_spaces=False))
    add("bloom gpt3-finnish", PreSpec("poro"))
    add("glm4 chatglm-bpe", PreSpec("llama3", null_bos=True))
    add("viking", PreSpec("viking", clean_spaces=False))
    add("tekken", PreSpec("tekken", clean_spaces=False, ignore_merges=True, add_bos=True))
    add("chameleon", PreSpec("chameleon", clean_spaces=False, add_bos=True))
    add("gpt-4o llama4 kanana2 talkie minimax-m2", PreSpec("gpt-4o", clean_spaces=False))
    add("granite-embed-multi-97m",
        PreSpec("granite-emb-multi", clean_spaces=False, ignore_merges=True))
    add("tiny_aya cohere2moe", PreSpec("tiny-aya", clean_spaces=False))
    add("superbpe", PreSpec("superbpe", clean_spaces=False))
    add("bailingmoe bailingmoe2 llada-moe", PreSpec("bailingmoe", clean_spaces=False))
    add("seed-coder", PreSpec("seed-coder", clean_spaces=False))
    add("ufakzeka", PreSpec("ufakzeka", clean_spaces=False))
    add("exaone-moe", PreSpec("exaone-moe"))
    add("laguna", PreSpec("laguna", clean_spaces=False))
    add("minicpm5", PreSpec("minicpm5", ignore_merges=True))
    add("kimi-k2", PreSpec("kimi-k2", clean_spaces=False))
    add("gemma4 granite-embed-multi-311m", PreSpec("lines", spm_style=True, gemma4=True))
    add("sarvam-moe", PreSpec("lines", clean_spaces=False, spm_style=True))
    return table


PRE_SPECS = _specs()
# known to llama.cpp but needing code beyond a regex set (custom matchers, no byte encoding)
UNSUPPORTED_PRE = {"afmoe", "whitespace", "youtu"}


def pre_spec(name: str | None) -> PreSpec:
    """The PreSpec for a `tokenizer.ggml.pre` value; llama.cpp uses 'default' when absent."""
    if name is None or name == "":
        return PRE_SPECS["default"]
    if name in PRE_SPECS:
        return PRE_SPECS[name]
    if name in UNSUPPORTED_PRE:
        raise VocabError(f"pre-tokenizer '{name}' (tokenizer.ggml.pre) is known to llama.cpp "
                         "but not supported here yet")
    raise VocabError(f"unknown pre-tokenizer type '{name}' (tokenizer.ggml.pre)")


# --- llama.cpp's collapsed representation ------------------------------------------------

_CATEGORY_PLACEHOLDER = {"N": "\xd1", "L": "\xd2", "P": "\xd3", "M": "\xd4", "S": "\xd5"}
_OTHER_PLACEHOLDER = "\xd0"
_VT = 0x0B
# ASCII members llama.cpp gives each category inside a collapsed class (k_ucat_map)
_ASCII_MEMBERS = {"N": "0-9", "L": "A-Za-z", "P": "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}", "M": "",
                  "S": "\\$\\+<->^`\\|"}
# \p{..} names llama.cpp collapses, and the category each stands for
_COLLAPSIBLE = {"N": "N", "L": "L", "P": "P", "M": "M", "S": "S",
                "Lu": "L", "Ll": "L", "Lt": "L", "Lm": "L", "Lo": "L"}
_CATEGORY_TESTS = [(c, regex.compile(r"\p{%s}" % c)) for c in "NLPMS"]
_WHITESPACE = regex.compile(r"\s")


class _CollapseTable(dict):
    """str.translate table mapping a code point to its collapsed form, filled on first use."""

    def __init__(self, whitespace_only: bool):
        super().__init__((i, i) for i in range(128))
        self.whitespace_only = whitespace_only

    def __missing__(self, cpt: int) -> int:
        ch = chr(cpt)
        if _WHITESPACE.match(ch):
            out = _VT
        elif self.whitespace_only:
            out = cpt
        else:
            out = ord(next((_CATEGORY_PLACEHOLDER[c] for c, rx in _CATEGORY_TESTS if rx.match(ch)),
                           _OTHER_PLACEHOLDER))
        self[cpt] = out
        return out


_COLLAPSED = _CollapseTable(whitespace_only=False)
_WIDE = _CollapseTable(whitespace_only=True)


def collapse_regex(expr: str) -> str:
    """llama.cpp's rewrite of `\\p{X}` into placeholder classes, including its `[` tracking."""
    out = []
    inside = False
    i = 0
    while i < len(expr):
        ch = expr[i]
        if ch == "[" and (i == 0 or expr[i - 1] != "\\"):
            out.append("[")
            inside = True
        elif inside and ch == "]" and expr[i - 1] != "\\":
            out.append("]")
            inside = False
        elif ch == "\\" and i + 3 < len(expr) and expr[i + 1] == "p" and expr[i + 2] == "{":
            close = expr.find("}", i + 3)
            name = expr[i + 3:close] if close != -1 and close <= i + 10 else None
            if name in _COLLAPSIBLE:
                cat = _COLLAPSIBLE[name]
                body = _CATEGORY_PLACEHOLDER[cat] + _ASCII_MEMBERS[cat]
                out.append(body if inside else "[" + body + "]")
                i = close + 1
                continue
            out.append(ch)
        else:
            out.append(ch)
        i += 1
    return "".join(out)


# the regexes run as "unicode" (llama.cpp's hand-written matchers), with their flags (Kimi K2's
# set difference needs the regex module's VERSION1 syntax)
UNICODE_FLAGS = {GPT2: 0, LLAMA3: 0, LLAMA3_ORIGINAL: 0, KIMI_K2: regex.V1}


@dataclass(frozen=True)
class _Rule:
    mode: str  # "unicode", "collapsed" or "wide"
    rx: regex.Pattern
    splitter: regex.Pattern | None  # "(rx)" for regex.split, when that gives the same pieces


def _compile(expr: str) -> _Rule:
    """Pick llama.cpp's way of running `expr` (see the module docstring) and compile it."""
    if expr in UNICODE_FLAGS:
        mode, flags = "unicode", UNICODE_FLAGS[expr]
    else:
        if expr.endswith("$") and not expr.endswith("\\$"):
            expr = expr[:-1] + "\\Z"  # std::regex's '$' is the end of the input only
        flags = regex.ASCII
        mode = "wide"
        if any("\\p{" + name + "}" in expr for name in _COLLAPSIBLE):
            mode, expr = "collapsed", collapse_regex(expr)
    rx = regex.compile(expr, flags)
    # regex.split with one group returns gaps and matches in C; only valid when the regex has
    # no groups of its own and cannot match the empty string (no look-ahead-only branches)
    splitter = regex.compile("(" + expr + ")", flags) if rx.groups == 0 and "(?=" not in expr else None
    return _Rule(mode, rx, splitter)


class PreTokenizer:
    """Splits text into words with one regex set, the way llama.cpp's unicode_regex_split does."""

    def __init__(self, exprs: list[str]):
        self.exprs = list(exprs)
        self._rules = [_compile(e) for e in exprs]

    @classmethod
    def named(cls, regex_set: str) -> "PreTokenizer":
        return cls(REGEX_SETS[regex_set])

    def split(self, text: str) -> list[str]:
        """The words of `text` in order; their concatenation is `text`.

        Each regex runs on each piece separately, as llama.cpp runs it on each offset range.
        A piece's collapsed form has the same length, so match positions carry over.
        """
        pieces = [text] if text else []
        for rule in self._rules:
            out: list[str] = []
            for piece in pieces:
                if rule.mode == "unicode" or piece.isascii():
                    if rule.splitter is not None:
                        out.extend(w for w in rule.splitter.split(piece) if w)
                    else:
                        _split_spans(rule.rx, piece, piece, out)
                else:
                    table = _COLLAPSED if rule.mode == "collapsed" else _WIDE
                    _split_spans(rule.rx, piece.translate(table), piece, out)
            pieces = out
        return pieces


def _split_spans(rx: regex.Pattern, subject: str, piece: str, out: list[str]) -> None:
    """Append the matches of rx in subject and the gaps between them, cut from piece."""
    pos = 0
    for m in rx.finditer(subject):
        a, b = m.span()
        if a > pos:
            out.append(piece[pos:a])
        if b > a:
            out.append(piece[a:b])
        pos = max(pos, b)
    if pos < len(piece):
        out.append(piece[pos:])
