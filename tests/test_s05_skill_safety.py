"""s05: skills are safe to load from a cloned repository.

Arguments are data, never shell; a project skill's !`commands` run on the
model's load_skill only after the human's yes (kept in ~/.agent/trusted.yaml
by content hash); read_file reaches into skill folders, never past them.
Real folders, real git, real bash; the human's answers come through a real
(non-terminal) stdin.
"""
import io
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from conftest import chapters_from, run_chapter
from fake_api import reply, tool

ALL = chapters_from("s05")
pytestmark = pytest.mark.parametrize("mod", ALL, indirect=True)
QUESTION = "Allow its commands"  # in the question a project skill's commands raise


def make_skill(root, folder, body, description="A test skill.", files=None):
    d = Path(root) / folder
    d.mkdir(parents=True, exist_ok=True)
    (d / "SKILL.md").write_text(f"---\ndescription: {description}\n---\n{body}\n")
    for name, content in (files or {}).items():
        (d / name).write_text(content)
    return d


def project_root(workspace):
    return workspace / ".agent" / "skills"


def user_root():
    return Path.home() / ".agent" / "skills"


def trust_file():
    return Path.home() / ".agent" / "trusted.yaml"


def git(workspace, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
                   cwd=workspace, check=True, capture_output=True)


def make_repo(workspace):
    """Two commits (the second adds SECOND-LINE), then a staged STAGED-LINE."""
    (workspace / "app.py").write_text("print('hi')\n")
    git(workspace, "init", "-q")
    git(workspace, "add", ".")
    git(workspace, "commit", "-qm", "start")
    (workspace / "app.py").write_text("print('hi')\nprint('SECOND-LINE')\n")
    git(workspace, "commit", "-qam", "second commit")
    (workspace / "app.py").write_text("print('hi')\nprint('SECOND-LINE')\nprint('STAGED-LINE')\n")
    git(workspace, "add", "app.py")


def answers(monkeypatch, text):
    """The human's stdin is a pipe holding `text` ("" is end of input at once)."""
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))


def call(mod, tool_name, **args):
    return mod.run_tool(SimpleNamespace(id="toolu_test", name=tool_name, input=args))


# --- 1. arguments are data ---------------------------------------------------

@pytest.mark.parametrize("args", ["HEAD; touch PWNED", "!`touch PWNED`", "$(touch PWNED)",
                                  "`touch PWNED`", "x\ntouch PWNED", "'; touch PWNED; '",
                                  "a | tee PWNED", "HEAD && touch PWNED"])
def test_arguments_never_run_as_commands(mod, workspace, args):
    make_repo(workspace)
    by_model = mod.load_skill("review-code", arguments=args)
    by_human = mod.handle_slash(f"/review-code {args}", {})
    assert not (workspace / "PWNED").exists()
    for out in (by_model, by_human):
        assert "second commit" in out  # the skill's own commands still ran
        assert "Review target: `" + args + "`" in out  # the text gets the arguments as given


def test_placeholders_in_a_command_are_quoted_words(mod, workspace):
    make_skill(user_root(), "show", "\n".join([
        "Bare: !`printf '<%s>' $0 $1 $5`",
        "All: !`printf '<%s>' $ARGUMENTS`",
        "Single: !`echo '$1'`",
        "Escaped: !`echo \\$1`",
        "Double: !`echo \"$1\"`",
        "Text: $1 and $ARGUMENTS"]))
    args = "\"a b\" '$(touch PWNED)'"
    out = mod.handle_slash(f"/show {args}", {})
    assert not (Path.cwd() / "PWNED").exists()
    assert "Bare: <a b><$(touch PWNED)>\n" in out  # a missing $5 is no word at all
    assert "All: <a b><$(touch PWNED)>\n" in out  # two words stay two
    assert "Single: $1\n" in out and "Escaped: $1\n" in out  # the shell would not expand them
    assert 'Double: [command `echo "$1"` failed: $1 inside "..." is not allowed' in out
    assert f"Text: $(touch PWNED) and {args}" in out


def test_inserted_text_is_never_scanned_again(mod, workspace):
    make_skill(project_root(workspace), "echoes", "\n".join([
        "Said: $ARGUMENTS",
        "Out: !`printf '!\\140touch PWNED\\140 $ARGUMENTS $0'`"]))  # \140 is a backtick
    args = "!`touch PWNED` $0 $ARGUMENTS[0]"
    out = mod.handle_slash(f"/echoes {args}", {})
    assert not (workspace / "PWNED").exists()
    assert f"Said: {args}\n" in out
    assert "Out: !`touch PWNED` $ARGUMENTS $0" in out  # output kept as printed


