"""s07.28, rule 1 of the boundary: nothing a sandboxed command writes is run, or
read as config, outside the sandbox. Git is the way out it must close: git runs
programs named by config (core.fsmonitor, hooks, filters, aliases), and reads
config from wherever its pointer files say.

So in every git folder of the workspace (the main .git, a nested repository's,
a bare one, a worktree's or submodule's) only git's data may change: after each
sandboxed command everything else is put back; a git folder the command made
keeps nothing that runs a program; a .git file or link it made goes.

Each attack runs real bwrap through run_bash, then does what the human or the
agent does later, outside the sandbox: a plain `git status` (which runs
core.fsmonitor) or a commit (which runs hooks). Each is first run unsandboxed,
to show that the later git would run the planted code: the test can fail.
"""
import json
import os
import subprocess

import pytest

from conftest import chapters_from, run_chapter
from fake_api import reply, tool

S07 = chapters_from("s07")
in_s07 = pytest.mark.parametrize("mod", S07, indirect=True)
FSMONITOR = "printf '[core]\\n\\tfsmonitor = touch PWNED\\n' >> {}"


@pytest.fixture
def sandboxed(mod):
    ok, why = mod.sandbox_available()
    if not ok:
        pytest.skip(f"the OS sandbox does not work here: {why}")
    mod.agent_state().permissions["sandbox"]["enabled"] = True
    return mod


def bash(mod, command):
    try:
        return mod.run_bash(command)
    except mod.ToolError as e:
        return str(e)


def git(cwd, *args):
    """The human's git, later, outside the sandbox (a status runs core.fsmonitor)."""
    return subprocess.run(["git", "-c", "user.name=h", "-c", "user.email=h@h", *args], cwd=cwd,
                          capture_output=True, text=True)


def pwned(where):
    return any("PWNED" in files for _, _, files in os.walk(where))


def unsandboxed_shows_the_attack(mod, workspace, command, later):
    """Run the attack with the sandbox off: the later git runs the planted code."""
    state = mod.agent_state()
    state.permissions["sandbox"]["enabled"] = False
    try:
        mod.run_bash(command)
        later()
        assert pwned(workspace), "the attack does not work even unsandboxed"
    finally:
        state.permissions["sandbox"]["enabled"] = True
    subprocess.run(["rm", "-rf", *[str(p) for p in workspace.iterdir() if p.name != ".agent"]], check=True)
    for here, _, files in os.walk(workspace):
        if "PWNED" in files:
            os.unlink(os.path.join(here, "PWNED"))


@in_s07
def test_a_new_repository_keeps_no_config_key_or_hook_that_runs_a_program(sandboxed, workspace):
    mod = sandboxed
    attack = ("git init -q sub && " + FSMONITOR.format("sub/.git/config") + " && "
              "git -C sub config alias.st '!touch PWNED' && git -C sub config filter.x.clean 'touch PWNED' && "
              "printf '#!/bin/sh\\ntouch PWNED\\n' > sub/.git/hooks/pre-commit && chmod +x sub/.git/hooks/pre-commit")
    later = lambda: (git(workspace / "sub", "status"), git(workspace / "sub", "commit", "-qm", "x", "--allow-empty"))  # noqa: E731
    unsandboxed_shows_the_attack(mod, workspace, attack, later)
    out = bash(mod, attack)
    assert "sub/.git/config was written anew without alias.st, core.fsmonitor, filter.x.clean" in out, out
    assert "sub/.git/hooks/pre-commit made not executable" in out
    later()
    assert not pwned(workspace)
    assert (workspace / "sub/.git/HEAD").exists()  # the repository itself stays: git init works
    assert git(workspace / "sub", "config", "core.bare").stdout.strip() == "false"  # its own keys too


@in_s07
def test_a_bare_repository_and_a_submodule_folder_are_git_folders_too(sandboxed, workspace):
    mod = sandboxed
    git(workspace, "init", "-q")
    attack = ("git init -q --bare bare.git && " + FSMONITOR.format("bare.git/config") + " && "
              "git init -q --bare .git/modules/lib && " + FSMONITOR.format(".git/modules/lib/config"))
    out = bash(mod, attack)
    assert "bare.git/config was written anew without core.fsmonitor" in out, out
    assert ".git/modules/lib/config was written anew without core.fsmonitor" in out
    git(workspace / "bare.git", "status")
    git(workspace / ".git/modules/lib", "status")
    assert not pwned(workspace)


