"""Symbolic dimensions: integer polynomials over named symbols.

A ubatch's token count, the number of KV cells read and the number of outputs are symbols
(docs/architecture.md, decision 3), so one graph (and one compiled kernel set) serves every size.
Shapes, byte strides and view offsets are built from them with + and *; nothing in the IR
needs division. A `Dim` is a plain int or a `SymExpr`; both hash and compare by value so
signatures stay stable.
"""
from __future__ import annotations

from typing import Mapping, Union

Monomial = tuple[str, ...]  # sorted symbol names, () for the constant term


class SymExpr:
    """Sum of integer-coefficient monomials, e.g. 4*n_embd*n_tokens + 64."""

    __slots__ = ("terms", "_hash", "_text")

    def __init__(self, terms: Mapping[Monomial, int]):
        self.terms: dict[Monomial, int] = {m: c for m, c in sorted(terms.items()) if c != 0}
        self._hash = hash(tuple(self.terms.items()))
        self._text: str | None = None   # repr, made once: signatures print every shape

    @staticmethod
    def symbol(name: str) -> "SymExpr":
        return SymExpr({(name,): 1})

    @property
    def symbols(self) -> set[str]:
        return {s for m in self.terms for s in m}

    def eval(self, env: Mapping[str, int]) -> int:
        total = 0
        for mono, coef in self.terms.items():
            v = coef
            for s in mono:
                v *= env[s]
            total += v
        return total

    def __add__(self, other: "Dim") -> "Dim":
        out = dict(self.terms)
        for m, c in _terms(other).items():
            out[m] = out.get(m, 0) + c
        return simplify(SymExpr(out))

    __radd__ = __add__

    @staticmethod
    def _sorted(terms: dict[Monomial, int]) -> "SymExpr":
        """A SymExpr of terms already sorted and without zeros (skips __init__'s work)."""
        e = SymExpr.__new__(SymExpr)
        e.terms = terms
        e._hash = hash(tuple(terms.items()))
        e._text = None
        return e

    def __mul__(self, other: "Dim") -> "Dim":
        if isinstance(other, int):   # strides: by far the most common product (order kept)
            return SymExpr._sorted({m: c * other for m, c in self.terms.items()}) if other else 0
        out: dict[Monomial, int] = {}
        for m1, c1 in self.terms.items():
            for m2, c2 in _terms(other).items():
                m = tuple(sorted(m1 + m2))
                out[m] = out.get(m, 0) + c1 * c2
        return simplify(SymExpr(out))

    __rmul__ = __mul__

    def __sub__(self, other: "Dim") -> "Dim":
        return self + (-1) * other

    def __eq__(self, other: object) -> bool:
        if isinstance(other, int):
            return self.terms == _terms(other)
        return isinstance(other, SymExpr) and self.terms == other.terms

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):
        """Pickled as its terms: the hash is made again where it is loaded (a string's hash
        differs from process to process, so a stored one would not find its equals)."""
        return SymExpr, (self.terms,)

    def __repr__(self) -> str:
        if self._text is None:
            self._text = self._format()
        return self._text

    def _format(self) -> str:
        parts = []
        for mono, coef in self.terms.items():
            factors = list(mono)
            if coef != 1 or not factors:
                factors.insert(0, str(coef))
            parts.append("*".join(factors))
        return " + ".join(parts) if parts else "0"


Dim = Union[int, SymExpr]


def _terms(x: Dim) -> dict[Monomial, int]:
    if isinstance(x, SymExpr):
        return x.terms
    return {(): int(x)} if x else {}


def simplify(x: Dim) -> Dim:
    """A SymExpr without symbols becomes a plain int."""
    if isinstance(x, SymExpr) and all(m == () for m in x.terms):
        return x.terms.get((), 0)
    return x


def is_static(x: Dim) -> bool:
    return not isinstance(x, SymExpr)


def evaluate(x: Dim, env: Mapping[str, int]) -> int:
    return x.eval(env) if isinstance(x, SymExpr) else int(x)


def evaluate_params(value, env: Mapping[str, int]):
    """Op parameters with every symbolic value (possibly inside tuples) evaluated."""
    if isinstance(value, SymExpr):
        return value.eval(env)
    if isinstance(value, tuple):
        return tuple(evaluate_params(v, env) for v in value)
    if isinstance(value, dict):
        return {k: evaluate_params(v, env) for k, v in value.items()}
    return value


def dim_str(x: Dim) -> str:
    return str(x) if isinstance(x, int) else repr(x)


# The symbols the llama runtime uses (docs/architecture.md, decision 3).
N_TOKENS = SymExpr.symbol("n_tokens")
N_KV = SymExpr.symbol("n_kv")
N_OUTPUTS = SymExpr.symbol("n_outputs")
# Cells read from the separate sliding-window cache of an iSWA model (llama.cpp's
# llama_kv_cache_iswa): smaller than the main cache, so it needs its own symbol.
N_KV_SWA = SymExpr.symbol("n_kv_swa")
