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
    assert [(r["text"], r["scope"]) for r in state.permissions["rules"]] == [("Bash(ls:*)", "user")]
    run_turn(mod, api, client, [])
    assert (workspace / "hookruns").read_text() == "run\n"           # once, not twice
