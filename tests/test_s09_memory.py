"""s09: project instructions, the sectioned system prompt, auto memory, the
consolidation lock and its confinement, sessions and resume.

Real git repositories, real files, real processes. The memory side calls are
off in the suite; a test marked memory turns them on and scripts each one:
a recall reply at a prompt when memory files exist, an extraction reply after
a turn. Extraction runs in a background thread: tests join it before asserting.
"""
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, chapters_from, message_bodies, run_chapter, run_turn
from fake_api import reply, tool

pytestmark = pytest.mark.parametrize("mod", chapters_from("s09"), indirect=True)


def git_init(path):
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    subprocess.run(["git", "-C", str(path), "symbolic-ref", "HEAD", "refs/heads/start"], check=True)


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def texts(content):
    return [b["text"] for b in ([{"type": "text", "text": content}] if isinstance(content, str) else content)
            if b.get("type") == "text"]


def main_bodies(api):
    """The loop's requests (streamed, with tools), not the memory side calls."""
    return [b for b in message_bodies(api) if b.get("tools")]


def side_bodies(api):
    return [b for b in message_bodies(api) if not b.get("tools")]


def op(name, type="project", description=None, body=None, kind="create"):
    return {"op": kind, "name": name, "type": type,
            "description": description or f"What {name} is about", "body": body or f"The body of {name}."}


def ops_reply(*ops):
    return reply(json.dumps({"operations": list(ops)}))


def names_reply(*names):
    return reply(json.dumps({"names": list(names)}))


def frontmatter(path):
    """(meta, body) of a memory file, parsed as YAML frontmatter."""
    text = path.read_text()
    assert text.startswith("---\n"), text
    head, body = text[4:].split("\n---\n", 1)
    return yaml.safe_load(head), body.strip()


def user_memory():
    return Path.home() / ".agent" / "memory"


def project_memory(workspace):
    return workspace / ".agent" / "memory"


def index_names(folder):
    text = (folder / "MEMORY.md").read_text() if (folder / "MEMORY.md").exists() else ""
    return [line.split("]", 1)[0].removeprefix("- [") for line in text.splitlines() if line.startswith("- [")]


def join_memory(mod):
    for job in mod.agent_state().memory["jobs"]:
        job.join(10)
        assert not job.is_alive(), "a memory job did not finish"


def prompt_turn(mod, api, client, history, prompt, steps):
    """One user turn with the memory side calls on: steps are every request it makes, in order."""
    api.add(*steps)
    mod.add_user_text(history, prompt)
    assert mod.agent_loop(client, history) == "end_turn"
    join_memory(mod)
    assert api.remaining() == 0 and api.exhausted == 0
    return history


def recording(mod):
    """A session file for the running agent, as main() starts one (drawn again on a
    name a session of this same second has: claim_session_file would, at its first write)."""
    state = mod.agent_state()
    state.record = mod.new_session(state)
    while state.record["path"].exists():
        state.record = mod.new_session(state)
    return state.record["path"]


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def fresh_agent(mod, workspace):
    """A new agent on the same workspace (a new process, as far as the state goes)."""
    state = mod.AgentState(workspace)
    state.mode = "bypassPermissions"
    state.permissions["sandbox"]["enabled"] = False
    return mod.acting_as(state)


def deny_rule(mod, text):
    return mod.parse_rule(text) | {"effect": "deny", "scope": "user", "file": "config.yaml"}


# --- project instructions ---

def instruction_tree(workspace):
    """git root -> sub -> sub/deeper (the working directory), plus ~/.agent/AGENTS.md."""
    git_init(workspace)
    sub, deeper = workspace / "sub", workspace / "sub" / "deeper"
    write(Path.home() / ".agent" / "AGENTS.md", "HOME-RULE\n")
    write(workspace / "AGENTS.md", "ROOT-AGENTS\n")
    write(workspace / "CLAUDE.md", "ROOT-CLAUDE\n")
    write(sub / "AGENTS.override.md", "SUB-OVERRIDE\n")
    write(sub / "AGENTS.md", "SUB-AGENTS\n")
    write(sub / "CLAUDE.md", "SUB-CLAUDE\n")
    write(deeper / "CLAUDE.md", "\n".join([
        "DEEPER-CLAUDE",
        "<!-- HIDDEN-COMMENT @comment.md -->",
        "Style: @a.md",
        "Outside: @../../../outside.md",
        "Secrets: @.env",
        "Chain: @d1.md",
        "Inline `see @span.md` stays as written.",
        "```",
        "@fenced.md",
        "```",
        "After the fence: @after.md",
    ]) + "\n")
    write(deeper / "a.md", "A-TEXT @b.md\n")
    write(deeper / "b.md", "B-TEXT @a.md\n")
    write(workspace.parent / "outside.md", "OUTSIDE-TEXT\n")   # outside the repository
    write(deeper / ".env", "SECRET=hunter2\n")
    for k in range(1, 8):
        write(deeper / f"d{k}.md", f"D{k}-TEXT @d{k + 1}.md\n")
    for name in ("span", "fenced", "comment", "after"):
        write(deeper / f"{name}.md", f"{name.upper()}-TEXT\n")
    return sub, deeper


def test_a_file_of_the_chain_that_another_includes_is_read_once(mod, workspace, monkeypatch):
    git_init(workspace)
    write(workspace / "AGENTS.md", "ROOT-ONCE\n")
    deeper = workspace / "pkg"
    write(deeper / "AGENTS.md", "Start from the root's rules: @../AGENTS.md\nPKG-OWN\n")
    monkeypatch.chdir(deeper)
    state = mod.agent_state()
    state.workdir = deeper.resolve()
    text = mod.load_instructions(state)
    assert text.count("ROOT-ONCE") == 1 and text.count("PKG-OWN") == 1
    assert "(@../AGENTS.md: read on its own, under its # From heading)" in text


def test_the_instruction_chain_one_file_per_folder_root_first_includes_guarded(mod, workspace, monkeypatch):
    sub, deeper = instruction_tree(workspace)
    monkeypatch.chdir(deeper)
    state = mod.agent_state()
    state.workdir = deeper.resolve()
    state.permissions["rules"] = [deny_rule(mod, "read_file(**/.env)")]
    text = mod.load_instructions(state)

    heads = [line.removeprefix("# From ") for line in text.splitlines() if line.startswith("# From ")]
    claude = mod.__name__ == "agent_full"  # full.3: a folder's CLAUDE.md is read beside its AGENTS file
    assert heads == [str(Path.home() / ".agent" / "AGENTS.md"), str(workspace.resolve() / "AGENTS.md"),
                     *[str(workspace.resolve() / "CLAUDE.md")] * claude, str(sub.resolve() / "AGENTS.override.md"),
                     *[str(sub.resolve() / "CLAUDE.md")] * claude, str(deeper.resolve() / "CLAUDE.md")]
    for kept in ("HOME-RULE", "ROOT-AGENTS", "SUB-OVERRIDE", "DEEPER-CLAUDE", *["ROOT-CLAUDE", "SUB-CLAUDE"] * claude):
        assert text.count(kept) == 1
    for shadowed in ("SUB-AGENTS", *["ROOT-CLAUDE", "SUB-CLAUDE"] * (not claude)):  # one file per folder
        assert shadowed not in text
    assert text.index("HOME-RULE") < text.index("ROOT-AGENTS") < text.index("SUB-OVERRIDE") \
        < text.index("DEEPER-CLAUDE")
    # a -> b -> a: both read once, the loop noted
    assert text.count("A-TEXT") == 1 and text.count("B-TEXT") == 1
    assert "(@a.md skipped: it includes itself)" in text
    # outside the workspace, and a denied .env: named, not read
    assert "OUTSIDE-TEXT" not in text and "(@../../../outside.md not read: outside the repository" in text
    assert "hunter2" not in text and "(@.env not read: it looks like a secret" in text
    # five levels of includes, then a note
    assert all(f"D{k}-TEXT" in text for k in range(1, 6))
    assert "D6-TEXT" not in text and "(@d6.md skipped: includes go 5 levels deep at most)" in text
    # code is left alone; comments go
    assert "`see @span.md` stays as written" in text and "SPAN-TEXT" not in text
    assert "\n@fenced.md\n" in text and "FENCED-TEXT" not in text
    assert "AFTER-TEXT" in text  # the fence closed again
    assert "HIDDEN-COMMENT" not in text and "COMMENT-TEXT" not in text


