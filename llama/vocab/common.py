"""Names shared by the vocabulary and its tokenizer models: token types, attributes, flags."""
from __future__ import annotations

from dataclasses import dataclass, fields
from enum import IntEnum, IntFlag


class VocabError(ValueError):
    """A vocabulary that cannot be loaded or used: bad metadata, bad token id, bad input."""


class TokenType(IntEnum):
    """`tokenizer.ggml.token_type` values as GGUF stores them (llama_token_type)."""
    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


class TokenAttr(IntFlag):
    """llama.cpp's per-token attributes (llama_token_attr); what the tokenizer actually uses."""
    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    NORMALIZED = 1 << 6
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8
    SINGLE_WORD = 1 << 9


# GGUF token type -> attribute (types outside the table become UNDEFINED, as in llama.cpp)
ATTR_OF_TYPE = {
    TokenType.UNKNOWN: TokenAttr.UNKNOWN,
    TokenType.UNUSED: TokenAttr.UNUSED,
    TokenType.NORMAL: TokenAttr.NORMAL,
    TokenType.CONTROL: TokenAttr.CONTROL,
    TokenType.USER_DEFINED: TokenAttr.USER_DEFINED,
    TokenType.BYTE: TokenAttr.BYTE,
}


@dataclass
class VocabFlags:
    """Tokenizer switches; a tokenizer model sets llama.cpp's defaults, GGUF keys override."""
    add_bos: bool = False
    add_eos: bool = False
    add_sep: bool = False
    add_space_prefix: bool = False
    clean_spaces: bool = False
    escape_whitespaces: bool = True
    ignore_merges: bool = False
    remove_extra_whitespaces: bool = False


@dataclass
class SpecialIds:
    """Special token ids; None is llama.cpp's LLAMA_TOKEN_NULL."""
    bos: int | None = None
    eos: int | None = None
    eot: int | None = None
    eom: int | None = None
    unk: int | None = None
    sep: int | None = None
    pad: int | None = None
    mask: int | None = None
    fim_pre: int | None = None
    fim_suf: int | None = None
    fim_mid: int | None = None
    fim_pad: int | None = None
    fim_rep: int | None = None
    fim_sep: int | None = None

    def names(self) -> list[str]:
        return [f.name for f in fields(self)]


# GGUF keys of the special ids, in llama.cpp's reading order (later keys win).
SPECIAL_ID_KEYS = [
    ("bos", "tokenizer.ggml.bos_token_id"),
    ("eos", "tokenizer.ggml.eos_token_id"),
    ("eot", "tokenizer.ggml.eot_token_id"),
    ("eom", "tokenizer.ggml.eom_token_id"),
    ("unk", "tokenizer.ggml.unknown_token_id"),
    ("sep", "tokenizer.ggml.seperator_token_id"),  # sic: GGUF's spelling
    ("pad", "tokenizer.ggml.padding_token_id"),
    ("mask", "tokenizer.ggml.mask_token_id"),
    ("fim_pre", "tokenizer.ggml.fim_pre_token_id"),
    ("fim_suf", "tokenizer.ggml.fim_suf_token_id"),
    ("fim_mid", "tokenizer.ggml.fim_mid_token_id"),
    ("fim_pad", "tokenizer.ggml.fim_pad_token_id"),
    ("fim_rep", "tokenizer.ggml.fim_rep_token_id"),
    ("fim_sep", "tokenizer.ggml.fim_sep_token_id"),
    # deprecated spellings
    ("fim_pre", "tokenizer.ggml.prefix_token_id"),
    ("fim_suf", "tokenizer.ggml.suffix_token_id"),
    ("fim_mid", "tokenizer.ggml.middle_token_id"),
]
