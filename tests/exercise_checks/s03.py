"""Checks for exercises/s03.md. Each point: (what must hold, a hint, fn(x))."""
import contextlib
import io

from fake_api import reply, tool

A, B, C = "Write the greeting module", "Write its test", "Write the README"


def items(*statuses):
    return {"items": [{"content": c, "status": s} for c, s in zip((A, B, C), statuses)]}


def turn(x, steps, prompt="do the work", finish="Finished."):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return x.turn(steps, prompt, finish)


def texts_after_rounds(history):
    """For each tool round, the text blocks the loop added after its results."""
    return [[b["text"] for b in m["content"] if b.get("type") == "text"]
            for m in history[1:] if m["role"] == "user" and isinstance(m["content"], list)]


def naming(history, content):
    """Indexes of the tool rounds after which some added text names `content`."""
    return [k for k, texts in enumerate(texts_after_rounds(history)) if any(content in t for t in texts)]


def resent(n, plan):
    """n rounds, each re-sending the same plan beside a bash call: busy, but no progress."""
    return [reply(tool("todo_write", plan), tool("bash", {"command": f"echo step {i}"})) for i in range(n)]


# s03.1: a reminder that names the stale item ---------------------------------
def stale_named(x):
    history = turn(x, resent(8, items("in_progress", "pending", "pending")))
    rounds = naming(history, A)
    assert rounds, ("8 rounds with the same item in progress (the plan re-sent each time) and no "
                    "reminder names it")
    assert 4 <= rounds[0] <= 6, (f"the first reminder naming it came after tool round {rounds[0] + 1}, "
                                 f"not after round 6 (STALE_ROUNDS)")


def stale_progress_resets(x):
    steps = resent(4, items("in_progress", "pending", "pending"))
    steps += resent(4, items("completed", "in_progress", "pending"))
    history = turn(x, steps)
    named = naming(history, A) + naming(history, B)
    assert not named, (f"a reminder came after round {named[0] + 1}, although the item in progress "
                       f"changed after round 4: a new item in progress starts a new count")


def stale_not_every_round(x):
    history = turn(x, resent(13, items("in_progress", "pending", "pending")))
    rounds = naming(history, A)
    assert len(rounds) == 2, (f"over 13 rounds on one item, reminders naming it came after rounds "
                              f"{[r + 1 for r in rounds]}: once every 6 rounds, not {len(rounds)} times")


def quiet_rounds_still(x):
    steps = [reply(tool("todo_write", items("in_progress", "pending", "pending")))]
    steps += [reply(tool("bash", {"command": f"echo {i}"})) for i in range(3)]
    history = turn(x, steps)
    added = [t for texts in texts_after_rounds(history) for t in texts]
    assert any("todo_write" in t for t in added), ("3 rounds without todo_write got no reminder: the "
                                                   "chapter's own reminder must still work")


# s03.2: do not end a turn with an open plan ----------------------------------
def last_user_text(body):
    m = body["messages"][-1]
    blocks = [{"type": "text", "text": m["content"]}] if isinstance(m["content"], str) else m["content"]
    return " ".join(b.get("text", "") for b in blocks if b.get("type") == "text")


def nudged_once(x):
    steps = [reply(tool("todo_write", items("completed", "in_progress", "pending"))),
             reply("All done."), reply("Now it is all done."), reply("Still done.")]
    history = turn(x, steps, finish=None)
    bodies = x.bodies()
    assert len(bodies) >= 3, (f"the turn ended after {len(bodies)} model calls: ending with 2 unfinished "
                              f"items must get one more call")
    said = last_user_text(bodies[2])
    assert B in said and C in said, f"the message after 'All done.' does not name the unfinished items: {said[:300]!r}"
    assert len(bodies) == 3, f"{len(bodies)} model calls: the reminder comes once per turn, then the turn may end"
    assert x.reason == "end_turn" and history[-1]["role"] == "assistant", \
        f"the turn ended with {x.reason!r}; the model's last reply must end it normally"


def no_nudge_when_done(x):
    turn(x, [reply(tool("todo_write", items("completed", "completed", "completed")))])
    assert len(x.bodies()) == 2, f"{len(x.bodies())} model calls for a finished plan, not 2"
    x.api.reset()
    x.state.plan = {"items": [], "rounds_since_update": 0}
    turn(x, [])
    assert len(x.bodies()) == 1, f"{len(x.bodies())} model calls with no plan at all, not 1"


def nudged_every_turn(x):
    turn(x, [reply(tool("todo_write", items("completed", "in_progress", "pending"))), reply("Done.")])
    x.api.reset()
    turn(x, [reply("Done again.")], prompt="and now?")
    assert len(x.bodies()) == 2, (f"the next turn, with the plan still open, made {len(x.bodies())} "
                                  f"model call(s), not 2: each turn gets its own reminder")
    assert B in last_user_text(x.bodies()[1]), "the second turn's reminder does not name the open items"


EXERCISES = {
    1: ("a reminder that names the stale item", [
        ("an item in progress for 6 tool rounds gets a reminder that names it, even if the plan is re-sent",
         "Trace a round that re-sends the same plan through plan_reminder(): does your count see it?",
         stale_named),
        ("a new item in progress starts a new count",
         "How does your count know which item it is counting?",
         stale_progress_resets),
        ("the reminder comes every 6 rounds, not every round after the 6th",
         "Every 6 rounds, not every round after the 6th: how does the chapter repeat its own reminder?",
         stale_not_every_round),
        ("the chapter's reminder after 3 rounds without todo_write still works",
         "Add to plan_reminder(); do not replace what it already does.",
         quiet_rounds_still),
    ]),
    2: ("do not end a turn with an open plan", [
        ("ending a turn with unfinished items gets one more model call, whose prompt names them",
         "In agent_loop(), where a reply without tool calls ends the turn, append a user message "
         "naming the unfinished items and go round once more.",
         nudged_once),
        ("no reminder when every item is completed, or when there is no plan",
         "has_open_items() says whether there is anything to remind about.",
         no_nudge_when_done),
        ("every turn gets its own reminder",
         "Where does your 'already reminded' mark live, and what sets it back for the next turn?",
         nudged_every_turn),
    ]),
}
