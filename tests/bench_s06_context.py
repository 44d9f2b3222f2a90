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

Every figure comes from the request bodies the server logged, with one token
estimator for all (characters / 4), so the numbers are comparable:
  input tokens     sum over requests;   peak context: the largest request
  prefix stability the share of each request's predecessor it repeats byte for
                   byte (cache_control ignored): 1.0 = the history only grew
  est. input cost  list price $3/M input tokens; cache reads 0.1x, writes 1.25x.
                   Cache simulator: the prefix up to the last breakpoint that
                   the previous request also had, and that still matches it
                   byte for byte, is a read; the rest up to the newest
                   breakpoint is a write; anything after it is plain input.
                   (a) and (b) send no cache: everything is plain input.

A second scenario splits the work over several prompts: 100 reads of
distinct 14 KB files, 25 per user prompt, four prompts in one session (each
prompt is a new user turn appended to the same history, each ends on a text
reply). It compares the peer-style policy, (b) above, with the chapter's
defaults; --sweep adds candidate settings (KEEP_RESULTS x WORKING_BUDGET x
CLEAR_MIN_SHARE) on both scenarios, each with its ratio to (b).

--edit-every N makes every Nth read (the first, the N+1th, ...) followed by an
edit_file of the file just read (one more request each), for policies that
treat the reads of edited files differently (exercise s06.1); --chapter takes
any file in the repository root, a learner's copy too (--chapter my_s06).

Run:  python tests/bench_s06_context.py [--turns 100] [--chapter s06_compact] [--sweep]
                                         [--edit-every N]