def test_bang_must_open_a_line_or_follow_whitespace(mod, workspace, capsys):
    make_repo(workspace)
    out = mod.handle_slash("/commit-message", {})
    assert "add `!` after the type or scope (`feat(api)!: ...`) and a footer" in out
    assert "[command" not in out  # no broken shell line ran
    assert "+print('STAGED-LINE')" in out and "second commit" in out
    ran = [line for line in capsys.readouterr().err.splitlines() if line.startswith("> !")]
    assert ran == ["> !git diff --cached --stat", "> !git diff --cached",
                   "> !git log --oneline -10"]
    make_skill(user_root(), "bangs", "Glued x!`echo NO1` (!`echo NO2`) `!`echo NO3`\n"
               "!`echo YES-LINE`\ntab:\t!`echo YES-TAB`")
    out = mod.handle_slash("/bangs", {})
    assert "x!`echo NO1` (!`echo NO2`) `!`echo NO3`" in out
    assert "YES-LINE\ntab:\tYES-TAB" in out


def test_built_in_skills_still_do_what_they_say(mod, workspace):
    make_repo(workspace)
    (workspace / "lib").mkdir()
    (workspace / "lib" / "x.py").write_text("x = 1\n")
    git(workspace, "add", "lib")
    git(workspace, "commit", "-qm", "lib")
    (workspace / "lib" / "x.py").write_text("x = 2\n")
    (workspace / "app.py").write_text("print('WORKTREE-LINE')\n")
    ranged = mod.load_skill("review-code", arguments="HEAD~2..HEAD~1")
    assert "Review target: `HEAD~2..HEAD~1`" in ranged and "+print('SECOND-LINE')" in ranged
    assert "STAGED-LINE" not in ranged.split("Diff for the target:")[1].split("Recent")[0]
    two_paths = mod.handle_slash("/review-code app.py lib", {})
    assert "+x = 2" in two_paths and "+print('WORKTREE-LINE')" in two_paths
    everything = mod.load_skill("review-code")  # no arguments: all uncommitted changes
    assert "+x = 2" in everything and "2 files changed" in everything
    for out in (ranged, two_paths, everything):
        assert "[command" not in out and "!`" not in out
    spec = mod.load_skill("spec", arguments="a CSV export")
    assert "HARD-GATE" in spec and "ARGUMENTS: a CSV export" in spec


# --- 2. project commands need the human's yes -------------------------------

def test_load_skill_is_flagged_as_running_commands(mod):
    assert mod.TOOL_FLAGS["load_skill"] == {"read_only": False, "concurrency_safe": False}
    assert not mod.is_concurrency_safe(SimpleNamespace(name="load_skill"))


def deploy_skill(workspace, tag="v1"):
    return make_skill(project_root(workspace), "deploy",
                      f"Deploy {tag}.\nStatus: !`touch RAN && echo ran-$0`\nDone.")


@pytest.mark.parametrize("stdin", ["", "n\n", "yeah\n", "\n", "no\n"])
def test_project_commands_do_not_run_without_a_yes(mod, workspace, monkeypatch, capsys, stdin):
    deploy_skill(workspace)
    answers(monkeypatch, stdin)
    result = call(mod, "load_skill", name="deploy", arguments="prod")
    assert not result.get("is_error") and not (workspace / "RAN").exists()
    assert ("Status: [command `touch RAN && echo ran-$0` not run: the human did not allow "
            "this project skill's commands") in result["content"]
    assert "Deploy v1." in result["content"] and "Done." in result["content"]
    err = capsys.readouterr().err
    assert QUESTION in err and "touch RAN && echo ran-$0" in err
    assert ".agent/skills/deploy/SKILL.md" in err
    assert not trust_file().exists()