@in_s07
def test_a_new_git_file_or_link_is_taken_away(sandboxed, workspace):
    mod = sandboxed
    git(workspace, "init", "-q")
    attack = ("git init -q --bare evil && " + FSMONITOR.format("evil/config") + " && "
              "mkdir -p d e && echo 'gitdir: ../evil' > d/.git && ln -s ../evil e/.git")
    out = bash(mod, attack)
    assert "d/.git set aside" in out and "e/.git set aside" in out, out
    assert not os.path.lexists(workspace / "d/.git") and not os.path.lexists(workspace / "e/.git")
    git(workspace / "d", "status")
    git(workspace / "e", "status")
    assert not pwned(workspace)


@in_s07
def test_what_git_reads_in_an_existing_repository_is_read_only_or_put_back(sandboxed, workspace):
    mod = sandboxed
    git(workspace, "init", "-q")
    (workspace / "vendor/lib").mkdir(parents=True)
    git(workspace / "vendor/lib", "init", "-q")  # a nested repository, the human's
    before = (workspace / "vendor/lib/.git/config").read_bytes()
    out = bash(mod, FSMONITOR.format("vendor/lib/.git/config"))
    assert "Read-only file system" in out  # existing config is bound read-only, in every git folder
    attack = ("git init -q --bare evil && " + FSMONITOR.format("evil/config") + " && "
              "echo ../../evil > vendor/lib/.git/commondir && echo ../evil > .git/commondir && "
              "printf '[core]\\n\\tfsmonitor = touch PWNED\\n' > .git/config.worktree && "
              "echo x > .git/description.new")
    out = bash(mod, attack)
    for planted in ("vendor/lib/.git/commondir", ".git/commondir", ".git/config.worktree",
                    ".git/description.new"):
        assert f"{planted} set aside" in out, (planted, out)
        assert not os.path.lexists(workspace / planted)
    assert (workspace / "vendor/lib/.git/config").read_bytes() == before
    git(workspace, "status")
    git(workspace / "vendor/lib", "status")
    assert not pwned(workspace)


@in_s07
def test_a_changed_file_is_put_back_as_it_was(sandboxed, workspace):
    mod = sandboxed
    git(workspace, "init", "-q")
    description = workspace / ".git/description"
    description.write_text("the human's words\n")
    description.chmod(0o640)
    out = bash(mod, "echo evil > .git/description")
    assert ".git/description put back" in out, out
    assert description.read_text() == "the human's words\n"
    assert description.stat().st_mode & 0o777 == 0o640


@in_s07
def test_git_still_works_inside_the_sandbox(sandboxed, workspace):
    """add, commit, switch, stash, init in a new folder and a build that writes the
    workspace: nothing to put back, so nothing said."""
    mod = sandboxed
    git(workspace, "init", "-q", "-b", "main")
    (workspace / "app.py").write_text("print(1)\n")
    id_ = "-c user.name=t -c user.email=t@t"
    out = mod.run_bash(
        f"git add -A && git {id_} commit -qm one && git switch -qc topic && echo 2 >> app.py && "
        f"git stash -q && git stash pop -q && git {id_} commit -qam two && git switch -q main && "
        f"git stash list && mkdir -p tools/new && git init -q tools/new && "
        f"python3 -c \"open('build.txt', 'w').write('built')\" && git log --oneline --all | wc -l")
    assert out.strip() == "2", out  # two commits, no note from the audit
    assert (workspace / "build.txt").read_text() == "built"
    assert (workspace / "tools/new/.git/HEAD").exists()


