"""s06: the clearing policy knows its floor.

What no clear can lower (tools, system prompt, the prompts, the files re-attached
after a compaction) is the floor: WORKING_BUDGET counts only the results above
it, and a batch clear, which makes the next request write all its messages to
the cache again, must free enough to repay that within CLEAR_PAYBACK requests:
0.1 S (N + 1) >= 1.15 W (S freed, W the messages left). Both are seen here from
the requests the scripted API received, at the chapter's own defaults.
"""
import json
import re

import pytest

from conftest import chapters_from, message_bodies, strip_cache
from fake_api import reply, tool

each = pytest.mark.parametrize("mod", chapters_from("s06"), indirect=True)
CLEARED = "old tool result cleared"
SUMMARY = "<summary>\n1. Primary request: read the files, one a turn.\n</summary>"


def tokens(obj):
    return len(json.dumps(obj, ensure_ascii=False)) // 4   # the chapter's estimate


def make_files(workspace, first, count):
    """14 KB files (~3.6K tokens each), f<first>..: BEGIN-i ... END-i."""
    for i in range(first, first + count):
        rows = "".join(f"f{i:03d} row {n:03d}: " + "lorem ipsum dolor sit amet " * 2 + "\n" for n in range(190))
        (workspace / f"f{i:03d}.txt").write_text(f"BEGIN-{i:03d}\n{rows}END-{i:03d}\n")


def read_all(mod, api, client, history, first, count):
    api.script([reply(tool("read_file", {"path": f"f{i:03d}.txt"})) for i in range(first, first + count)]
               + [reply("Read them all.")])
    assert mod.agent_loop(client, history) == "end_turn"
    assert api.remaining() == 0 and api.exhausted == 0


def results(body):
    """tool_use_id -> result text, in order."""
    return {b["tool_use_id"]: str(b["content"]) for m in body["messages"] if m["role"] == "user"
            and isinstance(m["content"], list) for b in m["content"] if b.get("type") == "tool_result"}


def clears(bodies):
    """Indexes of the requests where more results show as placeholders than in the one before."""
    shown = [sum(CLEARED in text for text in results(b).values()) for b in bodies]
    return [k for k in range(1, len(bodies)) if shown[k] > shown[k - 1]]


def freed(before, after):
    """Tokens the placeholders of a clear freed: the results whole in `before`, cleared in `after`."""
    now = results(after)
    return sum(tokens(full) - tokens(now[key]) for key, full in results(before).items()
               if CLEARED not in full and CLEARED in now.get(key, ""))


@each
def test_the_working_budget_counts_above_the_floor(mod, api, client, workspace):
    # A long pasted prompt (~30K tokens) is floor: no clear can lower it. Results are
    # cleared only once they alone would free more than WORKING_BUDGET, not as soon as
    # floor and results together pass it (that was after 3 reads here).
    make_files(workspace, 0, 18)
    history = [{"role": "user", "content": "Context:\n" + "notes on the design. " * 6_000
                + "\nNow read f000.txt to f017.txt, one a turn."}]
    read_all(mod, api, client, history, 0, 18)
    bodies = message_bodies(api)
    batches = clears(bodies)
    assert batches, "no batch clear at all"
    before = results(bodies[batches[0] - 1])
    above_floor = sum(tokens(text) - 25 for text in before.values() if CLEARED not in text)
    assert above_floor > mod.WORKING_BUDGET == 20_000


@each
def test_after_a_compaction_a_batch_clear_repays_its_rewrite(mod, api, client, workspace):
    # The case: after a compaction, 5 re-attached files (~18K tokens) and the
    # summary are floor. A budget on the whole request then left little room, and a
    # batch clear (each a ~30K-token cache rewrite) came every 3 requests.
    make_files(workspace, 0, 40)
    history = [{"role": "user", "content": "Read f000.txt to f007.txt, one a turn."}]
    read_all(mod, api, client, history, 0, 8)
    api.script([reply(SUMMARY)])
    mod.compact_now(client, history)
    assert sum("Re-read after compaction" in json.dumps(m) for m in history) == 1   # the files are back
    start = len(message_bodies(api))
    mod.add_user_text(history, "Now read f008.txt to f039.txt, one a turn.")
    read_all(mod, api, client, history, 8, 32)
    bodies = message_bodies(api)[start:]
    batches = clears(bodies)
    assert batches, "no batch clear at all"
    gaps = [b - a for a, b in zip([0] + batches, batches)]
    assert min(gaps) >= 5, f"batch clears at requests {batches}: every few requests"
    n, read, write = mod.CLEAR_PAYBACK, mod.CACHE_READ_PRICE, mod.CACHE_WRITE_PRICE
    for k in batches:
        saved = freed(bodies[k - 1], bodies[k])
        rewritten = tokens(strip_cache(bodies[k]["messages"]))   # W: what the next request writes again
        assert read * saved * (n + 1) >= (write - read) * rewritten * 0.97, (k, saved, rewritten)


@each
def test_a_cleared_result_is_kept_in_the_file_its_placeholder_names(mod, api, client, workspace):
    # A placeholder's way back must be real: "run the tool again" was none for a command
    # with effects (here each run appends to a log, so a rerun prints something else).
    # Every result a batch clears is saved as it is cleared; the placeholder names where.
    make_files(workspace, 0, 12)
    calls = [tool("bash", {"command": f"echo run >> runs.log; wc -l < runs.log; cat f{i:03d}.txt"})
             for i in range(12)]
    api.script([reply(c) for c in calls] + [reply("Done.")])
    history = [{"role": "user", "content": "Run the twelve commands, one a turn."}]
    assert mod.agent_loop(client, history) == "end_turn"
    first = {b["tool_use_id"]: b["content"] for b in history[2]["content"]}[calls[0]["id"]]
    assert first.startswith("1\nBEGIN-000")  # the first run's own output
    last = results(message_bodies(api)[-1])[calls[0]["id"]]
    assert CLEARED in last, "the first result was never cleared"
    path = re.search(r"the full output is in (\S+) ", last)[1]
    assert (workspace / path).read_text() == first  # the way back gives the result back, whole
