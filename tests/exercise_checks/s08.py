"""Checks for exercises/s08.md. Each point: (what must hold, a hint, fn(x))."""
import contextlib
import io
import json
import sys
from pathlib import Path

import yaml

from fake_api import reply, tool


def turn(x, steps, prompt="do the work"):
    """x.turn with the agent's output kept (x.err: what it printed on stderr), not shown."""
    out, err = io.StringIO(), io.StringIO()
    x.patch(sys, "stdin", io.StringIO(""))  # a question nobody answers reads end of input: no
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        history = x.turn(steps, prompt)
    x.err = getattr(x, "err", "") + err.getvalue()
    return history


def user_config(x, data):
    """Write ~/.agent/config.yaml and load every config as a session start does; the
    point's agent takes the result (sandbox off, as the checker's agents are)."""
    path = Path.home() / ".agent" / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    try:
        settings = x.mod.load_permissions(x.ws)
    except x.mod.ConfigError as e:
        raise AssertionError(f"the config did not load: {e}")
    settings["sandbox"]["enabled"] = False
    x.state.permissions = settings
    return settings


def bash(command):
    return reply(tool("bash", {"command": command}))


def command_hook(event, command, condition=None):
    return {"event": event, **({"if": condition} if condition else {}),
            "action": {"type": "command", "command": command}}


def lines(x, name):
    path = x.ws / name
    return path.read_text().splitlines() if path.exists() else []


# s08.1: a permission_denied event -----------------------------------------------------
DENY_RM = {"permissions": {"deny": ["bash(rm *)"]}}


def denied_payload(x):
    path = x.ws / "denied.json"
    assert path.exists(), "no permission_denied hook ran after the refused call"
    return json.loads(path.read_text())


def event_loads(x):
    user_config(x, {"hooks": [command_hook("permission_denied", "cat > denied.json")]})
    hooks = [h for h in x.state.permissions.get("hooks", []) if h["event"] == "permission_denied"]
    assert hooks, "the permission_denied hook was not loaded"


def deny_rule_fires_it(x):
    user_config(x, DENY_RM | {"hooks": [command_hook("permission_denied",
                                                     'cat > denied.json; printf %s "$EVENT" > denied-event.txt')]})
    history = turn(x, [bash("rm -rf build")])
    assert x.tool_results(history)[0].get("is_error"), "rm -rf build was not refused"
    payload = denied_payload(x)
    event = (x.ws / "denied-event.txt").read_text()  # our event name: $EVENT (stdin has Claude Code's keys only)
    assert event == "permission_denied", f"the hook's EVENT is {event!r}"
    assert payload.get("tool_name") == "bash", f"the payload's tool_name is {payload.get('tool_name')!r}"
    assert (payload.get("tool_input") or {}).get("command") == "rm -rf build", \
        f"the payload's tool_input is {payload.get('tool_input')!r}"
    assert "bash(rm *)" in str(payload.get("reason")), \
        f"the payload's reason does not name the deny rule: {payload.get('reason')!r}"


def a_no_fires_it(x):
    user_config(x, {"hooks": [command_hook("permission_denied", "cat > denied.json")]})
    x.state.mode = "default"
    x.patch(x.mod, "ask_human", lambda question: "n")
    turn(x, [bash("touch a.txt")])
    payload = denied_payload(x)
    assert "the user said no" in str(payload.get("reason")), \
        f"after the human's no the reason was {payload.get('reason')!r}"


def allowed_calls_do_not(x):
    user_config(x, DENY_RM | {"hooks": [command_hook("permission_denied", "echo denied >> denied.txt")]})
    turn(x, [bash("echo fine"), bash("rm -rf build"), bash("echo fine again")])
    assert len(lines(x, "denied.txt")) == 1, \
        f"one refused call of three fired permission_denied {len(lines(x, 'denied.txt'))} times"


def context_reaches_the_model(x):
    hook = {"event": "permission_denied",
            "action": {"type": "prompt", "message": "Refused? Ask the user before you try anything else."}}
    user_config(x, DENY_RM | {"hooks": [hook]})
    turn(x, [bash("rm -rf build")])
    sent = json.dumps(x.bodies()[1]["messages"][-1])
    assert "Ask the user before you try anything else" in sent, \
        "the prompt hook's message was not in the next request"