@pytest.mark.e2e("s07")
@pytest.mark.parametrize("mod", S07, indirect=True)
def test_in_the_default_mode_the_models_unasked_commands_leave_git_nothing_to_run(mod, api, workspace):
    """The real process, in the default mode, where sandboxed bash is allowed unasked:
    the model's commands plant a repository that runs a program, and a redirect of the
    workspace's own .git; the human's next git runs neither, and the model is told."""
    ok, why = mod.sandbox_available()
    if not ok:
        pytest.skip(f"the OS sandbox does not work here: {why}")
    git(workspace, "init", "-q")
    plant = ("git init -q --bare evil && " + FSMONITOR.format("evil/config") + " && "
             "echo ../evil > .git/commondir && git init -q sub && " + FSMONITOR.format("sub/.git/config"))
    api.script([reply(tool("bash", {"command": plant})), reply("Done.")])
    r = run_chapter(mod.__name__, "set things up", api=api, cwd=workspace, input="",
                    env={"HOME": str(workspace.parent / "home"), "AGENT_PERMISSION_MODE": "default"})
    assert r.returncode == 0, r.stderr
    told = json.dumps(api.requests[1]["body"]["messages"][-1]["content"])
    assert ".git/commondir set aside" in told and "sub/.git/config was written anew without core.fsmonitor" in told
    git(workspace, "status")
    git(workspace / "sub", "status")
    assert not pwned(workspace)


# --- a hostile review of the design: each failed before its fix ---
CFG = ("printf '[core]\\n\\trepositoryformatversion = 0\\n\\tbare = false\\n\\tworktree = .\\n"
       "\\tfsmonitor = touch PWNED\\n' > {}")


@in_s07
def test_git_folders_are_found_as_git_finds_them(sandboxed, workspace):
    """HEAD a link to a folder, objects and refs executable files, the workspace
    itself: git takes each for a repository, so the audit does too."""
    mod = sandboxed
    bash(mod, "mkdir -p a/objects a/refs/heads && ln -s refs/heads a/HEAD && " + CFG.format("a/config") +
         " && mkdir b && touch b/objects b/refs && chmod +x b/objects b/refs && echo 'ref: refs/heads/m' > b/HEAD"
         " && " + CFG.format("b/config"))
    bash(mod, "mkdir -p objects refs/heads && echo 'ref: refs/heads/main' > HEAD && " + CFG.format("config"))
    for where in (workspace / "a", workspace / "b", workspace):
        git(where, "status")
    assert not pwned(workspace)


@in_s07
def test_an_existing_submodules_git_folder_cannot_leave_the_audit(sandboxed, workspace):
    up = workspace.parent / "up"
    up.mkdir()
    git(up, "init", "-q")
    git(up, "commit", "-qm", "x", "--allow-empty")
    git(workspace, "init", "-q")
    git(workspace, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(up), "lib")
    git(workspace, "commit", "-qm", "sub")
    out = bash(sandboxed, "git init -q --bare evil && " + FSMONITOR.format("evil/config") + " && "
               "cd .git/modules/lib && rm HEAD && ln -s refs/heads HEAD && echo ../../../evil > commondir")
    assert ".git/modules/lib/commondir set aside" in out, out
    git(workspace, "status")
    assert not pwned(workspace)


@in_s07
def test_a_new_config_is_written_anew_however_big_and_whatever_lock_it_has(sandboxed, workspace):
    bash(sandboxed, "git init -q big && head -c 1100000 /dev/zero | tr '\\0' '#' >> big/.git/config && "
                    "printf '\\n[core]\\n\\tfsmonitor = touch PWNED\\n' >> big/.git/config && "
                    "git init -q locked && printf '[core]\\n\\tfsmonitor = touch PWNED\\n' >> locked/.git/config"
                    " && touch locked/.git/config.lock")
    git(workspace / "big", "status")
    git(workspace / "locked", "status")
    assert not pwned(workspace)


@in_s07
def test_one_entry_that_cannot_be_put_back_does_not_stop_the_audit(sandboxed, workspace):
    git(workspace, "init", "-q")
    deep = "d" * 200
    out = bash(sandboxed, "git init -q --bare evil && " + FSMONITOR.format("evil/config") +
               f" && echo ../evil > .git/commondir && mkdir .git/zzz && cd .git/zzz && "
               f"for i in $(seq 25); do mkdir {deep} && cd {deep}; done")
    assert ".git/commondir set aside" in out and "could not be put back" in out, out
    git(workspace, "status")
    assert not pwned(workspace)


