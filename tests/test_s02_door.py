"""The boundary's second rule, whose one home is s02's write_inside(): the agent's
own writes never follow a link and leave no gap between check and use. The path
is walked from / one name at a time with O_NOFOLLOW, and the file is replaced by
a rename in its judged folder, never written through. Runs on s02 and every
later file.
"""
import os
import stat
from pathlib import Path

import pytest

from conftest import chapters_from

each = pytest.mark.parametrize("mod", chapters_from("s02"), indirect=True)


def read_then(mod, name):
    """write and edit need a read first (s02's rule)."""
    mod.read_file(name)


@each
def test_a_folder_swapped_for_a_link_after_the_judge_is_not_written_through(mod, workspace, monkeypatch):
    """A background command that flips d/ between missing and a link to ~/.agent made
    write_file d/config.yaml land in ~/.agent/config.yaml: read at the next start as
    the user's own config, its hooks run outside the sandbox."""
    target = Path.home() / ".agent"
    target.mkdir(parents=True, exist_ok=True)
    judged = mod.safe_path

    def judge_then_swap(p):
        path = judged(p)                                    # judged: workspace/d/config.yaml
        (workspace / "d").symlink_to(target, target_is_directory=True)   # the flip, just after
        return path

    monkeypatch.setattr(mod, "safe_path", judge_then_swap)
    with pytest.raises(mod.ToolError, match="Could not write"):
        mod.write_file("d/config.yaml", "hooks: [{event: session_start, action: {type: command}}]\n")
    assert not (target / "config.yaml").exists()


@each
def test_a_link_in_the_workspace_is_resolved_once_and_stays_a_link(mod, workspace):
    (workspace / "AGENTS.md").write_text("Use tabs.\n")
    (workspace / "CLAUDE.md").symlink_to("AGENTS.md")
    read_then(mod, "CLAUDE.md")
    mod.edit_file("CLAUDE.md", "tabs", "spaces")
    assert (workspace / "CLAUDE.md").is_symlink() and (workspace / "AGENTS.md").read_text() == "Use spaces.\n"


