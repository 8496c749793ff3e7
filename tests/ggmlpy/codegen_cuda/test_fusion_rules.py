"""The CUDA fusion rules (ggmlpy/codegen_cuda/fusion_rules.py) as the backend applies them to a split
(codegen_cuda/fusion.py): each pattern forms the group it should on a small graph, the
knobs of LowerOptions choose the rules, a split's boundary keeps values others read out of
group interiors, and the step order keeps every dependency with each group consecutive.
Nothing here launches a kernel (the kernels' results: test_fused.py, test_llama.py)."""
from __future__ import annotations

import pytest

from ggmlpy.codegen_cuda.fusion import STEPS, LowerOptions, lower_split, split_groups
from ggmlpy.codegen_cuda.lower_attention import AttentionStep
from ggmlpy.codegen_cuda.lower_matmul import MatMulOptions, MatMulStep
from ggmlpy.codegen_cuda.lower_simple import RopeStep
from ggmlpy.ir.graph import Graph
from ggmlpy.ir.ops import OPS, Kind
from ggmlpy.ir.tensor import Tensor
from ggmlpy.ir.types import GGMLType
from ggmlpy.passes.common import deps, memory_order_edges
from ggmlpy.codegen_cuda.fusion_rules import CudaFusionOptions, cuda_rules

from .cases import attention_graph, chain_graph, ffn_graph, qkv_graph

NO_ROPE = LowerOptions(matmul=MatMulOptions(fuse_rope=False))


def groups_of(g: Graph, opts: LowerOptions = LowerOptions(), nodes: list[Tensor] | None = None):
    order, groups = split_groups(g, g.nodes if nodes is None else nodes, opts)
    check_order(order, groups, g.nodes if nodes is None else nodes)
    return [(grp.pattern, [t.op for t in grp.nodes]) for grp in groups]


def check_order(order: list[Tensor], groups, nodes: list[Tensor]) -> None:
    """Every node once; its sources and earlier cache accesses before it; groups consecutive."""
    assert sorted(t.id for t in order) == sorted(t.id for t in nodes)
    at = {t.id: i for i, t in enumerate(order)}
    for t in order:
        assert all(at[d.id] < at[t.id] for d in deps(t) if d.id in at), t
    for before, after in memory_order_edges(nodes):
        assert at[before.id] < at[after.id]
    for grp in groups:
        idx = [at[t.id] for t in grp.nodes]
        assert idx == list(range(idx[0], idx[0] + len(idx))), grp.pattern


def test_every_rule_has_a_step_builder():
    rules = cuda_rules(CudaFusionOptions(fuse_oproj=True))
    assert {r.name for r in rules} == set(STEPS)


def test_attention_with_and_without_the_final_cont():
    assert groups_of(attention_graph()) == [("attention", ["mul_mat", "soft_max", "mul_mat", "permute", "cont"])]
    assert groups_of(attention_graph(fuse_cont=False)) == [("attention", ["mul_mat", "soft_max", "mul_mat"])]


def test_attention_takes_the_output_projection_only_when_asked():
    g = attention_graph(n_tokens=1, head=64, n_head=9, n_head_kv=3, wo_type=GGMLType.Q4_1)
    attention = ["mul_mat", "soft_max", "mul_mat", "permute", "cont"]
    assert groups_of(g, LowerOptions(fuse_oproj=True)) == [("attention", attention + ["mul_mat", "add"])]
    assert groups_of(g) == [("attention", attention), ("residual_product", ["mul_mat", "add"])]
    (step,) = [s for s in lower_split(g, g.nodes, LowerOptions(fuse_oproj=True)) if isinstance(s, AttentionStep)]
    assert step.oproj is not None


def test_feed_forward_products():
    """One token: Q/K/V in one launch, gate and up with the GLU, the residual add; the norm
    feeds five products, so it is no product's prenorm (a norm * weight step of its own)."""
    assert groups_of(ffn_graph()) == [
        ("norm_mul", ["rms_norm", "mul"]),
        ("shared_x_product", ["mul_mat"] * 3),
        ("glu_product", ["mul_mat", "mul_mat", "swiglu"]),
        ("residual_product", ["mul_mat", "add"]),
    ]
    # many tokens (the tiled kernel): only the residual epilogue and the norm fuse
    assert groups_of(ffn_graph(single=False)) == [("norm_mul", ["rms_norm", "mul"]),
                                                  ("residual_product", ["mul_mat", "add"])]


def test_decode_block_entry_is_one_product_with_prenorm_store_and_rope_epilogues():
    ((pattern, ops),) = groups_of(qkv_graph())
    assert pattern == "shared_x_product"
    assert ops[:2] == ["rms_norm", "mul"] and ops.count("mul_mat") == 3
    assert ops.count("rope") == 2 and ops.count("set_rows") == 2
    g = qkv_graph()
    (step,) = lower_split(g, g.nodes, LowerOptions())
    assert isinstance(step, MatMulStep) and step.prenorm.weight is not None
    assert step.store is not None and step.store.index == 2          # V's rows, stored
    assert sorted(step.ropes) == [0, 1] and step.ropes[1].store is not None  # K rotated and stored
    assert step.ropes[0].store is None


