#!/usr/bin/env python3
"""Benchmark (not a test): what s12's MCP client does for time and for the cache.

    python tests/bench_s12_mcp.py [--runs 3] [--turns 12] [--chapter s12_worktree_mcp]

1. Parallel calls. A real MCP server (tests/mcp_sdk_server.py over stdio, the
   official mcp package) has a tool `slow` that takes 0.5 s and is annotated
   readOnlyHint, so the chapter marks it concurrency-safe. One reply with 4
   calls of it goes through the chapter's own run_tools, once as registered
   (the 4 calls run at once) and once with the tool marked not concurrency-safe
   (one after the other). The median wall time of --runs runs each is printed
   side by side, with the ratio.
2. Deferred tools and the prompt cache. The same server with 71 tools (60 of
   them with ~1,500-character descriptions, ~25K tokens of definitions) plays a
   session of --turns requests against the scripted model (tests/fake_api.py,
   which simulates the prompt cache by prefix). In both runs the model calls
   one of the 71 tools at request 3 and bash otherwise; with deferral it finds
   the tool with tool_search at request 2, without (defer: false) it is sent
   the 71 definitions every time. Printed: requests whose tools block changed,
   and the input, cache-read and cache-write tokens the API reported, summed.

Figures only; nothing here can fail on time.
"""
import argparse
import contextlib
import importlib
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
sys.path[:0] = [str(ROOT), str(TESTS)]

import anthropic  # noqa: E402
from fake_api import ScriptedAPI, reply, tool  # noqa: E402

SERVER = [sys.executable, str(TESTS / "mcp_sdk_server.py")]


@contextlib.contextmanager
def agent(mod, servers):
    """A fresh agent on a throwaway workspace with these MCP servers (the user's own config)."""
    with tempfile.TemporaryDirectory() as ws, mod.acting_as(mod.AgentState(ws)) as state:
        state.mode, state.permissions["sandbox"]["enabled"] = "bypassPermissions", False
        state.permissions["mcp_servers"] = [("user", "bench", servers)]
        with contextlib.redirect_stderr(io.StringIO()):
            mod.start_mcp(wait=60)
        try:
            yield state
        finally:
            mod.close_mcp()


def four_calls(mod, runs):
    """Median seconds for one reply's 4 calls of the 0.5 s tool: (parallel, serial)."""
    calls = [SimpleNamespace(id=f"toolu_{i}", name="mcp__sdk__slow", input={"tag": str(i)}) for i in range(4)]
    times = {True: [], False: []}
    with agent(mod, {"sdk": {"command": SERVER[0], "args": SERVER[1:]}}):
        flags = mod.TOOL_FLAGS["mcp__sdk__slow"]
        for _ in range(runs):
            for safe in (True, False):
                flags["concurrency_safe"] = safe
                t = time.perf_counter()
                with contextlib.redirect_stderr(io.StringIO()):
                    results = mod.run_tools(calls, [])
                times[safe].append(time.perf_counter() - t)
                assert all(not r.get("is_error") for r in results), results
    return statistics.median(times[True]), statistics.median(times[False])


def session(mod, api, defer, turns):
    """One scripted session; returns (requests whose tools changed, input, cache read, cache write)."""
    bills, charge = [], mod.charge
    mod.charge = lambda message, usage=None: bills.append(message.usage) or charge(message, usage)
    servers = {"sdk": {"command": SERVER[0], "args": [*SERVER[1:], "--tools", "60", "--long", "--page", "25"],
                       "defer": None if defer else False}}
    steps = [reply(tool("bash", {"command": "echo 1"}))]
    steps.append(reply(tool("tool_search", {"query": "kw7"}) if defer else tool("bash", {"command": "echo 2"})))
    steps.append(reply(tool("mcp__sdk__gen_7", {"key": "k"})))
    steps += [reply(tool("bash", {"command": f"echo {i}"})) for i in range(4, turns)] + [reply("done")]
    api.reset(full=True)
    api.script(steps)
    client = anthropic.Anthropic(api_key="bench", base_url=api.url, max_retries=0)
    try:
        with agent(mod, servers), contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            assert mod.agent_loop(client, [{"role": "user", "content": "work"}]) == "end_turn"
    finally:
        mod.charge = charge
    assert not api.invalid(), api.invalid()[0]["error"]
    bodies = [r["body"] for r in api.requests if r["path"].split("?")[0] == "/v1/messages"]
    names = [[t["name"] for t in b["tools"]] for b in bodies]
    changed = sum(a != b for a, b in zip(names, names[1:]))
    return (len(bodies), changed, sum(u.input_tokens for u in bills),
            sum(u.cache_read_input_tokens for u in bills), sum(u.cache_creation_input_tokens for u in bills))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--chapter", default="s12_worktree_mcp")
    args = ap.parse_args()
    os.environ["AGENT_AUTO_MEMORY"] = "0"
    for var in ("NO_PROXY", "no_proxy"):
        os.environ[var] = ",".join(filter(None, ["127.0.0.1", "localhost", os.environ.get(var, "")]))
    mod = importlib.import_module(args.chapter)

    parallel, serial = four_calls(mod, args.runs)
    print(f"4 calls of a 0.5 s read-only MCP tool in one reply (median of {args.runs}):")
    print(f"  {'parallel (readOnlyHint)':<28}{parallel:6.2f} s")
    print(f"  {'serial':<28}{serial:6.2f} s")
    print(f"  parallel is {serial / parallel:.1f}x faster")

    api = ScriptedAPI().start()
    try:
        rows = [("deferred, found at request 2", session(mod, api, True, args.turns)),
                ("all 71 sent (defer: false)", session(mod, api, False, args.turns))]
    finally:
        api.close()
    print(f"\nA session of {args.turns} requests with 71 MCP tools (~25K tokens of definitions):")
    print(f"  {'':<30}{'requests':>9}{'tools changed':>15}{'input':>9}{'cache read':>12}{'cache write':>13}")
    for label, (n, changed, inp, read, write) in rows:
        print(f"  {label:<30}{n:>9}{changed:>15}{inp:>9,}{read:>12,}{write:>13,}")
    (_, _, i1, r1, w1), (_, _, i2, r2, w2) = rows[0][1], rows[1][1]
    cost = lambda i, r, w: i + 0.1 * r + 1.25 * w   # in input-token units at list prices
    print(f"  input cost with deferral: {cost(i1, r1, w1) / cost(i2, r2, w2):.2f} x without "
          f"(cache reads 0.1x, writes 1.25x the input price)")


if __name__ == "__main__":
    main()
