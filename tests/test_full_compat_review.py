"""agent_full: regressions from the review of Claude Code compatibility (full.3).
Each test names what a copied settings file or a cloned repository did, and fails
on the code before its fix.
"""
import io
import json
import shlex
import sys
from pathlib import Path

import pytest

from conftest import run_turn
from fake_api import reply, tool

full = pytest.mark.parametrize("mod", ["agent_full"], indirect=True)
PY = shlex.quote(sys.executable)


def answers(monkeypatch, *lines):
    """The human's answers, read from stdin in order; then end of input."""
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(line + "\n" for line in lines)))


def settings(folder, data, name="settings.json"):
    path = folder / ".claude" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


def load(mod, monkeypatch, *lines, mode="default"):
    """The config files read as main() reads them, the human answering `lines`."""
    answers(monkeypatch, *lines)
    state = mod.agent_state()
    state.permissions = mod.load_permissions(state.workdir)
    state.permissions["sandbox"]["enabled"] = False
    state.mode = mode
    return state


def results(history):
    return [b for m in history if m["role"] == "user" and isinstance(m["content"], list)
            for b in m["content"] if b.get("type") == "tool_result"]


# --- finding 4: the trust question shows every allow rule, the widest first ---------

@pytest.mark.permissions
@full
def test_a_long_claude_allow_list_shows_its_bare_rules_first(mod, workspace, monkeypatch):
    settings(workspace, {"permissions": {"allow": [
        "Bash(npm run test:*)", "Bash(npm run lint)", "Read(src/**)", "Grep(src/**)", "Glob(src/**)",
        "Edit(//**)", "Bash"]}})
    asked = []
    monkeypatch.setattr(mod, "ask_human", lambda q: asked.append(q) or "n")
    mod.load_permissions(mod.agent_state().workdir)
    shown = asked[0].split("allows ", 1)[1].split(". Trust this file?")[0].split(", ")
    assert shown[:3] == ["Edit(//**)", "Write(//**)", "Bash"]     # Edit covers Write: both shown, first
    assert len(shown) == 8 and "..." not in asked[0]


# --- finding 9: run in the home directory, ~/.claude/settings.json is read once ------

@pytest.mark.permissions
@full
def test_in_the_home_directory_the_users_settings_are_read_once(mod, api, client, workspace, monkeypatch):
    monkeypatch.setenv("HOME", str(workspace))
    settings(workspace, {"permissions": {"allow": ["Bash(ls:*)"]}, "hooks": {"UserPromptSubmit": [
        {"hooks": [{"type": "command", "command": "echo run >> hookruns"}]}]}})
    monkeypatch.setattr(mod, "ask_human", lambda q: pytest.fail(f"asked about the user's own file: {q}"))
    state = load(mod, monkeypatch)
    assert [(r["text"], r["scope"]) for r in mod.own_rules(state)] == [("Bash(ls:*)", "user")]
    run_turn(mod, api, client, [])
    assert (workspace / "hookruns").read_text() == "run\n"           # once, not twice


# --- finding 10: a wrong-typed value is one line naming the file and key -------------

WRONG = [None, 0, 5, -1, 1.5, float("nan"), True, False, "", "x", [], [1], ["plan"], [[]], {}, {"a": 1},
         {"a": []}]
HANDLER = {"type": "command", "command": "true"}


def nested(key, value):
    """A settings document with `value` at the dotted `key`, the rest of it valid."""
    top, _, rest = key.partition(".")
    if top == "handler":
        return {"hooks": {"PreToolUse": [{"matcher": "Bash", "hooks": [HANDLER | {rest: value}]}]}}
    if top == "group":
        return {"hooks": {"PreToolUse": [{"matcher": "Bash", "hooks": [HANDLER]} | {rest: value}]}}
    if top == "event":
        return {"hooks": {"PreToolUse": value}}
    return {top: value} if not rest else {top: {rest: value}}


SETTINGS_KEYS = ["permissions", "sandbox", "hooks", "permissions.allow", "permissions.deny", "permissions.ask",
                 "permissions.additionalDirectories", "permissions.defaultMode",
                 "permissions.disableBypassPermissionsMode", "sandbox.enabled", "sandbox.autoAllowBashIfSandboxed",
                 "event", "group.matcher", "group.hooks", "handler.type", "handler.command", "handler.url",
                 "handler.headers", "handler.allowedEnvVars", "handler.prompt", "handler.timeout",
                 "handler.async", "handler.once", "handler.if"]


@full
@pytest.mark.parametrize("key", SETTINGS_KEYS)
def test_every_key_the_settings_reader_reads_survives_wrong_types(mod, workspace, key):
    for value in WRONG:
        path = settings(workspace, nested(key, value))
        try:
            mod.read_settings(path)
        except mod.ConfigError as e:                               # a refusal names the file
            assert str(e).startswith(f"{path}: ") and "\n" not in str(e), (key, value, e)
        except Exception as e:                                     # anything else is a traceback at start-up
            pytest.fail(f"{key} = {value!r}: {type(e).__name__}: {e}")
    for value in (["plan"], 5, {"a": 1}):                          # the review's case, and its cousins
        with pytest.raises(mod.ConfigError, match="permissions.defaultMode must be one of"):
            mod.read_settings(settings(workspace, {"permissions": {"defaultMode": value}}))


