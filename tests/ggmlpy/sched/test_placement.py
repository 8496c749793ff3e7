"""Placement (docs/architecture.md, step 6): layers to devices by n_gpu_layers and tensor_split, checked
against hand-computed maps; leaf devices for the scheduler; bad arguments."""
from __future__ import annotations

import pytest

from ggmlpy.ir.builder import GraphBuilder
from ggmlpy.ir.types import GGMLType
from llama.placement import (
    HOST, Placement, PlacementError, layer_devices, layer_of, make_device_backend, parse_devices,
    parse_overrides, split_points,
)

from .fakes import FakeDevice

C, G, G0, G1 = HOST, "cuda:0", "cuda:0", "cuda:1"


def layers(n_layer, ngl, devices=(G,), tensor_split=None, free=None) -> list[str]:
    """Every layer's device, the output layer last."""
    return layer_devices(n_layer, ngl, list(devices), split_points(len(devices), tensor_split, free))


# one device ----------------------------------------------------------------------------------
@pytest.mark.parametrize("ngl, expected", [
    (0, [C, C, C, C, C]),      # nothing offloaded
    (1, [C, C, C, C, G]),      # i_gpu_start = 4: only the output layer
    (3, [C, C, G, G, G]),      # i_gpu_start = 2: the last two layers and the output
    (4, [C, G, G, G, G]),      # n_gpu_layers = n_layer: layer 0 stays (the output counts as one)
    (5, [G, G, G, G, G]),      # n_layer + 1: everything
    (99, [G, G, G, G, G]),
    (-1, [G, G, G, G, G]),     # llama.cpp: negative means all
])
def test_n_gpu_layers_puts_the_last_layers_and_the_output_on_the_device(ngl, expected):
    assert layers(4, ngl) == expected


def test_no_devices_keeps_everything_on_the_cpu():
    assert layer_devices(4, 99, [], ()) == [C] * 5


def test_seed_example_32_layers_24_on_the_gpu():
    """n_layer 32, n_gpu_layers 24: i_gpu_start = 32 + 1 - 24 = 9; layers 9..31 and the output."""
    got = layers(32, 24)
    assert got[:9] == [C] * 9 and got[9:] == [G] * 24


# several devices -----------------------------------------------------------------------------
def test_equal_split_over_two_devices():
    """ngl 99, n_layer 4: act = 5, x = il/5 = 0, .2, .4, .6, .8 against splits [0.5, 1]."""
    assert layers(4, 99, (G0, G1), [1, 1]) == [G0, G0, G0, G1, G1]


def test_three_to_one_split():
    """splits [0.75, 1]: x = 0 .. 0.6 on the first device, 0.8 (the output) on the second."""
    assert layers(4, 99, (G0, G1), [3, 1]) == [G0, G0, G0, G0, G1]


def test_split_by_free_memory_when_no_tensor_split():
    """12 GB and 8 GB free, 24 of 32 layers: splits [0.6, 1]; (il - 9)/24 < 0.6 for il <= 23."""
    got = layers(32, 24, (G0, G1), None, [12e9, 8e9])
    assert got[:9] == [C] * 9 and got[9:24] == [G0] * 15 and got[24:] == [G1] * 9


def test_all_zero_tensor_split_means_the_default():
    assert layers(4, 99, (G0, G1), [0, 0], [1.0, 3.0]) == layers(4, 99, (G0, G1), None, [1.0, 3.0])


def test_devices_without_memory_figures_split_equally():
    assert split_points(2, None, [None, None]) == (0.5, 1.0)
    assert split_points(3, None, None) == pytest.approx((1 / 3, 2 / 3, 1.0))
    assert split_points(2, None, [8e9, None]) == (0.5, 1.0)  # cannot be proportional


def test_partial_offload_over_two_devices():
    """ngl 3 of 4 layers: i_gpu_start 2, act 3; x = 0, 1/3, 2/3 against [0.5, 1]."""
    assert layers(4, 3, (G0, G1), [1, 1]) == [C, C, G0, G0, G1]


def test_a_zero_share_device_gets_no_layer():
    assert layers(4, 99, (G0, G1), [1, 0]) == [G0] * 5


# names and leaves ----------------------------------------------------------------------------
def test_layer_of_weight_and_cache_names():
    assert layer_of("blk.12.attn_q.weight") == 12
    assert layer_of("cache_v_l7") == 7
    assert layer_of("token_embd.weight") is None
    assert layer_of("output_norm.weight") is None


def placed(tied=()) -> Placement:
    return Placement.plan(4, ["cpu:1"], 3, tied=tied)  # layers cpu, cpu, cpu:1, cpu:1; output cpu:1


