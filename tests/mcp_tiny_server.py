#!/usr/bin/env python3
"""A tiny MCP server over stdio, standard library only: what the offline demo
bundles, and the misbehaving server of the fault tests.

    python tests/mcp_tiny_server.py [--fault crash|garbage|hang] [--banner] [--slow-start S] [--trace]

It speaks MCP 2025-11-25: newline-delimited JSON-RPC 2.0 on stdin and stdout,
its log on stderr. Tools: word_count {text} and env {name} (both annotated
readOnlyHint), and shout {text}. With --fault, every tools/call goes wrong:
crash ends the process, garbage prints lines that are not JSON-RPC instead of
an answer, hang never answers. --banner prints one stray line on stdout at
start (a common mistake a client should survive); --slow-start waits S seconds
before it answers initialize. --trace writes every JSON-RPC message to stderr as
it goes, "<- " what the client sent, "-> " the answer (the offline demo shows the
exchange from the log its client keeps of the server's stderr).
"""
import argparse
import json
import os
import sys
import time

TOOLS = [
    {"name": "word_count", "description": "Count the words in a text.",
     "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
     "annotations": {"readOnlyHint": True}},
    {"name": "env", "description": "The value of one environment variable of the server's process.",
     "inputSchema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
     "annotations": {"readOnlyHint": True}},
    {"name": "shout", "description": "The text in capital letters.",
     "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}},
]


TRACE = []   # --trace: [True]


def trace(arrow, line):
    if TRACE:
        print(f"{arrow} {line}", file=sys.stderr, flush=True)


def send(message):
    line = json.dumps(message)
    trace("->", line)
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def call(name, args):
    if name == "word_count":
        return f"{len(str(args.get('text', '')).split())} words"
    if name == "env":
        return os.environ.get(str(args.get("name")), "(not set)")
    if name == "shout":
        return str(args.get("text", "")).upper()
    return None


def answer(message, args):
    method, rid = message.get("method"), message.get("id")
    if method == "initialize":
        time.sleep(args.slow_start)
        return {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                "serverInfo": {"name": "tiny", "version": "1.0"}}
    if method == "tools/list":
        return {"tools": TOOLS}
    if method == "ping":
        return {}
    if method == "tools/call":
        if args.fault == "crash":
            print("tiny: crashing on purpose", file=sys.stderr, flush=True)
            os._exit(7)
        if args.fault == "garbage":
            for i in range(500):
                sys.stdout.write(f"garbage line {i}: this is not JSON-RPC\n")
            sys.stdout.flush()
            return "no answer"
        if args.fault == "hang":
            return "no answer"
        params = message.get("params") or {}
        text = call(params.get("name"), params.get("arguments") or {})
        if text is None:
            return {"error": {"code": -32602, "message": f"unknown tool {params.get('name')}"}}
        return {"content": [{"type": "text", "text": text}]}
    return {"error": {"code": -32601, "message": f"method {method} not found"}} if rid is not None else None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--fault", choices=("crash", "garbage", "hang"))
    p.add_argument("--banner", action="store_true")
    p.add_argument("--slow-start", type=float, default=0.0)
    p.add_argument("--trace", action="store_true")
    args = p.parse_args()
    TRACE[:] = [True] * args.trace
    print("tiny: started", file=sys.stderr, flush=True)
    if args.banner:
        print("tiny MCP server ready", flush=True)   # not JSON-RPC: the client must skip it
    for line in sys.stdin:
        if not line.strip():
            continue
        trace("<-", line.strip())
        message = json.loads(line)
        if "id" not in message:       # a notification (initialized, cancelled): nothing to answer
            continue
        result = answer(message, args)
        if result == "no answer":
            continue
        if isinstance(result, dict) and "error" in result:
            send({"jsonrpc": "2.0", "id": message["id"], "error": result["error"]})
        else:
            send({"jsonrpc": "2.0", "id": message["id"], "result": result})


if __name__ == "__main__":
    main()