# s08.2: conditions on what the tool returned -----------------------------------------
def result_hook(event, condition, marker):
    return command_hook(event, f"echo hit >> {marker}", condition)


def result_fires_on_output(x):
    user_config(x, {"hooks": [result_hook("post_tool_use", 'tool == "bash" && result =~ "FAILED"', "hits.txt")]})
    turn(x, [bash("echo '2 passed, 1 FAILED'")])
    assert len(lines(x, "hits.txt")) == 1, "the output held FAILED, and the hook did not run"


def result_does_not_fire_otherwise(x):
    user_config(x, {"hooks": [result_hook("post_tool_use", 'tool == "bash" && result =~ "FAILED"', "hits.txt")]})
    turn(x, [bash("echo '3 passed'"), bash("echo 'all FAILED'"), bash("echo done")])
    assert len(lines(x, "hits.txt")) == 1, \
        f"one output of three held FAILED, and the hook ran {len(lines(x, 'hits.txt'))} times"


def result_is_the_error_on_failure(x):
    user_config(x, {"hooks": [result_hook("post_tool_failure", 'result =~ "exit status 3"', "hits.txt")]})
    history = turn(x, [bash("echo broken; exit 3")])
    assert x.tool_results(history)[0].get("is_error"), "exit 3 was not a failed call"
    assert len(lines(x, "hits.txt")) == 1, "on post_tool_failure, result did not hold the error text"


def no_result_before_the_call(x):
    user_config(x, {"hooks": [result_hook("pre_tool_use", 'result =~ "."', "pre.txt"),
                              result_hook("pre_tool_use", 'result == ""', "empty.txt")]})
    turn(x, [bash("echo hello")])
    assert not lines(x, "pre.txt"), "before the call ran, result was not empty"
    assert len(lines(x, "empty.txt")) == 1, 'result == "" did not hold before the call'


def bad_field_still_refused(x):
    path = Path.home() / ".agent" / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"hooks": [result_hook("post_tool_use", 'reslt =~ "x"', "hits.txt")]}))
    try:
        x.mod.load_permissions(x.ws)
    except x.mod.ConfigError as e:
        assert "result" in str(e), f"the error does not name result among the fields: {e}"
        return
    raise AssertionError("a condition on the unknown field reslt was accepted")


EXERCISES = {
    1: ("a permission_denied event", [
        ("a hook on permission_denied loads",
         "Add the event to HOOK_EVENTS (Claude Code's name for it: PermissionDenied).",
         event_loads),
        ("a refusal by a deny rule fires it; the payload has tool_name, tool_input and the reason",
         "Which function returns the denial text the model gets, whichever layer refused?",
         deny_rule_fires_it),
        ("a no from the human fires it too",
         "Does the human's no reach the model by the same line as a deny rule's refusal?",
         a_no_fires_it),
        ("an allowed call does not fire it",
         "Fire only on the way to a denial, not for calls that go ahead.",
         allowed_calls_do_not),
        ("its hooks' context reaches the model with the denial",
         "fire() returns a verdict; pass its context to note(), as pre_tool_hooks() does.",
         context_reaches_the_model),
    ]),
    2: ("conditions on what the tool returned", [
        ("post_tool_use: result =~ \"FAILED\" fires when the output holds FAILED",
         "Add result to the fields CLAUSE accepts, and give payload_value() its text.",
         result_fires_on_output),
        ("and does not fire when it does not",
         "payload_value() must read the event's own output, not something every event has.",
         result_does_not_fire_otherwise),
        ("post_tool_failure: result is the error text",
         "Print the payload of a post_tool_failure (after_tool() builds it): where is the text?",
         result_is_the_error_on_failure),
        ("before the call (pre_tool_use) result is empty",
         "An event without a result gives \"\", as payload_value() does for a missing prompt.",
         no_result_before_the_call),
        ("an unknown field is still refused, and the error lists result",
         "parse_condition()'s message names the fields a condition may use: add result there.",
         bad_field_still_refused),
    ]),
}
