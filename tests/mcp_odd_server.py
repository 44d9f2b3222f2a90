#!/usr/bin/env python3
"""A stdio MCP server that does odd things on purpose, standard library only: the
review tests' server (tests/test_s12_mcp_review.py).

    python tests/mcp_odd_server.py '<settings as JSON>'   (or the path of a file that holds them)

Settings (all optional):
    tools         the tool list (default: one tool, ok {x})
    page          tools per tools/list page (nextCursor is the offset)
    endless       every page brings new tools and a new cursor, forever
    same_cursor   every page's nextCursor is "again"
    result        what tools/call answers (default: a text block "ok")
    noread        after tools/list, stop reading stdin (the pipe fills up)
    hang          never answer tools/call
    stderr_bytes  bytes written to stderr at start
    record        a file: every message received is appended to it, one per line
"""
import json
import sys
import time

ARG = sys.argv[1] if len(sys.argv) > 1 else "{}"
SETTINGS = json.loads(ARG if ARG.startswith("{") else open(ARG).read())
TOOLS = SETTINGS.get("tools") or [{"name": "ok", "description": "Fine.",
                                   "inputSchema": {"type": "object", "properties": {"x": {"type": "string"}}}}]


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")   # ensure_ascii: a lone surrogate goes as \udc80
    sys.stdout.flush()


def tools_page(params):
    if SETTINGS.get("same_cursor"):
        return {"tools": TOOLS, "nextCursor": "again"}
    offset = int(params.get("cursor") or 0)
    if SETTINGS.get("endless"):
        return {"tools": [{"name": f"t{offset}", "inputSchema": {"type": "object"}}], "nextCursor": str(offset + 1)}
    size = SETTINGS.get("page") or len(TOOLS)
    page = {"tools": TOOLS[offset:offset + size]}
    return page | ({"nextCursor": str(offset + size)} if offset + size < len(TOOLS) else {})


def answer(method, params):
    if method == "initialize":
        return {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}, "serverInfo": {"name": "odd"}}
    if method == "tools/list":
        return tools_page(params)
    if method == "tools/call":
        return SETTINGS.get("result") or {"content": [{"type": "text", "text": "ok"}]}
    return {}


def main():
    if SETTINGS.get("stderr_bytes"):
        sys.stderr.write("e" * SETTINGS["stderr_bytes"] + "\n")
        sys.stderr.flush()
    for line in sys.stdin:
        message = json.loads(line)
        if SETTINGS.get("record"):
            with open(SETTINGS["record"], "a") as f:
                f.write(json.dumps(message) + "\n")
        if "id" not in message:
            continue
        method = message.get("method")
        if method == "tools/call" and SETTINGS.get("hang"):
            continue
        send({"jsonrpc": "2.0", "id": message["id"], "result": answer(method, message.get("params") or {})})
        if method == "tools/list" and SETTINGS.get("noread"):
            time.sleep(3600)                    # stdin is never read again


if __name__ == "__main__":
    main()
