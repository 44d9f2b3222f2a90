"""s06: a paste larger than the window must not wedge the session.

Kept whole, such a prompt failed its turn (the earlier conversation was
summarised away, the paste stayed, the retry was refused again) and every later
prompt too, since a new prompt joins the failed one. A prompt's text over
PERSIST_PROMPT_BYTES now goes to disk as a big tool result does, before the
first request: the model gets its head, the path and how to read the rest, the
human one line. Where the window matters the model has a 200K window on the
scripted server, the chapter's CONTEXT_WINDOW, and the server refuses a longer
request as the real API does; the `api` fixture fails a test whose requests it
refused.
"""
import re

import pytest

from conftest import chapters_from, message_bodies, run_chapter, strip_cache
from fake_api import reply
from test_s06_compact import check_history, dump, kinds
from test_s06_recovery import unwritable  # noqa: F401 (a fixture)

each = pytest.mark.parametrize("mod", chapters_from("s06"), indirect=True)

WINDOW_MODEL = "claude-sonnet-4-5"          # a 200K window on the scripted server


def paste_of(chars, head="PASTE-HEAD"):
    """A log of about `chars` characters: a first line to find, numbered lines, a last line."""
    line = "worker=3 status=ok elapsed=12ms path=/srv/app/handler.py"
    body = [f"log line {i:07d}: {line}" for i in range(chars // (len(line) + 19) + 1)]
    return "\n".join([f"{head}: the first line of the paste", *body, "PASTE-TAIL: what is wrong here?"])


def one_line_of(chars):
    """A paste as the REPL reads it, one line (a minified JSON document, say)."""
    record = '{"worker": 3, "status": "ok", "elapsed_ms": 12, "path": "/srv/app/handler.py"}, '
    return f"PASTE-HEAD [{record * (chars // len(record))}] PASTE-TAIL: what is wrong here?"


def saved_files(workspace):
    folder = workspace / ".agent" / "tool-results"
    return sorted(folder.glob("prompt-*.txt")) if folder.is_dir() else []


def told_lines(err):
    """The human's lines about a saved prompt."""
    return [ln for ln in err.splitlines() if "characters of the prompt" in ln]


@pytest.fixture
def window(monkeypatch):
    monkeypatch.setenv("MODEL_ID", WINDOW_MODEL)


@each
def test_a_paste_larger_than_the_window_leaves_the_session_working(mod, api, client, workspace,
                                                                   window, capsys):
    paste = paste_of(4 * mod.CONTEXT_WINDOW + 100_000)               # ~225K tokens alone
    history = [{"role": "user", "content": "EARLIER-PROMPT: look at the service"},
               {"role": "assistant", "content": [{"type": "text", "text": "EARLIER-ANSWER: ok"}]},
               {"role": "user", "content": paste}]
    api.script([reply("I read the head of it"), reply("still here")])
    assert mod.agent_loop(client, history) == "end_turn"
    mod.add_user_text(history, "LATER-PROMPT: and now?")
    assert mod.agent_loop(client, history) == "end_turn"
    assert api.invalid() == [] and api.remaining() == 0 and api.exhausted == 0
    assert kinds(api) == ["main", "main"]                            # nothing summarised away
    first, later = message_bodies(api)
    assert "EARLIER-PROMPT" in dump(first) and "EARLIER-PROMPT" in dump(later)
    assert "LATER-PROMPT" in dump(later["messages"][-1])
    sent = dump(first["messages"][-1])                               # the paste as the model got it
    assert "PASTE-HEAD" in sent and "log line 0000000" in sent       # its head...
    assert "PASTE-TAIL" not in sent and len(sent) < mod.PREVIEW_CHARS + 1_000  # ...not the rest
    [saved] = saved_files(workspace)
    assert saved.read_text(encoding="utf-8") == paste                # all of it, to read back
    path = saved.relative_to(workspace).as_posix()
    assert path in sent and "read_file" in sent and "offset" in sent and "limit" in sent
    assert f"{len(paste):,} characters, {paste.count(chr(10)) + 1:,} lines" in sent
    told = told_lines(capsys.readouterr().err)
    assert len(told) == 1 and path in told[0] and f"{len(paste):,}" in told[0]
    check_history(history)


@each
def test_only_a_prompt_text_over_the_threshold_goes_to_disk(mod, api, client, workspace, capsys):
    just = "k" * mod.PERSIST_PROMPT_BYTES                            # at the threshold: sent whole
    api.script([reply("fine")])
    history = [{"role": "user", "content": just}]
    assert mod.agent_loop(client, history) == "end_turn"
    assert history[0]["content"] == just and just in dump(message_bodies(api)[0]["messages"])
    assert saved_files(workspace) == [] and told_lines(capsys.readouterr().err) == []
    over = "PASTE-HEAD\n" + "w" * mod.PERSIST_PROMPT_BYTES            # one over: saved
    mod.add_user_text(history, over)
    api.script([reply("saved it")])
    assert mod.agent_loop(client, history) == "end_turn"
    [saved] = saved_files(workspace)
    assert saved.read_text(encoding="utf-8") == over
    last = dump(message_bodies(api)[1]["messages"][-1])
    assert "PASTE-HEAD" in last and over not in last
    assert len(told_lines(capsys.readouterr().err)) == 1


@each
def test_a_paste_merged_after_a_failed_turn_keeps_the_other_texts(mod, api, client, workspace):
    """After a failed turn a new prompt joins the old one's message: only the long
    text moves to disk, the typed ones stay as they are, in their order."""
    paste = paste_of(mod.PERSIST_PROMPT_BYTES + 50_000)
    history = [{"role": "user", "content": "TYPED-FIRST"}]
    mod.add_user_text(history, paste)
    mod.add_user_text(history, "TYPED-AFTER")
    api.script([reply("ok")])
    assert mod.agent_loop(client, history) == "end_turn"
    texts = [b["text"] for m in message_bodies(api)[0]["messages"] if m["role"] == "user"
             for b in m["content"] if b["type"] == "text"]
    first = texts.index("TYPED-FIRST")
    assert texts[first + 2] == "TYPED-AFTER" and texts[first + 1].startswith("<persisted-prompt>")
    assert "PASTE-HEAD" in texts[first + 1] and "PASTE-TAIL" not in dump(texts)
    [saved] = saved_files(workspace)
    assert saved.read_text(encoding="utf-8") == paste


@each
def test_a_saved_paste_is_sent_the_same_way_every_later_turn(mod, api, client, workspace):
    """Saved once, as it enters: the next turn sends the same bytes (the cached prefix
    holds) and writes nothing again."""
    history = [{"role": "user", "content": paste_of(mod.PERSIST_PROMPT_BYTES + 10_000)}]
    api.script([reply("one"), reply("two")])
    assert mod.agent_loop(client, history) == "end_turn"
    mod.add_user_text(history, "next")
    assert mod.agent_loop(client, history) == "end_turn"
    first, second = message_bodies(api)
    assert "PASTE-HEAD" in dump(first["messages"][0]) and "PASTE-TAIL" not in dump(first)
    assert strip_cache(second["messages"][0]) == strip_cache(first["messages"][0])
    assert len(saved_files(workspace)) == 1


@each
def test_a_paste_that_cannot_be_saved_still_leaves_the_session_working(mod, api, client, unwritable,
                                                                      window, capsys):
    paste = paste_of(4 * mod.CONTEXT_WINDOW + 100_000)
    history = [{"role": "user", "content": paste}]
    api.script([reply("I see the head only"), reply("fine")])
    assert mod.agent_loop(client, history) == "end_turn"
    mod.add_user_text(history, "and now?")
    assert mod.agent_loop(client, history) == "end_turn"
    assert api.invalid() == [] and kinds(api) == ["main", "main"]
    sent = dump(message_bodies(api)[0]["messages"][-1])
    assert "PASTE-HEAD" in sent and "PASTE-TAIL" not in sent and len(sent) < mod.PREVIEW_CHARS + 1_000
    assert "could not be saved" in sent and ".agent/tool-results" not in sent
    told = [ln for ln in capsys.readouterr().err.splitlines() if "could not be saved" in ln]
    assert len(told) == 1 and f"{len(paste):,}" in told[0]


@pytest.mark.parametrize("mod", chapters_from("s08"), indirect=True)
def test_a_prompt_hook_sees_the_paste_whole_and_a_blocked_one_is_not_saved(mod, api, client,
                                                                         workspace):
    """s08 on: user_prompt_submit runs first, on the prompt as typed; a prompt it
    blocks is dropped before anything of it reaches the disk."""
    from test_s08_hooks import calls, hook, recorder, use_hooks
    paste = paste_of(mod.PERSIST_PROMPT_BYTES + 10_000)
    use_hooks(mod, hook("user_prompt_submit", recorder(workspace, "prompt")))
    api.script([reply("ok")])
    assert mod.agent_loop(client, [{"role": "user", "content": paste}]) == "end_turn"
    assert calls(workspace, "prompt")[0]["stdin"]["prompt"] == paste
    assert len(saved_files(workspace)) == 1
    use_hooks(mod, hook("user_prompt_submit", "echo 'no pastes' >&2; exit 2"))
    other = paste_of(mod.PERSIST_PROMPT_BYTES + 10_000, head="BLOCKED-HEAD")
    assert mod.agent_loop(client, [{"role": "user", "content": other}]) == "prompt_blocked"
    assert len(saved_files(workspace)) == 1 and len(message_bodies(api)) == 1


# --- end to end: piped stdin and a one-shot prompt --------------------------------------

@each
@pytest.mark.e2e("s06")
def test_a_piped_paste_larger_than_the_window_and_a_one_shot_paste(mod, api, workspace):
    paste = one_line_of(4 * mod.CONTEXT_WINDOW + 100_000)          # the REPL reads a line a prompt
    api.script([reply("hello back"), reply("read the head"), reply("answered the next one")])
    p = run_chapter(mod.__name__, api=api, cwd=workspace, env={"MODEL_ID": WINDOW_MODEL},
                    input=f"EARLIER-PROMPT: hello\n{paste}\nNEXT-PROMPT: what did you see?\n")
    assert p.returncode == 0, p.stderr[-2_000:]
    assert api.invalid() == [] and kinds(api) == ["main"] * 3, p.stderr[-2_000:]
    assert "read the head" in p.stdout and "answered the next one" in p.stdout
    first, pasted, later = message_bodies(api)
    assert "PASTE-HEAD" in dump(pasted["messages"][-1]) and "PASTE-TAIL" not in dump(later)
    assert "EARLIER-PROMPT" in dump(later) and "NEXT-PROMPT" in dump(later["messages"][-1])
    [saved] = saved_files(workspace)
    assert saved.read_text(encoding="utf-8") == paste
    assert len(told_lines(p.stderr)) == 1
    # One-shot: the words of the command line, joined (one argument holds at most 128 KB on Linux).
    api.reset()
    argv_paste = paste_of(mod.PERSIST_PROMPT_BYTES + 10_000, head="ARGV-HEAD")
    cut = argv_paste.index(" ", len(argv_paste) // 2)
    api.script([reply("done")])
    p = run_chapter(mod.__name__, argv_paste[:cut], argv_paste[cut + 1:], api=api, cwd=workspace)
    assert p.returncode == 0, p.stderr[-2_000:]
    sent = dump(message_bodies(api)[0]["messages"][-1])
    assert "ARGV-HEAD" in sent and "PASTE-TAIL" not in sent and re.search(r"prompt-\w+\.txt", sent)
    assert any(f.read_text(encoding="utf-8") == argv_paste for f in saved_files(workspace))
    assert len(told_lines(p.stderr)) == 1


@each
def test_a_paste_is_measured_in_bytes_so_text_that_is_not_ascii_goes_to_disk_too(mod, workspace, capsys):
    """Review: 199,000 emoji passed a bar of 200,000 characters, yet weigh ~200K tokens:
    the wedge this file is about came back for text that is not ASCII."""
    history = [{"role": "user", "content": "\U0001f600" * 60_000}]      # 60K characters, 240K bytes
    mod.persist_prompt(history)
    assert "<persisted-prompt>" in history[0]["content"]
    assert list((workspace / ".agent" / "tool-results").glob("prompt-*.txt"))