def test_a_secret_looking_include_is_never_read_rule_or_not(mod, workspace):
    """It used to take a read-deny rule to stop `@conf/.env`: an instruction file sent the
    repository's secrets to the model unless the human had thought to deny them."""
    write(workspace / "conf" / ".env", "SECRET=hunter2\n")  # not the .env the agent's own key may be in
    write(workspace / "conf" / "deploy.pem", "PRIVATE-KEY-TEXT\n")
    write(workspace / "conf" / ".env.example", "SECRET=<yours>\n")
    write(workspace / "AGENTS.md", "Secrets: @conf/.env @conf/deploy.pem, a template: @conf/.env.example\n")
    text = mod.load_instructions(mod.agent_state())
    assert "hunter2" not in text and "PRIVATE-KEY-TEXT" not in text and "SECRET=<yours>" in text
    assert text.count("it looks like a secret") == 2
    mod.agent_state().permissions["rules"] = [deny_rule(mod, "read_file(**/.env.example)")]
    assert "SECRET=<yours>" not in mod.load_instructions(mod.agent_state())   # a rule still denies more


def test_instructions_over_the_cap_are_cut_with_a_note_naming_what_was_cut(mod, workspace):
    git_init(workspace)
    big = write(workspace / "sub" / "AGENTS.md", "".join(f"line {n:05} of a long file\n" for n in range(2_000)))
    write(workspace / "AGENTS.md", "ROOT-RULE\n")
    write(workspace / "sub" / "deeper" / "AGENTS.md", "DEEPER-RULE\n")
    state = mod.agent_state()
    state.workdir = (workspace / "sub" / "deeper").resolve()
    text = mod.load_instructions(state)
    body, note = text.rsplit("\n\n", 1)
    assert len(body.encode()) <= mod.INSTRUCTIONS_CAP
    assert "ROOT-RULE" in body and "line 00000" in body and "DEEPER-RULE" not in text
    assert note.startswith("[instructions cut: ") and f"from {big.resolve()} on]" in note
    total = int(note.split(" of ")[1].split()[0])
    assert total > mod.INSTRUCTIONS_CAP and f"{total - mod.INSTRUCTIONS_CAP} of {total} bytes" in note


def test_instructions_reach_the_first_request_as_a_reminder_in_the_first_user_message(mod, api, client,
                                                                                      workspace):
    git_init(workspace)
    write(workspace / "AGENTS.md", "Use tabs, not spaces. RULE-MARK\n")
    run_turn(mod, api, client, [], prompt="write a script")
    body = message_bodies(api)[0]
    first = body["messages"][0]
    assert first["role"] == "user"
    assert first["content"][0]["type"] == "text"
    reminder = first["content"][0]["text"]
    assert reminder.startswith("<system-reminder>") and reminder.rstrip().endswith("</system-reminder>")
    assert "RULE-MARK" in reminder and f"# From {workspace.resolve() / 'AGENTS.md'}" in reminder
    assert texts(first["content"])[-1] == "write a script"
    assert "RULE-MARK" not in json.dumps(body["system"])


# --- the system prompt ---

def test_the_system_prompt_is_byte_identical_for_ten_turns_and_sectioned_in_order(mod, api, client, workspace):
    git_init(workspace)
    write(workspace / "AGENTS.md", "RULE-MARK\n")
    history = []
    for k in range(10):
        api.add(reply(tool("bash", {"command": f"echo {k} > f{k}.txt"})),
                reply(tool("read_file", {"path": f"f{k}.txt"})), reply(f"done {k}"))
        mod.add_user_text(history, f"turn {k}")
        assert mod.agent_loop(client, history) == "end_turn"
        # what could leak into a prompt built per turn: the branch, the instructions, the files
        subprocess.run(["git", "-C", str(workspace), "symbolic-ref", "HEAD", f"refs/heads/b{k}"], check=True)
        write(workspace / "AGENTS.md", f"RULE-MARK changed {k}\n")
    assert api.remaining() == 0 and api.exhausted == 0
    systems = [json.dumps(b["system"]) for b in message_bodies(api)]
    assert len(systems) == 30 and len(set(systems)) == 1
    system = message_bodies(api)[0]["system"][0]["text"]
    assert "Git: branch start" in system and "RULE-MARK" not in system
    names = [name for name, _ in mod.prompt_sections(mod.agent_state())]
    assert names == ["identity", "rules", "tools", "environment", "skills"]
    marks = [mod.SYSTEM, mod.PROMPT_RULES, mod.PROMPT_TOOLS, "Environment at session start", "Skills ("]
    where = [system.index(m) for m in marks]
    assert where == sorted(where) and where[0] == 0


# --- auto memory ---

@pytest.mark.memory
def test_extraction_writes_memory_files_with_frontmatter_in_the_right_folders(mod, api, client, workspace):
    recording(mod)
    ops = [op("prefers-pytest", "user", "Prefers pytest over unittest"),
           op("no-emoji", "feedback", "No emoji in commit messages",
              "No emoji.\n**Why:** the changelog tool chokes.\n**How to apply:** plain text."),
           op("deploy-friday", "project", "Deploys happen on Fridays"),
           op("grafana-board", "reference", "Latency graphs are on the ops Grafana board")]
    prompt_turn(mod, api, client, [], "I prefer pytest; deploys are on Fridays",
                [reply("Noted."), ops_reply(*ops)])
    extraction = side_bodies(api)[0]
    assert extraction["system"] == mod.EXTRACT_SYSTEM
    assert "I prefer pytest; deploys are on Fridays" in extraction["messages"][0]["content"]
    where = {"user": user_memory(), "feedback": user_memory(),
             "project": project_memory(workspace), "reference": project_memory(workspace)}
    for o in ops:
        meta, body = frontmatter(where[o["type"]] / f"{o['name']}.md")
        assert meta == {"name": o["name"], "description": o["description"], "type": o["type"]}
        assert body == o["body"]
    assert index_names(user_memory()) == ["no-emoji", "prefers-pytest"]
    assert index_names(project_memory(workspace)) == ["deploy-friday", "grafana-board"]
    assert not list(user_memory().glob("deploy-friday.md"))


