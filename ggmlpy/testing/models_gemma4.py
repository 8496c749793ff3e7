"""Tiny Gemma 4 files: the layer and global writers `models_archs` uses for "gemma4".

GEMMA4_DENSE is shaped like E2B: six layers, windows on all but layers 3 and 5, global
layers with twice the head size, one KV head and "proportional" RoPE (rope_freqs leaves 24
of their 32 dim pairs unrotated), the last two layers reading the cache of layers 2 and 3,
per-layer embeddings 32 wide, the shared layers' FFN twice as wide. GEMMA4_MOE is shaped
like 26B-A4B: no shared cache and no per-layer embeddings, a dense FFN beside four experts
whose gate and up rows are stacked in one tensor, with a scale per expert. Both have an
output projection of their own (the released files tie it; untied, greedy tokens vary), omit
attn_v on the global layers (they use K as V), scale each layer's output and soft-cap the
logits. With `fused_qkv=True` a layer's Q, K and V are one attn_qkv.weight instead.

`write_tiny_gemma4_assistant` writes a "gemma4-assistant" file (the MTP drafter llama.cpp
runs with `--spec-type draft-mtp`) that fits a tiny gemma4 target: it reads the target's KV.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

SWA_PATTERN = [True, True, True, False, True, False]
GEMMA4_DENSE: dict[str, Any] = dict(
    n_layer=6, fused_qkv=False, head_dim=64, n_swa=4, rope_base=1e6, final_softcap=10.0,
    extra_keys={"attention.sliding_window_pattern": SWA_PATTERN, "attention.key_length_swa": 32,
                "attention.value_length_swa": 32, "rope.dimension_count_swa": 32, "rope.freq_base_swa": 1e4,
                "attention.head_count_kv": [2, 2, 2, 1, 2, 1], "attention.shared_kv_layers": 2,
                "embedding_length_per_layer_input": 32, "feed_forward_length": [96, 96, 96, 96, 192, 192]})
GEMMA4_MOE: dict[str, Any] = dict(
    n_layer=4, fused_qkv=False, head_dim=64, n_swa=4, rope_base=1e6, final_softcap=10.0,
    n_expert=4, n_expert_used=2, n_ff_exp=32,
    extra_keys={"attention.sliding_window_pattern": [True, True, False, True], "attention.key_length_swa": 32,
                "attention.value_length_swa": 32, "rope.dimension_count_swa": 32, "rope.freq_base_swa": 1e4,
                "attention.head_count_kv": [2, 2, 1, 2], "embedding_length_per_layer_input": 0})
ROTATED_PAIRS = 8   # of the global layers' head_dim / 2 pairs; the rest get factor 1e30


def gemma4_globals(t: Any) -> None:
    """rope_freqs and, where the file has them, the per-layer embedding tensors."""
    c, k = t.cfg, t.cfg.extra_keys
    half = c.head // 2
    t.add("rope_freqs.weight", np.array([1.0] * ROTATED_PAIRS + [1e30] * (half - ROTATED_PAIRS), np.float32))
    n_pl = k["embedding_length_per_layer_input"]
    if n_pl:
        wide = n_pl * c.n_layer
        t.add("per_layer_token_embd.weight", t.rng.standard_normal((c.n_vocab, wide)).astype(np.float32))
        t.mat("per_layer_model_proj.weight", c.n_embd, wide)
        t.norm("per_layer_proj_norm.weight", n_pl)


def gemma4_layer(t: Any, p: str) -> None:
    c, k = t.cfg, t.cfg.extra_keys
    il = int(p.split(".")[1])
    swa = k["attention.sliding_window_pattern"][il]
    head = k["attention.key_length_swa"] if swa else c.head
    n_kv = k["attention.head_count_kv"][il]
    n_ff = k["feed_forward_length"][il] if "feed_forward_length" in k else c.n_ff
    t.norm(p + "attn_norm.weight", c.n_embd)
    if c.fused_qkv:   # rows [Q | K | V], V on every layer
        t.mat(p + "attn_qkv.weight", c.n_embd, head * (c.n_head + 2 * n_kv))
    else:
        t.mat(p + "attn_q.weight", c.n_embd, head * c.n_head)
        t.mat(p + "attn_k.weight", c.n_embd, head * n_kv)
        if swa:
            t.mat(p + "attn_v.weight", c.n_embd, head * n_kv)
    t.mat(p + "attn_output.weight", head * c.n_head, c.n_embd)
    t.norm(p + "attn_q_norm.weight", head)
    t.norm(p + "attn_k_norm.weight", head)
    t.norm(p + "post_attention_norm.weight", c.n_embd)
    t.add(p + "layer_output_scale.weight", np.array([0.5 + t.rng.random()], np.float32))
    t.norm(p + "ffn_norm.weight", c.n_embd)
    t.mat(p + "ffn_gate.weight", c.n_embd, n_ff)
    t.mat(p + "ffn_up.weight", c.n_embd, n_ff)
    t.mat(p + "ffn_down.weight", n_ff, c.n_embd)
    t.norm(p + "post_ffw_norm.weight", c.n_embd)
    if c.n_expert:
        t.mat(p + "ffn_gate_inp.weight", c.n_embd, c.n_expert)
        t.norm(p + "ffn_gate_inp.scale", c.n_embd)
        t.experts(p + "ffn_gate_up_exps.weight", c.n_embd, 2 * c.n_ff_exp)
        t.experts(p + "ffn_down_exps.weight", c.n_ff_exp, c.n_embd)
        t.norm(p + "ffn_down_exps.scale", c.n_expert)
        for name in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
            t.norm(p + name + ".weight", c.n_embd)
    n_pl = k["embedding_length_per_layer_input"]
    if n_pl:
        t.mat(p + "inp_gate.weight", c.n_embd, n_pl)
        t.mat(p + "proj.weight", n_pl, c.n_embd)
        t.norm(p + "post_norm.weight", c.n_embd)


def _target_shape(target: Any) -> dict[str, Any]:
    """What an assistant must agree on with its gemma4 target: from a GGUF file's path, a
    TinyConfig or a dict of `write_tiny_model("gemma4", ...)` settings."""
    from ggmlpy.testing.models_archs import TinyConfig, tiny_config
    if isinstance(target, dict):
        target = tiny_config("gemma4", **target)
    if isinstance(target, TinyConfig):
        c, k = target, target.extra_keys
        half = c.head // 2
        return dict(n_embd=c.n_embd, n_vocab=c.n_vocab, n_layer=c.n_layer, n_ctx_train=c.n_ctx_train,
                    swa=[bool(s) for s in k["attention.sliding_window_pattern"]], head=c.head,
                    head_swa=k["attention.key_length_swa"], n_rot=c.n_rot or c.head,
                    n_rot_swa=k.get("rope.dimension_count_swa", k["attention.key_length_swa"]),
                    n_head_kv=list(k.get("attention.head_count_kv", [c.n_head_kv] * c.n_layer)),
                    shared=k.get("attention.shared_kv_layers", 0), n_swa=c.n_swa, rope_base=c.rope_base,
                    rope_base_swa=k.get("rope.freq_base_swa", c.rope_base),
                    rope_freqs=np.array([1.0] * ROTATED_PAIRS + [1e30] * (half - ROTATED_PAIRS), np.float32))
    from ggmlpy.gguf.file import GGUFFile
    with GGUFFile(target) as f:
        arch = f.get("general.architecture")
        if arch != "gemma4":
            raise ValueError(f"{target}: a gemma4 target expected, not {arch!r}")

        def key(name: str, default: Any = None) -> Any:
            return f.get(f"gemma4.{name}", default)
        n_layer, head = int(key("block_count")), int(key("attention.key_length"))
        n_kv = key("attention.head_count_kv")
        return dict(n_embd=int(key("embedding_length")), n_vocab=len(f.get("tokenizer.ggml.tokens")),
                    n_layer=n_layer, n_ctx_train=int(key("context_length")),
                    swa=[bool(s) for s in key("attention.sliding_window_pattern")], head=head,
                    head_swa=int(key("attention.key_length_swa")), n_rot=int(key("rope.dimension_count", head)),
                    n_rot_swa=int(key("rope.dimension_count_swa", key("attention.key_length_swa"))),
                    n_head_kv=[int(n) for n in np.broadcast_to(np.asarray(n_kv), (n_layer,))],
                    shared=int(key("attention.shared_kv_layers", 0)), n_swa=int(key("attention.sliding_window")),
                    rope_base=float(key("rope.freq_base", 1e4)),
                    rope_base_swa=float(key("rope.freq_base_swa", key("rope.freq_base", 1e4))),
                    rope_freqs=f.tensors["rope_freqs.weight"].data.view(np.float32).copy())


def assistant_kv_layers(shape: dict[str, Any]) -> dict[bool, int]:
    """The target layer whose KV cache an assistant layer reads, by the assistant layer's
    kind (True: sliding window): llama.cpp's share rule, the target's n_layer - 2 for SWA
    and n_layer - 1 for global layers, then through the target's shared-KV reuse (layers
    from n_layer - shared_kv_layers on read the last SWA / global layer before them)."""
    n, first_shared = shape["n_layer"], shape["n_layer"] - shape["shared"]
    out = {}
    for swa, il in ((True, n - 2), (False, n - 1)):
        if shape["swa"][il] != swa:
            raise ValueError(f"target layer {il} must be {'a sliding-window' if swa else 'a global'} layer")
        out[swa] = first_shared - (2 if swa else 1) if il >= first_shared else il
    return out


def write_tiny_gemma4_assistant(path: str | Path, target_path_or_cfg: Any = None, *, n_layer: int = 2,
                                n_embd: int = 32, n_head: int = 4, n_ff: int = 64,
                                swa_pattern: list[bool] | None = None, final_softcap: float = 0.0,
                                seed: int = 4) -> Path:
    """A tiny "gemma4-assistant" (Gemma 4's MTP drafter, llama.cpp's `--spec-type draft-mtp`)
    for a gemma4 target: the target's GGUF path, a TinyConfig, or a dict of its
    `write_tiny_model("gemma4", ...)` settings (None: that writer's defaults).

    The assistant has n_embd of its own and embedding_length_out = the target's n_embd; all
    its layers are nextn layers (nextn_predict_layers = block_count). It has Q but no K/V:
    its sliding-window layers attend over the target's KV cache of target layer n_layer - 2,
    its global layers over n_layer - 1 (see `assistant_kv_layers`), so head sizes, head_count_kv,
    RoPE dims, bases, window and rope_freqs are the target's for that kind of layer. swa_pattern
    defaults to windows on all layers but the last. Same tiny vocabulary as the target; F32
    weights from a generator seeded with `seed` (the default 4: with the default target,
    llama.cpp accepts some of its drafts, see tests/tools/mtp_vectors.py); final_softcap (0:
    not written) is a key llama.cpp's assistant graph ignores."""
    from ggmlpy.testing.models_archs import TinyConfig, _common_keys, _Tiny
    if target_path_or_cfg is None:
        target_path_or_cfg = {}
    if not isinstance(target_path_or_cfg, (dict, TinyConfig)):
        target_path_or_cfg = Path(target_path_or_cfg)
    tg = _target_shape(target_path_or_cfg)
    if n_embd == tg["n_embd"]:
        raise ValueError("the assistant's n_embd must differ from the target's (llama.cpp refuses it)")
    pattern = [il < n_layer - 1 for il in range(n_layer)] if swa_pattern is None else [bool(s) for s in swa_pattern]
    if len(pattern) != n_layer:
        raise ValueError(f"swa_pattern has {len(pattern)} entries for {n_layer} layers")
    reads = assistant_kv_layers(tg)
    n_kv = [tg["n_head_kv"][reads[swa]] for swa in pattern]
    if any(n_head % n for n in n_kv):
        raise ValueError(f"n_head {n_head} is not a multiple of the target's head_count_kv {n_kv}")
    cfg = TinyConfig(
        arch="gemma4-assistant", n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_ff=n_ff, n_vocab=tg["n_vocab"],
        n_ctx_train=tg["n_ctx_train"], head_dim=tg["head"], n_rot=tg["n_rot"], n_swa=tg["n_swa"],
        rope_base=tg["rope_base"], final_softcap=final_softcap, seed=seed, fused_qkv=False,
        extra_keys={"embedding_length_out": tg["n_embd"], "nextn_predict_layers": n_layer,
                    "attention.sliding_window_pattern": pattern, "attention.head_count_kv": n_kv,
                    "attention.key_length_swa": tg["head_swa"], "attention.value_length_swa": tg["head_swa"],
                    "rope.dimension_count_swa": tg["n_rot_swa"], "rope.freq_base_swa": float(tg["rope_base_swa"])})
    t = _Tiny(cfg)
    _common_keys(t)
    t.add("token_embd.weight", t.rng.standard_normal((cfg.n_vocab, n_embd)).astype(np.float32))  # also the output
    t.norm("output_norm.weight", n_embd)
    if not all(pattern):
        t.add("rope_freqs.weight", np.asarray(tg["rope_freqs"], np.float32))
    t.mat("nextn.pre_projection.weight", 2 * tg["n_embd"], n_embd)    # [target embedding | target hidden]
    t.mat("nextn.post_projection.weight", n_embd, tg["n_embd"])
    for il, swa in enumerate(pattern):
        p, head = f"blk.{il}.", tg["head_swa"] if swa else tg["head"]
        t.norm(p + "attn_norm.weight", n_embd)
        t.mat(p + "attn_q.weight", n_embd, head * n_head)
        t.mat(p + "attn_output.weight", head * n_head, n_embd)
        t.norm(p + "attn_q_norm.weight", head)
        t.norm(p + "post_attention_norm.weight", n_embd)
        t.add(p + "layer_output_scale.weight", np.array([0.5 + t.rng.random()], np.float32))
        t.norm(p + "ffn_norm.weight", n_embd)
        t.mat(p + "ffn_gate.weight", n_embd, n_ff)
        t.mat(p + "ffn_up.weight", n_embd, n_ff)
        t.mat(p + "ffn_down.weight", n_ff, n_embd)
        t.norm(p + "post_ffw_norm.weight", n_embd)
    return t.w.write(path)