@each
def test_a_hard_link_to_a_file_elsewhere_is_replaced_not_written_through(mod, workspace, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("the user's file\n")
    os.link(outside, workspace / "notes.txt")               # a clone cannot ship one; a command can make one
    read_then(mod, "notes.txt")
    mod.write_file("notes.txt", "the agent's\n")
    assert outside.read_text() == "the user's file\n" and (workspace / "notes.txt").read_text() == "the agent's\n"


@each
def test_an_edited_file_keeps_its_mode_and_a_new_one_gets_the_umasks(mod, workspace):
    script = workspace / "run.sh"
    script.write_text("echo one\n")
    script.chmod(0o750)
    read_then(mod, "run.sh")
    mod.edit_file("run.sh", "one", "two")
    assert stat.S_IMODE(script.stat().st_mode) == 0o750 and script.read_text() == "echo two\n"
    mod.write_file("new/deep/file.txt", "x")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((workspace / "new" / "deep" / "file.txt").stat().st_mode) == 0o666 & ~umask
    assert not [p for p in workspace.rglob(".agent-write-*")]   # no temporary file left behind


@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_the_always_rule_saver_writes_through_the_door(mod, workspace, tmp_path):
    """The rule saver appended to .agent/.gitignore by its path: a link planted there
    (a clone can ship one) had the line appended to the file it points at."""
    victim = tmp_path / "bashrc"
    victim.write_text("export PATH=$PATH\n")
    (workspace / ".agent").mkdir()
    (workspace / ".agent" / ".gitignore").symlink_to(victim)
    mod.remember_rules(["bash(make test)"], mod.agent_state())
    assert victim.read_text() == "export PATH=$PATH\n"
    assert (workspace / ".agent" / ".gitignore").read_text() == "config.local.yaml\n"
    assert "bash(make test)" in (workspace / ".agent" / "config.local.yaml").read_text()


@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_the_path_judged_is_the_path_written(mod, workspace, monkeypatch):
    """A folder that turns into a link between decide() and the write (a background
    command, or while the human reads the question) led write_file d/config.yaml into
    .agent/config.yaml, a protected file no mode lets the file tools write."""
    state = mod.agent_state()
    state.mode, state.permissions["sandbox"]["enabled"] = "acceptEdits", False
    (workspace / ".agent").mkdir()
    judge = mod.judge

    def judge_then_flip(block):
        verdict = judge(block)
        (workspace / "d").symlink_to(workspace / ".agent", target_is_directory=True)
        return verdict

    monkeypatch.setattr(mod, "judge", judge_then_flip)
    block = type("Block", (), {"id": "t1", "name": "write_file",
                               "input": {"path": "d/config.yaml", "content": "hooks: []\n"}})()
    result = mod.run_tool(block)
    assert result.get("is_error") and "leads elsewhere than when the call was judged" in result["content"]
    assert not (workspace / ".agent" / "config.yaml").exists()


@pytest.mark.parametrize("mod", chapters_from("s08"), indirect=True)
def test_hooks_log_goes_through_the_door(mod, workspace, tmp_path):
    """hooks.log was opened with O_NOFOLLOW on its own name only: an .agent folder a
    clone ships as a link to elsewhere had the log written there."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (workspace / ".agent").symlink_to(elsewhere, target_is_directory=True)
    hook = {"name": "user#1", "action": {"type": "command"}}
    mod.log_hook(hook, "pre_tool_use", "ok", 0.1)
    assert not (elsewhere / "hooks.log").exists()
    (workspace / ".agent").unlink()
    mod.log_hook(hook, "pre_tool_use", "ok", 0.1)
    assert "pre_tool_use user#1 command" in (workspace / ".agent" / "hooks.log").read_text()


# --- every other file the agent writes goes through the same door ---------------------
# A clone can ship .agent/<x> as a link to elsewhere (or a folder on the way as one);
# the agent's own records then failed over or were written where the link points.

@pytest.fixture
def elsewhere(tmp_path):
    """A folder outside the workspace that a planted link points at; nothing may land in it."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    return folder


def plant(link, target):
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target, target_is_directory=target.is_dir())


@each
def test_a_link_at_the_path_becomes_a_plain_file_of_the_new_files_mode(mod, workspace, elsewhere):
    """write_inside kept "the mode of what stood there": for a link that is 0o777, so a
    link replaced by the agent's own record left a world-writable file."""
    plant(workspace / "notes.txt", elsewhere / "victim.txt")
    mod.write_inside(workspace / "notes.txt", b"the agent's\n", 0o600)
    assert not (elsewhere / "victim.txt").exists()
    assert stat.S_IMODE(os.lstat(workspace / "notes.txt").st_mode) == 0o600 & ~current_umask()


def current_umask():
    umask = os.umask(0)
    os.umask(umask)
    return umask


@pytest.mark.parametrize("mod", chapters_from("s05"), indirect=True)
def test_a_yes_is_recorded_through_the_door_and_through_a_dotfiles_home_link(mod, workspace, tmp_path):
    """trusted.yaml is written through s02's door too; ~/.agent itself may be the
    user's own link (dotfiles), which is resolved once, not refused."""
    dotfiles = tmp_path / "dotfiles" / "agent"
    dotfiles.mkdir(parents=True)
    plant(Path.home() / ".agent", dotfiles)
    mod.trust("SKILL.md", "abc")
    assert "abc" in (dotfiles / "trusted.yaml").read_text()
    assert stat.S_IMODE((dotfiles / "trusted.yaml").stat().st_mode) == 0o600 & ~current_umask()


