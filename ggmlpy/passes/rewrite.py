"""Rewrite rules as data: a pattern over a small tree of tensors, and what replaces a match.

As tinygrad's PatternMatcher: a pass is a table of `Rule(pattern, build)` rather than an
if-chain, so adding a rewrite is adding a row. `Pat` matches a tensor by op, op kind, a
predicate and (recursively) its sources, binding names to the tensors it matched; a name
used twice must bind the same tensor both times (that is how "the two matmuls share an
input" is written). `rewrite_graph` applies a rule table bottom-up over a graph, to a fixed
point at every node, and never mutates its input (common.rebuild).

    Pat("mul", src=(Pat("rms_norm", name="norm"), Pat(name="weight")))
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from ggmlpy.ir.graph import Graph
from ggmlpy.ir.ops import Kind
from ggmlpy.ir.tensor import Tensor
from ggmlpy.passes.common import PassError, op_kind, rebuild

Bindings = dict[str, Tensor]


@dataclass(frozen=True)
class Pat:
    """A tensor pattern. Every field left as None matches anything."""

    op: str | tuple[str, ...] | None = None      # op name, or any of several
    kind: Kind | tuple[Kind, ...] | None = None  # registry kind(s) of the op
    src: tuple["Pat", ...] | None = None         # the sources, in order (None: any sources)
    extra_src: bool = False                      # allow more sources than `src` lists
    commutative: bool = False                    # two sources: also try them swapped
    name: str | None = None                      # bind the matched tensor to this name
    where: Callable[[Tensor], bool] | None = None  # one more condition on the tensor

    def __post_init__(self) -> None:
        if self.commutative and (self.src is None or len(self.src) != 2):
            raise ValueError("a commutative pattern needs exactly two source patterns")


def match(pat: Pat, t: Tensor, bound: Bindings | None = None) -> Bindings | None:
    """The bindings of pat matched at t (extending `bound`), or None when it does not match."""
    return next(matches(pat, t, bound), None)


def matches(pat: Pat, t: Tensor, bound: Bindings | None = None) -> Iterator[Bindings]:
    """Every way pat matches at t, in order: one for each order of t's sources that matches
    (two at most: a commutative pattern's sources as they are, then swapped), each with the
    first bindings of its sub-patterns. A rule whose condition needs the other order of a
    commutative pattern (the residual of `add(mul_mat, mul_mat)`) takes the next one."""
    bound = dict(bound or {})
    if pat.op is not None and t.op not in ((pat.op,) if isinstance(pat.op, str) else pat.op):
        return
    if pat.kind is not None:
        kinds = (pat.kind,) if isinstance(pat.kind, Kind) else pat.kind
        if op_kind(t) not in kinds:
            return
    if pat.name is not None:
        if pat.name in bound and bound[pat.name] is not t:
            return
        bound[pat.name] = t
    if pat.where is not None and not pat.where(t):
        return
    if pat.src is None:
        yield bound
        return
    n = len(pat.src)
    if len(t.src) < n or (len(t.src) > n and not pat.extra_src):
        return
    orders = [t.src[:n]]
    if pat.commutative:
        orders.append((t.src[1], t.src[0]))
    for srcs in orders:
        result: Bindings | None = bound
        for sub, s in zip(pat.src, srcs):
            result = match(sub, s, result)
            if result is None:
                break
        if result is not None:
            yield result


Build = Callable[[Tensor, Bindings], "Tensor | None"]


@dataclass(frozen=True)
class Rule:
    """`pattern` matched at a node; `build(node, bindings)` returns its replacement: a fresh
    tensor, or one of the tensors the pattern bound below the node (which ends rewriting
    there), or None to leave the node as it is."""

    name: str
    pattern: Pat
    build: Build
    doc: str = ""


def apply_rules(rules: Sequence[Rule], t: Tensor, max_steps: int = 16) -> Tensor | None:
    """t rewritten by the first matching rule, again and again until none applies; None when
    no rule changed t. A result that is an existing tensor ends the rewriting (it is
    already final: it was rewritten when the walk passed it)."""
    cur, changed = t, False
    for _ in range(max_steps):
        for rule in rules:
            bound = match(rule.pattern, cur)
            if bound is None:
                continue
            new = rule.build(cur, bound)
            if new is not None and new is not cur:
                break
        else:
            return cur if changed else None
        if any(new is b for b in bound.values()):
            return new
        cur, changed = new, True
    raise PassError(f"rewrite rules did not settle on {t!r} after {max_steps} steps")


def rewrite_graph(graph: Graph, rules: Sequence[Rule]) -> Graph:
    """graph with every node rewritten bottom-up by `rules` (see apply_rules)."""
    return rebuild(graph, lambda t: apply_rules(rules, t))
