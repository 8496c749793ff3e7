"""`ggmlpy serve` flags: llama-server's names map onto ServerConfig; unknown ones fail."""
import os
import subprocess
import sys

import pytest

from ggmlpy.cli import build_parser
from ggmlpy.cli.serve_cmd import config_from_args


def test_llama_server_flags_map_to_the_config(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("k2\n\nk3\n")
    args = build_parser().parse_args([
        "serve", "-m", "m.gguf", "-np", "4", "-c", "8192", "-t", "2", "-b", "256", "-ub", "128",
        "-ngl", "3", "--api-key", "k1", "--api-key-file", str(keys), "--alias", "a", "-n", "64",
        "--seed", "7", "--temp", "0.5", "--no-slots", "--metrics", "-fa", "off", "-ctk", "f32",
        "-ctv", "bf16", "--swa-full", "-kvu", "--embeddings", "--pooling", "mean"])
    cfg = config_from_args(args)
    assert (cfg.parallel, cfg.ctx_size, cfg.threads, cfg.batch_size, cfg.ubatch_size) == (4, 8192, 2, 256, 128)
    assert cfg.api_keys == ["k1", "k2", "k3"] and cfg.model_name == "a"
    assert (cfg.n_predict, cfg.seed, cfg.temp, cfg.slots, cfg.metrics) == (64, 7, 0.5, False, True)
    assert (cfg.flash_attn, cfg.cache_type_k, cfg.cache_type_v, cfg.swa_full) == ("off", "f32", "bf16", True)
    assert cfg.embedding and cfg.pooling == "mean" and cfg.host == "127.0.0.1" and cfg.port == 8080


def test_unknown_flag_is_an_error_naming_it(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "-m", "m.gguf", "--no-such-flag"])
    assert "--no-such-flag" in capsys.readouterr().err


def test_serve_without_the_server_extra_names_it(tmp_path):
    """A Python where fastapi/uvicorn cannot be imported gets one line naming the extra."""
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "uvicorn.py").write_text("raise ImportError('blocked', name='uvicorn')\n")
    res = subprocess.run([sys.executable, "-m", "ggmlpy", "serve", "-m", "smollm2-135m"],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(blocker)})
    assert res.returncode == 1
    assert "pip install 'ggmlpy[server]'" in res.stderr and "Traceback" not in res.stderr