@pytest.mark.parametrize("stdin", ["y\n", "yes\n", " YES \n", "Y\n"])
def test_a_yes_runs_them_and_is_remembered_by_content(mod, workspace, monkeypatch, capsys,
                                                       stdin):
    folder = deploy_skill(workspace)
    answers(monkeypatch, stdin)
    assert "Status: ran-prod" in mod.load_skill("deploy", "prod")
    assert QUESTION in capsys.readouterr().err
    saved = yaml.safe_load(trust_file().read_text())
    digest = mod.hashlib.sha256((folder / "SKILL.md").read_bytes()).hexdigest()
    assert saved == {"workspaces": {str(workspace.resolve()):
                                    {".agent/skills/deploy/SKILL.md": digest}}}
    assert [p.name for p in trust_file().parent.iterdir()] == ["trusted.yaml"]  # no temp left
    answers(monkeypatch, "")  # asked no more: end of input would say no
    assert "Status: ran-again" in mod.load_skill("deploy", "again")
    assert QUESTION not in capsys.readouterr().err
    deploy_skill(workspace, tag="v2")  # a changed SKILL.md is a new question
    (workspace / "RAN").unlink()
    assert "not run" in mod.load_skill("deploy", "prod") and not (workspace / "RAN").exists()
    assert QUESTION in capsys.readouterr().err


def test_trust_is_per_workspace(mod, workspace, monkeypatch, tmp_path, capsys):
    deploy_skill(workspace)
    answers(monkeypatch, "y\n")
    assert "ran-a" in mod.load_skill("deploy", "a")
    other = tmp_path / "other"
    other.mkdir()
    deploy_skill(other)  # the same SKILL.md, byte for byte, in another clone
    answers(monkeypatch, "")
    with mod.acting_as(mod.AgentState(other)):
        assert "not run" in mod.load_skill("deploy", "b")
    assert not (other / "RAN").exists()
    assert capsys.readouterr().err.count(QUESTION) == 2


def test_human_and_own_skills_need_no_question(mod, workspace, monkeypatch, capsys):
    make_repo(workspace)
    deploy_skill(workspace)
    make_skill(user_root(), "mine", "Mine: !`echo user-$0`")
    answers(monkeypatch, "")  # any question would be answered no
    assert "Status: ran-typed" in mod.handle_slash("/deploy typed", {})  # the human chose it
    assert "Mine: user-x" in mod.load_skill("mine", "x")
    assert "second commit" in mod.load_skill("review-code")
    make_skill(project_root(workspace), "plain", "No commands here.")
    assert "No commands here." in mod.load_skill("plain")
    assert QUESTION not in capsys.readouterr().err and not trust_file().exists()


def test_the_model_loop_asks_once_and_gets_the_output(mod, api, client, workspace, monkeypatch,
                                                       capsys):
    deploy_skill(workspace)
    answers(monkeypatch, "y\n")
    api.script([reply(tool("load_skill", {"name": "deploy", "arguments": "p1"})),
                reply(tool("load_skill", {"name": "deploy", "arguments": "p2"})), reply("Done.")])
    assert mod.agent_loop(client, [{"role": "user", "content": "deploy"}]) == "end_turn"
    first, second = (str(r["body"]["messages"][-1]["content"]) for r in api.requests[1:])
    assert "ran-p1" in first and "ran-p2" in second  # the second call asked nothing
    assert capsys.readouterr().err.count(QUESTION) == 1


@pytest.mark.parametrize("content", ["workspaces: [unclosed\n", "- a list\n", "just text\n",
                                     "workspaces: [1, 2]\n", "workspaces: {x: 3}\n"])
def test_corrupt_trust_file_is_empty_with_one_warning(mod, workspace, monkeypatch, capsys,
                                                      content):
    trust_file().parent.mkdir(parents=True)
    trust_file().write_text(content)
    deploy_skill(workspace)
    answers(monkeypatch, "")
    mod.load_skill("deploy")
    mod.load_skill("deploy")
    err = capsys.readouterr().err
    assert err.count("trusted.yaml is corrupt") == 1 and err.count(QUESTION) == 2
    assert mod.load_trusted() == {}
    answers(monkeypatch, "y\n")
    assert "ran-" in mod.load_skill("deploy")  # the yes rewrites the file
    saved = yaml.safe_load(trust_file().read_text())["workspaces"]
    assert list(saved) == [str(workspace.resolve())]


def test_trust_file_keeps_other_entries(mod, workspace, monkeypatch):
    trust_file().parent.mkdir(parents=True)
    here = str(workspace.resolve())
    other = {"/elsewhere": {"AGENTS.md": "ab" * 32}, here: {"x.md": "cd" * 32}}
    trust_file().write_text(yaml.safe_dump({"workspaces": other}))
    deploy_skill(workspace)
    answers(monkeypatch, "yes\n")
    mod.load_skill("deploy")
    saved = yaml.safe_load(trust_file().read_text())["workspaces"]
    assert saved["/elsewhere"] == other["/elsewhere"]
    assert set(saved[here]) == {"x.md", ".agent/skills/deploy/SKILL.md"}


