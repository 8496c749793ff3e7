#!/usr/bin/env python3
"""A small MCP server for the tests of llama/server/tools/mcp.py: JSON-RPC 2.0 on stdio, one
message a line, exiting at the end of its stdin.

Tools:
  echo {message}   "echo: <message>"
  add {a, b}       their sum
  slow {seconds}   sleeps, then "slept <seconds>"; answered from its own thread, so calls
                   made after it can be answered before it
  fail_once        an RPC error on this process's first call, "ok" after
  is_error         a result flagged isError
  notify {message} a progress notification, a line that is not JSON, a blank line and the
                   reply, all in one write
  ping_client      pings the client, answers "pong" once the client answered the ping
  crash            exits without answering
  pid              this process's id
  env {name}       the variable's value and the working directory, as JSON
  state            what the client told this process, as JSON: whether it sent
                   notifications/initialized, and the ids it cancelled

Flags: --hang-init (never answer initialize), --grandchild (start a grandchild that sleeps
holding this process's stdio; `pid` then also gives its pid), --stderr TEXT (write TEXT to
stderr at start), --paged (list the tools in two pages), --stubborn (ignore SIGTERM and stay
after the end of stdin).
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time

TOOLS = [
    {"name": "echo", "description": "Echo back the message",
     "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}},
    {"name": "add", "description": "Add two numbers",
     "inputSchema": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}},
    {"name": "slow", "description": "Sleep, then answer",
     "inputSchema": {"type": "object", "properties": {"seconds": {"type": "number"}}}},
    {"name": "fail_once", "description": "Fail the first time"},
    {"name": "is_error", "description": "A result that is an error", "inputSchema": {"type": "object"}},
    {"name": "notify", "description": "Notify, then answer", "inputSchema": {"type": "object"}},
    {"name": "ping_client", "description": "Ping the client, then answer", "inputSchema": {"type": "object"}},
    {"name": "crash", "description": "Exit without answering", "inputSchema": {"type": "object"}},
    {"name": "pid", "description": "The process id", "inputSchema": {"type": "object"}},
    {"name": "env", "description": "An environment variable and the cwd", "inputSchema": {"type": "object"}},
    {"name": "state", "description": "What the client said", "inputSchema": {"type": "object"}},
]

write_lock = threading.Lock()
state = {"initialized": False, "cancelled": [], "failed_once": False, "grandchild": None}
pings = {}   # id of our ping -> id of the tools/call waiting for its answer


def write(*messages):
    data = "".join(m if isinstance(m, str) else json.dumps(m) + "\n" for m in messages).encode()
    with write_lock:
        os.write(1, data)


def text(req_id, value, is_error=False):
    result = {"content": [{"type": "text", "text": value}]}
    if is_error:
        result["isError"] = True
    return {"jsonrpc": "2.0", "id": req_id, "result": result}


def error(req_id, code, message):
    return {"jsonrpc": "2.0", "id": req_id, "error": {"code": code, "message": message}}


def slow(req_id, seconds):
    time.sleep(seconds)
    write(text(req_id, f"slept {seconds}"))


def call(req_id, name, args):
    if name == "echo":
        return text(req_id, f"echo: {args.get('message', '')}")
    if name == "add":
        return text(req_id, str(args.get("a", 0) + args.get("b", 0)))
    if name == "slow":
        threading.Thread(target=slow, args=(req_id, args.get("seconds", 1)), daemon=True).start()
        return None
    if name == "fail_once":
        if not state["failed_once"]:
            state["failed_once"] = True
            return error(req_id, -32000, "transient error")
        return text(req_id, "ok")
    if name == "is_error":
        return text(req_id, "it went wrong", is_error=True)
    if name == "notify":
        progress = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1, "total": 2}}
        write(progress, "not json\n", "\n", text(req_id, f"echo: {args.get('message', '')}"))
        return None
    if name == "ping_client":
        ping_id = f"ping-{req_id}"
        pings[ping_id] = req_id
        return {"jsonrpc": "2.0", "id": ping_id, "method": "ping"}
    if name == "crash":
        os._exit(3)
    if name == "pid":
        return text(req_id, json.dumps({"pid": os.getpid(), "grandchild": state["grandchild"]}))
    if name == "env":
        return text(req_id, json.dumps({"value": os.environ.get(args.get("name", "")), "cwd": os.getcwd()}))
    if name == "state":
        return text(req_id, json.dumps({"initialized": state["initialized"], "cancelled": state["cancelled"]}))
    return error(req_id, -32602, f"Unknown tool: {name}")


def handle(msg, flags):
    method, req_id, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
    if method is None:   # a reply to our ping
        if req_id in pings and "result" in msg:
            return text(pings.pop(req_id), "pong")
        return None
    if req_id is None:   # a notification
        if method == "notifications/initialized":
            state["initialized"] = True
        elif method == "notifications/cancelled":
            state["cancelled"].append(params.get("requestId"))
        return None
    if method == "initialize":
        if "--hang-init" in flags:
            return None
        return {"jsonrpc": "2.0", "id": req_id, "result": {
            "protocolVersion": "2024-11-05", "capabilities": {"tools": {}},
            "serverInfo": {"name": "test-echo", "version": "1.0"}}}
    if method == "tools/list":
        if "--paged" not in flags:
            return {"jsonrpc": "2.0", "id": req_id, "result": {"tools": TOOLS}}
        if params.get("cursor") == "page2":
            return {"jsonrpc": "2.0", "id": req_id, "result": {"tools": TOOLS[2:]}}
        return {"jsonrpc": "2.0", "id": req_id, "result": {"tools": TOOLS[:2], "nextCursor": "page2"}}
    if method == "tools/call":
        return call(req_id, params.get("name"), params.get("arguments") or {})
    if method == "ping":
        return {"jsonrpc": "2.0", "id": req_id, "result": {}}
    return error(req_id, -32601, f"Method not found: {method}")


def main():
    flags = sys.argv[1:]
    if "--stderr" in flags:
        os.write(2, (flags[flags.index("--stderr") + 1] + "\n").encode())
    if "--grandchild" in flags:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        state["grandchild"] = child.pid
    if "--stubborn" in flags:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for line in sys.stdin.buffer:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        reply = handle(msg, flags)
        if reply is not None:
            write(reply)
    if "--stubborn" in flags:
        time.sleep(60)


if __name__ == "__main__":
    main()