def leaf(name: str, op_user: str | None = None):
    b = GraphBuilder()
    w = b.weight(name, GGMLType.F32, (4, 4))
    user = None
    if op_user == "get_rows":
        user = b.get_rows(w, b.input("ids", GGMLType.I32, (2,)))
    elif op_user == "mul_mat":
        user = b.mul_mat(w, b.input("x", GGMLType.F32, (4, 2)))
    return w, user


def test_weights_and_kv_cache_follow_their_layer():
    p = placed()
    assert p.layers == (C, C, "cpu:1", "cpu:1") and p.output == "cpu:1"
    for name, dev in [("blk.1.ffn_up.weight", C), ("blk.2.attn_q.weight", "cpu:1"), ("cache_k_l1", C),
                      ("cache_v_l3", "cpu:1"), ("token_embd.weight", C), ("output_norm.weight", "cpu:1"),
                      ("output.weight", "cpu:1")]:
        assert p.device_for(leaf(name)[0], None) == dev, name
        assert p.devices_of(leaf(name)[0]) == (dev,), name


def test_tied_embeddings_live_on_the_cpu_and_on_the_output_device():
    p = placed(tied=["token_embd.weight"])
    w, lookup = leaf("token_embd.weight", "get_rows")
    assert p.device_for(w, lookup) == C
    w, output = leaf("token_embd.weight", "mul_mat")
    assert p.device_for(w, output) == "cpu:1"
    assert p.devices_of(w) == (C, "cpu:1")


def test_without_devices_nothing_is_placed():
    p = Placement.plan(4, None, 99)
    assert not p.active and p.layers == (C,) * 4
    assert p.device_for(leaf("blk.3.attn_q.weight")[0], None) is None


def test_check_weights_keeps_what_the_device_cannot_run_on_the_cpu():
    p = placed()
    gpu = FakeDevice("gpu", {"mul"}, memory="cpu:1")  # runs norms, no matrix products
    weights = [("blk.3.attn_q.weight", GGMLType.Q4_0, (64, 64)), ("blk.3.attn_norm.weight", GGMLType.F32, (64,)),
               ("blk.0.attn_q.weight", GGMLType.Q4_0, (64, 64))]
    p.check_weights(weights, lambda device: gpu)
    assert p.moved == {"blk.3.attn_q.weight": "cpu:1 cannot run mul_mat on Q4_0"}
    assert p.device_of_name("blk.3.attn_q.weight") == C
    assert p.device_of_name("blk.3.attn_norm.weight") == "cpu:1"
    assert "blk.3.attn_q.weight: cpu:1 cannot run mul_mat on Q4_0, on cpu" in p.describe()


def test_experts_a_device_cannot_run_stay_on_the_cpu():
    """Stacked experts are probed with mul_mat_id (llama.cpp's weight_buft_supported)."""
    p = placed()
    gpu = FakeDevice("gpu", {"mul_mat"}, memory="cpu:1")   # dense products only
    weights = [("blk.3.ffn_up_exps.weight", GGMLType.Q4_K, (256, 32, 8)),
               ("blk.3.ffn_gate_inp.weight", GGMLType.F32, (256, 8))]
    p.check_weights(weights, lambda device: gpu)
    assert p.moved == {"blk.3.ffn_up_exps.weight": "cpu:1 cannot run mul_mat_id on Q4_K"}
    assert p.device_of_name("blk.3.ffn_gate_inp.weight") == "cpu:1"


def test_describe_lists_layers_like_llama_cpp():
    lines = placed().describe().splitlines()
    assert lines[0] == "layer input assigned to device cpu"
    assert lines[3] == "layer   2 assigned to device cpu:1"
    assert lines[-1] == "layer output assigned to device cpu:1"


# llama.cpp's --override-tensor ----------------------------------------------------------------
def test_overrides_move_matching_weights_first_match_wins():
    p = Placement.plan(4, ["cpu:1"], 3, override_tensor=[r"ffn_up=CPU", r"blk\.[23]\.ffn_=cpu:1",
                                                        r"attn_q=cpu1", r"blk\.0\.=cpu:1"])
    assert p.layers == (C, C, "cpu:1", "cpu:1")
    assert p.device_of_name("blk.3.ffn_up.weight") == C        # the first item wins over the second
    assert p.device_of_name("blk.3.ffn_down.weight") == "cpu:1"
    assert p.device_of_name("blk.1.attn_q.weight") == "cpu:1"  # llama.cpp's CPU1 form of cpu:1
    assert p.device_of_name("blk.0.attn_norm.weight") == "cpu:1"
    assert p.device_of_name("blk.1.attn_k.weight") == C        # no item matches: its layer's
    assert p.device_of_name("cache_k_l0") == C                 # the KV cache is not a weight
    assert "tensors matching 'ffn_up' overridden to cpu" in p.describe()


