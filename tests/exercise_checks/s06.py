"""Checks for exercises/s06.md. Each point: (what must hold, a hint, fn(x))."""
import contextlib
import io
import math
import re

from fake_api import error, reply, tool

CLEARED = "old tool result cleared"


def turn(x, steps, history=None, prompt="do the work"):
    """One scripted turn ending on 'Finished.', output captured; returns the history."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        if history is None:
            return x.turn(steps, prompt)
        x.api.script(list(steps) + [reply("Finished.")])
        x.mod.add_user_text(history, prompt)
        x.reason = x.mod.agent_loop(x.client, history)
        return history


# s06.1: never clear the read of a file being edited ------------------------------
def workspace(x, n, size=2_000):
    for i in range(n):
        (x.ws / f"f{i:02d}.txt").write_text(f"FILE-{i:02d}\n" + "z" * size + f"\nEND-{i:02d}\n")
    x.patch(x.mod, "WORKING_BUDGET", 2_000)      # a small window: batches come every few reads
    x.patch(x.mod, "KEEP_RESULTS", 2)
    x.patch(x.mod, "CLEAR_PAYBACK", math.inf)    # (each batch pays: these results are small)


def read(i):
    return tool("read_file", {"path": f"f{i:02d}.txt"})


def edit(i):
    return tool("edit_file", {"path": f"f{i:02d}.txt", "old_string": f"FILE-{i:02d}\n",
                              "new_string": f"FILE-{i:02d} (edited)\n"})


def shown(body, call):
    """'full', 'cleared' or None (not in the request) for a call's result."""
    for m in body["messages"]:
        for b in m["content"] if isinstance(m["content"], list) else []:
            if b.get("type") == "tool_result" and b["tool_use_id"] == call["id"]:
                return "cleared" if CLEARED in str(b.get("content")) else "full"
    return None


def edited_read_kept(x):
    workspace(x, 15)
    first = read(0)
    turn(x, [reply(first), reply(edit(0))] + [reply(read(i)) for i in range(1, 15)])
    last = x.bodies()[-1]
    assert sum(CLEARED in str(m["content"]) for m in last["messages"]) > 0, "no result was ever cleared"
    assert shown(last, first) == "full", ("f00.txt was edited after it was read, yet its read_file result "
                                          "was cleared: the model's next edit copies old_string from it")


def others_still_cleared(x):
    workspace(x, 15)
    reads = [read(i) for i in range(1, 15)]
    turn(x, [reply(read(0)), reply(edit(0))] + [reply(c) for c in reads])
    cleared = [c for c in reads if shown(x.bodies()[-1], c) == "cleared"]
    assert len(cleared) >= 8, (f"only {len(cleared)} of 14 reads of files never edited were cleared: "
                               f"protect the edited file's read, not every read")


def cleared_stays_cleared(x):
    workspace(x, 16)
    first = read(0)
    turn(x, [reply(first)] + [reply(read(i)) for i in range(1, 11)] + [reply(edit(0))]
         + [reply(read(i)) for i in range(11, 16)])
    states = [shown(b, first) for b in x.bodies()]
    assert "cleared" in states, "f00.txt's read was never cleared before its edit; the check needs it to be"
    after = states[states.index("cleared"):]
    assert "full" not in after, ("f00.txt's read, cleared before the file was edited, came back in a later "
                                 "request: that changes the cached prefix. A cleared result stays cleared.")


def at_most_three(x):
    workspace(x, 17)
    reads = [read(i) for i in range(5)]
    steps = [reply(c) for pair in zip(reads, [edit(i) for i in range(5)]) for c in pair]
    turn(x, steps + [reply(read(i)) for i in range(5, 17)])
    full = [i for i, c in enumerate(reads) if shown(x.bodies()[-1], c) == "full"]
    assert full == [2, 3, 4], (f"after editing f00..f04, the reads kept whole are of files {full}: "
                               f"KEEP_EDITED = 3 keeps the three most recently edited, [2, 3, 4]")


# s06.2: a fallback model on overload ------------------------------------------
FALLBACK = "claude-fallback-1"


def setup(x, fallback=True):
    x.patch(x.mod, "RETRY_BASE_DELAY", 0.0)
    x.patch(x.mod, "RETRY_MAX_DELAY", 0.0)
    if fallback:
        x.mod.os.environ["AGENT_FALLBACK_MODEL"] = FALLBACK     # the checker puts it back after


def models(x):
    return [b["model"] for b in x.bodies()]


def switches(x):
    setup(x)
    turn(x, [error(529), error(529)])
    seen = models(x)
    assert len(seen) == 3, f"{len(seen)} requests for two 529s and a reply"
    assert FALLBACK not in seen[:2] and seen[2] == FALLBACK, (f"the requests went to {seen}: after two "
                                                              f"overloaded errors in a row (not one) the "
                                                              f"retry goes to {FALLBACK}")


def stays_for_turn(x):
    setup(x)
    turn(x, [error(529), error(529), reply(tool("bash", {"command": "echo hi"}))])
    seen = models(x)
    assert seen[-1] == FALLBACK, f"the requests went to {seen}: the rest of the turn stays on the fallback"


def back_next_turn(x):
    setup(x)
    history = turn(x, [error(529), error(529)])
    turn(x, [], history, prompt="and now?")
    seen = models(x)
    assert seen[2] == FALLBACK, f"the requests went to {seen}: no switch to the fallback"
    assert seen[-1] == seen[0] != FALLBACK, f"the requests went to {seen}: a new turn starts on the main model"