@pytest.mark.memory
def test_a_second_create_with_the_same_name_or_meaning_is_not_made_twice(mod, api, client, workspace):
    history = prompt_turn(mod, api, client, [], "remember this",
                          [reply("Noted."), ops_reply(op("prefers-pytest", "user", "Prefers pytest over unittest."))])
    original = (user_memory() / "prefers-pytest.md").read_text()
    prompt_turn(mod, api, client, history, "and again", [
        names_reply(), reply("Noted."),
        ops_reply(op("prefers-pytest", "user", "Something else entirely", "Other body."),  # same name
                  op("pytest-over-unittest", "user", "prefers PYTEST, over unittest"),  # same meaning
                  op("tabs-not-spaces", "user", "Indents with tabs"))])  # new
    assert (user_memory() / "prefers-pytest.md").read_text() == original
    assert sorted(p.stem for p in user_memory().glob("*.md")) == ["MEMORY", "prefers-pytest", "tabs-not-spaces"]
    assert index_names(user_memory()) == ["prefers-pytest", "tabs-not-spaces"]


@pytest.mark.memory
def test_descriptions_that_differ_in_a_word_are_different_memories(mod, api, client, workspace):
    prompt_turn(mod, api, client, [], "note the ports", [reply("Noted."), ops_reply(
        op("service-a-port", description="Service A listens on port 8080"),
        op("service-b-port", description="Service B listens on port 8080"))])
    assert index_names(project_memory(workspace)) == ["service-a-port", "service-b-port"]


def test_a_huge_memory_file_is_not_read_whole(mod, workspace):
    import tracemalloc
    folder = project_memory(workspace)
    mod.write_memory(op("small-one"), mod.agent_state())
    with open(folder / "huge.md", "w") as fh:  # a cloned repository's .agent/memory may hold anything
        fh.write("---\nname: huge\ndescription: big\ntype: project\n---\n\n")
        fh.truncate(50_000_000)
    tracemalloc.start()
    try:
        found = mod.read_memories(mod.agent_state())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sorted(m["name"] for m in found) == ["huge", "small-one"]
    assert peak < 5_000_000


def snapshot(*folders):
    return {p: p.read_bytes() for f in folders for p in sorted(f.rglob("*")) if p.is_file()}


@pytest.mark.memory
@pytest.mark.parametrize("garbage", ["Nothing to remember, I think.", '{"operations": [{"op": "create", "name"'])
def test_a_bad_extraction_reply_changes_nothing_and_is_logged(mod, api, client, workspace, garbage):
    recording(mod)
    state = mod.agent_state()
    mod.apply_operations([op("deploy-friday"), op("prefers-pytest", "user")], state)
    before = snapshot(user_memory(), project_memory(workspace))
    prompt_turn(mod, api, client, [], "hello", [names_reply(), reply("Hi."), reply(garbage)])
    assert snapshot(user_memory(), project_memory(workspace)) == before
    log = (workspace / ".agent" / "memory.log").read_text()
    assert "extraction reply ignored" in log


@pytest.mark.memory
def test_invalid_operations_are_ignored_and_the_valid_one_applies(mod, api, client, workspace, tmp_path):
    recording(mod)
    bad = [op("../x"), op("Bad_Name"), op("ok-name", "bogus"), op("no-body") | {"body": ""},
           op("renamed", kind="rename"), op("x" * 65), "not even a dict"]
    prompt_turn(mod, api, client, [], "hello", [reply("Hi."), ops_reply(*bad, op("good-one"))])
    assert sorted(p.name for p in project_memory(workspace).iterdir()) == [".gitignore", "MEMORY.md", "good-one.md"]
    assert not user_memory().exists()
    assert not [p for p in tmp_path.rglob("x.md")]
    assert index_names(project_memory(workspace)) == ["good-one"]
    log = (workspace / ".agent" / "memory.log").read_text()
    assert log.count("operation ignored") == len(bad)


@pytest.mark.parametrize("description", ["short", "a long description " * 8])
def test_the_index_cap_holds_with_a_more_line(mod, workspace, description):
    state = mod.agent_state()
    for n in range(250):
        mod.write_memory(op(f"memory-{n:03}", description=f"{description} {n}"), state)
    folder = project_memory(workspace)
    mod.write_index(folder)
    raw = (folder / "MEMORY.md").read_bytes()
    lines = raw.decode().splitlines()
    assert len(lines) <= mod.INDEX_LINES and len(raw) <= mod.INDEX_BYTES
    assert lines[-1].startswith("- ... ") and "more in" in lines[-1]
    assert int(lines[-1].split()[2]) + len(lines) - 1 == 250  # every memory is indexed or counted
    assert len(lines) > 100  # the cap, not something smaller, stopped it
    shown = mod.memory_index(state)
    assert len(shown.encode()) <= mod.INDEX_BYTES + 200 and "more in" in shown


@pytest.mark.parametrize("width", [60, 300])  # many short lines (the line cap), long ones (the byte cap)
def test_a_cloned_memory_index_of_any_size_is_read_within_the_cap(mod, workspace, width):
    folder = project_memory(workspace)
    folder.mkdir(parents=True)
    with open(folder / "MEMORY.md", "w") as fh:  # a cloned repository's index, never written by the agent
        fh.write("".join(f"- [cloned-{n}](cloned-{n}.md) (project): ".ljust(width - 1, "x") + "\n"
                         for n in range(20_000)))
    shown = mod.memory_index(mod.agent_state())
    assert "cloned-0" in shown
    assert len(shown.splitlines()) <= mod.INDEX_LINES + 1 and len(shown.encode()) <= mod.INDEX_BYTES + 200


@pytest.mark.memory
def test_a_slow_extraction_does_not_delay_the_next_prompt(mod, api, client, workspace):
    arrived, release = threading.Event(), threading.Event()

    def slow_extraction(body):
        arrived.set()
        release.wait(20)
        return ops_reply(op("late-memory"))

    try:
        history = [{"role": "user", "content": "first"}]
        api.add(reply("One."), slow_extraction)
        assert mod.agent_loop(client, history) == "end_turn"
        job = mod.agent_state().memory["jobs"][0]
        assert job.is_alive()  # the turn returned while its extraction still waits for the model
        assert arrived.wait(10)  # its request took its scripted step: the next one is the loop's
        mod.add_user_text(history, "second")
        api.add(reply("Two."), ops_reply())
        assert mod.agent_loop(client, history) == "end_turn"  # not held up by the first extraction
        assert job.is_alive() and not (project_memory(workspace) / "late-memory.md").exists()
    finally:
        release.set()
    join_memory(mod)
    assert (project_memory(workspace) / "late-memory.md").exists()
    assert api.remaining() == 0 and api.exhausted == 0


@pytest.mark.memory
def test_update_and_delete_work_and_an_update_to_another_type_moves_the_file(mod, api, client, workspace):
    history = prompt_turn(mod, api, client, [], "remember things", [reply("Noted."), ops_reply(
        op("deploy-friday", description="Deploys happen on Fridays"), op("old-fact"),
        op("ci-runner", "user", "CI runs on my laptop"))])
    prompt_turn(mod, api, client, history, "actually", [names_reply(), reply("Noted."), ops_reply(
        op("deploy-friday", description="Deploys happen on Thursdays", body="Thursdays now.", kind="update"),
        {"op": "delete", "name": "old-fact"},
        op("ci-runner", "project", "CI runs on the build server", kind="update"))])
    project = project_memory(workspace)
    meta, body = frontmatter(project / "deploy-friday.md")
    assert meta["description"] == "Deploys happen on Thursdays" and body == "Thursdays now."
    assert not (project / "old-fact.md").exists()
    assert not (user_memory() / "ci-runner.md").exists() and (project / "ci-runner.md").exists()
    assert index_names(project) == ["ci-runner", "deploy-friday"]
    assert index_names(user_memory()) == []