@full
def test_a_list_as_default_mode_stops_the_start_with_one_line(mod, api, workspace):
    from conftest import run_chapter
    settings(workspace, {"permissions": {"defaultMode": ["plan"]}})
    r = run_chapter("agent_full", "-p", "hi", api=api, cwd=workspace)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "settings.json: permissions.defaultMode must be one of" in r.stderr and not api.requests


# --- finding 11: what a newer Claude Code writes loads, with a line ------------------

@full
def test_an_unknown_handler_key_and_a_long_timeout_load_with_a_warning(mod, workspace, capsys):
    path = settings(workspace, {"hooks": {"PostToolUse": [{"matcher": "Write", "hooks": [
        {"type": "command", "command": "true", "timeout": 1800, "newField": 1, "alsoNew": "x"}]}]}})
    hooks = mod.load_permissions(workspace, trust_all=True)["hooks"]
    assert len(hooks) == 1 and hooks[0]["timeout"] == mod.HOOK_MAX_TIMEOUT
    err = capsys.readouterr().err
    assert "alsoNew, newField not used here: ignored" in err
    assert "timeout 1800s is over the 600s most: 600s" in err
    for bad in (0, -5, "60", float("nan")):                        # still refused: no sensible reading
        settings(workspace, {"hooks": {"Stop": [{"hooks": [HANDLER | {"timeout": bad}]}]}})
        with pytest.raises(mod.ConfigError, match=r"timeout must be a number of seconds, above 0"):
            mod.read_settings(path)


@full
def test_unknown_permissions_keys_are_named_once(mod, workspace, capsys):
    path = settings(workspace, {"permissions": {"allow": ["Read"], "disableAutoMode": "disable"}})
    assert mod.read_settings(path)["permissions"]["allow"] == ["Read"]
    assert "permissions.disableAutoMode has no match here: ignored" in capsys.readouterr().err


@pytest.mark.permissions
@full
def test_disable_bypass_permissions_mode_is_honoured_from_any_file(mod, workspace, monkeypatch):
    settings(workspace, {"permissions": {"deny": ["Bash(curl:*)"], "disableBypassPermissionsMode": "disable"}})
    monkeypatch.setattr(mod, "ask_human", lambda q: pytest.fail(f"asked: {q}"))   # it only tightens: no trust
    with pytest.raises(ValueError, match=r"bypassPermissions is turned off by \.claude/settings\.json"):
        mod.start_permissions(["--permission-mode", "bypassPermissions"])
    monkeypatch.setenv("AGENT_PERMISSION_MODE", "bypassPermissions")
    with pytest.raises(ValueError, match="disableBypassPermissionsMode"):
        mod.start_permissions([])
    monkeypatch.delenv("AGENT_PERMISSION_MODE")
    mod.start_permissions([])
    with pytest.raises(ValueError, match="disableBypassPermissionsMode"):
        mod.set_mode("bypassPermissions")                          # /mode cannot reach it either
    assert mod.agent_state().mode == "default"
    settings(workspace, {"permissions": {"disableBypassPermissionsMode": True}})
    with pytest.raises(mod.ConfigError, match='disableBypassPermissionsMode must be "disable"'):
        mod.start_permissions([])


@pytest.mark.permissions
@full
def test_dont_ask_is_default_under_p_and_refused_interactively(mod, workspace):
    with pytest.raises(ValueError, match="dontAsk works with -p only"):
        mod.start_permissions(["--permission-mode", "dontAsk"])
    mod.FRONT_END["current"] = mod.Headless("text")
    mod.start_permissions(["--permission-mode", "dontAsk"])
    assert mod.agent_state().mode == "default"                     # -p answers every question no


# --- finding 13: the matcher and Notification, caught by tests ----------------------

def claude_hooks(mod, event, handler, matcher=None):
    """One Claude Code hook, as if read from a trusted user settings file."""
    group = {"hooks": [handler]} | ({"matcher": matcher} if matcher is not None else {})
    state = mod.agent_state()
    state.permissions["hooks"] = mod.read_hooks(Path("settings.json"), {"hooks": {event: [group]}}, "user", True)
    return state


@full
def test_a_plain_matcher_is_an_exact_name_not_a_search(mod, api, client, workspace):
    claude_hooks(mod, "PreToolUse", {"type": "command", "command": "echo blocked >&2; exit 2"}, matcher="Task")
    assert not mod.matcher_hits("Task", "TaskCreate") and mod.matcher_hits("Task", "Task")
    assert mod.matcher_hits("Task.*", "TaskCreate")               # a regex is a search, as in Claude Code
    history = run_turn(mod, api, client, [reply(tool("task_create", {"subject": "write the notes"}))])
    created = results(history)[0]
    assert not created.get("is_error") and "blocked" not in created["content"]   # Task is not TaskCreate