def only_overload(x):
    setup(x)
    turn(x, [error(429), error(429), error(500)])
    assert FALLBACK not in models(x), (f"the requests went to {models(x)}: only overloaded errors (529) "
                                       f"switch; a rate limit or a 500 is retried on the same model")


def needs_the_variable(x):
    setup(x, fallback=False)
    turn(x, [error(529), error(529), error(529)])
    seen = models(x)
    assert len(set(seen)) == 1 and len(seen) == 4, (f"without AGENT_FALLBACK_MODEL the requests went to "
                                                    f"{seen}: nothing may change")


# s06.3: the plan survives compaction ---------------------------------------------
SUMMARY = "<analysis>draft</analysis>\n<summary>1. Primary request: SUMMARY-TEXT</summary>"
NEAR = {"input_tokens": 168_000}                # past AUTO_COMPACT_AT: the next call compacts first


def plan(*statuses):
    names = ("Write the parser", "Test the parser", "Document it")
    return tool("todo_write", {"items": [{"content": c, "status": st} for c, st in zip(names, statuses)]})


def head_text(x):
    """The text of the first message of the last request: the summary message."""
    first = x.bodies()[-1]["messages"][0]
    blocks = first["content"] if isinstance(first["content"], list) else [{"type": "text", "text": first["content"]}]
    return "\n".join(b.get("text", "") for b in blocks)


def compacted(x):
    assert any(b.get("tool_choice") == {"type": "none"} for b in x.bodies()), "no compaction happened"
    assert "SUMMARY-TEXT" in head_text(x), "the request after the compaction does not start with the summary"


def plan_after_auto(x):
    x.patch(x.mod, "KEEP_TAIL_MESSAGES", 2)
    turn(x, [reply(plan("in_progress", "pending", "pending")), reply(plan("completed", "in_progress", "pending")),
             reply(tool("bash", {"command": "echo parsed"}), usage=NEAR), reply(SUMMARY)])
    compacted(x)
    missing = [line for line in x.mod.plan_lines() if line not in head_text(x)]
    assert not missing, (f"after an auto-compaction the summary message does not hold the plan's "
                         f"checklist (plan_text() or plan_lines()); missing {missing[0]!r}")


def plan_after_requested(x):
    x.patch(x.mod, "KEEP_TAIL_MESSAGES", 2)
    turn(x, [reply(plan("in_progress", "pending", "pending")), reply(tool("compact", {})), reply(SUMMARY)])
    compacted(x)
    assert all(line in head_text(x) for line in x.mod.plan_lines()), (
        "after a compaction the model asked for (the compact tool), the summary message does not hold the plan")


def mentions_a_plan(text):
    """A plan by any of its names (Plan, plans, todo list, checklist); "explanation" is none."""
    return bool(re.search(r"\bplans?\b|\btodos?\b|todo[ _-]list|checklist", text, re.I))


def no_plan_no_text(x):
    x.patch(x.mod, "KEEP_TAIL_MESSAGES", 2)
    turn(x, [reply(tool("todo_write", {"items": []})), reply(tool("bash", {"command": "echo hi"}), usage=NEAR),
             reply(SUMMARY)])
    compacted(x)
    assert not mentions_a_plan(head_text(x)), ("with an empty plan the summary message still mentions a plan: "
                                                f"{head_text(x)[-300:]!r}")


EXERCISES = {
    1: ("never clear the read of a file being edited", [
        ("a read_file result stays whole in a batch clear when the file was edited after that read",
         "clear_old_results() picks what a batch clears: which of its candidates is the read of a "
         "file that was edited after it?",
         edited_read_kept),
        ("reads of files that were not edited are still cleared",
         "Protect only the newest read of each edited file, not every read.",
         others_still_cleared),
        ("a result already cleared stays cleared when its file is edited later",
         "Requests already went out with that placeholder. Reread the section's comment on clearing "
         "versus caching.",
         cleared_stays_cleared),
        ("at most KEEP_EDITED = 3 files are protected: the three most recently edited",
         "Order the edited files by their latest edit and keep the last KEEP_EDITED.",
         at_most_three),
    ]),
    2: ("a fallback model on overload", [
        ("with AGENT_FALLBACK_MODEL set, after 2 overloaded errors (529) in a row the retry goes to that model",
         "recover() sees every error: count the 529s in `turn`, and let call_with_recovery() pass a model "
         "to call_model().",
         switches),
        ("the rest of the turn stays on the fallback model",
         "How long does `turn` in call_with_recovery() live? The next model call of the same user "
         "turn starts with a new one.",
         stays_for_turn),
        ("the next user turn starts on the main model again",
         "Where does a user turn begin, and does your switch notice?",
         back_next_turn),
        ("only overload switches: a 429 or a 500 is retried on the same model",
         "is_transient() says yes to more than overload: what does a 529 look like to recover()?",
         only_overload),
        ("without AGENT_FALLBACK_MODEL nothing changes",
         "No variable, no switch: the retries stay on the main model.",
         needs_the_variable),
    ]),
    3: ("the plan survives compaction", [
        ("after an auto-compaction the summary message holds the current plan's checklist",
         "Which message does the next request start with after a compaction, and which function builds it?",
         plan_after_auto),
        ("so does a compaction the model asked for with the compact tool",
         "Follow the compact tool's call: which of your lines does it pass through?",
         plan_after_requested),
        ("with no plan, or an empty one, the summary message says nothing about a plan",
         "Only when plan()['items'] is not empty.",
         no_plan_no_text),
    ]),
}
