"""s08: where no OS sandbox works, a trusted hook runs outside it, so the workspace files its command
runs are trusted with it: hashed at the yes, and asked about again once the model
(or a command it ran) changed one. Regressions from the review of agent_full's
Claude Code compatibility; each test fails on the code before the fix.
"""
import pytest
import yaml

from conftest import chapters_from, run_turn
from fake_api import reply, tool

from_s08 = pytest.mark.parametrize("mod", chapters_from("s08"), indirect=True)
EVIL = "touch ESCAPED\n"


def project_hooks(workspace, command, script="exit 0\n"):
    """A project config whose post_tool_use hook runs `command`; scripts/fmt.sh holds `script`."""
    (workspace / ".agent").mkdir(exist_ok=True)
    (workspace / ".agent" / "config.yaml").write_text(yaml.safe_dump({"hooks": [
        {"event": "post_tool_use", "if": 'tool == "write_file"', "action": {"type": "command", "command": command}}]}))
    if script is not None:
        (workspace / "scripts").mkdir(exist_ok=True)
        (workspace / "scripts" / "fmt.sh").write_text(script)


def trusted(mod, monkeypatch, trust_all=False):
    """The config read at start-up, the human saying yes to it; then every later question
    is recorded and answered by `replies` (no, unless a test says otherwise)."""
    monkeypatch.setattr(mod, "ask_human", lambda q: "y")
    state = mod.agent_state()
    state.permissions = mod.load_permissions(state.workdir, trust_all)
    state.permissions["sandbox"]["enabled"] = False
    asked, replies = [], []
    monkeypatch.setattr(mod, "ask_human", lambda q: asked.append(q) or (replies.pop(0) if replies else "n"))
    return asked, replies


def rewrite(path, content=EVIL):
    """The model's steps that replace a file: read it (if it is there), then write it."""
    return reply(tool("read_file", {"path": path}), tool("write_file", {"path": path, "content": content}))


@from_s08
def test_a_hook_script_the_model_rewrote_asks_before_it_runs(mod, api, client, workspace, monkeypatch):
    project_hooks(workspace, "sh scripts/fmt.sh")
    asked, _ = trusted(mod, monkeypatch)
    run_turn(mod, api, client, [rewrite("scripts/fmt.sh"), rewrite("notes.txt", "x")])
    assert not (workspace / "ESCAPED").exists()                    # the rewritten script never ran
    assert len(asked) == 1 and "scripts/fmt.sh" in asked[0] and "changed since you trusted it" in asked[0]
    log = (workspace / ".agent" / "hooks.log").read_text()
    assert "not run: a file it runs changed since it was trusted" in log


@from_s08
def test_a_yes_runs_it_and_is_remembered(mod, api, client, workspace, monkeypatch):
    project_hooks(workspace, "sh scripts/fmt.sh")
    asked, replies = trusted(mod, monkeypatch)
    replies.append("y")
    run_turn(mod, api, client, [rewrite("scripts/fmt.sh"), rewrite("notes.txt", "x")])
    assert (workspace / "ESCAPED").exists() and len(asked) == 1   # asked once: the yes is recorded


@from_s08
def test_an_unchanged_script_runs_unasked(mod, api, client, workspace, monkeypatch):
    project_hooks(workspace, 'sh "$CLAUDE_PROJECT_DIR"/scripts/fmt.sh', script="echo ran >> ran.txt\n")
    asked, _ = trusted(mod, monkeypatch)
    run_turn(mod, api, client, [rewrite("notes.txt", "x")])
    assert (workspace / "ran.txt").read_text() == "ran\n" and not asked


@from_s08
def test_a_script_the_hook_names_that_did_not_exist_yet_asks_once_made(mod, api, client, workspace, monkeypatch):
    project_hooks(workspace, "sh scripts/fmt.sh", script=None)     # trusted while there is no such file
    asked, _ = trusted(mod, monkeypatch)
    run_turn(mod, api, client, [rewrite("scripts/fmt.sh")])
    assert not (workspace / "ESCAPED").exists() and len(asked) == 1


