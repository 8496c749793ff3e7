"""The server's configuration: llama-server's options that ggmlpy implements, by the same
names and meanings, plus a few of ggmlpy's own (`max_queue`, `body_limit`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ServerConfig:
    model: str
    host: str = "127.0.0.1"
    port: int = 8080
    ctx_size: int = 4096          # total, split between the slots (llama-server's -c)
    parallel: int = 1             # slots (-np)
    threads: int | None = None
    batch_size: int = 2048
    ubatch_size: int = 512
    n_gpu_layers: int = 0
    devices: list[str] | None = None          # -dev: offload devices (default with -ngl: every GPU)
    tensor_split: list[float] | None = None   # -ts
    override_tensor: list[str] | None = None  # -ot PATTERN=DEVICE items
    repack: bool = True                       # --repack / -nr: weights in the CPU backend's layouts
    api_keys: list[str] = field(default_factory=list)
    alias: str | None = None      # --alias: the model's names, comma-separated (the first in order is its id)
    tags: str | None = None       # --tags: comma-separated, listed by /v1/models
    n_predict: int = -1           # default max tokens per request; -1: up to the slot's end
    seed: int = -1
    temp: float = 0.8
    embedding: bool = False
    reranking: bool = False       # --reranking: /rerank answers (embedding on, pooling rank)
    pooling: str | None = None
    metrics: bool = False
    slots: bool = True
    props: bool = False           # --props: POST /props answers (it changes nothing, as llama-server's)
    jinja: bool = True
    chat_template: str | None = None   # a built-in format name or a jinja source
    chat_template_kwargs: dict = field(default_factory=dict)   # --chat-template-kwargs: template variables
    reasoning: str = "auto"       # -rea: thinking on, off or auto (where the template shows it)
    reasoning_format: str = "auto"   # how reasoning is returned: auto, deepseek, deepseek-legacy, none
    reasoning_budget: int = -1    # --reasoning-budget: reasoning tokens before the end marker is forced (-1: no cap)
    reasoning_budget_message: str | None = None   # --reasoning-budget-message: written before it
    context_shift: bool = False
    spm_infill: bool = False      # /infill's suffix before the prefix (--spm-infill)
    cache_reuse: int = 0          # --cache-reuse: the requests' default n_cache_reuse (0: off)
    ctx_checkpoints: int = 32     # --ctx-checkpoints: per slot, where the memory cannot drop tokens
    sse_ping_interval: int = 30   # seconds of silence in a stream before a ":" ping; -1: none
    slot_save_path: str | None = None
    cont_batching: bool = True
    flash_attn: str = "auto"
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    kv_unified: bool = False
    swa_full: bool = False
    offline: bool = False
    webui: bool = True            # the chat page at / (llama-server's default; --no-ui: off)
    backend: str | None = None
    # LoRA adapters (--lora, --lora-scaled): (path, scale) in the order given, ids 0, 1, ...
    lora: list[tuple[str, float]] = field(default_factory=list)
    lora_init_without_apply: bool = False  # loaded with scale 0 (POST /lora-adapters applies them)
    max_queue: int = 64           # requests waiting for a slot; beyond: 503
    body_limit: int = 8 << 20     # bytes of a request body; beyond: 413
    cors_origins: str = "*"       # --cors-origins: "*", "localhost" or a comma-separated list
    cors_methods: str = "GET, POST, DELETE, OPTIONS"   # --cors-methods
    cors_headers: str = "*"       # --cors-headers
    timeout_graceful_shutdown: float = 10.0
    # tools for agents (llama/server/tools): built-in ones by name ("all"), the runtime they run
    # in, MCP servers ({"mcpServers": {...}}), and the /cors-proxy for pages that reach MCP servers
    tools: list[str] = field(default_factory=list)
    tools_runtime: str | None = None
    mcp_servers: dict | None = None
    ui_mcp_proxy: bool = False
    vertex: Any = None            # gcp.VertexRoutes: Vertex AI's routes (AIP_MODE=PREDICTION), or None
    # speculative decoding (llama/speculative): llama-server's --spec-type list and its options
    spec_type: list[str] = field(default_factory=list)   # none, ngram-simple, draft-simple
    model_draft: str | None = None    # -md: the draft model (draft-simple)
    spec_draft_n_max: int = 3
    spec_draft_n_min: int = 0
    spec_draft_p_min: float = 0.0
    spec_ngram_size_n: int = 12       # --spec-ngram-simple-size-n / -m
    spec_ngram_size_m: int = 48
    sleep_idle_seconds: float = -1   # --sleep-idle-seconds: unload the model after this long idle (-1: never)
    verbose: bool = False         # --verbose: debug logs, and answers carry `__verbose` unless asked not to

    @property
    def aliases(self) -> list[str]:
        return sorted({a.strip() for a in (self.alias or "").split(",") if a.strip()})

    @property
    def tag_list(self) -> list[str]:
        return sorted({t.strip() for t in (self.tags or "").split(",") if t.strip()})

    @property
    def model_name(self) -> str:
        """The id /v1/models reports: the first alias in order (llama-server keeps them in a
        std::set), or the model as given."""
        return self.aliases[0] if self.aliases else self.model
