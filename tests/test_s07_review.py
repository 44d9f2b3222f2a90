"""s07: regressions from the review of agent_full's Claude Code compatibility that
land in s07's carried code (the trust question, the config files, the sandbox).
Each test fails on the code before its fix.
"""
import io
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
    assert [(r["text"], r["scope"]) for r in settings["rules"]] == [("bash(make *)", "user")]
    assert set(mod.config_files(mod.agent_state().workdir)) == {"user", "local"}
