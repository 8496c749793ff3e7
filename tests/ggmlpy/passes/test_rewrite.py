"""The pattern -> replacement engine: what patterns match and bind, and how rewrite_graph
applies a rule table (bottom-up, to a fixed point, without touching its input)."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlpy.ir import GGMLType, Graph, GraphBuilder
from ggmlpy.ir.ops import Kind
from ggmlpy.ir.tensor import Flag
from ggmlpy.passes.common import PassError, copy_tensor
from ggmlpy.passes.rewrite import Pat, Rule, match, rewrite_graph
from tests.ggmlpy.passes.helpers import run_graph, snapshot

F32 = GGMLType.F32


def leaves(b: GraphBuilder, n: int = 2, ne=(8, 4)):
    return [b.input(f"x{i}", F32, ne) for i in range(n)]


def test_match_binds_names_and_checks_op_kind_and_where():
    b = GraphBuilder()
    x, y = leaves(b)
    n = b.rms_norm(x, 1e-5)
    m = b.mul(n, y)
    pat = Pat("mul", src=(Pat("rms_norm", name="norm"), Pat(name="w")))
    assert match(pat, m) == {"norm": n, "w": y}
    assert match(Pat(kind=Kind.ELEMENTWISE), m) == {}
    assert match(Pat(kind=Kind.ROW), m) is None
    assert match(Pat(("add", "mul")), m) == {}
    assert match(Pat("add"), m) is None
    assert match(Pat("mul", where=lambda t: t.ne[0] == 8), m) == {}
    assert match(Pat("mul", where=lambda t: t.ne[0] == 9), m) is None
    assert match(Pat("mul", src=(Pat("rms_norm"), Pat("rms_norm"))), m) is None


def test_a_name_used_twice_must_bind_the_same_tensor():
    b = GraphBuilder()
    x, y = leaves(b)
    same = b.add(x, x)
    different = b.add(x, y)
    pat = Pat("add", src=(Pat(name="a"), Pat(name="a")))
    assert match(pat, same) == {"a": x}
    assert match(pat, different) is None


def test_source_count_extra_sources_and_commutative_patterns():
    b = GraphBuilder()
    x, y = leaves(b)
    mask = b.input("mask", F32, (8, 4))
    sm = b.soft_max_ext(x, mask, 0.5, 0.0)
    assert match(Pat("soft_max", src=(Pat(name="a"),)), sm) is None            # two sources
    assert match(Pat("soft_max", src=(Pat(name="a"),), extra_src=True), sm) == {"a": x}
    mm = b.mul_mat(b.weight("w", F32, (8, 8)), x)
    add = b.add(y, mm)
    plain = Pat("add", src=(Pat("mul_mat", name="mm"), Pat(name="r")))
    assert match(plain, add) is None
    swapped = Pat("add", src=(Pat("mul_mat", name="mm"), Pat(name="r")), commutative=True)
    assert match(swapped, add) == {"mm": mm, "r": y}
    with pytest.raises(ValueError, match="commutative"):
        Pat("add", src=(Pat(),), commutative=True)


def _fold_scales(t, bound):
    inner = bound["inner"]
    return copy_tensor(t, src=inner.src, params={"s": t.params["s"] * inner.params["s"], "b": 0.0})


def _drop_unit_scale(t, bound):
    return bound["x"] if t.params["s"] == 1.0 and t.params["b"] == 0.0 else None


SCALE_RULES = (
    Rule("unit", Pat("scale", src=(Pat(name="x"),)), _drop_unit_scale),
    Rule("fold", Pat("scale", src=(Pat("scale", name="inner", where=lambda t: t.params["b"] == 0.0),),
                     where=lambda t: t.params["b"] == 0.0), _fold_scales),
)


def test_rewrite_reaches_a_fixed_point_and_keeps_values():
    b = GraphBuilder()
    (x,) = leaves(b, 1)
    s = b.scale(b.scale(b.scale(x, 2.0), 3.0), 0.5)
    out = b.silu(s)
    g = b.build([out])
    before = snapshot(g)
    r = rewrite_graph(g, SCALE_RULES)
    assert snapshot(g) == before
    scales = [t for t in r.nodes if t.op == "scale"]
    assert len(scales) == 1 and scales[0].params["s"] == 3.0 and scales[0].src[0] is x
    assert [t.op for t in r.nodes] == ["scale", "silu"]
    data = {"x0": np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)}
    np.testing.assert_allclose(run_graph(r, data, {})[0], run_graph(g, data, {})[0], rtol=1e-6)


def test_a_rule_may_return_a_tensor_it_bound():
    b = GraphBuilder()
    (x,) = leaves(b, 1)
    out = b.tanh(b.scale(b.scale(x, 2.0), 0.5))  # folds to scale(x, 1), then to x
    r = rewrite_graph(b.build([out]), SCALE_RULES)
    assert [t.op for t in r.nodes] == ["tanh"]
    assert r.outputs[0].src[0] is x
    assert r.outputs[0] is not out and out.src[0].op == "scale"  # a copy; the input is intact


def test_outputs_keep_their_node_name_and_flag():
    b = GraphBuilder()
    (x,) = leaves(b, 1)
    unit = b.name(b.scale(x, 1.0), "kept")            # would become x: an output keeps its node
    folded = b.name(b.scale(b.scale(x, 2.0), 3.0), "folded")
    g = b.build([unit, folded])
    r = rewrite_graph(g, SCALE_RULES)
    assert r.outputs[0] is unit
    new = r.outputs[1]
    assert new is not folded and new.params["s"] == 6.0
    assert new.name == "folded" and new.flags & Flag.OUTPUT
    assert len(r.outputs) == 2


def test_rules_that_never_settle_are_an_error():
    b = GraphBuilder()
    (x,) = leaves(b, 1)
    g = b.build([b.silu(x)])
    forever = Rule("forever", Pat("silu"), lambda t, bound: copy_tensor(t))
    with pytest.raises(PassError, match="did not settle"):
        rewrite_graph(g, [forever])


def test_untouched_graph_shares_every_tensor():
    b = GraphBuilder()
    x, y = leaves(b)
    g = b.build([b.add(b.silu(x), y)])
    r = rewrite_graph(g, SCALE_RULES)
    assert all(a is c for a, c in zip(r.tensors, g.tensors)) and len(r.tensors) == len(g.tensors)
    assert isinstance(r, Graph) and r is not g
