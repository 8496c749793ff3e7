"""`ggmlpy serve -ctk/-ctv`: llama-server's KV cache types. The flags take llama.cpp's names;
a server on a quantised cache answers as Llama does with the same types, its slot files
hold the cache's bytes and are refused by a server of other types; a quantised V with
-fa off is refused when the model loads, with llama.cpp's message."""
from __future__ import annotations

import pytest

from ggmlpy.cli import build_parser
from ggmlpy.cli.serve_cmd import config_from_args
from llama.server.state import load_llama
from tests.llama.server.conftest import running
from tests.tools.kv_quant_vectors import write_file

PROMPT = [5, 17, 200, 33, 41, 9, 8, 7, 100]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_file("h32", tmp_path_factory.mktemp("kv_types_server"))


def test_the_flags_take_llama_cpps_names(capsys):
    args = build_parser().parse_args(["serve", "-m", "m.gguf", "-ctk", "q8_0", "--cache-type-v", "iq4_nl"])
    cfg = config_from_args(args)
    assert (cfg.cache_type_k, cfg.cache_type_v, cfg.flash_attn) == ("q8_0", "iq4_nl", "auto")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "-m", "m.gguf", "-ctk", "q2_k"])
    assert "q5_1" in capsys.readouterr().err   # the allowed values are listed


def test_a_quantised_v_with_flash_attention_off_is_refused(tiny):
    args = build_parser().parse_args(["serve", "-m", str(tiny), "-c", "64", "-ctv", "q4_0", "-fa", "off"])
    with pytest.raises(ValueError, match="quantized V cache requires flash_attn to be enabled"):
        load_llama(config_from_args(args))


def test_a_server_on_a_quantised_cache(tiny, tmp_path):
    from llama import Llama

    body = {"prompt": PROMPT, "n_predict": 6, "temperature": 0, "id_slot": 0, "return_tokens": True}
    with running(tiny, parallel=1, ctx_size=128, cache_type_k="q8_0", cache_type_v="q4_0",
                 slot_save_path=str(tmp_path)) as s, s.client() as c:
        ctx = s.state.llm.ctx
        assert (ctx.type_k, ctx.type_v, ctx.flash_attn) == ("q8_0", "q4_0", True)
        first = c.post("/completion", json=body).json()
        direct = Llama(str(tiny), n_ctx=128, type_k=8, type_v=2, verbose=False)
        expected = direct.create_completion(PROMPT, max_tokens=6, temperature=0.0)["choices"][0]["text"]
        assert first["content"] == expected
        saved = c.post("/slots/0?action=save", json={"filename": "q.bin"}).json()
        assert saved["n_saved"] > 0
        c.post("/slots/0?action=erase")
        restored = c.post("/slots/0?action=restore", json={"filename": "q.bin"}).json()
        assert restored["n_restored"] == saved["n_saved"]
        assert c.post("/completion", json=body).json()["content"] == first["content"]
    with running(tiny, parallel=1, ctx_size=128, slot_save_path=str(tmp_path)) as s, s.client() as c:
        r = c.post("/slots/0?action=restore", json={"filename": "q.bin"})
        assert r.status_code == 400
        assert "saved with KV cache types K q8_0, V q4_0; this server's are K f16, V f16" in r.text