@pytest.mark.parametrize("cpu_moe, n_cpu_moe, on_cpu", [(True, 0, {0, 1, 2, 3}), (False, 2, {0, 1}), (False, 0, set())])
def test_cpu_moe_keeps_the_experts_of_the_layers_asked_on_the_cpu(cpu_moe, n_cpu_moe, on_cpu):
    from llama.placement import with_cpu_moe

    p = Placement.plan(4, ["cpu:1"], 99, override_tensor=with_cpu_moe(None, cpu_moe, n_cpu_moe))
    for il in range(4):
        for name in ("ffn_up_exps", "ffn_gate_exps", "ffn_down_exps", "ffn_gate_up_exps"):
            assert p.device_of_name(f"blk.{il}.{name}.weight") == (C if il in on_cpu else "cpu:1")
        assert p.device_of_name(f"blk.{il}.ffn_gate_inp.weight") == "cpu:1"   # the router moves with its layer
        assert p.device_of_name(f"blk.{il}.attn_q.weight") == "cpu:1"


def test_an_override_of_a_tied_embedding_moves_the_output_copy_too():
    p = Placement.plan(4, ["cpu:1"], 99, tied=["token_embd.weight"], override_tensor=["token_embd=cpu"])
    w, output = leaf("token_embd.weight", "mul_mat")
    assert p.output == "cpu:1" and p.device_for(w, output) == C and p.devices_of(w) == (C,)
    assert "also on" not in p.describe()


@pytest.mark.parametrize("items, message", [
    (["ffn_up"], "expected PATTERN=DEVICE"),
    (["=cpu"], "expected PATTERN=DEVICE"),
    (["ffn_up="], "expected PATTERN=DEVICE"),
    (["ffn_(up=cpu"], "bad pattern"),
    (["ffn_up=cuda:0"], "device 'cuda:0' is not one of this placement's devices \\(cpu, cpu:1\\)"),
    (["ffn_up=gpu"], "device 'gpu' is not one of"),
    ("ffn_up=cpu", "list of PATTERN=DEVICE items"),
])
def test_bad_overrides_name_the_item(items, message):
    with pytest.raises(PlacementError, match=message):
        parse_overrides(items, ("cpu:1",))


# devices and errors --------------------------------------------------------------------------
def test_device_names():
    assert parse_devices(None) == ()
    assert parse_devices(["cuda", "cpu:1"]) == ("cuda:0", "cpu:1")


@pytest.mark.parametrize("devices, message", [
    (["gpu:0"], "unknown device 'gpu:0'"),
    (["cpu"], "host CPU"),
    (["cpu:0"], "host CPU"),
    (["cpu:1", "cpu:1"], "named twice"),
    ("cpu:1", "list of names"),
])
def test_bad_device_names(devices, message):
    with pytest.raises(PlacementError, match=message):
        parse_devices(devices)


@pytest.mark.parametrize("tensor_split, message", [
    ([1.0], "1 entries for 2 devices"),
    ([1.0, -1.0], ">= 0"),
])
def test_bad_tensor_split(tensor_split, message):
    with pytest.raises(PlacementError, match=message):
        Placement.plan(4, ["cpu:1", "cpu:2"], 99, tensor_split)


def test_a_second_cpu_device_is_its_own_backend():
    be = make_device_backend("cpu:1")
    assert be.name == "cpu:1" and be.buffer_type == "cpu:1"
    other = make_device_backend("cpu:2")
    assert other is not be and other.name == "cpu:2"


def test_model_load_refuses_bad_devices_clearly(tmp_path):
    import llama
    from ggmlpy.testing.models import write_tiny_llama

    path = write_tiny_llama(tmp_path / "tiny.gguf", n_layer=2)
    with pytest.raises(PlacementError, match="unknown device 'gpu'"):
        llama.Model.load(path, devices=["gpu"], n_gpu_layers=99)
    with pytest.raises(PlacementError, match="1 entries for 2 devices"):
        llama.Model.load(path, devices=["cpu:1", "cpu:2"], n_gpu_layers=99, tensor_split=[1.0])
    # act 3: x = 0, 1/3 for the layers, 2/3 for the output, against splits [0.5, 1]
    model = llama.Model.load(path, devices=["cpu:1", "cpu:2"], n_gpu_layers=99, tensor_split=[1, 1])
    assert model.placement.layers == ("cpu:1", "cpu:1") and model.placement.output == "cpu:2"


def test_an_absent_cuda_device_is_a_clear_error():
    from ggmlpy.codegen_cuda import cuda_available

    if cuda_available()[0]:
        pytest.skip("a CUDA device is present")
    with pytest.raises(PlacementError, match="device cuda:0 is not available"):
        make_device_backend("cuda:0")