def test_memory_lists_and_forget_deletes_the_file_and_its_index_line(mod, workspace, capsys):
    state = mod.agent_state()
    mod.apply_operations([op("deploy-friday", description="Deploys happen on Fridays"),
                          op("prefers-pytest", "user", "Prefers pytest")], state)
    ctx = {"client": None, "history": []}
    assert mod.handle_slash("/memory", ctx) is None
    out = capsys.readouterr().out
    assert "deploy-friday" in out and "Deploys happen on Fridays" in out and "project" in out
    assert "prefers-pytest" in out and str(user_memory() / "prefers-pytest.md") in out
    mod.handle_slash("/forget deploy-friday", ctx)
    assert "error" not in ctx
    assert not (project_memory(workspace) / "deploy-friday.md").exists()
    assert "deploy-friday" not in (project_memory(workspace) / "MEMORY.md").read_text()
    assert (user_memory() / "prefers-pytest.md").exists()
    mod.handle_slash("/forget deploy-friday", ctx)
    assert "no memory named 'deploy-friday'" in ctx["error"]


def memory_reminder(body):
    """The recalled-memories reminder on the request's last user message, or None."""
    found = [t for t in texts(body["messages"][-1]["content"]) if t.startswith("<system-reminder>\nMemories")]
    return found[0] if found else None


@pytest.mark.memory
def test_recall_attaches_at_most_five_memories_once_each(mod, api, client, workspace):
    state = mod.agent_state()
    topics = ["release dates", "the build cache", "code review", "the CI matrix", "flaky tests",
              "the changelog", "version tags"]
    mod.apply_operations([op(f"m{k}", description=f"How we handle {topics[k - 1]}", body=f"BODY-{k}")
                          for k in range(1, 8)], state)
    history = prompt_turn(mod, api, client, [], "plan the release", [
        names_reply("m7", "m6", "m5", "m4", "m3", "m2", "m1"), reply("Planned."), ops_reply()])
    recall = side_bodies(api)[0]
    assert recall["system"] == mod.RECALL_SYSTEM
    assert "The request:\nplan the release" in recall["messages"][0]["content"]
    assert all(f"- m{k} (project)" in recall["messages"][0]["content"] for k in range(1, 8))
    shown = memory_reminder(main_bodies(api)[0])
    assert [k for k in range(1, 8) if f"## m{k} " in shown] == [3, 4, 5, 6, 7]
    assert "BODY-7" in shown and "BODY-2" not in shown
    api.reset()
    prompt_turn(mod, api, client, history, "next", [names_reply("m7", "m2"), reply("Ok."), ops_reply()])
    listing = side_bodies(api)[0]["messages"][0]["content"]
    assert "- m7 " not in listing and "- m2 " in listing  # attached ones are not offered again
    shown = memory_reminder(main_bodies(api)[0])
    assert "## m2 " in shown and "## m7 " not in shown


@pytest.mark.memory
def test_a_garbage_recall_reply_falls_back_to_keywords(mod, api, client, workspace):
    recording(mod)
    state = mod.agent_state()
    mod.apply_operations([op("pytest-preference", "user", "Run the tests with pytest, not unittest"),
                          op("deploy-window", description="Deploys happen on Fridays only"),
                          op("grafana-board", "reference", "Latency graphs live on Grafana")], state)
    prompt_turn(mod, api, client, [], "please run the pytest suite",
                [reply("I cannot tell, sorry."), reply("Ran it."), ops_reply()])
    shown = memory_reminder(main_bodies(api)[0])
    assert "## pytest-preference " in shown
    assert "deploy-window" not in shown and "grafana-board" not in shown
    assert "recall fell back to keywords" in (workspace / ".agent" / "memory.log").read_text()


@pytest.mark.memory
@pytest.mark.parametrize("how", ["environment", "config"])
def test_auto_memory_off_stops_every_side_call(mod, api, client, workspace, monkeypatch, how):
    state = mod.agent_state()
    mod.apply_operations([op("deploy-friday", description="Deploys happen on Fridays")], state)
    if how == "environment":
        monkeypatch.setenv("AGENT_AUTO_MEMORY", "0")
    else:
        write(workspace / ".agent" / "config.yaml", "memory:\n  auto: false\n")
        state.permissions = mod.load_permissions(workspace)
        state.permissions["sandbox"]["enabled"] = False
    history = run_turn(mod, api, client, [], prompt="when do deploys happen?")
    assert len(message_bodies(api)) == 1 and not side_bodies(api)
    assert state.memory["jobs"] == [] and memory_reminder(main_bodies(api)[0]) is None
    assert len(history) == 2


def test_a_memory_config_must_be_auto_true_or_false(mod, workspace):
    write(workspace / ".agent" / "config.yaml", "memory:\n  auto: nope\n")
    with pytest.raises(mod.ConfigError, match="memory must be a mapping"):
        mod.load_permissions(workspace)


# --- consolidation: the lock, the gates, the confinement ---

RACER = """
import importlib, os, sys, time, types
from pathlib import Path
sys.path.insert(0, sys.argv[1])
sys.modules["anthropic"] = types.ModuleType("anthropic")  # take_lock needs no SDK: a second saved
mod = importlib.import_module(sys.argv[2])
folder, rounds = Path(sys.argv[3]), int(sys.argv[4])
read = os.read
def slow_read(fd, n):  # widen the gap between looking at the lock and taking it
    data = read(fd, n)
    time.sleep(0.05)
    return data
os.read = slow_read
print("ready", flush=True)
for k in range(rounds):
    while not (folder / f"go{k}").exists():
        time.sleep(0.0005)
    print("won" if mod.take_lock(folder / f"lock{k}") is not False else "lost", flush=True)
    while not (folder / f"done{k}").exists():
        time.sleep(0.0005)
"""


