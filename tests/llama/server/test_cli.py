"""`ggmlpy serve` flags: llama-server's names map onto ServerConfig; unknown ones fail."""
import os
import subprocess
import sys

import pytest

from ggmlpy.cli import build_parser
from ggmlpy.ir.types import GGMLType
from ggmlpy.cli.serve_cmd import config_from_args


def test_llama_server_flags_map_to_the_config(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("k2\n\nk3\n")
    args = build_parser().parse_args([
        "serve", "-m", "m.gguf", "-np", "4", "-c", "8192", "-t", "2", "-b", "256", "-ub", "128",
        "-ngl", "3", "--api-key", "k1", "--api-key-file", str(keys), "--alias", "a", "-n", "64",
        "--seed", "7", "--temp", "0.5", "--no-slots", "--metrics", "-fa", "off", "-ctk", "f32",
        "-ctv", "bf16", "--swa-full", "-kvu", "--embeddings", "--pooling", "mean",
        "--context-shift", "--sse-ping-interval", "5", "--cache-reuse", "256", "--props"])
    cfg = config_from_args(args)
    assert (cfg.parallel, cfg.ctx_size, cfg.threads, cfg.batch_size, cfg.ubatch_size) == (4, 8192, 2, 256, 128)
    assert cfg.api_keys == ["k1", "k2", "k3"] and cfg.model_name == "a"
    assert (cfg.n_predict, cfg.seed, cfg.temp, cfg.slots, cfg.metrics) == (64, 7, 0.5, False, True)
    assert (cfg.flash_attn, cfg.cache_type_k, cfg.cache_type_v, cfg.swa_full) == ("off", "f32", "bf16", True)
    assert cfg.embedding and cfg.pooling == "mean" and cfg.host == "127.0.0.1" and cfg.port == 8080
    assert cfg.context_shift and cfg.sse_ping_interval == 5 and cfg.cache_reuse == 256 and cfg.props
    assert not config_from_args(build_parser().parse_args(["serve", "-m", "m.gguf"])).props


def test_offload_flags_reach_the_model_placement(tmp_path):
    """-dev, -ngl, -ts and -ot are llama-server's (and `ggmlpy run`'s): the server's model
    is placed by them (a second CPU device stands in for a GPU)."""
    from ggmlpy.testing.models import write_tiny_llama
    from llama.server.state import load_llama

    path = write_tiny_llama(tmp_path / "tiny.gguf", n_layer=3, tied=True)
    args = build_parser().parse_args(["serve", "-m", str(path), "-c", "256", "-t", "1", "-dev", "cpu:1",
                                      "-ngl", "99", "-ot", r"token_embd=CPU,blk\.0\.=cpu"])
    cfg = config_from_args(args)
    assert (cfg.devices, cfg.n_gpu_layers, cfg.tensor_split) == (["cpu:1"], 99, None)
    assert cfg.override_tensor == ["token_embd=CPU", r"blk\.0\.=cpu"]
    llm = load_llama(cfg)
    p = llm.model.placement
    assert p.layers == ("cpu:1",) * 3 and p.output == "cpu:1"
    assert p.device_of_name("blk.0.attn_q.weight") == "cpu" and p.device_of_name("blk.1.attn_q.weight") == "cpu:1"
    assert "token_embd.weight" in p.tied and "also on" not in p.describe()  # the output product on the host
    assert llm.tokenize(b"hi") == llm.model.tokenize("hi")


def test_no_repack_reaches_the_model(tmp_path):
    """-nr (llama-server's --no-repack): the server's model keeps every weight as the file has it."""
    from ggmlpy.testing.models import write_tiny_llama
    from llama.server.state import load_llama

    path = write_tiny_llama(tmp_path / "tiny.gguf", n_layer=2, weight_type=GGMLType.Q4_0)
    copies = {}
    for flags in ([], ["-nr"]):
        cfg = config_from_args(build_parser().parse_args(["serve", "-m", str(path), "-c", "128", "-t", "1", *flags]))
        llm = load_llama(cfg)   # its warm-up decode repacks
        assert cfg.repack == llm.model.repack == (not flags)
        copies[bool(flags)] = len(llm.model.backend_cache["cpu.repacked"].arrays)
    assert copies[False] > 0 and copies[True] == 0


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


def test_ray_flags_parse_and_bad_ones_fail():
    from ggmlpy.cli.serve_cmd import ray_options_from_args
    parse = build_parser().parse_args
    opts = ray_options_from_args(parse(["serve", "-m", "m.gguf", "--ray", "--autoscaling-min", "1",
                                        "--autoscaling-max", "4", "--autoscaling-config",
                                        '{"target_ongoing_requests": 3}', "--replica-cpus", "2"]))
    assert opts["autoscaling"] == {"target_ongoing_requests": 3, "min_replicas": 1, "max_replicas": 4}
    assert opts["replica_cpus"] == 2 and opts["address"] is None and opts["replicas"] == 1
    assert ray_options_from_args(parse(["serve", "-m", "m.gguf"])) is None
    for argv, message in ((["--replicas", "2"], "--replicas: only with --ray"),
                          (["--ray", "--replicas", "0"], "at least 1"),
                          (["--ray", "--autoscaling-config", "{"], "not valid JSON"),
                          (["--ray", "--autoscaling-config", "[1]"], "JSON object"),
                          (["--ray", "--replicas", "2", "--autoscaling-max", "3"], "fixed")):
        with pytest.raises(ValueError, match=message):
            ray_options_from_args(parse(["serve", "-m", "m.gguf", *argv]))


def test_serve_ray_without_the_ray_extra_names_it(tmp_path):
    """A Python where Ray cannot be imported gets one line naming the [ray] extra."""
    blocker = tmp_path / "block"
    (blocker / "ray").mkdir(parents=True)
    (blocker / "ray" / "__init__.py").write_text("raise ImportError('blocked', name='ray')\n")
    res = subprocess.run([sys.executable, "-m", "ggmlpy", "serve", "--ray", "-m", "smollm2-135m"],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(blocker)})
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        "ggmlpy serve: error: ray is not installed; --ray needs the extra: pip install 'ggmlpy[ray]'"]