def test_ask_human_reads_a_pipe_and_prompts_on_stderr(mod, monkeypatch, capsys):
    answers(monkeypatch, "maybe\nyes\n")
    assert mod.ask_human("Go? ") == "maybe"
    assert mod.ask_human("Again? ") == "yes"
    assert mod.ask_human("Once more? ") == "no"  # end of input
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("Go? maybe\nAgain? yes\nOnce more? ")   # piped answers echoed


@pytest.mark.e2e("s05")
def test_cli_piped_answer_decides(mod, api, workspace):
    deploy_skill(workspace)
    steps = [reply(tool("load_skill", {"name": "deploy", "arguments": "cli"})), reply("Done.")]
    api.script(list(steps))
    p = run_chapter(mod.__name__, api=api, cwd=workspace, input="deploy it\n")  # no answer
    assert p.returncode == 0, p.stderr
    assert QUESTION in p.stderr and not (workspace / "RAN").exists()
    assert "not run" in str(api.requests[1]["body"]["messages"][-1]["content"])
    api.reset()
    api.script(list(steps))
    p = run_chapter(mod.__name__, api=api, cwd=workspace, input="deploy it\ny\n")
    assert p.returncode == 0, p.stderr
    assert (workspace / "RAN").exists() and QUESTION not in p.stdout
    assert "ran-cli" in str(api.requests[1]["body"]["messages"][-1]["content"])


# --- 3. reads stay inside skill folders -------------------------------------

def refused(mod, path):
    with pytest.raises(mod.ToolError, match="outside the workspace"):
        mod.read_file(str(path))
    return True


def test_skills_root_linked_to_slash_opens_nothing(mod, workspace):
    (workspace / ".agent").mkdir()
    project_root(workspace).symlink_to("/")
    assert mod.skill_file("/etc/passwd") is None
    assert refused(mod, "/etc/passwd") and refused(mod, project_root(workspace) / "etc" / "passwd")
    assert {"spec", "review-code", "commit-message"} <= set(mod.discover_skills())


def test_skill_folder_linked_outside(mod, workspace, tmp_path):
    project_root(workspace).mkdir(parents=True)
    (project_root(workspace) / "etc").symlink_to("/etc")  # no SKILL.md there: no skill
    assert "etc" not in mod.discover_skills()
    assert refused(mod, project_root(workspace) / "etc" / "passwd")
    # a linked folder that is a skill: reads stay inside the folder it points to
    target = make_skill(tmp_path / "src", "my-skill", "See ref.md.", files={"ref.md": "REF-OK\n"})
    (tmp_path / "src" / "secret.txt").write_text("SECRET\n")
    user_root().mkdir(parents=True)
    (user_root() / "my-skill").symlink_to(target)
    assert "REF-OK" in mod.read_file(str(user_root() / "my-skill" / "ref.md"))
    assert "REF-OK" in mod.read_file(str(target / "ref.md"))
    assert refused(mod, user_root() / "my-skill" / ".." / "secret.txt")
    assert refused(mod, tmp_path / "src" / "secret.txt")


def test_only_files_of_discovered_skills(mod, workspace):
    folder = make_skill(user_root(), "notes", "Notes.", files={"ref.md": "REF-OK\n"})
    (Path.home() / "secret.txt").write_text("SECRET\n")
    (folder / "escape").symlink_to(Path.home() / "secret.txt")
    (folder / "up").symlink_to(Path.home())
    (user_root() / "loose.md").write_text("LOOSE\n")  # in the root, in no skill
    (user_root() / "drafts").mkdir()  # a folder without SKILL.md is no skill
    (user_root() / "drafts" / "plan.md").write_text("DRAFT\n")
    make_skill(user_root(), ".hidden", "Hidden.", files={"h.md": "HIDDEN\n"})  # skipped
    make_skill(user_root(), "broken", "x", description="", files={"b.md": "BROKEN\n"})
    assert "REF-OK" in mod.read_file(str(folder / "ref.md"))
    for path in (folder / "escape", folder / "up" / "secret.txt", user_root() / "loose.md",
                 user_root() / "drafts" / "plan.md", user_root() / ".hidden" / "h.md",
                 user_root() / "broken" / "b.md"):
        assert mod.skill_file(str(path)) is None, path
        assert refused(mod, path)
