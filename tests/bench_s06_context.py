#!/usr/bin/env python3
"""Benchmark: what three context policies cost over one long session.

Replays a scripted session through the real chapter loop (agent_loop, with its
real tools and history management) against the local scripted Messages API:
the model reads a different 12 KB file on each of 100 turns. The same script
runs under three policies, set through the chapter's own constants:

  (a) no management        no clearing, no compaction, no cache
  (b) clear every turn     keep the last 3 results, clear the rest on every
                           turn (the naive "microcompact"), no cache
  (c) this chapter         batch clearing past WORKING_BUDGET, KEEP_RESULTS
                           kept, cache breakpoints as sent by the chapter

Every figure comes from the scripted API's log: the request bodies, and the usage
it answered each with (its tokens: 4 bytes of request body a token):
  input tokens     sum over requests;   peak context: the largest request
  prefix stability the share of each request's predecessor it repeats byte for
                   byte (cache_control ignored): 1.0 = the history only grew
  est. input cost  list price $3/M input tokens; cache reads 0.1x, writes 1.25x,
                   as fake_api.PromptCache bills them: the API's documented
                   prompt-caching rules (each breakpoint looks back up to 20
                   blocks for a prefix an earlier request wrote; writes only at
                   breakpoints; a prefix under the model's minimum is not
                   cached), the one cost model tests/bench_vs_claude_code.py
                   uses too. (a) and (b) send no cache (the peer course sends no
                   cache_control): every token is plain input.

A second scenario splits the work over several prompts: 100 reads of
distinct 14 KB files, 25 per user prompt, four prompts in one session (each
prompt is a new user turn appended to the same history, each ends on a text
reply). A third is the same with a compaction after the first prompt (/compact:
a summary and 5 re-attached files, ~20K tokens no clear can lower, the floor of
the later prompts). They compare the peer-style policy, (b) above, with the
chapter's defaults; --sweep adds candidate settings (KEEP_RESULTS x
WORKING_BUDGET x CLEAR_PAYBACK) on every scenario, each with its ratio to (b).
--window 200K or 1M sets the model (claude-sonnet-4-5, claude-opus-5-5: the
scripted API's window and minimum cacheable prefix) and the chapter's
CONTEXT_WINDOW with the limits made from it; (a) always runs on the 1M model,
as it goes past 200K.

--edit-every N makes every Nth read (the first, the N+1th, ...) followed by an
edit_file of the file just read (one more request each), for policies that
treat the reads of edited files differently (exercise s06.1); --chapter takes
any file in the repository root, a learner's copy too (--chapter my_s06).

Run:  python tests/bench_s06_context.py [--turns 100] [--chapter s06_compact] [--sweep]
                                         [--edit-every N] [--window 200K|1M]
Prints the tables and the cost ratios to (b); it never asserts anything.
"""
import argparse
import contextlib
import importlib.util
import io
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import anthropic

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
sys.path.insert(0, str(TESTS))

from conftest import strip_cache as plain  # noqa: E402  (the same cleaning the tests use)
from fake_api import ScriptedAPI, priced, reply, tool  # noqa: E402

FILE_BYTES = 12 * 1024
PRICE_INPUT = 3.00              # USD per million input tokens
CLEARED = "old tool result cleared"
MODELS = {"200K": "claude-sonnet-4-5", "1M": "claude-opus-5-5"}   # as bench_vs_claude_code.py
WINDOW = {"200K": 200_000, "1M": 1_000_000}
SUMMARY = ("<summary>\n1. Primary request: read the files named in each prompt, one a turn.\n"
           "2. Done so far: the first prompt's files.\n</summary>")
NO_COMPACTION = {"AUTO_COMPACT_AT": math.inf, "FORCE_COMPACT_AT": math.inf}
POLICIES = [
    ("(a) no management", False,
     {"WORKING_BUDGET": math.inf, "CACHE_TTL": math.inf, **NO_COMPACTION}),
    ("(b) clear every turn, keep 3, no cache", False,
     {"WORKING_BUDGET": 0, "KEEP_RESULTS": 3, "CLEAR_PAYBACK": math.inf, **NO_COMPACTION}),
    ("(c) this chapter: batches + cache", True, {}),
]
PROMPTS, PROMPT_FILE_BYTES = 4, 14 * 1024   # the multi-prompt scenario: 4 prompts, 14 KB files
SWEEP_KEEP = (1, 2, 3)                       # KEEP_RESULTS candidates
SWEEP_BUDGET = (20_000, 30_000, 40_000, 50_000)  # WORKING_BUDGET candidates, tokens above the floor
SWEEP_PAYBACK = (5, 10, 20)                  # CLEAR_PAYBACK candidates, requests