@in_s07
def test_a_planted_rebase_runs_no_exec_line(sandboxed, workspace):
    git(workspace, "init", "-q")
    (workspace / "a").write_text("a")
    git(workspace, "add", "a")
    git(workspace, "commit", "-qm", "one")
    head = git(workspace, "rev-parse", "HEAD").stdout.strip()
    branch = git(workspace, "symbolic-ref", "HEAD").stdout.strip()
    out = bash(sandboxed, f"mkdir .git/rebase-merge && cd .git/rebase-merge && echo {branch} > head-name && "
               f"echo {head} > onto && echo {head} > orig-head && touch interactive && "
               f"printf 'exec touch PWNED\\n' > git-rebase-todo && : > done && echo 1 > end && echo 0 > msgnum")
    assert "git-rebase-todo had its exec lines dropped" in out, out
    git(workspace, "rebase", "--continue")
    assert not pwned(workspace)


@in_s07
def test_a_worktree_added_inside_the_workspace_keeps_its_pointer(sandboxed, workspace):
    git(workspace, "init", "-q")
    (workspace / "a").write_text("a")
    git(workspace, "add", "a")
    git(workspace, "commit", "-qm", "one")
    out = bash(sandboxed, "git worktree add -q wt -b feature")
    assert (workspace / "wt/.git").is_file(), out
    assert git(workspace / "wt", "branch", "--show-current").stdout.strip() == "feature"


# --- a second hostile review: each failed before its fix ---
PROGRAM = "mkdir git-merge- && printf '#!/bin/sh\\ntouch PWNED\\n' > git-merge-/x && chmod +x git-merge-/x"


def two_branches(ws):
    """main: one, three; topic: one, two. Returns their commits."""
    git(ws, "init", "-q", "-b", "main")
    (ws / "a").write_text("a\n")
    git(ws, "add", "a")
    git(ws, "commit", "-qm", "one")
    git(ws, "switch", "-qc", "topic")
    (ws / "a").write_text("b\n")
    git(ws, "commit", "-qam", "two")
    git(ws, "switch", "-q", "main")
    (ws / "c").write_text("c\n")
    git(ws, "add", "c")
    git(ws, "commit", "-qm", "three")
    return git(ws, "rev-parse", "main").stdout.strip(), git(ws, "rev-parse", "topic").stdout.strip()

@in_s07
def test_a_planted_rebase_strategy_runs_a_program(sandboxed, workspace):
    main, topic = two_branches(workspace)
    out = bash(sandboxed, f"mkdir .git/rebase-merge && cd .git/rebase-merge && echo refs/heads/main > head-name && "
               f"echo {main} > onto && echo {main} > orig-head && touch interactive && "
               f"echo 'pick {topic} two' > git-rebase-todo && : > done && echo 1 > end && echo 0 > msgnum && "
               f"echo /x > strategy && cd ../.. && {PROGRAM}")
    git(workspace, "rebase", "--continue")     # the human, later, outside the sandbox
    assert not pwned(workspace), out


@in_s07
def test_a_planted_cherry_pick_strategy_runs_a_program(sandboxed, workspace):
    main, topic = two_branches(workspace)
    out = bash(sandboxed, f"mkdir .git/sequencer && cd .git/sequencer && echo {main} > head && "
               f"printf 'pick {main} three\\npick {topic} two\\n' > todo && printf '[options]\\n\\tstrategy = /x\\n' > opts && "
               f"cd ../.. && {PROGRAM}")
    git(workspace, "cherry-pick", "--continue")
    assert not pwned(workspace), out


@in_s07
def test_a_config_the_repository_includes_from_the_workspace(sandboxed, workspace):
    """A common set-up: the project shares git settings in a tracked file, and each
    clone runs `git config include.path ../.gitconfig` once."""
    git(workspace, "init", "-q")
    (workspace / "tools").mkdir(); (workspace / "tools/git.config").write_text("[diff]\n\tcolorMoved = zebra\n")
    git(workspace, "config", "include.path", "../tools/git.config")
    out = bash(sandboxed, "printf '[core]\\n\\tfsmonitor = touch PWNED\\n' >> tools/git.config")
    git(workspace, "status")
    assert not pwned(workspace), out


