"""Fusion: mark groups of nodes that one kernel should compute. Nothing is lowered here.

Representation (what a code generator reads)
---------------------------------------------
The graph keeps every node; the pass adds `graph.hints["fusion_groups"]`, a tuple of
`FusionGroup(pattern, nodes, inputs, outputs)` in graph order, each field a tuple of
positions in `graph.tensors`:
  - `pattern`: the kind of group, a key of patterns.FUSED_KINDS ("norm_mul", ...): the
    rule that formed it, and the emitter a backend uses;
  - `nodes`: the ops the kernel computes, in order; they are consecutive among
    `graph.nodes` (the pass reorders the graph, keeping every dependency, so that they are);
  - `inputs`: the tensors the group reads from outside (weights, activations, views);
  - `outputs`: the members whose values leave the group (read by other nodes, or graph
    outputs). Every other member is interior: it is never materialised, so it gets no
    memory (buffers.py) and the kernel keeps it in registers or a tile.
`fusion_groups(graph)` turns the positions back into tensors and checks they still fit.
Because every node stays, a backend without a fused emitter (and the reference backend)
runs the graph as it is, node by node; positions are id-free, so the groups are part of the
graph's signature. Any later pass that changes the tensor list drops the annotation
(common.new_graph), so fusion runs last among the rewriting passes.

Rules are data: a pattern per group root and the bound names that are members, named once
in passes/patterns.py; a backend composes its rule set from those patterns and its kernel
predicates (`FusionRule.where`) in its own package and hands it to the engine: the CPU's to
the graph pass (`mark_fusion_groups(graph, rules)`, pipeline.py takes the rules of the
backends that run the pass: Backend.fusion_rules), the CUDA's to `group_nodes` over each of
its splits after scheduling (codegen_cuda/fusion.py, docs/backends.md section 4). A member
that is not a root must have no reader outside its group. A node joins at most one group
(earlier rules win), and a group is refused when running it as one step would need a value
it produces (a cycle through other nodes). Each backend receives the groups it runs fused
through one hook, Backend.split_groups.
"""
from __future__ import annotations

import hashlib
import heapq
import inspect
import sys
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Callable, Iterator, Mapping, Protocol, Sequence

from ggmlpy.ir.graph import Graph
from ggmlpy.ir.ops import Kind
from ggmlpy.ir.tensor import Flag, Tensor
from ggmlpy.passes.common import (
    FUSION_HINT, PassError, consumers, deps, memory_order_edges, op_kind,
)
from ggmlpy.passes.rewrite import Bindings, Pat, match