Prints the tables and the cost ratios to (b); it never asserts anything.
"""
import argparse
import contextlib
import importlib.util
import io
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import anthropic

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
sys.path.insert(0, str(TESTS))

from conftest import strip_cache as plain  # noqa: E402  (the same cleaning the tests use)
from fake_api import ScriptedAPI, reply, tool  # noqa: E402

FILE_BYTES = 12 * 1024
PRICE_INPUT = 3.00              # USD per million input tokens
READ, WRITE = 0.10, 1.25        # cache read / write multipliers
CLEARED = "old tool result cleared"
NO_COMPACTION = {"AUTO_COMPACT_AT": math.inf, "FORCE_COMPACT_AT": math.inf}
POLICIES = [
    ("(a) no management", False,
     {"WORKING_BUDGET": math.inf, "CACHE_TTL": math.inf, **NO_COMPACTION}),
    ("(b) clear every turn, keep 3, no cache", False,
     {"WORKING_BUDGET": 0, "KEEP_RESULTS": 3, **NO_COMPACTION}),
    ("(c) this chapter: batches + cache", True, {}),
]
PROMPTS, PROMPT_FILE_BYTES = 4, 14 * 1024   # the multi-prompt scenario: 4 prompts, 14 KB files
SWEEP_KEEP = (2, 3)                          # KEEP_RESULTS candidates
SWEEP_BUDGET = (30_000, 40_000, 50_000)      # WORKING_BUDGET candidates, tokens
SWEEP_MIN_FREE = (5_000, 10_000, 15_000)     # tokens a batch must free: CLEAR_MIN_SHARE x budget


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


def load(chapter, settings, workspace):
    """A fresh copy of the chapter module (no state shared between policies)."""
    spec = importlib.util.spec_from_file_location(f"bench_{chapter}", ROOT / f"{chapter}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.CURRENT.set(mod.AgentState(workspace))
    for name, value in settings.items():
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


def replay(chapter, settings, turns, prompts=1, file_bytes=FILE_BYTES, edit_every=0):
    """The session: `turns` reads split evenly over `prompts` user prompts, each a
    new user turn in the same history. Returns the logged request bodies."""
    with tempfile.TemporaryDirectory() as tmp, ScriptedAPI() as api:
        workspace = Path(tmp)
        make_files(workspace, turns, file_bytes)
        mod = load(chapter, settings, workspace)
        mod.MAX_TURNS = 2 * turns + 10
        client = anthropic.Anthropic(api_key="bench", base_url=api.url, max_retries=0)
        history, per = [], turns // prompts
        for p in range(prompts):
            first, last = p * per, turns if p == prompts - 1 else (p + 1) * per
            api.script(steps(first, last, edit_every) + [reply("Read them all.")])
            history.append({"role": "user", "content":
                            f"Read f{first:03d}.txt to f{last - 1:03d}.txt, one a turn."})
            quiet = io.StringIO()
            with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
                reason = mod.agent_loop(client, history)
            if reason != "end_turn" or api.invalid() or api.exhausted or api.remaining():
                sys.exit(f"replay failed (prompt {p + 1}): {reason} {api.invalid()[:1]}")
        return [r["body"] for r in api.requests if r["path"].split("?")[0] == "/v1/messages"]


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


def breakpoints(segs):
    out, pos = [], 0
    for s, bp in segs:
        pos += len(s)
        if bp:
            out.append(pos)
    return out


def measure(bodies, caching, turns):
    segs = [segments(b) for b in bodies]
    sizes = [sum(len(s) for s, _ in sg) for sg in segs]
    cost_chars, reads, writes, stable_all, stable_between, clears = 0.0, 0, 0, [], [], 0
    for k, sg in enumerate(segs):
        bps = breakpoints(sg) if caching else []
        read = 0
        if k:
            shared = common_prefix(segs[k - 1], sg)
            share = shared / sizes[k - 1]
            stable_all.append(share)
            grew = bodies[k - 1]["messages"].__str__().count(CLEARED) < str(bodies[k]["messages"]).count(CLEARED)
            clears += grew
            if not grew:
                stable_between.append(share)
            written = set(breakpoints(segs[k - 1])) if caching else set()
            read = max([p for p in bps if p <= shared and p in written], default=0)
        last = bps[-1] if bps else 0
        reads += read
        writes += max(0, last - read)
        cost_chars += (sizes[k] - last) + READ * read + WRITE * max(0, last - read)
    text = [json.dumps(b, ensure_ascii=False) for b in bodies]
    seen = sum(any(f"BEGIN-{i:03d}" in t and f"END-{i:03d}" in t for t in text) for i in range(turns))
    return {"requests": len(bodies), "tokens": sum(sizes) // 4, "peak": max(sizes) // 4,
            "stable": sum(stable_all) / len(stable_all),
            "between": (sum(stable_between) / len(stable_between), min(stable_between))
            if stable_between else (0.0, 0.0),
            "clears": clears, "cost": cost_chars / 4 * PRICE_INPUT / 1e6, "seen": seen,
            "cached": reads / sum(sizes), "reads": reads // 4, "writes": writes // 4}


def one_prompt(chapter, turns, edit_every=0):
    """The first scenario: (a), (b) and (c) over one prompt."""
    rows = []
    for name, caching, settings in POLICIES:
        began = time.monotonic()
        bodies = replay(chapter, settings, turns, edit_every=edit_every)
        rows.append((name, measure(bodies, caching, turns), time.monotonic() - began))
    edits = f", every {edit_every}th followed by an edit" if edit_every else ""
    print(f"{turns} turns, each reading a different {FILE_BYTES // 1024} KB file{edits} "
          f"({chapter}); tokens = characters / 4\n")
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
    print(f"\nratio (c)/(b) estimated input cost: {c['cost'] / b['cost']:.2f}   (target <= 0.60)")
    print(f"ratio (c)/(a): {c['cost'] / a['cost']:.2f}; (a) peaks at {a['peak']:,} tokens "
          f"{'(past the 200,000 window: the real API would refuse it)' if a['peak'] > 200_000 else ''}")
    print("stable = share of the previous request repeated byte for byte (mean over all requests);"
          "\nbetween clears = the same over requests where no batch clear happened (target >= 0.99);"
          "\ncached = share of all input tokens that were cache reads")
    print("replay time: " + ", ".join(f"{name[:3]} {t:.1f}s" for name, _, t in rows))
    return b


def candidates():
    """The sweep: (label, settings) for each KEEP_RESULTS x budget x batch minimum."""
    for keep in SWEEP_KEEP:
        for budget in SWEEP_BUDGET:
            for least in SWEEP_MIN_FREE:
                yield (f"keep {keep}, {budget // 1000}K, batch >= {least // 1000}K",
                       {"KEEP_RESULTS": keep, "WORKING_BUDGET": budget,
                        "CLEAR_MIN_SHARE": least / budget})


def compare(title, chapter, turns, prompts, file_bytes, sweep, peer=None, target="", edit_every=0):
    """Peer policy (b) vs the chapter's defaults (and the sweep), with ratios to (b)."""
    began = time.monotonic()
    if peer is None:
        peer = measure(replay(chapter, POLICIES[1][2], turns, prompts, file_bytes, edit_every),
                       False, turns)
    defaults = load(chapter, {}, ROOT)
    now = (f"defaults: keep {defaults.KEEP_RESULTS}, {defaults.WORKING_BUDGET // 1000}K, batch >= "
           f"{defaults.CLEAR_MIN_SHARE * defaults.WORKING_BUDGET / 1000:g}K")
    rows = [("(b) peer: keep 3, clear every turn, no cache", peer),
            (f"(c) {now}", measure(replay(chapter, {}, turns, prompts, file_bytes, edit_every),
                                   True, turns))]
    for label, settings in (candidates() if sweep else ()):
        rows.append((f"    {label}", measure(replay(chapter, settings, turns, prompts, file_bytes,
                                                    edit_every), True, turns)))
    print(f"\n{title} ({chapter}); tokens = characters / 4\n")
    head = (f"{'policy':46} {'input tok':>10} {'peak ctx':>9} {'cache read':>10} {'cache write':>11} "
            f"{'clears':>6} {'est. cost':>10} {'x (b)':>6} {'files seen':>10}")
    print(head + "\n" + "-" * len(head))
    for name, m in rows:
        print(f"{name:46} {m['tokens']:>10,} {m['peak']:>9,} {m['reads']:>10,} {m['writes']:>11,} "
              f"{m['clears']:>6} {'$' + format(m['cost'], '.3f'):>10} {m['cost'] / peer['cost']:>6.2f} "
              f"{m['seen']:>6}/{turns}")
    print(f"\nratio (c)/(b) estimated input cost: {rows[1][1]['cost'] / peer['cost']:.2f}"
          f"{target}; replay time {time.monotonic() - began:.0f}s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=100)
    ap.add_argument("--chapter", default="s06_compact")
    ap.add_argument("--sweep", action="store_true",
                    help="also replay the candidate settings on both scenarios (a few minutes)")
    ap.add_argument("--edit-every", type=int, default=0, metavar="N",
                    help="follow every Nth read by an edit of that file (default: no edits)")
    args = ap.parse_args()
    peer = one_prompt(args.chapter, args.turns, args.edit_every)
    if args.sweep:
        compare(f"Sweep, {args.turns} turns in one prompt, {FILE_BYTES // 1024} KB files",
                args.chapter, args.turns, 1, FILE_BYTES, True, peer, edit_every=args.edit_every)
    compare(f"{args.turns} reads of different {PROMPT_FILE_BYTES // 1024} KB files over "
            f"{PROMPTS} prompts ({args.turns // PROMPTS} each) in one session",
            args.chapter, args.turns, PROMPTS, PROMPT_FILE_BYTES, args.sweep,
            target="   (target <= 0.55)", edit_every=args.edit_every)


if __name__ == "__main__":
    main()