@in_s07
def test_a_nested_repositorys_hooks_path(sandboxed, workspace):
    git(workspace, "init", "-q")
    (workspace / "vendor/lib/.githooks").mkdir(parents=True)
    git(workspace / "vendor/lib", "init", "-q")
    git(workspace / "vendor/lib", "config", "core.hooksPath", ".githooks")
    out = bash(sandboxed, "printf '#!/bin/sh\\ntouch PWNED\\n' > vendor/lib/.githooks/pre-commit && "
                          "chmod +x vendor/lib/.githooks/pre-commit")
    git(workspace / "vendor/lib", "commit", "-qm", "x", "--allow-empty")
    assert not pwned(workspace), out


@in_s07
def test_husky_hooks_run_the_script_one_folder_up(sandboxed, workspace):
    """husky v9 (`npx husky init`): core.hooksPath = .husky/_, whose stubs run .husky/<hook>."""
    git(workspace, "init", "-q")
    (workspace / ".husky/_").mkdir(parents=True)
    stub = workspace / ".husky/_/pre-commit"
    stub.write_text('#!/bin/sh\n. "$(dirname "$0")/h"\n')
    (workspace / ".husky/_/h").write_text('#!/bin/sh\nn=$(basename "$0")\ns=$(dirname "$(dirname "$0")")/$n\n'
                                          '[ ! -f "$s" ] && exit 0\nsh -e "$s"\n')
    stub.chmod(0o755)
    (workspace / ".husky/pre-commit").write_text("npm test\n")
    git(workspace, "config", "core.hooksPath", ".husky/_")
    out = bash(sandboxed, "echo 'touch PWNED' > .husky/pre-commit")
    git(workspace, "commit", "-qm", "x", "--allow-empty")
    assert not pwned(workspace), out


@in_s07
def test_a_hook_linked_to_a_tracked_script(sandboxed, workspace):
    """A common set-up: `ln -s ../../scripts/pre-commit.sh .git/hooks/pre-commit`."""
    git(workspace, "init", "-q")
    (workspace / "scripts").mkdir()
    (workspace / "scripts/pre-commit.sh").write_text("#!/bin/sh\nexit 0\n")
    (workspace / "scripts/pre-commit.sh").chmod(0o755)
    os.symlink("../../scripts/pre-commit.sh", workspace / ".git/hooks/pre-commit")
    out = bash(sandboxed, "printf '#!/bin/sh\\ntouch PWNED\\n' > scripts/pre-commit.sh")
    git(workspace, "commit", "-qm", "x", "--allow-empty")
    assert not pwned(workspace), out


@in_s07
def test_a_repository_in_an_additional_directory(sandboxed, workspace):
    """additional_directories (Claude Code's --add-dir) are writable in the sandbox too,
    and a sibling checkout is the usual one to add: its .git is never bound nor audited."""
    lib = workspace.parent / "shared-lib"
    lib.mkdir()
    git(lib, "init", "-q")
    sandboxed.agent_state().permissions["additional_directories"] = [lib]
    out = bash(sandboxed, f"printf '[core]\\n\\tfsmonitor = touch PWNED\\n' >> {lib}/.git/config && "
                          f"printf '#!/bin/sh\\ntouch PWNED\\n' > {lib}/.git/hooks/pre-commit && chmod +x {lib}/.git/hooks/pre-commit")
    git(lib, "status")
    assert not pwned(lib), out


@in_s07
def test_a_command_too_long_to_start_leaves_nothing_held(sandboxed, workspace):
    """E2BIG: the command never starts; its snapshot and stubs must still end with it."""
    git(workspace, "init", "-q")
    with pytest.raises(OSError):
        bash(sandboxed, "cat > data.txt <<'EOF'\n" + "x" * 140_000 + "\nEOF")
    (workspace / ".git/description").write_text("the human's, later\n")   # the human, much later
    out = bash(sandboxed, "true")
    assert "description" not in out, out
    assert (workspace / ".git/description").read_text() == "the human's, later\n"
    assert not (workspace / ".mcp.json").exists()


@in_s07
def test_a_config_write_is_explained(sandboxed, workspace):
    git(workspace, "init", "-q")
    out = bash(sandboxed, "git config user.name Ada")
    assert "Device or resource busy" in out and "git config is theirs to change" in out, out