@dataclass(frozen=True)
class FusionGroup:
    """One fused kernel, by positions in graph.tensors (see the module docstring)."""

    pattern: str
    nodes: tuple[int, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


@dataclass
class ResolvedGroup:
    """A FusionGroup with tensors instead of positions."""

    pattern: str
    nodes: list[Tensor]
    inputs: list[Tensor]
    outputs: list[Tensor]

    @property
    def interior(self) -> list[Tensor]:
        out = {t.id for t in self.outputs}
        return [t for t in self.nodes if t.id not in out]


Candidate = tuple[list[Tensor], list[Tensor]]  # (members in graph order, roots)


@dataclass
class MatchContext:
    """What a rule's candidates see: the tensors to group in order (a graph's, or one split's
    nodes), their readers anywhere in the graph, the ids already in a group, the graph's hints."""

    tensors: list[Tensor]
    position: dict[int, int]
    users: dict[int, list[Tensor]]
    claimed: set[int]
    hints: Mapping[str, object] = field(default_factory=dict)

    def is_output(self, t: Tensor) -> bool:
        """Whether t's value is needed beyond these tensors: a graph output, or read by a node
        that is not one of them (of another split)."""
        return bool(t.flags & Flag.OUTPUT) or any(u.id not in self.position for u in self.users.get(t.id, ()))

    def only_consumer(self, t: Tensor) -> Tensor | None:
        """t's one reader, when t has exactly one and is needed nowhere else."""
        users = self.users.get(t.id, [])
        return users[0] if len(users) == 1 and not self.is_output(t) else None

    def free(self, *ts: Tensor) -> bool:
        """Whether every t is one of the tensors to group and in no group yet."""
        return all(t.id in self.position and t.id not in self.claimed for t in ts)


Predicate = Callable[[Bindings, "MatchContext"], bool]  # (bindings of a match, its context)


@dataclass(frozen=True)
class Both:
    """Two predicates, both of which must hold (FusionRule.where)."""

    first: Predicate
    second: Predicate

    def __call__(self, b: Bindings, ctx: "MatchContext") -> bool:
        return self.first(b, ctx) and self.second(b, ctx)


@dataclass(frozen=True)
class FusionRule:
    """Groups whose roots match `roots` (several roots: sibling ops fused side by side, bound
    names shared between them); `members` are the bound names the kernel computes."""

    name: str
    roots: tuple[Pat, ...]
    members: tuple[str, ...]
    check: Predicate | None = None
    doc: str = ""
    views_and_writes: bool = False  # members may be views and writes (see _acceptable)

    def where(self, check: Predicate) -> "FusionRule":
        """This pattern with one more condition: a backend's kernel predicate."""
        return replace(self, check=check if self.check is None else Both(self.check, check))

    def candidates(self, ctx: MatchContext) -> Iterator[Candidate]:
        per_root = [[(t, b) for t in ctx.tensors if not t.is_leaf and (b := match(p, t)) is not None]
                    for p in self.roots]
        for combo in _combinations(per_root, ctx.position):
            bound: Bindings | None = {}
            for _, b in combo:
                bound = _merge(bound, b)
                if bound is None:
                    break
            if bound is None or (self.check is not None and not self.check(bound, ctx)):
                continue
            members = sorted({bound[n].id: bound[n] for n in self.members}.values(),
                             key=lambda t: ctx.position[t.id])
            yield members, [t for t, _ in combo]


@dataclass(frozen=True)
class ChainRule:
    """Maximal chains of ops of `kinds` where each link is the only reader of the previous
    one and has its shape (broadcast operands are inputs of the chain)."""

    name: str
    kinds: tuple[Kind, ...] = (Kind.ELEMENTWISE,)
    exclude: tuple[str, ...] = ("cont",)  # copies that change layout are not chain links
    min_length: int = 2
    doc: str = ""
    views_and_writes: bool = False
    ops: tuple[str, ...] = ()  # when given, the ops that are links (instead of `kinds`)
    link: Callable[[Tensor, Tensor], bool] | None = None  # (previous, next): one more condition

    def _eligible(self, t: Tensor, ctx: MatchContext) -> bool:
        of_kind = t.op in self.ops if self.ops else op_kind(t) in self.kinds
        return of_kind and t.op not in self.exclude and ctx.free(t)

    def candidates(self, ctx: MatchContext) -> Iterator[Candidate]:
        for t in ctx.tensors:
            if not self._eligible(t, ctx):
                continue
            chain = [t]
            while not chain[-1].flags & Flag.OUTPUT:
                users = ctx.users[chain[-1].id]
                if len(users) != 1 or not self._eligible(users[0], ctx) or users[0].ne != t.ne \
                        or users[0] in chain or (self.link is not None and not self.link(chain[-1], users[0])):
                    break
                chain.append(users[0])
            if len(chain) >= self.min_length:
                yield chain, [chain[-1]]


def _combinations(per_root, position) -> Iterator[list]:
    """One match per root pattern, distinct nodes in increasing graph order."""
    def rec(i: int, chosen: list) -> Iterator[list]:
        if i == len(per_root):
            yield list(chosen)
            return
        after = position[chosen[-1][0].id] if chosen else -1
        for t, b in per_root[i]:
            if position[t.id] > after:
                chosen.append((t, b))
                yield from rec(i + 1, chosen)
                chosen.pop()
    return rec(0, [])


def _merge(a: Bindings | None, b: Bindings) -> Bindings | None:
    """Both bindings together, or None when a shared name binds different tensors."""
    if a is None:
        return None
    out = dict(a)
    for k, v in b.items():
        if k in out and out[k] is not v:
            return None
        out[k] = v
    return out


# the pass -------------------------------------------------------------------------------------
class Rule(Protocol):
    """What the engine asks of a rule (FusionRule, ChainRule, the CUDA rules of
    codegen_cuda/fusion_rules.py):
    its name (the groups' pattern), whether members may be views and writes, and candidate
    groups (members in order, and the roots: members whose values may be read outside),
    preferred ones first; the engine takes each that is still acceptable when yielded."""

    name: str
    views_and_writes: bool

    def candidates(self, ctx: MatchContext) -> Iterator[Candidate]: ...


def mark_fusion_groups(graph: Graph, rules: Sequence[Rule]) -> Graph:
    """graph (same tensors, reordered so that each group is consecutive) with the fusion
    groups `rules` form in hints["fusion_groups"]; an earlier annotation is replaced."""
    tensors = list(graph.tensors)
    order, groups = group_nodes(tensors, consumers(tensors), rules, graph.hints)
    hints = dict(graph.hints)
    hints[FUSION_HINT] = _annotations(order, groups, consumers(order))
    return Graph(list(graph.outputs), order, hints)


def group_nodes(tensors: list[Tensor], users: dict[int, list[Tensor]], rules: Sequence[Rule],
                hints: Mapping[str, object] | None = None) -> tuple[list[Tensor], list[tuple[str, list[Tensor]]]]:
    """The groups `rules` form among `tensors` (a graph's, or one split's nodes in order),
    as (pattern, members in order), and an order of the tensors that keeps every dependency
    among them and runs each group's members consecutively. `users`: readers of every tensor
    anywhere in the graph (a reader that is not in `tensors` needs the value: see
    MatchContext.is_output)."""
    position = {t.id: i for i, t in enumerate(tensors)}
    ctx = MatchContext(tensors, position, users, set(), hints if hints is not None else {})
    preds, succs = _dependencies(tensors, position)
    groups: list[tuple[str, list[Tensor]]] = []
    group_of: dict[int, int] = {}
    for rule in rules:
        for members, roots in rule.candidates(ctx):
            if _acceptable(members, roots, ctx, rule.views_and_writes) and \
                    not _creates_cycle(members, groups, group_of, succs, position):
                for m in members:
                    ctx.claimed.add(m.id)
                    group_of[m.id] = len(groups)
                groups.append((rule.name, members))
    if not groups:
        return list(tensors), groups
    return _contiguous_order(tensors, groups, group_of, preds, position), groups


def rules_key(rules: Sequence[Rule]) -> str:
    """A key part for results of `rules` (stored optimised graphs, passes/stored.py): their
    names, and the source of every module their code comes from (the rules' classes and
    predicates, a backend's included), so an edit to any of them changes the key."""
    modules: set[str] = set()

    def visit(x: object) -> None:
        if isinstance(x, (tuple, list)):
            for y in x:
                visit(y)
        elif is_dataclass(x) and not isinstance(x, type):
            modules.add(type(x).__module__)
            for f in fields(x):
                visit(getattr(x, f.name))
        elif callable(x) and getattr(x, "__module__", None):
            modules.add(x.__module__)

    visit(tuple(rules))
    digest = hashlib.sha256("+".join(r.name for r in rules).encode())
    for name in sorted(modules):
        path = inspect.getsourcefile(sys.modules[name])
        digest.update(name.encode())
        if path is not None:
            with open(path, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()


def _acceptable(members: list[Tensor], roots: list[Tensor], ctx: MatchContext, views_and_writes: bool = False) -> bool:
    ids = {m.id for m in members}
    if len(ids) != len(members) or ids & ctx.claimed or any(m.id not in ctx.position for m in members):
        return False
    if any(m.is_leaf or (not views_and_writes and op_kind(m) in (Kind.VIEW, Kind.WRITE)) for m in members):
        return False
    root_ids = {r.id for r in roots}
    for m in members:
        if m.id not in root_ids:
            if m.flags & Flag.OUTPUT or any(u.id not in ids for u in ctx.users[m.id]):
                return False
    return True


def _dependencies(tensors: list[Tensor], position: dict[int, int]) -> tuple[dict[int, list[Tensor]], dict[int, list[Tensor]]]:
    """Predecessors and successors of every tensor among `tensors`: data flow plus write
    ordering (what lies outside them, another split's nodes or leaves, is there already)."""
    preds: dict[int, list[Tensor]] = {t.id: [d for d in deps(t) if d.id in position] for t in tensors}
    for before, after in memory_order_edges(tensors):
        preds[after.id].append(before)
    succs: dict[int, list[Tensor]] = {t.id: [] for t in tensors}
    for t in tensors:
        for p in preds[t.id]:
            succs[p.id].append(t)
    return preds, succs


def _creates_cycle(members, groups, group_of, succs, position) -> bool:
    """Whether some path leaves the candidate and comes back into it, through other nodes
    or groups already accepted (each group counts as one step)."""
    ids = {m.id for m in members}
    limit = max(position[m.id] for m in members)
    stack = [s for m in members for s in succs[m.id] if s.id not in ids]
    seen: set[int] = set()
    while stack:
        t = stack.pop()
        if t.id in ids:
            return True
        if t.id in seen:
            continue
        g = group_of.get(t.id)
        unit = groups[g][1] if g is not None else [t]
        seen.update(u.id for u in unit)
        if min(position[u.id] for u in unit) > limit:
            continue  # everything after the candidate's last member cannot lead back into it
        for u in unit:
            stack.extend(succs[u.id])
    return False


def _contiguous_order(tensors, groups, group_of, preds, position) -> list[Tensor]:
    """A topological order with each group's members consecutive, otherwise as close to
    the original order as possible (Kahn's algorithm, earliest original position first)."""
    def unit_key(t: Tensor) -> tuple[str, int]:
        g = group_of.get(t.id)
        return ("g", g) if g is not None else ("t", t.id)

    units: dict[tuple[str, int], list[Tensor]] = {}
    for t in tensors:
        units.setdefault(unit_key(t), []).append(t)
    indegree = {k: 0 for k in units}
    after: dict[tuple[str, int], set] = {k: set() for k in units}
    for key, members in units.items():
        for m in members:
            for p in preds[m.id]:
                pk = unit_key(p)
                if pk != key and key not in after[pk]:
                    after[pk].add(key)
                    indegree[key] += 1
    heap = [(position[ms[0].id], k) for k, ms in units.items() if indegree[k] == 0]
    heapq.heapify(heap)
    order: list[Tensor] = []
    while heap:
        _, key = heapq.heappop(heap)
        order.extend(units[key])
        for nxt in after[key]:
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                heapq.heappush(heap, (position[units[nxt][0].id], nxt))
    if len(order) != len(tensors):
        raise PassError("fusion groups form a cycle; no order runs each as one step")
    return order


def _annotations(order, groups, users) -> tuple[FusionGroup, ...]:
    position = {t.id: i for i, t in enumerate(order)}
    out = []
    for pattern, members in groups:
        ids = {m.id for m in members}
        inputs = {s.id: s for m in members for s in m.src if s.id not in ids}
        outputs = [m for m in members
                   if m.flags & Flag.OUTPUT or any(u.id not in ids for u in users[m.id])]
        out.append(FusionGroup(pattern, tuple(position[m.id] for m in members),
                               tuple(position[i] for i in inputs),
                               tuple(position[m.id] for m in outputs)))
    return tuple(sorted(out, key=lambda g: g.nodes[0]))


def resolve_groups(groups: list[tuple[str, list[Tensor]]], users: dict[int, list[Tensor]]) -> list[ResolvedGroup]:
    """group_nodes' groups with their inputs and outputs (members read outside the group,
    or graph outputs), as fusion_groups gives a graph's."""
    out = []
    for pattern, members in groups:
        ids = {m.id for m in members}
        inputs = {s.id: s for m in members for s in m.src if s.id not in ids}
        outputs = [m for m in members if m.flags & Flag.OUTPUT or any(u.id not in ids for u in users.get(m.id, ()))]
        out.append(ResolvedGroup(pattern, list(members), list(inputs.values()), outputs))
    return out


def fusion_groups(graph: Graph) -> list[ResolvedGroup]:
    """The graph's fusion groups as tensors ([] when it has none); PassError when the
    annotation no longer fits the graph (a pass changed it without dropping the hint)."""
    groups = graph.hints.get(FUSION_HINT, ())
    tensors = graph.tensors
    node_index = {t.id: i for i, t in enumerate(graph.nodes)}
    out = []
    for g in groups:
        if any(not 0 <= p < len(tensors) for p in g.nodes + g.inputs + g.outputs):
            raise PassError(f"fusion group {g.pattern} points outside the graph")
        nodes = [tensors[p] for p in g.nodes]
        idx = [node_index.get(t.id) for t in nodes]
        if None in idx or idx != list(range(idx[0], idx[0] + len(idx))):
            raise PassError(f"fusion group {g.pattern} is not a run of consecutive nodes")
        out.append(ResolvedGroup(g.pattern, nodes, [tensors[p] for p in g.inputs],
                                 [tensors[p] for p in g.outputs]))
    return out


def describe_groups(graph: Graph, keys: dict[int, str] | None = None) -> str:
    """One line per group: pattern, members (key and op), outputs and inputs."""
    from ggmlpy.ir.dump import tensor_keys

    keys = keys or tensor_keys(graph)

    def label(ts: list[Tensor]) -> str:
        return ", ".join(f"{keys[t.id]} {t.name}" if t.name else keys[t.id] for t in ts)

    groups = fusion_groups(graph)
    lines = [f"fusion groups: {len(groups)}"]
    for i, g in enumerate(groups):
        members = ", ".join(f"{keys[t.id]} {t.op}" for t in g.nodes)
        lines.append(f"  g{i} {g.pattern}: {members} -> {label(g.outputs)}; reads {label(g.inputs)}")
    return "\n".join(lines) + "\n"