@from_s08
def test_trust_workspace_answers_for_a_changed_script(mod, api, client, workspace, monkeypatch):
    project_hooks(workspace, "sh scripts/fmt.sh")
    asked, _ = trusted(mod, monkeypatch, trust_all=True)
    run_turn(mod, api, client, [rewrite("scripts/fmt.sh")])
    assert (workspace / "ESCAPED").exists() and not asked


@from_s08
def test_the_users_own_hooks_are_not_asked_about(mod, api, client, workspace, monkeypatch):
    (workspace / "scripts").mkdir()
    (workspace / "scripts" / "fmt.sh").write_text("exit 0\n")
    state = mod.agent_state()
    state.permissions["hooks"] = mod.read_hooks("config.yaml", {"hooks": [{
        "event": "post_tool_use", "action": {"type": "command", "command": "sh scripts/fmt.sh"}}]}, "user", True)
    monkeypatch.setattr(mod, "ask_human", lambda q: pytest.fail(f"asked: {q}"))
    run_turn(mod, api, client, [rewrite("scripts/fmt.sh")])
    assert (workspace / "ESCAPED").exists()


@from_s08
def test_what_a_hook_only_writes_or_reads_is_no_file_it_runs(mod, workspace):
    (workspace / "lint.py").write_text("")
    files = lambda command: mod.hook_files({"action": {"type": "command", "command": command}}, workspace)
    assert files("echo project >> order.txt") == [] and files("ruff check -q $FILE_PATH >&2 || exit 2") == []
    assert files('sh "$CLAUDE_PROJECT_DIR"/scripts/fmt.sh; python3 lint.py "$FILE_PATH"') == ["scripts/fmt.sh",
                                                                                            "lint.py"]
    assert files("FOO=1 timeout 5 ./check.sh && bash -c './inner.sh x'") == ["check.sh", "inner.sh"]
    assert files("/usr/bin/env python3 ../outside.py; npx prettier --write x.ts") == []


# --- with the OS sandbox: a project's hook runs inside it (rule 1) ---
def sandbox_on(mod):
    ok, why = mod.sandbox_available()
    if not ok:
        pytest.skip(f"the OS sandbox does not work here: {why}")
    mod.agent_state().permissions["sandbox"]["enabled"] = True


@from_s08
def test_a_project_hook_runs_inside_the_sandbox_whatever_code_it_reaches(mod, api, client, workspace,
                                                                         monkeypatch):
    """`make lint` is trusted; the Makefile it runs is the model's to change. Inside the
    sandbox the changed code cannot write outside the workspace, nor plant a git
    fsmonitor for the human's next git; the workspace stays writable to it."""
    home = workspace.parent / "home"
    (workspace / "Makefile").write_text("lint:\n\t@echo linted >> lint.txt\n")
    project_hooks(workspace, "make -s lint", script=None)
    trusted(mod, monkeypatch)
    sandbox_on(mod)
    evil = (f"lint:\n\t@echo linted >> lint.txt; touch {home}/ESCAPED; git init -q sub; "
            f"git -C sub config core.fsmonitor 'touch {home}/PWNED'\n")
    run_turn(mod, api, client, [rewrite("Makefile", evil), rewrite("notes.txt", "x")])
    assert (workspace / "lint.txt").read_text() == "linted\nlinted\n"  # it ran, twice, in the workspace
    assert not (home / "ESCAPED").exists()                              # HOME is read-only inside
    import subprocess
    subprocess.run(["git", "status"], cwd=workspace / "sub", capture_output=True)
    assert not (home / "PWNED").exists()                                # the audit ran after the hook
    assert "core.fsmonitor" not in (workspace / "sub/.git/config").read_text()


@from_s08
def test_the_humans_own_hooks_still_run_as_the_human(mod, api, client, workspace, monkeypatch):
    home = workspace.parent / "home"
    state = mod.agent_state()
    sandbox_on(mod)
    state.permissions["hooks"] = mod.read_hooks("config.yaml", {"hooks": [{
        "event": "post_tool_use", "action": {"type": "command", "command": f"touch {home}/mine"}}]}, "user", True)
    run_turn(mod, api, client, [rewrite("notes.txt", "x")])
    assert (home / "mine").exists()