def test_of_two_processes_taking_the_lock_exactly_one_wins(mod, tmp_path):
    rounds = 3
    procs = [subprocess.Popen([sys.executable, "-c", RACER, str(ROOT), mod.__name__, str(tmp_path), str(rounds)],
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        assert [p.stdout.readline().strip() for p in procs] == ["ready", "ready"]
        for k in range(rounds):
            (tmp_path / f"go{k}").touch()
            said = [p.stdout.readline().strip() for p in procs]
            assert sorted(said) == ["lost", "won"], f"round {k}: {said}"
            winner = procs[said.index("won")]
            assert (tmp_path / f"lock{k}").read_text() == str(winner.pid)
            (tmp_path / f"done{k}").touch()
        assert [p.wait(10) for p in procs] == [0, 0]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_stale_lock_is_taken_over_and_a_live_fresh_one_is_not(mod, tmp_path):
    lock = tmp_path / "memory" / ".consolidate-lock"
    assert mod.take_lock(lock) is None and lock.read_text() == str(os.getpid())  # no lock before
    dead = subprocess.Popen(["true"])
    dead.wait()
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        for pid, age, taken in [(dead.pid, 60, True), (sleeper.pid, 2 * 3600, True), (sleeper.pid, 60, False)]:
            lock.write_text(str(pid))
            then = time.time() - age
            os.utime(lock, (then, then))
            got = mod.take_lock(lock)
            if taken:
                assert got == pytest.approx(then) and lock.read_text() == str(os.getpid())
                assert lock.stat().st_mtime > then + age - 60  # the new run's start
            else:
                assert got is False and lock.read_text() == str(pid)
                assert lock.stat().st_mtime == pytest.approx(then)
    finally:
        sleeper.kill()
        sleeper.wait()


def dream_ready(mod, workspace, sessions=5, age=0):
    """Memories, `sessions` session files `age` seconds old, no lock: every gate open."""
    state = mod.agent_state()
    mod.apply_operations([op("deploy-friday")], state)
    for k in range(sessions):
        path = own_session(mod, workspace / ".agent" / "sessions" / f"20260101-00000{k}-abcd.jsonl")
        then = time.time() - age
        os.utime(path, (then, then))
    return state


def own_session(mod, path, text="{}\n"):
    """A session file as if this user's agent had started it (recorded in ~/.agent/sessions.txt)."""
    write(path, text)
    mod.register_session(mod.agent_state(), path)
    return path


def test_dream_due_opens_only_when_every_gate_is_met(mod, workspace):
    state = dream_ready(mod, workspace)
    assert mod.dream_due(state)
    assert not mod.dream_due(state)  # a look in the last 10 minutes (this process): no second look
    state.memory["scanned"] = time.time() - mod.DREAM_SCAN_EVERY - 1
    assert mod.dream_due(state)
    lock = mod.lock_path(state)
    write(lock, "1")
    for age_hours, due in [(1, False), (23, False), (25, True)]:
        then = time.time() - age_hours * 3600
        os.utime(lock, (then, then))
        state.memory["scanned"] = 0
        assert mod.dream_due(state) is due, f"lock {age_hours} h old"


def test_dream_due_needs_five_sessions_since_the_last_run_and_some_memory(mod, workspace):
    state = dream_ready(mod, workspace, sessions=4)
    assert not mod.dream_due(state)
    state.memory["scanned"] = 0
    write(workspace / ".agent" / "sessions" / "20260101-000008-abcd.jsonl", "{}\n")  # shipped by a clone
    assert not mod.dream_due(state)                                                   # does not count
    state.memory["scanned"] = 0
    own_session(mod, workspace / ".agent" / "sessions" / "20260101-000009-abcd.jsonl")
    assert mod.dream_due(state)
    lock = mod.lock_path(state)  # the five sessions are older than the last run: they do not count
    write(lock, "1")
    for path in (workspace / ".agent" / "sessions").iterdir():
        os.utime(path, (time.time() - 30 * 3600,) * 2)
    os.utime(lock, (time.time() - 25 * 3600,) * 2)
    state.memory["scanned"] = 0
    assert not mod.dream_due(state)
    for path in project_memory(workspace).glob("*.md"):
        path.unlink()
    os.utime(lock, (time.time() - 40 * 3600,) * 2)
    state.memory["scanned"] = 0
    assert not mod.dream_due(state)  # nothing to consolidate


@pytest.mark.parametrize("outcome", ["api_error", "raises", "end_turn"])
def test_a_failed_consolidation_puts_the_old_mtime_back(mod, workspace, monkeypatch, outcome):
    state = dream_ready(mod, workspace)
    lock = mod.lock_path(state)
    write(lock, "999999999")
    then = time.time() - 3 * 24 * 3600
    os.utime(lock, (then, then))
    before = mod.take_lock(lock)
    assert before == pytest.approx(then)

    def run_child(client, history, child, settings):
        if outcome == "raises":
            raise RuntimeError("the child broke")
        return outcome

    monkeypatch.setattr(mod, "run_child", run_child)
    mod.consolidate(state, before)
    if outcome == "end_turn":
        assert lock.stat().st_mtime > then + 24 * 3600  # done: the 24 h gate counts from this run
    else:
        assert lock.stat().st_mtime == pytest.approx(then)  # failed: the next session may try again
    assert f"consolidation {'done' if outcome == 'end_turn' else 'failed'}" in \
        (workspace / ".agent" / "memory.log").read_text()


def test_a_failed_first_consolidation_leaves_the_gates_open(mod, workspace, monkeypatch):
    state = dream_ready(mod, workspace)
    before = mod.take_lock(mod.lock_path(state))
    assert before is None  # there was no lock
    monkeypatch.setattr(mod, "run_child", lambda *a: "api_error")
    mod.consolidate(state, before)
    state.memory["scanned"] = 0
    assert mod.dream_due(state)


def test_the_consolidator_writes_only_in_the_memory_folders_and_has_no_unsandboxed_bash(mod, workspace,
                                                                                        monkeypatch):
    state = dream_ready(mod, workspace)
    seen = []
    monkeypatch.setattr(mod, "run_child", lambda client, history, child, settings:
                        seen.append((child, settings)) or "end_turn")
    mod.consolidate(state, None)
    child, settings = seen[0]
    assert child.write_roots == [user_memory().resolve(), project_memory(workspace).resolve()]
    assert sorted(t["name"] for t in settings["tools"]) == \
        ["bash", "edit_file", "glob", "grep", "read_file", "write_file"]
    with mod.acting_as(child):
        assert mod.decide("write_file", {"path": ".agent/sessions/x.jsonl", "content": "x"}, child)[0] == "deny"
        for path in ("src.py", "../elsewhere.md", ".agent/notes.md", str(Path.home() / "notes.md")):
            effect, layer, why = mod.decide("write_file", {"path": path, "content": "x"}, child)
            assert (effect, layer) == ("deny", "memory folders only"), path
            effect, layer, why = mod.decide("edit_file", {"path": path, "old_string": "a", "new_string": "b"}, child)
            assert (effect, layer) == ("deny", "memory folders only"), path
        for path in (".agent/memory/merged.md", str(user_memory() / "merged.md")):
            assert mod.decide("write_file", {"path": path, "content": "x"}, child)[0] == "allow", path
        assert mod.decide("read_file", {"path": "src.py"}, child)[0] == "allow"
        assert not child.permissions["sandbox"]["enabled"]
        assert mod.decide("bash", {"command": "ls"}, child)[:2] == ("deny", "memory folders only")


def test_the_consolidators_sandboxed_bash_cannot_write_the_workspace(mod, workspace, monkeypatch):
    ok, why = mod.sandbox_available()
    if not ok:
        pytest.skip(f"the OS sandbox does not work here: {why}")
    state = dream_ready(mod, workspace)
    seen = []
    monkeypatch.setattr(mod, "run_child", lambda client, history, child, settings: seen.append(child) or "end_turn")
    mod.consolidate(state, None)
    child = seen[0]
    child.permissions = dict(child.permissions, sandbox=dict(child.permissions["sandbox"], enabled=True))
    with mod.acting_as(child):
        assert mod.decide("bash", {"command": "touch made.txt"}, child)[1] != "memory folders only"
        mod.run_bash("touch made.txt; touch .agent/memory/made.md")
    assert not (workspace / "made.txt").exists() and not (project_memory(workspace) / "made.md").exists()
    with mod.acting_as(mod.AgentState(workspace)) as plain:  # the same command for an ordinary agent
        plain.permissions["sandbox"]["enabled"] = True
        mod.run_bash("touch made.txt")
    assert (workspace / "made.txt").exists()


# --- sessions ---

def test_one_record_per_message_and_the_reply_is_on_disk_before_its_tools_run(mod, api, client, workspace):
    path = recording(mod)
    history = run_turn(mod, api, client, [reply(tool("bash", {"command": "cat .agent/sessions/*.jsonl"},
                                                     id="toolu_01seen"))])
    seen = main_bodies(api)[1]["messages"][-1]["content"]
    result = next(b for b in seen if b["type"] == "tool_result")
    assert '"id": "toolu_01seen"' in result["content"]  # the tool read its own call
    recs = records(path)
    assert recs[0]["type"] == "mode" and all("ts" in r for r in recs)
    assert [r["i"] for r in recs if r["type"] == "message"] == [0, 1, 2, 3]
    assert not any('"_' in json.dumps(r["message"]) for r in recs if r["type"] == "message")  # marks apart
    assert mod.read_session(path)[0] == history and len(history) == 4  # the marks as well


def test_a_compaction_writes_a_boundary_and_resume_loads_only_what_follows(mod, api, client, workspace):
    path = recording(mod)
    history = []
    for k in range(4):
        api.add(reply(f"answer {k}"))
        mod.add_user_text(history, f"question {k}")
        mod.agent_loop(client, history)
    api.add(reply("<summary>THE-SUMMARY</summary>"))
    assert mod.compact(client, history, why="requested")
    lines = path.read_text().splitlines(keepends=True)
    kinds = [json.loads(line)["type"] for line in lines]
    assert kinds.count("boundary") == 1
    cut = write(workspace / "cut.jsonl", "".join(lines[:kinds.index("boundary") + 1]))
    before = mod.read_session(cut)[0]  # a boundary whose messages never came: the old history holds
    assert "question 0" in json.dumps(before) and "THE-SUMMARY" not in json.dumps(before)
    loaded = mod.read_session(path)[0]
    assert loaded == history and "THE-SUMMARY" in json.dumps(loaded[0])
    assert "question 0" not in json.dumps(loaded)
    api.add(reply("answer 4"))
    mod.add_user_text(history, "question 4")
    mod.agent_loop(client, history)
    assert mod.read_session(path)[0] == history
    assert api.exhausted == 0


def test_malformed_lines_are_skipped_and_a_torn_last_line_costs_only_itself(mod, api, client, workspace):
    path = recording(mod)
    history = run_turn(mod, api, client, [], prompt="first")
    with open(path, "a") as fh:
        fh.write("not json\n")
        fh.write(json.dumps({"type": "message", "i": 0, "message": {"role": "user", "content": "x"}}) + "\n")  # no ts
        fh.write(json.dumps({"type": "message", "i": 99, "ts": 1, "message": {"role": "user", "content": "x"}}) + "\n")
        fh.write(json.dumps({"type": "message", "i": 1, "ts": 1, "message": {"role": "robot"}}) + "\n")
        fh.write('{"type": "message", "i": 2, "ts": 17')  # a crash mid-write
    messages, mode, last_ts, bad, _ = mod.read_session(path)
    assert messages == history and bad == 5
    with fresh_agent(mod, workspace):
        resumed = mod.resume(None, path)
        assert resumed == history
        api.reset()
        mod.add_user_text(resumed, "second")
        api.add(reply("again"))
        assert mod.agent_loop(client, resumed) == "end_turn"
    assert mod.read_session(path)[0] == resumed and len(resumed) == 4


def call(id, name="read_file"):
    return {"type": "tool_use", "id": id, "name": name, "input": {"path": "a.txt"}}


def result(id):
    return {"type": "tool_result", "tool_use_id": id, "content": "ok"}


def test_complete_prefix_cuts_an_unanswered_call_and_a_result_without_its_call(mod):
    done = [{"role": "user", "content": "go"},
            {"role": "assistant", "content": [call("toolu_1")]},
            {"role": "user", "content": [result("toolu_1")]},
            {"role": "assistant", "content": [{"type": "text", "text": "done"}]}]
    assert mod.complete_prefix(done) == done
    assert mod.complete_prefix(done[:2]) == done[:1]  # the crash came while the tool ran
    half = [done[0], {"role": "assistant", "content": [call("toolu_1"), call("toolu_2")]}, done[2]]
    assert mod.complete_prefix(half) == done[:1]  # one of two calls answered
    stray = done[:1] + [{"role": "assistant", "content": [{"type": "text", "text": "hm"}]},
                        {"role": "user", "content": [result("toolu_9")]}]
    assert mod.complete_prefix(stray) == done[:1]
    twice = done + [{"role": "assistant", "content": [{"type": "text", "text": "again"}]}]
    assert mod.complete_prefix(twice) == done


def test_resuming_a_session_cut_mid_tool_sends_a_valid_request(mod, api, client, workspace):
    path = recording(mod)
    history = [{"role": "user", "content": "go"}, {"role": "assistant", "content": [call("toolu_01a")]}]
    mod.sync_session(history)
    with fresh_agent(mod, workspace):
        resumed = mod.resume(None, path)
        assert resumed == history[:1]
        mod.add_user_text(resumed, "go on")
        api.add(reply("ok"))
        assert mod.agent_loop(client, resumed) == "end_turn"
    sent = message_bodies(api)[0]["messages"]
    assert "toolu_01a" not in json.dumps(sent) and texts(sent[0]["content"]) == ["go", "go on"]


def session_files(workspace):
    return sorted((workspace / ".agent" / "sessions").glob("*.jsonl"), key=lambda p: p.stat().st_mtime)


def sent_texts(body):
    return [t for m in body["messages"] for t in texts(m["content"])]


@pytest.mark.e2e("s09")
def test_continue_brings_back_the_history_in_a_new_process(mod, api, workspace):
    api.script([reply("first answer")])
    r = run_chapter(mod.__name__, "the first prompt", api=api, cwd=workspace)
    assert r.returncode == 0, r.stderr
    [first] = session_files(workspace)
    api.script([reply("second answer")])
    r = run_chapter(mod.__name__, "--continue", "next", api=api, cwd=workspace)
    assert r.returncode == 0, r.stderr
    assert sent_texts(message_bodies(api)[1]) == ["the first prompt", "first answer", "next"]
    assert session_files(workspace) == [first]  # the same file goes on
    assert [m["role"] for m in mod.read_session(first)[0]] == ["user", "assistant"] * 2
    assert api.exhausted == 0  # and the api fixture checks that both requests were valid


@pytest.mark.e2e("s09")
@pytest.mark.permissions
@pytest.mark.parametrize("first_mode", ["plan", "default"])
def test_a_resumed_plan_mode_session_keeps_its_plan_file_and_is_told_once(mod, api, workspace, first_mode):
    """The plan file was named per process: after --continue the reminder named a new,
    empty file and the plan was orphaned. It is the session's now. A history that holds
    the reminder gets nothing new; one that lacks it (started in default) gets it once."""
    from test_s07_permissions import PLAN_PATH, write_the_named_plan
    env = {"HOME": str(workspace.parent / "home"), "AGENT_PERMISSION_MODE": first_mode}
    api.script([write_the_named_plan, reply("Planned.")] if first_mode == "plan" else [reply("Hello.")])
    r = run_chapter(mod.__name__, "plan the change", api=api, cwd=workspace, env=env)
    assert r.returncode == 0, r.stderr
    api.script([reply("Going on.")])
    r = run_chapter(mod.__name__, "--permission-mode", "plan", "--continue", "go on", api=api,
                    cwd=workspace, env=env)
    assert r.returncode == 0, r.stderr
    body = json.dumps(message_bodies(api)[-1])
    [named] = PLAN_PATH.findall(body)                                 # told once, in either case
    [session] = (workspace / ".agent" / "sessions").glob("*.jsonl")
    assert named == f".agent/plans/{session.stem}.md"                 # the session's plan file
    if first_mode == "plan":
        assert (workspace / named).read_text() == "# Plan\n1. edit app.py"   # the plan is still there
    else:
        last = message_bodies(api)[-1]["messages"][-1]["content"]
        assert [b["text"][:40] for b in last][-2:] == ["<system-reminder>\nPlan mode is active. Y", "go on"]


@pytest.mark.permissions
def test_the_plan_file_the_reminder_names_survives_a_redrawn_session_name(mod, workspace):
    """Review: the reminder named the plan file before the first write claimed the session's
    name; a teammate of the same second holding that name made the claim draw again, and
    the named file stopped being the plan file."""
    state = mod.agent_state()
    state.record = mod.new_session(state)
    taken = state.record["path"]
    taken.parent.mkdir(parents=True, exist_ok=True)
    taken.write_text("")                                             # the other process's
    state.mode = "plan"
    history = [{"role": "user", "content": "plan it"}]
    mod.announce_plan_mode(history)
    named = history[0]["content"][0]["text"].split("plan file: ")[1].split("\n")[0]
    assert state.record["path"] != taken and named == f".agent/plans/{state.record['path'].stem}.md"
    assert mod.is_plan_file((workspace / named).resolve(), state)


def run_main(mod, api, monkeypatch, *argv):
    """main() in this process, as `python sNN_x.py ARGV` would run it."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
    monkeypatch.setenv("AGENT_PERMISSION_MODE", "bypassPermissions")
    return mod.main(list(argv))


def test_resume_id_picks_that_session_and_a_bad_id_is_one_line(mod, api, client, workspace, monkeypatch,
                                                              capsys):
    first = recording(mod)
    run_turn(mod, api, client, [], prompt="the first session")
    second = recording(mod)
    run_turn(mod, api, client, [], prompt="the second session")
    os.utime(first, (time.time() - 60,) * 2)  # the second is the newest
    api.reset()
    api.add(reply("more"))
    assert run_main(mod, api, monkeypatch, "--continue", "go on") == 0
    assert sent_texts(message_bodies(api)[0]) == ["the second session", "Finished.", "go on"]
    assert mod.agent_state().record["path"] == second
    api.reset()
    api.add(reply("again"))
    assert run_main(mod, api, monkeypatch, "--resume", first.stem, "go on") == 0
    assert sent_texts(message_bodies(api)[0]) == ["the first session", "Finished.", "go on"]
    assert mod.agent_state().record["path"] == first
    capsys.readouterr()
    write(first.with_name(first.stem[:8] + "-twin.jsonl"), "{}\n")  # a second name with first's prefix
    for argv, error in [(["--resume", "nope", "hi"], "--resume nope: no such session; /resume lists them"),
                        (["--resume", first.stem[:8], "hi"],
                         f"--resume {first.stem[:8]}: more than one session matches; /resume lists them"),
                        (["--resume"], "--resume needs a session ID: /resume lists them")]:
        assert run_main(mod, api, monkeypatch, *argv) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and [line for line in err.splitlines() if "--resume" in line] == [error]
    assert len(message_bodies(api)) == 1 and api.exhausted == 0


def test_slash_resume_lists_start_time_first_prompt_and_message_count(mod, api, client, workspace, capsys):
    write(workspace / "AGENTS.md", "RULE-MARK\n")  # the first message opens with a reminder block
    first = recording(mod)
    history = run_turn(mod, api, client, [], prompt="alpha prompt")
    api.reset()
    mod.add_user_text(history, "beta prompt")
    api.add(reply("ok"))
    mod.agent_loop(client, history)
    second = recording(mod)
    run_turn(mod, api, client, [reply(tool("read_file", {"path": "AGENTS.md"}))], prompt="gamma prompt")
    capsys.readouterr()
    mod.handle_slash("/resume", {"client": None, "history": []})
    out = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line for line in out}
    assert set(rows) == {first.stem, second.stem}
    try:
        start = time.strftime("%Y-%m-%d %H:%M", time.strptime(first.stem[:15], "%Y%m%d-%H%M%S"))
    except ValueError:  # agent_full names a session by UUID: its first record's time
        start = time.strftime("%Y-%m-%d %H:%M", time.localtime(json.loads(first.read_text().splitlines()[0])["ts"]))
    assert start in rows[first.stem]
    assert "4 messages" in rows[first.stem] and "alpha prompt" in rows[first.stem]
    assert "beta prompt" not in rows[first.stem]
    assert "4 messages" in rows[second.stem] and "gamma prompt" in rows[second.stem]


@pytest.mark.parametrize("saved, restored", [("acceptEdits", "acceptEdits"), ("plan", "default"),
                                             ("bypassPermissions", "default"), ("default", "default")])
def test_resume_restores_accept_edits_but_never_plan_or_bypass(mod, workspace, saved, restored):
    path = recording(mod)
    mod.agent_state().mode = "default"
    mod.sync_session([{"role": "user", "content": "hi"}])
    mod.set_mode(saved)
    with mod.acting_as(mod.AgentState(workspace)) as fresh:
        mod.resume(None, path)
        assert fresh.mode == restored


def test_resume_does_not_loosen_a_mode_the_human_started_with(mod, workspace):
    path = recording(mod)
    mod.sync_session([{"role": "user", "content": "hi"}])
    mod.set_mode("acceptEdits")
    with mod.acting_as(mod.AgentState(workspace)) as fresh:
        fresh.mode = "plan"  # --permission-mode plan --continue
        mod.resume(None, path)
        assert fresh.mode == "plan"


def test_file_read_records_of_another_session_are_not_resumed(mod, api, client, workspace):
    write(workspace / "a.txt", "one\n")
    old = recording(mod)
    run_turn(mod, api, client, [], prompt="hello")
    api.reset()
    recording(mod)
    run_turn(mod, api, client, [reply(tool("read_file", {"path": "a.txt"}))], prompt="read a.txt")
    assert mod.agent_state().files  # this conversation read it
    api.reset()
    ctx = {"client": client, "history": []}
    mod.handle_slash(f"/resume {old.stem}", ctx)
    assert "error" not in ctx and texts(ctx["history"][0]["content"]) == ["hello"]
    edit = {"path": "a.txt", "old_string": "one", "new_string": "two"}
    mod.add_user_text(ctx["history"], "change it")
    api.add(reply(tool("edit_file", edit)), reply("ok"))
    assert mod.agent_loop(client, ctx["history"]) == "end_turn"
    refused = main_bodies(api)[1]["messages"][-1]["content"][0]
    assert refused["is_error"] and "Read a.txt with read_file before changing it" in json.dumps(refused)
    assert (workspace / "a.txt").read_text() == "one\n"


@pytest.mark.parametrize("hours", [30, 1])
def test_a_time_gap_reminder_only_after_a_day(mod, api, client, workspace, hours):
    path = recording(mod)
    run_turn(mod, api, client, [], prompt="hello")
    lines = records(path)
    path.write_text("".join(json.dumps(r | {"ts": r["ts"] - hours * 3600}) + "\n" for r in lines))
    api.reset()
    with fresh_agent(mod, workspace):
        history = mod.resume(None, path)
        mod.add_user_text(history, "next")
        api.add(reply("ok"))
        assert mod.agent_loop(client, history) == "end_turn"
    sent = texts(message_bodies(api)[0]["messages"][-1]["content"])
    gap = [t for t in sent if "This session is resumed" in t]
    if hours > mod.GAP_HOURS:
        assert len(gap) == 1 and "its last message was 30 hours ago" in gap[0]
    else:
        assert gap == []
    assert "next" in sent


@pytest.mark.memory
def test_recall_reads_the_users_prompt_not_a_reminder_added_to_it(mod, api, client, workspace):
    path = recording(mod)
    mod.apply_operations([op("pytest-preference", "user", "Run the tests with pytest, not unittest")],
                         mod.agent_state())
    mod.sync_session([{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}])
    lines = records(path)
    path.write_text("".join(json.dumps(r | {"ts": r["ts"] - 30 * 3600}) + "\n" for r in lines))
    with fresh_agent(mod, workspace):
        history = mod.resume(None, path)
        prompt_turn(mod, api, client, history, "please run the pytest suite",
                    [reply("no idea"), reply("Ran it."), ops_reply()])
    assert "The request:\nplease run the pytest suite" in side_bodies(api)[0]["messages"][0]["content"]
    assert "## pytest-preference " in memory_reminder(main_bodies(api)[0])


# --- regressions from the review of the test findings ---------------------------------

@pytest.mark.permissions
def test_the_consolidator_never_asks_the_human(mod, workspace, monkeypatch):
    state = mod.agent_state()
    state.write_roots, state.mode = [workspace / ".agent" / "memory"], "default"
    state.permissions["sandbox"]["enabled"] = False
    state.permissions["rules"] = [mod.parse_rule("glob") | {"effect": "ask", "scope": "user", "file": "u"}]
    monkeypatch.setattr(mod, "ask_permission", lambda *a: pytest.fail("the consolidator asked the human"))
    block = type("Block", (), {"name": "glob", "input": {"pattern": "*"}, "id": "toolu_1"})()
    assert "nobody can be asked" in mod.judge(block)


def test_a_linked_agents_md_outside_the_project_is_not_read(mod, workspace, tmp_path):
    secret = tmp_path / "id_rsa"
    secret.write_text("PRIVATE KEY\n")
    (workspace / "AGENTS.md").symlink_to(secret)
    text = mod.load_instructions(mod.agent_state())
    assert "PRIVATE KEY" not in text and "not read: outside" in text


def test_started_in_a_subfolder_the_git_roots_includes_are_read_within_its_repository(mod, workspace,
                                                                                     tmp_path):
    """The root's AGENTS.md was read but its own @includes were refused as "outside the
    workspace": an include resolves within the repository its file belongs to, as in
    Claude Code. It still never leaves that repository, by a path or a link, and never
    reads a secret."""
    repo = workspace
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    write(repo / "docs" / "style.md", "Use tabs.\n")
    write(repo / ".env", "TOKEN=hunter2\n")
    write(tmp_path / "outside.md", "OUTSIDE-TEXT\n")
    (repo / "docs" / "away.md").symlink_to(tmp_path / "outside.md")
    write(repo / "AGENTS.md", "ROOT-TEXT @docs/style.md\nnot these: @../outside.md @docs/away.md @.env\n")
    (repo / "sub" / "deeper").mkdir(parents=True)
    with mod.acting_as(mod.AgentState(repo / "sub" / "deeper")) as state:
        text = mod.load_instructions(state)
    assert "ROOT-TEXT" in text and "Use tabs." in text
    assert "OUTSIDE-TEXT" not in text and "hunter2" not in text
    assert "(@../outside.md not read: outside the repository" in text
    assert "(@docs/away.md not read: outside the repository" in text      # the link is followed, then refused
    assert "(@.env not read: it looks like a secret" in text



def test_a_read_deny_rule_reaches_the_includes_above_the_workspace(mod, workspace):
    """Review: `**/private/**` was matched from the workspace only, so a file the wider
    boundary reaches above it (the repository root's) slipped past the rule."""
    repo = workspace
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    write(repo / "private" / "plan.md", "PRIVATE-PLAN\n")
    write(repo / "AGENTS.md", "ROOT @private/plan.md\n")
    write(repo / "svc" / "AGENTS.md", "SVC @../private/plan.md\n")
    with mod.acting_as(mod.AgentState(repo / "svc")) as state:
        state.permissions["rules"] = [deny_rule(mod, "read_file(**/private/**)")]
        text = mod.load_instructions(state)
    assert "PRIVATE-PLAN" not in text and text.count("not read: a read rule denies it") == 2


def test_home_as_a_git_repository_opens_nothing_of_home_to_includes(mod, workspace):
    """Review: with a dotfiles repository at ~, a project below it had all of ~ as its
    repository: @~/.config/gh/hosts.yml and @../../.ssh/x reached the model."""
    home = Path.home()
    subprocess.run(["git", "init", "-q", str(home)], check=True)
    write(home / ".config" / "gh" / "hosts.yml", "oauth_token: SECRET-1\n")
    write(home / ".ssh" / "work_deploy", "SECRET-2\n")
    write(home / "notes" / "todo.md", "SECRET-3\n")
    project = home / "Downloads" / "tarball"
    write(project / "AGENTS.md", "PROJECT @~/.config/gh/hosts.yml @../../.ssh/work_deploy @../../notes/todo.md\n")
    with mod.acting_as(mod.AgentState(project)) as state:
        text = mod.load_instructions(state)
    assert "PROJECT" in text and "SECRET" not in text and text.count("not read: outside the repository") == 3


@pytest.mark.parametrize("name", ["prod.env", ".env-prod", ".envrc", "secrets.yaml", "id_rsa-work",
                                  "terraform.tfvars", ".ssh/config", ".aws/credentials", ".git/config",
                                  ".config/gh/hosts.yml"])
def test_secret_looking_files_and_folders_are_never_included(mod, workspace, name):
    write(workspace / name, "SECRET-TEXT\n")
    write(workspace / "AGENTS.md", f"@{name}\n")
    assert "SECRET-TEXT" not in mod.load_instructions(mod.agent_state())


def test_two_sessions_that_draw_one_name_never_share_its_file(mod, workspace, tmp_path):
    """Teammates start in the same second: the one that writes second draws again."""
    state = mod.agent_state()
    state.record = mod.new_session(state)
    taken = state.record["path"]
    taken.parent.mkdir(parents=True)
    taken.write_text('{"type": "mode", "mode": "default"}\n')       # the other process's, written first
    mod.sync_session([{"role": "user", "content": "mine"}])
    mine = state.record["path"]
    assert mine != taken and taken.read_text() == '{"type": "mode", "mode": "default"}\n'
    assert [m["content"] for m in mod.read_session(mine)[0]] == ["mine"] and mod.session_id(state) == mine.stem
    outside = tmp_path / "planted-target"
    state.record = mod.new_session(state)
    state.record["path"].symlink_to(outside)                           # a dangling link, left by a clone
    link = state.record["path"]
    mod.sync_session([{"role": "user", "content": "again"}])
    assert not outside.exists() and state.record["path"] != link
    assert [m["content"] for m in mod.read_session(state.record["path"])[0]] == ["again"]


def test_the_session_file_follows_no_planted_link_and_stays_out_of_git(mod, workspace, tmp_path):
    state = mod.agent_state()
    victim = tmp_path / "victim"
    victim.write_text("original\n")
    state.record = mod.new_session(state)
    state.record["path"].parent.mkdir(parents=True)
    state.record["path"].symlink_to(victim)
    mod.sync_session([{"role": "user", "content": "hi"}])
    assert victim.read_text() == "original\n"
    assert (state.record["path"].parent / ".gitignore").read_text() == "*\n"


@pytest.mark.parametrize("name", [".netrc", ".pgpass", ".npmrc", ".pypirc", ".git-credentials", ".my.cnf",
                                  ".vault-token", "conf/.s3cfg", "_netrc", "deep/.htpasswd"])
def test_the_credential_files_of_s07s_list_are_never_included_either(mod, workspace, name):
    """The names HOME_SECRETS lists are refused by place, anywhere in the repository,
    as the ones SECRET_FILE's patterns name: one list, not two that drift."""
    write(workspace / name, "SECRET-TEXT\n")
    write(workspace / "AGENTS.md", f"@{name}\n")
    assert "SECRET-TEXT" not in mod.load_instructions(mod.agent_state())