def test_llama_server_spellings_and_the_flags_ggmlpy_lacks():
    """llama.cpp reads `_` as `-` in flag names; a flag whose feature ggmlpy lacks is refused
    by name (exit 2, the reason on stderr), one whose ask ggmlpy already meets is accepted."""
    from ggmlpy.cli.server_flags import FlagError, check, normalize

    assert normalize(["--cors_origins=a_b", "--no_ui", "x_y"]) == ["--cors-origins=a_b", "--no-ui", "x_y"]
    assert check(["-m", "m", "--cache-ram", "0", "--no-cache-idle-slots", "--reasoning-format=none", "-np", "2"]) \
        == ["-m", "m", "--reasoning-format=none", "-np", "2"]
    for argv, needle in ((["--mmproj-url", "u"], "--mmproj-url is not supported: ggmlpy runs no vision"),
                         (["--backend-sampling"], "--backend-sampling is not supported"),
                         (["--cache-ram", "256"], "--cache-ram 256: ggmlpy supports only --cache-ram 0")):
        with pytest.raises(FlagError, match=needle):
            check(argv)
    proc = subprocess.run([sys.executable, "-m", "ggmlpy", "serve", "-m", "m.gguf", "--spec_synth_len", "2"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "--spec-synth-len is not supported" in proc.stderr and "usage" not in proc.stderr
    args = build_parser().parse_args(["serve", "-m", "m", "--alias", "tinyllama-2,fim,code", "--tags", "chat,fim,small",
                                      "--no-ui", "--verbose"])
    cfg = config_from_args(args)
    assert cfg.aliases == ["code", "fim", "tinyllama-2"] and cfg.model_name == "code"
    assert cfg.tag_list == ["chat", "fim", "small"] and not cfg.webui and args.verbose


def test_llama_server_flags_for_reasoning_tools_and_modes(monkeypatch):
    """The flags llama-server's suite starts its server with, read into the config with
    llama-server's meanings; bad values fail naming the flag."""
    from llama.server.gcp import VertexRoutes
    parse = build_parser().parse_args
    cfg = config_from_args(parse([
        "serve", "-m", "m", "-rea", "off", "--reasoning-format", "deepseek-legacy", "--reasoning-budget", "16",
        "--reasoning-budget-message", "Done.", "--chat-template-kwargs", '{"enable_thinking": false}',
        "--reranking", "--sleep-idle-seconds", "2.5", "--mcp-servers-json",
        '{"mcpServers": {"echo": {"command": "python3", "args": ["x.py"]}}}', "--ui-mcp-proxy", "-kvu"]))
    assert (cfg.reasoning, cfg.reasoning_format, cfg.reasoning_budget, cfg.reasoning_budget_message) == \
        ("off", "deepseek-legacy", 16, "Done.")
    assert cfg.chat_template_kwargs == {"enable_thinking": False}
    assert cfg.reranking and cfg.embedding and cfg.pooling == "rank" and cfg.sleep_idle_seconds == 2.5
    assert cfg.mcp_servers["mcpServers"]["echo"]["args"] == ["x.py"] and cfg.ui_mcp_proxy and cfg.kv_unified
    assert cfg.cors_origins == "localhost"   # MCP servers narrow CORS, as llama-server's
    assert cfg.vertex is None
    monkeypatch.setenv("AIP_MODE", "PREDICTION")
    assert config_from_args(parse(["serve", "-m", "m"])).vertex == VertexRoutes("/predict", None)
    for argv, message in ((["--reasoning-budget", "-2"], "--reasoning-budget"),
                          (["--chat-template-kwargs", "[1]"], "--chat-template-kwargs must be a JSON object"),
                          (["--mcp-servers-json", "{"], "MCP config")):
        with pytest.raises(ValueError, match=message):
            config_from_args(parse(["serve", "-m", "m", *argv]))