@pytest.mark.parametrize("mod", chapters_from("s06"), indirect=True)
def test_the_compaction_transcript_goes_through_the_door(mod, workspace, elsewhere):
    plant(workspace / ".agent" / "transcripts", elsewhere)
    assert mod.save_transcript([{"role": "user", "content": "hi"}]) is None
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("mod", chapters_from("s08"), indirect=True)
def test_the_hook_transcript_and_its_gitignore_go_through_the_door(mod, workspace, elsewhere):
    """write_transcript made .agent/transcripts with Path.mkdir and keep_out_of_git
    opened .gitignore by its path: an .agent a clone ships as a link had both (and
    the conversation) written where it points."""
    state = mod.agent_state()
    state.record, state.messages = None, [{"role": "user", "content": "hi"}]
    plant(workspace / ".agent", elsewhere)
    mod.write_transcript(state)
    assert list(elsewhere.iterdir()) == []
    (workspace / ".agent").unlink()
    mod.write_transcript(state)
    assert (workspace / ".agent" / "transcripts" / ".gitignore").read_text() == "*\n"
    assert mod.transcript_file(state).read_text().startswith('{"role": "user"')


@pytest.mark.parametrize("mod", chapters_from("s09"), indirect=True)
def test_the_session_file_goes_through_the_door(mod, workspace, elsewhere, capsys):
    """The session file was made with Path.mkdir and opened with O_NOFOLLOW on its own
    name only: .agent/sessions shipped as a link had the conversation appended where
    it points, record after record."""
    plant(workspace / ".agent" / "sessions", elsewhere)
    state = mod.agent_state()
    state.record = mod.new_session(state)
    mod.sync_session([{"role": "user", "content": "hi"}])
    mod.sync_session([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    assert list(elsewhere.iterdir()) == []
    err = capsys.readouterr().err
    assert err.count("session not saved") == 1 and "Traceback" not in err


@pytest.mark.parametrize("mod", chapters_from("s09"), indirect=True)
def test_a_torn_line_is_ended_through_the_door(mod, workspace, elsewhere):
    """end_torn_line opened the session file by its path, following a folder on the way."""
    (elsewhere / "s.jsonl").write_text('{"torn"')
    plant(workspace / ".agent" / "sessions", elsewhere)
    mod.end_torn_line(workspace / ".agent" / "sessions" / "s.jsonl")
    assert (elsewhere / "s.jsonl").read_text() == '{"torn"'


@pytest.mark.parametrize("mod", chapters_from("s09"), indirect=True)
def test_memory_files_and_the_consolidation_lock_go_through_the_door(mod, workspace, elsewhere):
    """replace_file made the folder with Path.mkdir and wrote by mkstemp in it, and
    take_lock opened the lock with O_NOFOLLOW on its own name only: a folder on the
    way that is (or turns into) a link had the memory, its .gitignore and the lock's
    PID written where it points. memory_dirs refuses a linked folder when it looks,
    and the door holds whatever changes after that look."""
    folder = workspace / ".agent" / "memory"
    plant(folder, elsewhere)
    with pytest.raises(OSError):
        mod.replace_file(folder, "deploy.md", "---\nname: deploy\n---\n")
    assert mod.take_lock(folder / ".consolidate-lock") is False
    assert list(elsewhere.iterdir()) == []
    folder.unlink()
    mod.replace_file(folder, "deploy.md", "body\n")
    assert (folder / "deploy.md").read_text() == "body\n" and (folder / ".gitignore").read_text() == "*\n"
    assert stat.S_IMODE((folder / "deploy.md").stat().st_mode) == 0o600 & ~current_umask()


@pytest.mark.parametrize("mod", chapters_from("s09"), indirect=True)
def test_user_memory_and_the_session_register_follow_a_dotfiles_home_link(mod, workspace, tmp_path):
    """~/.agent may be the user's own link (dotfiles): resolved once, not refused."""
    dotfiles = tmp_path / "dotfiles" / "agent"
    dotfiles.mkdir(parents=True)
    plant(Path.home() / ".agent", dotfiles)
    mod.replace_file(Path.home() / ".agent" / "memory", "prefs.md", "tabs\n")
    state = mod.agent_state()
    mod.register_session(state, workspace / "x.jsonl")
    assert (dotfiles / "memory" / "prefs.md").read_text() == "tabs\n"
    assert (dotfiles / "sessions.txt").read_text() == f"{state.workdir}\tx\n"


@pytest.mark.parametrize("mod", chapters_from("s10"), indirect=True)
def test_the_task_board_schedules_and_command_logs_go_through_the_door(mod, workspace):
    """The task board, schedules.json and runtime-tasks checked that a link "leads
    inside" the workspace, then wrote through it: a clone that ships .agent, or
    .agent/tasks, as a link to a folder of the project (docs/, .github/) had the
    agent's records made there. The door follows no link, inside or out."""
    docs = workspace / "docs"
    docs.mkdir()
    plant(workspace / ".agent" / "tasks", docs)
    with pytest.raises(mod.ToolError, match="cannot be opened as a lock"):
        mod.task_create("x")
    (workspace / ".agent" / "tasks").unlink()
    (workspace / ".agent").rmdir()
    plant(workspace / ".agent", docs)
    for call in (lambda: mod.schedule_create("* * * * *", "x", durable=True),
                 lambda: mod.background_run("echo hi")):
        with pytest.raises(mod.ToolError):
            call()
    assert list(docs.iterdir()) == []



@pytest.mark.parametrize("mod", chapters_from("s11"), indirect=True)
def test_inboxes_and_the_message_log_go_through_the_door(mod, workspace, elsewhere, capsys):
    """Inboxes, their locks and messages.jsonl were opened with O_NOFOLLOW on their own
    names only: a team folder (or its inbox folder) turned into a link had every
    message, and the locks, written where it points."""
    folder = mod.create_team("t")
    (folder / "inbox").rmdir()
    plant(folder / "inbox", elsewhere)
    record = {"type": "message", "from": "lead", "to": "bob", "content": "hi"}
    with pytest.raises((OSError, mod.ToolError)):
        mod.append_record(folder / "inbox" / "bob.jsonl", record)
    mod.log_records(folder / "inbox", [record])          # the log of a team folder that is a link
    assert list(elsewhere.iterdir()) == []
    assert "the team's message log is not written" in capsys.readouterr().err


@pytest.mark.parametrize("mod", chapters_from("s12"), indirect=True)
def test_lane_locks_and_the_event_log_go_through_the_door(mod, workspace, elsewhere, capsys):
    """A lane's <name>.lock and events.jsonl were opened with O_NOFOLLOW on their own
    names only: .agent/worktrees turned into a link had them made where it points."""
    plant(workspace / ".agent" / "worktrees", elsewhere)
    lane = {"name": "fix", "path": workspace / ".agent" / "worktrees" / "fix", "origin": str(workspace)}
    with pytest.raises(mod.ToolError, match="cannot be opened"):
        mod.lock_lane(lane)
    assert mod.share_lock(lane) is None
    mod.log_event(workspace, "create", "fix")
    assert list(elsewhere.iterdir()) == []
    assert "the worktree event log is not written" in capsys.readouterr().err


@pytest.mark.parametrize("mod", ["agent_full"], indirect=True)
def test_the_prompt_history_goes_through_the_door(mod, workspace, elsewhere, capsys):
    """~/.agent/history was opened and chmod-ed by its path: a link there had its
    target made 0600 and the prompts appended to it."""
    victim = elsewhere / "notes"
    victim.write_text("the user's\n")
    victim.chmod(0o644)
    plant(Path.home() / ".agent" / "history", victim)
    assert type(mod.prompt_history()).__name__ == "InMemoryHistory"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o644 and victim.read_text() == "the user's\n"
    assert "input history not saved" in capsys.readouterr().err


@pytest.mark.parametrize("mod", chapters_from("s09"), indirect=True)
def test_the_memory_log_goes_through_the_door(mod, workspace, elsewhere):
    """memory.log was opened for appending by its path, following any link."""
    plant(workspace / ".agent", elsewhere)
    mod.log_memory("extracted 1")
    assert list(elsewhere.iterdir()) == []
    (workspace / ".agent").unlink()
    mod.log_memory("extracted 2")
    assert "extracted 2" in (workspace / ".agent" / "memory.log").read_text()
