"""Tools the server runs for its clients, as llama-server's `--tools` and MCP servers:
built-in file and shell tools (builtin.py) and the tools of configured MCP servers (mcp.py),
listed and invoked through `GET/POST /tools` (routes.py). Every tool has the interface in
base.py."""