@in_s07
def test_the_humans_own_git_meanwhile_is_set_aside_never_lost(sandboxed, workspace):
    """The human runs `git sparse-checkout set` while the agent's command runs: the audit
    cannot tell whose config.worktree it is, so it sets it aside, where it is kept."""
    import threading
    import time
    git(workspace, "init", "-q")
    (workspace / "src").mkdir()
    (workspace / "src/a").write_text("a")
    git(workspace, "add", "-A")
    git(workspace, "commit", "-qm", "x")
    human = threading.Thread(target=lambda: (time.sleep(1), git(workspace, "sparse-checkout", "set", "src")))
    human.start()
    out = bash(sandboxed, "sleep 3")
    human.join()
    state = sandboxed.agent_state()
    kept = workspace / ".agent/git-set-aside" / state.run_id / ".git/config.worktree"
    assert ".git/config.worktree set aside" in out and f"git-set-aside/{state.run_id}/" in out, out
    assert "sparse" in kept.read_text()
    assert git(workspace, "status", "--porcelain").stdout == ""  # set aside, and out of git


# --- a third hostile review: each failed before its fix ---
@in_s07
def test_a_todo_list_git_reads_but_the_audit_cannot_is_set_aside(sandboxed, workspace):
    main, _ = two_branches(workspace)
    rebase = (f"mkdir -p .git/rebase-merge && cd .git/rebase-merge && echo refs/heads/main > head-name && "
              f"echo {main} > onto && echo {main} > orig-head && touch interactive && : > done && "
              f"echo 1 > end && echo 0 > msgnum && ")
    out = bash(sandboxed, "echo 'exec touch PWNED' > notes.txt && " + rebase + "ln -s ../../notes.txt git-rebase-todo")
    assert ".git/rebase-merge/git-rebase-todo set aside" in out, out
    git(workspace, "rebase", "--continue")
    assert not pwned(workspace)
    git(workspace, "rebase", "--abort")
    out = bash(sandboxed, rebase + "{ printf '# '; head -c 1100000 /dev/zero | tr '\\0' x; "
                                   "printf '\\nexec touch PWNED\\n'; } > git-rebase-todo")
    git(workspace, "rebase", "--continue")
    assert not pwned(workspace), out


@in_s07
def test_a_cloned_link_where_things_are_set_aside_still_takes_the_plant_away(sandboxed, workspace):
    git(workspace, "init", "-q")
    (workspace / ".agent").mkdir(exist_ok=True)
    os.symlink("/nonexistent", workspace / ".agent/git-set-aside")
    out = bash(sandboxed, "git init -q --bare .git/lfs/evil && " + FSMONITOR.format(".git/lfs/evil/config") +
               " && echo lfs/evil > .git/commondir")
    git(workspace, "status")
    assert not pwned(workspace), out
    assert not (workspace / ".git/commondir").exists()


@in_s07
def test_an_include_made_by_the_command_or_chosen_by_its_branch_is_not_obeyed(sandboxed, workspace):
    two_branches(workspace)
    git(workspace, "config", "include.path", "../.gitconfig.local")        # optional: missing at first
    (workspace / "t.gitconfig").write_text("[diff]\n\tcolorMoved = zebra\n")
    git(workspace, "config", "includeIf.onbranch:topic.path", "../t.gitconfig")
    out = bash(sandboxed, "printf '[core]\\n\\tfsmonitor = touch PWNED\\n' > .gitconfig.local; "
                          "printf '[core]\\n\\tfsmonitor = touch PWNED\\n' >> t.gitconfig; "
                          "git symbolic-ref HEAD refs/heads/topic")
    assert ".gitconfig.local set aside" in out and "t.gitconfig: Read-only file system" in out, out
    git(workspace, "status")
    assert not pwned(workspace)


@in_s07
def test_home_as_an_additional_directory_keeps_the_agents_and_gits_config_out_of_reach(sandboxed, workspace):
    home = workspace.parent / "home"
    git(workspace, "init", "-q")
    sandboxed.agent_state().permissions["additional_directories"] = [home]
    bash(sandboxed, "mkdir -p ~/.config/git && printf '[core]\\n\\tfsmonitor = touch PWNED\\n' > ~/.config/git/config")
    bash(sandboxed, "mkdir -p ~/.agent && printf 'permissions:\\n  sandbox:\\n    enabled: false\\n' > "
                    "~/.agent/config.yaml")
    assert not (home / ".agent/config.yaml").exists() and not (home / ".config/git/config").exists()
    git(workspace, "status")
    assert not pwned(workspace)