@pytest.mark.permissions
@full
def test_a_notification_hook_is_told_and_never_answers_the_question(mod, api, client, workspace, monkeypatch):
    allow = {"hookSpecificOutput": {"hookEventName": "PermissionRequest", "decision": {"behavior": "allow"}}}
    state = claude_hooks(mod, "Notification", {"type": "command", "command": f"printf '%s' {shlex.quote(json.dumps(allow))}"})
    state.permissions["sandbox"]["enabled"] = False
    state.mode = "default"
    asked = []
    monkeypatch.setattr(mod, "ask_human", lambda q: asked.append(q) or "n")
    history = run_turn(mod, api, client, [reply(tool("bash", {"command": "touch made"}))])
    assert asked and "bash" in asked[0]                            # the human was asked, the hook only told
    assert results(history)[0]["is_error"] and not (workspace / "made").exists()


# --- finding 12: SessionStart's sources, and the subagent matchers -------------------

def recorder():
    """A hook command that keeps its stdin, one line per run, in seen.jsonl."""
    return f"{PY} -c 'import sys; open(\"seen.jsonl\", \"a\").write(sys.stdin.read() + \"\\n\")'"


def seen(workspace):
    path = workspace / "seen.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def session_start_hooks(mod, *matchers):
    """One recording SessionStart hook per matcher, as a trusted user file has them."""
    groups = [{"matcher": m, "hooks": [{"type": "command", "command": recorder()}]} for m in matchers]
    state = mod.agent_state()
    state.permissions["hooks"] = mod.read_hooks(Path("settings.json"), {"hooks": {"SessionStart": groups}},
                                                "user", True)
    return state


@full
def test_session_start_fires_after_a_compaction_and_a_clear_with_their_source(mod, api, client, workspace):
    from test_s06_compact import SUMMARY, history_of
    session_start_hooks(mod, "compact", "clear", "startup")
    api.script([reply(SUMMARY)])
    mod.compact_now(client, history_of(6))
    assert [(s["hook_event_name"], s["source"]) for s in seen(workspace)] == [("SessionStart", "compact")]
    mod.agent_state().record = mod.new_session(mod.agent_state())
    mod.clear_command("", {"history": [{"role": "user", "content": "old"}]})
    assert [s["source"] for s in seen(workspace)] == ["compact", "clear"]      # the startup matcher: neither


@full
def test_a_resumed_session_starts_with_source_resume(mod, api, workspace):
    from conftest import run_chapter
    settings(Path.home(), {"hooks": {"SessionStart": [{"hooks": [{"type": "command", "command": recorder()}]}]}})
    api.script([reply("first"), reply("second")])
    assert run_chapter("agent_full", "-p", "hi", api=api, cwd=workspace).returncode == 0
    r = run_chapter("agent_full", "-p", "--continue", "again", api=api, cwd=workspace)
    assert r.returncode == 0, r.stderr
    assert [s["source"] for s in seen(workspace)] == ["startup", "resume"]


@full
def test_subagent_matchers_test_the_agent_type(mod, api, client, workspace):
    hooks = {e: [{"matcher": "explore", "hooks": [{"type": "command", "command": recorder()}]}]
             for e in ("SubagentStart", "SubagentStop")}
    state = mod.agent_state()
    state.permissions["hooks"] = mod.read_hooks(Path("settings.json"), {"hooks": hooks}, "user", True)
    run_turn(mod, api, client, [reply(tool("agent", {"prompt": "look around", "agent_type": "explore"})),
                                reply("Seen it."),
                                reply(tool("agent", {"prompt": "do a thing", "description": "general"})),
                                reply("Did it.")])
    assert [(s["hook_event_name"], s["agent_type"]) for s in seen(workspace)] == [
        ("SubagentStart", "explore"), ("SubagentStop", "explore")]       # not the general-purpose one


# --- finding 5: a trusted Claude Code hook's script is trusted as it was -------------

@pytest.mark.permissions
@full
def test_a_claude_hook_script_rewritten_in_accept_edits_is_asked_about(mod, api, client, workspace, monkeypatch):
    (workspace / "scripts").mkdir()
    (workspace / "scripts" / "fmt.sh").write_text("#!/bin/sh\nexit 0\n")
    settings(workspace, {"hooks": {"PostToolUse": [{"matcher": "Write|Edit", "hooks": [
        {"type": "command", "command": 'sh "$CLAUDE_PROJECT_DIR"/scripts/fmt.sh'}]}]}})
    load(mod, monkeypatch, "y", mode="acceptEdits")                # the human trusts the settings file
    asked = []
    monkeypatch.setattr(mod, "ask_human", lambda q: asked.append(q) or "n")
    run_turn(mod, api, client, [reply(tool("read_file", {"path": "scripts/fmt.sh"})),
                                reply(tool("write_file", {"path": "scripts/fmt.sh", "content": "touch ESCAPED\n"}))])
    assert (workspace / "scripts" / "fmt.sh").read_text() == "touch ESCAPED\n"   # acceptEdits let it write
    assert not (workspace / "ESCAPED").exists()                    # but the hook did not run it unasked
    assert len(asked) == 1 and "scripts/fmt.sh" in asked[0] and "user#" not in asked[0]
