"""`ggmlpy serve`: an OpenAI- and llama-server-compatible HTTP server over one `Llama`
whose context is shared by `-np` slots, all decoded together each step (continuous
batching, docs/architecture.md, decision 11). `create_app(config)` builds the FastAPI app."""
from llama.server.app import HTTP_PROTOCOL, Server, create_app
from llama.server.config import ServerConfig

__all__ = ["HTTP_PROTOCOL", "Server", "ServerConfig", "create_app"]
