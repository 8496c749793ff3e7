"""The tensors most decoder-only files share, as llama.cpp's load_tensors writes them out
case by case: the token embedding, the output norm and projection, and a layer of
attn_norm, attention, ffn_norm and a gated FFN (with Gemma's post-norms where asked).
Each architecture's `tensors` names what it adds or leaves out.
"""
from __future__ import annotations

from llama.hparams import HParams
from llama.weights import Need, TensorTable


def add_embd_output(hp: HParams, t: TensorTable, output: bool = True,
                    output_bias: bool = False) -> None:
    """tok_embd and output_norm; with `output`, an optional output.weight (absent: the
    projection is tied to the embedding); with `output_bias`, an optional output.bias."""
    n_embd, n_vocab = hp.n_embd, hp.n_vocab
    t.add("tok_embd", "token_embd.weight", (n_embd, n_vocab))
    t.add("output_norm", "output_norm.weight", (n_embd,))
    if output:
        t.add("output", "output.weight", (n_embd, n_vocab), optional=True)
    if output_bias:
        t.add("output_b", "output.bias", (n_vocab,), optional=True)


def add_decoder_layer(hp: HParams, t: TensorTable, il: int, post_norms: bool = False,
                      **attention: Need) -> None:
    """Layer il of a pre-norm decoder with a gated FFN; `attention` goes to
    TensorTable.add_attention. post_norms adds Gemma 2/3's attn_post_norm and ffn_post_norm
    (post_attention_norm, post_ffw_norm)."""
    n_embd = hp.n_embd
    t.add_layer(il, "attn_norm", "attn_norm.weight", (n_embd,))
    t.add_attention(il, hp, **attention)
    if post_norms:
        t.add_layer(il, "attn_post_norm", "post_attention_norm.weight", (n_embd,))
    t.add_layer(il, "ffn_norm", "ffn_norm.weight", (n_embd,))
    t.add_gated_ffn(il, n_embd, hp.n_ff[il])
    if post_norms:
        t.add_layer(il, "ffn_post_norm", "post_ffw_norm.weight", (n_embd,))
