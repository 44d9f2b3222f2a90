#!/usr/bin/env python3
"""A real MCP server for the s12 tests, built with the official `mcp` package (2.x,
a test-only dependency): the lowlevel Server, so tools/list really pages.

    python tests/mcp_sdk_server.py [--tools N] [--page K] [--long]        # stdio
    python tests/mcp_sdk_server.py --http [--token T] [--json] [--tools N] ...  # Streamable HTTP

Over HTTP it listens on 127.0.0.1, a free port, and prints "PORT <n>" on stdout
once it accepts connections (over stdio, stdout is the protocol's own).
With --token T every HTTP request must carry "Authorization: Bearer T"; with
--json it answers application/json instead of an event stream.

Tools: echo, add, slow (0.5 s; it answers with its start and end) and image are annotated readOnlyHint; fail
returns isError; boom raises (a JSON-RPC error); structured returns
structuredContent; crash ends the process mid-call; hang never answers; grow
adds a tool and sends notifications/tools/list_changed; roots pings the client,
asks it for roots/list and answers with the URIs. --tools N adds gen_0 ..
gen_{N-1} (--long: each with a ~1,500-character description, for deferral).
"""
import argparse
import asyncio
import base64
import os
import socket
import sys
import time

import anyio
import mcp_types as types
from mcp.server.lowlevel import NotificationOptions, Server

PNG = base64.b64encode(bytes.fromhex(  # a 1x1 red pixel
    "89504e470d0a1a0a0000000d4948445200000001000000010802000000907753de"
    "0000000c4944415408d763f8cfc000000301010018dd8db00000000049454e44ae426082")).decode()
LONG = (" It belongs to a generated catalogue of look-up tools used to measure how much "
        "of the context a large server's tool definitions take. " * 12).strip()


def obj(**props):
    return {"type": "object", "properties": {k: {"type": t} for k, t in props.items()},
            "required": list(props)}


def make_tools(args):
    ro = types.ToolAnnotations(read_only_hint=True)
    tools = [
        types.Tool(name="echo", description="Echo the text back.", input_schema=obj(text="string"),
                   annotations=ro),
        types.Tool(name="add", description="Add two numbers.", input_schema=obj(a="number", b="number"),
                   annotations=ro),
        types.Tool(name="slow", description="Wait half a second, then say done.",
                   input_schema=obj(tag="string"), annotations=ro),
        types.Tool(name="image", description="A 1x1 PNG image.", input_schema=obj(), annotations=ro),
        types.Tool(name="fail", description="Always fails (isError).", input_schema=obj()),
        types.Tool(name="boom", description="Raises (a JSON-RPC error).", input_schema=obj()),
        types.Tool(name="structured", description="Structured content.", input_schema=obj(city="string")),
        types.Tool(name="crash", description="Ends the server process mid-call.", input_schema=obj()),
        types.Tool(name="hang", description="Never answers.", input_schema=obj()),
        types.Tool(name="grow", description="Adds the tool 'grown' and says so.", input_schema=obj()),
        types.Tool(name="roots", description="Asks the client for its roots (a request of the server's).",
                   input_schema=obj()),
    ]
    for i in range(args.tools):
        desc = f"Look up record {i} of the generated catalogue (keyword kw{i})." + (f" {LONG}" if args.long else "")
        tools.append(types.Tool(name=f"gen_{i}", description=desc, input_schema=obj(key="string")))
    return tools


def text(s):
    return types.CallToolResult(content=[types.TextContent(type="text", text=s)])


def build(args):
    tools = make_tools(args)

    async def list_tools(ctx, params):
        start = int(params.cursor) if params and params.cursor else 0
        page = tools[start:start + args.page]
        more = start + args.page < len(tools)
        return types.ListToolsResult(tools=page, next_cursor=str(start + args.page) if more else None)

    async def call_tool(ctx, params):
        name, a = params.name, params.arguments or {}
        if name == "echo":
            return text(f"echo: {a.get('text')}")
        if name == "add":
            return text(str(a["a"] + a["b"]))
        if name == "slow":  # its start and end, so a test can see calls overlap
            start = time.time()
            await anyio.sleep(0.5)
            return text(f"done {a.get('tag', '')} {start:.6f} {time.time():.6f}")
        if name == "image":
            return types.CallToolResult(content=[types.TextContent(type="text", text="a red pixel"),
                                                 types.ImageContent(type="image", data=PNG, mime_type="image/png")])
        if name == "fail":
            return types.CallToolResult(content=[types.TextContent(type="text", text="no such record")],
                                        is_error=True)
        if name == "boom":
            raise ValueError("boom went the tool")
        if name == "structured":
            return types.CallToolResult(content=[], structured_content={"city": a.get("city"), "temp": 21})
        if name == "crash":
            os._exit(3)
        if name == "hang":
            await anyio.sleep(3600)
        if name == "grow":
            if not any(t.name == "grown" for t in tools):
                tools.append(types.Tool(name="grown", description="Appeared later.", input_schema=obj()))
            await ctx.session.send_tool_list_changed()
            return text("grown")
        if name == "roots":
            await ctx.session.send_ping()
            found = await ctx.session.list_roots()
            return text(" ".join(str(r.uri) for r in found.roots))
        if name == "grown" or name.startswith("gen_"):
            return text(f"{name}: {a.get('key', '')}")
        raise ValueError(f"unknown tool {name}")

    return Server("sdk-test", version="1.0", on_list_tools=list_tools, on_call_tool=call_tool)


async def serve_stdio(server):
    from mcp.server.stdio import stdio_server
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options(NotificationOptions(tools_changed=True)))


def serve_http(server, token, json_response):
    import uvicorn
    app = server.streamable_http_app(json_response=json_response)
    if token:
        inner = app

        async def app(scope, receive, send):  # noqa: F811 - the guarded app
            if scope["type"] == "http" and (b"authorization", f"Bearer {token}".encode()) not in scope["headers"]:
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"unauthorized"})
                return
            await inner(scope, receive, send)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    http = uvicorn.Server(config)

    async def run():
        task = asyncio.ensure_future(http.serve(sockets=[sock]))
        while not http.started:
            await asyncio.sleep(0.02)
        print(f"PORT {sock.getsockname()[1]}", flush=True)
        await task
    asyncio.run(run())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tools", type=int, default=0)
    p.add_argument("--page", type=int, default=4)
    p.add_argument("--long", action="store_true")
    p.add_argument("--http", action="store_true")
    p.add_argument("--token")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    server = build(args)
    if args.http:
        serve_http(server, args.token, args.json)
    else:
        anyio.run(serve_stdio, server)


if __name__ == "__main__":
    sys.exit(main())