def make_files(workspace, turns, file_bytes=FILE_BYTES):
    for i in range(turns):
        lines, size, n = [f"BEGIN-{i:03d}"], 0, 0
        while size < file_bytes - 80:
            n += 1
            row = f"f{i:03d} row {n:03d}: " + "lorem ipsum dolor sit amet " * 2
            lines.append(row)
            size += len(row) + 1
        lines.append(f"END-{i:03d}")
        (workspace / f"f{i:03d}.txt").write_text("\n".join(lines) + "\n")


def load(chapter, settings, workspace, window="200K"):
    """A fresh copy of the chapter module (no state shared between policies), its
    context window and the limits made from it set to `window`."""
    spec = importlib.util.spec_from_file_location(f"bench_{chapter}", ROOT / f"{chapter}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.CURRENT.set(mod.AgentState(workspace))
    size = WINDOW[window]
    limits = {"CONTEXT_WINDOW": size, "AUTO_COMPACT_AT": size - mod.OUTPUT_RESERVE - mod.SAFETY_MARGIN,
              "FORCE_COMPACT_AT": size - mod.OUTPUT_RESERVE - 3_000, "PERSIST_PROMPT_BYTES": size // 4 * 4}
    for name, value in {**limits, **settings}.items():
        if not hasattr(mod, name):
            sys.exit(f"{chapter} has no constant {name}")
        setattr(mod, name, value)
    return mod


def steps(first, last, edit_every):
    """Replies that read f<first>..f<last - 1>, every edit_every-th read followed by an edit."""
    out = []
    for i in range(first, last):
        out.append(reply(tool("read_file", {"path": f"f{i:03d}.txt"})))
        if edit_every and i % edit_every == 0:
            out.append(reply(tool("edit_file", {"path": f"f{i:03d}.txt", "old_string": f"BEGIN-{i:03d}\n",
                                                "new_string": f"BEGIN-{i:03d} (edited)\n"})))
    return out


def replay(chapter, settings, turns, prompts=1, file_bytes=FILE_BYTES, edit_every=0, window="200K",
           compact_after=None):
    """The session: `turns` reads split evenly over `prompts` user prompts, each a
    new user turn in the same history (with /compact after prompt compact_after).
    Returns the logged Messages requests: {"body", "usage", "summary"} each."""
    with tempfile.TemporaryDirectory() as tmp, ScriptedAPI() as api:
        workspace = Path(tmp)
        make_files(workspace, turns, file_bytes)
        mod = load(chapter, settings, workspace, window)
        mod.MAX_TURNS = 2 * turns + 10
        old_model = os.environ.get("MODEL_ID")
        os.environ["MODEL_ID"] = MODELS[window]
        client = anthropic.Anthropic(api_key="bench", base_url=api.url, max_retries=0)
        history, per, summaries = [], turns // prompts, 0
        try:
            for p in range(prompts):
                first, last = p * per, turns if p == prompts - 1 else (p + 1) * per
                api.script(steps(first, last, edit_every) + [reply("Read them all.")])
                history.append({"role": "user", "content":
                                f"Read f{first:03d}.txt to f{last - 1:03d}.txt, one a turn."})
                quiet = io.StringIO()
                with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
                    reason = mod.agent_loop(client, history)
                    if p == compact_after:
                        api.add(reply(SUMMARY))
                        summaries = len(api.requests) + 1
                        mod.compact_now(client, history)
                if reason != "end_turn" or api.invalid() or api.exhausted or api.remaining():
                    sys.exit(f"replay failed (prompt {p + 1}): {reason} {api.invalid()[:1]}")
        finally:
            os.environ.pop("MODEL_ID") if old_model is None else os.environ.update(MODEL_ID=old_model)
        return [{"body": r["body"], "usage": r["usage"], "summary": n + 1 == summaries}
                for n, r in enumerate(api.requests) if r["path"].split("?")[0] == "/v1/messages"]


# --- measuring the logged requests ----------------------------------------

def segments(body):
    """The request in cache order (tools, system, messages) as (text, breakpoint) pieces."""
    system = body.get("system") or []
    if isinstance(system, str):
        system = [{"type": "text", "text": system}]
    pieces = [("tool", t) for t in body.get("tools", [])] + [("system", b) for b in system]
    for m in body["messages"]:
        pieces += [(m["role"], b) for b in m["content"]]
    return [(json.dumps([role, plain(b)], ensure_ascii=False), "cache_control" in b)
            for role, b in pieces]


def common_prefix(a, b):
    """Characters two segment lists share from the start."""
    n = 0
    for (x, _), (y, _) in zip(a, b):
        if x != y:
            return n + next((k for k, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
        n += len(x)
    return n


def measure(requests, caching, turns):
    """Figures of one replay. With caching, each request as the scripted API billed it
    (fake_api.PromptCache); without, every token plain input, as a request with no
    cache_control is billed."""
    bodies = [r["body"] for r in requests]
    segs = [segments(b) for b in bodies]
    sizes = [sum(len(s) for s, _ in sg) for sg in segs]
    stable_all, stable_between, clears = [], [], 0
    for k in range(1, len(segs)):
        share = common_prefix(segs[k - 1], segs[k]) / sizes[k - 1]
        stable_all.append(share)
        grew = str(bodies[k - 1]["messages"]).count(CLEARED) < str(bodies[k]["messages"]).count(CLEARED)
        clears += grew
        if not grew:
            stable_between.append(share)
    usage = [r["usage"] for r in requests]
    totals = [u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
              for u in usage]
    reads = sum(u["cache_read_input_tokens"] for u in usage) if caching else 0
    writes = sum(u["cache_creation_input_tokens"] for u in usage) if caching else 0
    units = sum(map(priced, usage)) if caching else sum(totals)
    text = [json.dumps(b, ensure_ascii=False) for b in bodies]
    seen = sum(any(f"BEGIN-{i:03d}" in t and f"END-{i:03d}" in t for t in text) for i in range(turns))
    return {"requests": len(bodies), "tokens": sum(totals), "peak": max(totals),
            "stable": sum(stable_all) / len(stable_all),
            "between": (sum(stable_between) / len(stable_between), min(stable_between))
            if stable_between else (0.0, 0.0),
            "clears": clears, "cost": units * PRICE_INPUT / 1e6, "seen": seen,
            "cached": reads / sum(totals), "reads": reads, "writes": writes,
            "summaries": sum(r["summary"] for r in requests)}


def one_prompt(chapter, turns, edit_every=0, window="200K"):
    """The first scenario: (a), (b) and (c) over one prompt."""
    rows = []
    for name, caching, settings in POLICIES:
        began = time.monotonic()
        on = "1M" if name.startswith("(a)") else window   # past 200K: refused on a 200K model
        requests = replay(chapter, settings, turns, edit_every=edit_every, window=on)
        rows.append((name, measure(requests, caching, turns), time.monotonic() - began))
    edits = f", every {edit_every}th followed by an edit" if edit_every else ""
    print(f"{turns} turns, each reading a different {FILE_BYTES // 1024} KB file{edits} "
          f"({chapter}, {window} window: {MODELS[window]}); tokens = request bytes / 4\n")
    head = (f"{'policy':40} {'requests':>8} {'input tok':>10} {'peak ctx':>9} {'stable':>7} "
            f"{'between clears':>15} {'clears':>6} {'cached':>6} {'est. cost':>10} {'files seen':>10}")
    print(head + "\n" + "-" * len(head))
    for name, m, _ in rows:
        mean, low = m["between"]
        print(f"{name:40} {m['requests']:>8} {m['tokens']:>10,} {m['peak']:>9,} {m['stable']:>7.3f} "
              f"{f'{mean:.3f} (min {low:.3f})':>15} {m['clears']:>6} {m['cached']:>6.0%} "
              f"{'$' + format(m['cost'], '.3f'):>10} "
              f"{m['seen']:>6}/{turns}")
    a, b, c = (m for _, m, _ in rows)
    print(f"\nratio (c)/(b) estimated input cost: {c['cost'] / b['cost']:.2f}   (target <= 0.50)")
    print(f"ratio (c)/(a): {c['cost'] / a['cost']:.2f}; (a) peaks at {a['peak']:,} tokens "
          f"{'(past a 200,000 window: the API would refuse it there)' if a['peak'] > 200_000 else ''}")
    print("stable = share of the previous request repeated byte for byte (mean over all requests);"
          "\nbetween clears = the same over requests where no batch clear happened (target >= 0.99);"
          "\ncached = share of all input tokens that were cache reads")
    print("replay time: " + ", ".join(f"{name[:3]} {t:.1f}s" for name, _, t in rows))
    return b


def candidates():
    """The sweep: (label, settings) for each KEEP_RESULTS x budget x payback."""
    for keep in SWEEP_KEEP:
        for budget in SWEEP_BUDGET:
            for payback in SWEEP_PAYBACK:
                yield (f"keep {keep}, {budget // 1000}K, repaid in {payback}",
                       {"KEEP_RESULTS": keep, "WORKING_BUDGET": budget, "CLEAR_PAYBACK": payback})


def compare(title, chapter, scenario, sweep, peer=None, target=""):
    """Peer policy (b) vs the chapter's defaults (and the sweep), with ratios to (b).
    scenario: replay()'s keywords but the settings."""
    began = time.monotonic()
    turns = scenario["turns"]
    if peer is None:
        peer = measure(replay(chapter, POLICIES[1][2], **scenario), False, turns)
    defaults = load(chapter, {}, ROOT)
    now = (f"defaults: keep {defaults.KEEP_RESULTS}, {defaults.WORKING_BUDGET // 1000}K, repaid in "
           f"{defaults.CLEAR_PAYBACK}")
    rows = [("(b) peer: keep 3, clear every turn, no cache", peer),
            (f"(c) {now}", measure(replay(chapter, {}, **scenario), True, turns))]
    for label, settings in (candidates() if sweep else ()):
        rows.append((f"    {label}", measure(replay(chapter, settings, **scenario), True, turns)))
    print(f"\n{title} ({chapter}, {scenario['window']} window: {MODELS[scenario['window']]}); "
          f"tokens = request bytes / 4\n")
    head = (f"{'policy':46} {'input tok':>10} {'peak ctx':>9} {'cache read':>10} {'cache write':>11} "
            f"{'clears':>6} {'est. cost':>10} {'x (b)':>6} {'files seen':>10}")
    print(head + "\n" + "-" * len(head))
    for name, m in rows:
        print(f"{name:46} {m['tokens']:>10,} {m['peak']:>9,} {m['reads']:>10,} {m['writes']:>11,} "
              f"{m['clears']:>6} {'$' + format(m['cost'], '.3f'):>10} {m['cost'] / peer['cost']:>6.2f} "
              f"{m['seen']:>6}/{turns}")
    if sweep:
        best = min(rows[2:], key=lambda row: row[1]["cost"])
        print(f"\ncheapest candidate: {best[0].strip()} at {best[1]['cost'] / peer['cost']:.2f} x (b)")
    print(f"\nratio (c)/(b) estimated input cost: {rows[1][1]['cost'] / peer['cost']:.2f}"
          f"{target}; replay time {time.monotonic() - began:.0f}s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=100)
    ap.add_argument("--chapter", default="s06_compact")
    ap.add_argument("--sweep", action="store_true",
                    help="also replay the candidate settings on every scenario (several minutes)")
    ap.add_argument("--edit-every", type=int, default=0, metavar="N",
                    help="follow every Nth read by an edit of that file (default: no edits)")
    ap.add_argument("--window", choices=sorted(WINDOW), default="200K",
                    help="the model's context window (default 200K)")
    args = ap.parse_args()
    peer = one_prompt(args.chapter, args.turns, args.edit_every, args.window)
    common = {"turns": args.turns, "edit_every": args.edit_every, "window": args.window}
    if args.sweep:
        compare(f"Sweep, {args.turns} turns in one prompt, {FILE_BYTES // 1024} KB files",
                args.chapter, common, True, peer)
    over = f"{args.turns} reads of different {PROMPT_FILE_BYTES // 1024} KB files over {PROMPTS} prompts " \
           f"({args.turns // PROMPTS} each) in one session"
    prompts = {**common, "prompts": PROMPTS, "file_bytes": PROMPT_FILE_BYTES}
    compare(over, args.chapter, prompts, args.sweep, target="   (target <= 0.50)")
    compare(f"{over}, /compact after the first (a summary and 5 files re-attached: the floor)",
            args.chapter, {**prompts, "compact_after": 0}, args.sweep, target="   (target <= 0.50)")


if __name__ == "__main__":
    main()