def test_without_rope_epilogues_the_ropes_pair_with_the_key_store():
    assert groups_of(qkv_graph(), NO_ROPE) == [
        ("shared_x_product", ["rms_norm", "mul", "mul_mat", "mul_mat", "mul_mat", "reshape", "reshape", "set_rows"]),
        ("rope", ["rope", "rope", "reshape", "set_rows"]),
    ]
    g = qkv_graph(single=False)  # many tokens: no matrix-vector products, the rest as above
    assert groups_of(g) == [("norm_mul", ["rms_norm", "mul"]), ("rope", ["rope", "rope", "reshape", "set_rows"])]
    rope = next(s for s in lower_split(g, g.nodes, LowerOptions()) if isinstance(s, RopeStep))
    assert [store is not None for _, store in rope.parts] == [False, True]


def test_elementwise_chains():
    assert groups_of(chain_graph()) == [("map_chain", ["scale", "tanh", "scale"]), ("map_chain", ["mul", "add", "silu"])]


@pytest.mark.parametrize("make", [attention_graph, ffn_graph, qkv_graph, chain_graph])
def test_fuse_false_is_a_step_per_node(make):
    g = make()
    steps = lower_split(g, g.nodes, LowerOptions(fuse=False))
    computing = [n for n in g.nodes if OPS[n.op].kind != Kind.VIEW]
    assert [s.nodes for s in steps] == [[n] for n in computing]
    assert groups_of(g, LowerOptions(fuse=False)) == []


def test_no_matrix_vector_kernel_means_no_product_extensions():
    opts = LowerOptions(matmul=MatMulOptions(max_cols=0))
    assert groups_of(qkv_graph(), opts) == [("norm_mul", ["rms_norm", "mul"]),
                                            ("rope", ["rope", "rope", "reshape", "set_rows"])]


def test_a_value_another_split_reads_stays_out_of_group_interiors():
    """The V store runs in another split: V's product is a group output (its own result)
    and nothing stores it; K's store and both ropes still fuse."""
    g = qkv_graph()
    v_store = next(t for t in g.nodes if t.op == "set_rows" and t.src[0].name == "cache_v")
    v_view = v_store.src[1]
    nodes = [t for t in g.nodes if t is not v_store and t is not v_view]
    ((pattern, ops),) = groups_of(g, LowerOptions(), nodes)
    assert pattern == "shared_x_product" and ops.count("set_rows") == 1 and ops.count("rope") == 2
    (step,) = lower_split(g, nodes, LowerOptions())
    assert step.store is None and step.outs[2] is step.mats[2]
    # and the norm read by another split is not computed inside the product
    norm_mul = next(t for t in g.nodes if t.op == "mul")
    others = [t for t in nodes if t.op not in ("rms_norm", "mul")]
    ((pattern, ops),) = groups_of(g, LowerOptions(), others)
    assert ops[0] == "mul_mat" and norm_mul not in others


def test_a_group_runs_where_its_inputs_are_ready():
    """Ropes of Q and K pair even though something reads K's rope before Q's is computed:
    the order moves that reader after the pair (the matcher before these rules ran the pair
    at the later rope, so it refused a pair whose first result was read before that)."""
    from ggmlpy.ir import N_TOKENS, GraphBuilder

    b = GraphBuilder()
    pos = b.input("pos", GGMLType.I32, (N_TOKENS,))
    x = b.input("x", GGMLType.F32, (32, N_TOKENS))
    rope = dict(n_dims=8, mode=0, n_ctx_orig=4096, freq_base=10000.0)
    k = b.rope_ext(b.reshape(b.mul_mat(b.weight("wk", GGMLType.F32, (32, 16)), x), 8, 2, N_TOKENS), pos, None, **rope)
    k_read = b.scale(k, 2.0)
    q = b.rope_ext(b.reshape(b.mul_mat(b.weight("wq", GGMLType.F32, (32, 32)), x), 8, 4, N_TOKENS), pos, None, **rope)
    g = b.build([k_read, q])
    assert ("rope", ["rope", "rope"]) in groups_of(g)


def test_cpu_and_cuda_splits_each_fuse_their_own_groups(tmp_path):
    """A context with the host CPU and a CUDA device (the preview backend: no GPU needed):
    the CPU splits use the CPU pass's groups that lie inside them, the CUDA split marks its
    own with the CUDA rules, and neither uses a node of the other's split."""
    from ggmlpy.codegen_cpu.fusion import CpuFusion
    from ggmlpy.passes.fusion import fusion_groups
    from ggmlpy.passes.pipeline import context_passes, context_rules, run_pipeline
    from ggmlpy.sched.scheduler import schedule
    from ggmlpy.testing.models import write_tiny_llama
    from ggmlpy.cli.viz_model import build_graph, place
    from llama.model import Model

    model = Model.load(write_tiny_llama(tmp_path / "tiny.gguf", n_layer=2))
    graph, _ = build_graph(model, 1, 256)
    placement, backends = place(model, ["cuda:0"], n_gpu_layers=2)
    g = run_pipeline(graph, passes=context_passes(backends), rules=context_rules(backends)).graph
    splits = schedule(g, backends, placement).splits
    kinds = {s.backend.name for s in splits}
    assert {"cpu", "cuda"} <= kinds, kinds
    for split in splits:
        own = {t.id for t in split.nodes}
        if split.backend.name == "cuda":
            _, groups = split_groups(g, split.nodes, split.backend.options)
            assert {"attention", "shared_x_product", "glu_product"} <= {grp.pattern for grp in groups}
        elif split.backend.name == "cpu":
            fusion = CpuFusion(g, split.nodes)
            groups = [grp for grp in fusion_groups(g) if fusion.runs_fused(grp)]
        else:
            continue
        assert groups and all(t.id in own for grp in groups for t in grp.nodes)
