"""s06: context management that must not paint a session into a corner.

Each test reproduces a way a session used to end or go wrong: many parallel
reads filling one message, the API's "no room for max_tokens" error, a
workspace that cannot be written, a stream cut mid-reply with stdout in a
file, a summary call that was neither streamed nor billed, a disk layer the
human could not see. It runs on s06 and every later chapter; the `api`
fixture fails a test whose requests the scripted server rejected.
"""
import errno
import os
import re
from pathlib import Path

import pytest

from conftest import chapters_from, message_bodies, strip_cache
from fake_api import error, reply, text, tool
from test_s06_compact import (SUMMARY, check_history, dump, history_of, kinds,
                              results_in, run)

each = pytest.mark.parametrize("mod", chapters_from("s06"), indirect=True)

# The real API's 400 when the prompt fits but the reply would not.
NO_ROOM = ("input length and `max_tokens` exceed context limit: 195112 + 8000 > 200000, "
           "decrease input length or `max_tokens` and try again")


# --- 1. many results in one message ---------------------------------------------

@each
def test_many_parallel_reads_together_fit_the_message_budget(mod, api, client, workspace):
    # 24 reads of ~29K characters each: ~700K characters, over 170K tokens in one message.
    calls = []
    for i in range(24):
        (workspace / f"part{i:02d}.txt").write_text(f"PART-{i:02d}\n" + ("r" * 99 + "\n") * 270)
        calls.append(tool("read_file", {"path": f"part{i:02d}.txt"}))
    api.script([reply(*calls), reply("read them all")])
    reason, history = run(mod, client, "read every part")
    assert reason == "end_turn"
    sent = results_in(message_bodies(api)[1])
    assert sum(len(c) for c in sent.values()) <= mod.MESSAGE_BUDGET_CHARS
    kept = [i for i, c in enumerate(calls) if f"PART-{i:02d}" in sent[c["id"]]]
    assert 1 <= len(kept) < 24
    for i, call in enumerate(calls):
        if i not in kept:     # the note names the file and how to read it in parts
            note = sent[call["id"]]
            assert len(note) < 500 and f"part{i:02d}.txt" in note
            assert "offset" in note and "limit" in note
    assert not (workspace / ".agent" / "tool-results").exists()    # read_file never goes to disk
    files = mod.agent_state().files      # a file the model did not see must be read before an edit
    assert [str((workspace / f"part{i:02d}.txt").resolve()) in files for i in range(24)] == \
        [i in kept for i in range(24)]
    check_history(history)


@each
def test_the_budget_saves_other_results_to_disk_before_leaving_out_reads(mod, workspace, capsys):
    class Call:
        def __init__(self, id, name, path=None):
            self.id, self.name, self.input = id, name, {"path": path} if path else {}
    calls = [Call("toolu_b1", "bash"), Call("toolu_r1", "read_file", "big.txt"),
             Call("toolu_r2", "read_file", "small.txt")]
    results = [{"type": "tool_result", "tool_use_id": c.id, "content": c.id[-2:] * n}
               for c, n in zip(calls, (14_000, 30_000, 15_000))]   # 28K + 60K + 30K characters
    mod.persist_large_results(calls, results)
    shown = [r["content"] for r in results]
    assert shown[0].startswith("<persisted-output>")            # saved first: nothing is lost
    assert "big.txt" in shown[1] and "offset" in shown[1]        # then the largest read
    assert shown[2] == "r2" * 15_000
    assert sum(map(len, shown)) <= mod.MESSAGE_BUDGET_CHARS
    err = capsys.readouterr().err                                # the human sees both
    assert ".agent/tool-results/toolu_b1.txt" in err and "28,000" in err and "big.txt" in err


@each
def test_a_kept_tail_too_big_on_its_own_is_shrunk_the_same_way(mod, api, client, workspace):
    # A history that already holds one message of 24 read results of 30K
    # characters: compaction keeps it as the tail, so unless the tail itself
    # shrinks, every later request is as large as the one that failed.
    calls = [{"type": "tool_use", "id": f"toolu_p{i:02d}", "name": "read_file",
              "input": {"path": f"part{i:02d}.txt"}} for i in range(24)]
    results = [{"type": "tool_result", "tool_use_id": c["id"],
                "content": f"PART-{i:02d}\n" + "r" * 30_000} for i, c in enumerate(calls)]
    history = [{"role": "user", "content": "read every part"},
               {"role": "assistant", "content": calls}, {"role": "user", "content": results}]
    api.script([reply(SUMMARY), reply("done")])
    assert mod.agent_loop(client, history) == "end_turn"
    assert kinds(api) == ["summary", "main"]
    after = results_in(message_bodies(api)[1])
    assert sum(len(c) for c in after.values()) <= mod.MESSAGE_BUDGET_CHARS
    assert "offset" in after["toolu_p00"] and "part00.txt" in after["toolu_p00"]
    check_history(history)


# --- 2. no room left for max_tokens ------------------------------------------------

@each
@pytest.mark.parametrize("message", [NO_ROOM, "input length and max_tokens exceed context "
                                              "limit: 195112 + 8000 > 200000"])
def test_no_room_for_max_tokens_retries_with_max_tokens_lowered_to_fit(mod, api, client, message):
    api.script([error(400, message), reply("done")])
    reason, history = run(mod, client)
    assert reason == "end_turn" and kinds(api) == ["main", "main"]
    first, retried = message_bodies(api)
    assert first["max_tokens"] == 8_000 and retried["max_tokens"] == 200_000 - 195_112
    assert strip_cache(retried["messages"]) == strip_cache(first["messages"])   # the same turn
    assert history[-1]["content"] == [text("done")]


@each
def test_too_little_room_for_a_useful_reply_compacts_and_retries(mod, api, client, monkeypatch):
    monkeypatch.setattr(mod, "KEEP_TAIL_MESSAGES", 2)
    history = history_of(4)
    mod.add_user_text(history, "PROMPT-NEXT")
    tight = "input length and `max_tokens` exceed context limit: 199500 + 8000 > 200000"
    api.script([error(400, tight), reply(SUMMARY), reply("done")])
    assert mod.agent_loop(client, history) == "end_turn"
    assert kinds(api) == ["main", "summary", "main"]
    retried = message_bodies(api)[2]
    assert retried["max_tokens"] == 8_000 and "SUMMARY-TEXT" in dump(retried["messages"][0])
    assert "PROMPT-NEXT" in dump(retried["messages"][-1])
    check_history(history)


@each
def test_a_summary_call_without_room_for_its_output_trims_and_retries(mod, api, client):
    history = history_of(10)
    full = "input length and `max_tokens` exceed context limit: 186000 + 16000 > 200000"
    api.script([error(400, full), reply(SUMMARY)])
    mod.compact_now(client, history)
    assert kinds(api) == ["summary", "summary"]
    first, second = message_bodies(api)
    assert "start the work" in dump(first["messages"])            # the oldest part...
    assert "start the work" not in dump(second["messages"])       # ...is dropped
    assert len(second["messages"]) < len(first["messages"])
    assert "SUMMARY-TEXT" in dump(history[0])
    check_history(history)


# --- 3. a workspace that cannot be written ---------------------------------------------

@pytest.fixture(params=["agent-is-a-file", "read-only-mount"])
def unwritable(request, mod, workspace, monkeypatch):
    """Nothing can be written under .agent/. The suite may run as root, and root
    writes through any chmod, so chmod alone cannot make the test fail: either
    .agent is a plain file (mkdir below it fails for root too), or the workspace
    is chmod 0555 and, for root, every mkdir/write below .agent raises EROFS as
    on a read-only mount."""
    if request.param == "agent-is-a-file":
        (workspace / ".agent").write_text("not a directory\n")
        return workspace
    workspace.chmod(0o555)
    request.addfinalizer(lambda: workspace.chmod(0o755))
    if os.geteuid() == 0:
        def refuse(path):
            if ".agent" in path.parts:
                raise OSError(errno.EROFS, "Read-only file system", str(path))
        real_mkdir, real_write, real_os_mkdir = Path.mkdir, Path.write_text, os.mkdir
        monkeypatch.setattr(Path, "mkdir", lambda p, *a, **k: refuse(p) or real_mkdir(p, *a, **k))
        monkeypatch.setattr(os, "mkdir", lambda p, *a, **k: refuse(Path(p)) or real_os_mkdir(p, *a, **k))
        monkeypatch.setattr(Path, "write_text",
                            lambda p, *a, **k: refuse(p) or real_write(p, *a, **k))
    return workspace


@each
def test_a_big_result_that_cannot_be_saved_is_clipped_with_a_note(mod, api, client, unwritable,
                                                                  capsys):
    call = tool("bash", {"command": "seq 1 60000"})
    api.script([reply(call), reply("done")])
    reason, history = run(mod, client)
    assert reason == "end_turn"                                   # the turn goes on
    shown = results_in(message_bodies(api)[1])[call["id"]]
    assert shown.startswith("1\n2\n3\n") and "59999" not in shown
    assert len(shown) < mod.PREVIEW_CHARS + 500
    assert "could not be saved" in shown and "saved to:" not in shown
    assert "could not be saved" in capsys.readouterr().err
    assert mod.keep_cleared(history[2]["content"][0]) is False  # nowhere to keep it: never cleared


@each
def test_a_transcript_that_cannot_be_saved_does_not_stop_compaction(mod, api, client, unwritable,
                                                                   capsys):
    history = history_of(6)
    api.script([reply(SUMMARY)])
    mod.compact_now(client, history)
    head = dump(history[0])
    assert "SUMMARY-TEXT" in head and ".agent/transcripts" not in head
    assert "could not be saved" in head
    err = capsys.readouterr().err
    assert "transcript not saved" in err and "[compacted (requested)" in err
    check_history(history)


# --- 4. a stream cut mid-reply -----------------------------------------------------

SENTENCE = "The parser reads one token at a time. "


@each
def test_a_cut_stream_is_transient_in_either_form_the_sdk_raises(mod):
    """A stream cut mid-body surfaces as the SDK's APIConnectionError (anthropic 2.17
    on) or as the HTTP library's own RemoteProtocolError (before): both are waited
    for and retried, so an SDK upgrade cannot turn a cut into a failed turn."""
    import anthropic
    try:
        import httpx2 as httpx
    except ImportError:
        import httpx
    request = httpx.Request("POST", "http://127.0.0.1/v1/messages")
    cut = httpx.RemoteProtocolError("peer closed connection without sending complete message body",
                                    request=request)
    assert mod.is_transient(cut) and mod.is_api_failure(cut)
    wrapped = anthropic.APIConnectionError(request=request)
    wrapped.__cause__ = cut
    assert mod.is_transient(wrapped) and mod.is_api_failure(wrapped)
    assert not mod.is_transient(ValueError("a bug in the chapter"))


@each
def test_a_cut_reply_is_continued_by_prefill_so_stdout_holds_one_reply(fast, api, client, capsys):
    answer = (SENTENCE * 20).strip()
    seen = []

    def rest(body):                     # the API continues right after the prefill
        seen.append(body)
        done = body["messages"][-1]["content"][-1]["text"]
        return reply(answer[len(done):])

    # 3 events before the text, then 12 characters per event: the cut leaves
    # 108 characters, ending in a space the prefill must not carry.
    api.script([reply(answer, cut_after=12), rest])
    reason, history = run(fast, client)
    assert reason == "end_turn"
    out, err = capsys.readouterr()
    assert out == answer + "\n" and out.count(SENTENCE.strip()) == 20
    assert history[-1]["content"] == [text(answer)]              # one reply, not two
    first, again = message_bodies(api)
    prefill = again["messages"][-1]
    assert prefill["role"] == "assistant" and len(prefill["content"]) == 1
    assert prefill["content"][0]["text"] == answer[:107]          # trailing space trimmed
    assert strip_cache(again["messages"][:-1]) == strip_cache(first["messages"])
    assert err.count("retry 1/") == 1
    check_history(history)


@each
def test_a_reply_cut_twice_is_continued_from_all_it_sent(fast, api, client, capsys):
    answer = (SENTENCE * 6).strip()

    def rest(body, cut=None):
        done = body["messages"][-1]["content"][-1]["text"]
        return reply(answer[len(done):], cut_after=cut)

    api.script([reply(answer, cut_after=8), lambda body: rest(body, 6), rest])
    reason, history = run(fast, client)
    assert reason == "end_turn"
    assert capsys.readouterr().out == answer + "\n"
    assert history[-1]["content"] == [text(answer)]


@each
def test_a_continuation_that_starts_with_a_tool_call_keeps_the_text_before_it(fast, api, client,
                                                                               capsys):
    words, call = "Let me check the parser first.", tool("bash", {"command": "echo hi"})
    # cut after the text block ended, before the tool call began: all text, so a prefill
    api.script([reply(words, call, cut_after=7), reply(call), reply("Checked.")])
    reason, history = run(fast, client)
    assert reason == "end_turn"
    assert strip_cache(message_bodies(api)[1]["messages"][-1]["content"]) == [text(words)]
    assert history[1]["content"] == [text(words), call]           # one reply: text, then call
    assert capsys.readouterr().out.splitlines() == [words, "Checked."]
    check_history(history)


@each
@pytest.mark.parametrize("began", ["tool", "thinking"])
def test_a_cut_reply_that_cannot_be_prefilled_restarts_on_a_fresh_line(fast, api, client, capsys,
                                                                       began):
    call, words = tool("bash", {"command": "echo hi"}), text("Let me check.")
    if began == "tool":          # cut inside the tool call: a prefill cannot hold one
        steps = [reply(words, call, cut_after=7), reply(words, call)]
    else:                        # thinking on: the API refuses a prefill
        think = {"type": "thinking", "thinking": "plan it", "signature": "sig"}
        steps = [reply(think, words, call, cut_after=9), reply(think, words, call)]
    api.script(steps + [reply("Checked.")])
    reason, history = run(fast, client)
    assert reason == "end_turn"
    out, err = capsys.readouterr()
    assert out.splitlines() == ["Let me check.", "Let me check.", "Checked."]
    assert message_bodies(api)[1] == message_bodies(api)[0]                       # restarted: the same request
    assert len([ln for ln in err.splitlines() if "stream cut" in ln]) == 1
    check_history(history)


# --- 5. the summary call ---------------------------------------------------------------

@each
def test_the_summary_call_is_streamed_billed_and_not_printed(mod, api, client, capsys):
    history = history_of(6)
    api.script([reply(SUMMARY, usage={"input_tokens": 150_000, "output_tokens": 2_000})])
    mod.compact_now(client, history)
    assert "SUMMARY-TEXT" in dump(history[0])
    assert message_bodies(api)[0].get("stream") is True
    assert mod.agent_state().session["cost"] == pytest.approx(0.48)   # 150K x $3/M + 2K x $15/M
    out, err = capsys.readouterr()
    assert "SUMMARY-TEXT" not in out + err and "DRAFT-NOTES" not in out + err
    assert "session ~$0.4800" in err


@each
def test_compaction_works_for_a_model_the_sdk_only_lets_stream(mod, api, client, monkeypatch):
    # The SDK refuses a non-streamed call with this many output tokens for
    # some model ids ("Streaming is required ..."), before sending anything.
    monkeypatch.setenv("MODEL_ID", "claude-opus-4-1@20250805")
    history = history_of(6)
    api.script([reply(SUMMARY)])
    mod.compact_now(client, history)
    assert kinds(api) == ["summary"] and "SUMMARY-TEXT" in dump(history[0])


@each
def test_a_subagents_summary_call_is_on_its_bill_and_the_sessions(mod, api, client):
    api.script([reply(tool("agent", {"prompt": "look around"})),
                reply(tool("compact", {})),                                           # child
                reply(SUMMARY, usage={"input_tokens": 150_000, "output_tokens": 2_000}),  # summary
                reply("child report"),                                                # child
                reply("parent final")])
    reason, history = run(mod, client)
    assert reason == "end_turn"
    assert kinds(api) == ["main", "main", "summary", "main", "main"]
    report = history[2]["content"][0]["content"]
    calls, tokens_in = map(int, re.search(r"(\d+) model calls, (\d+) input", report).groups())
    assert calls == 3 and tokens_in >= 150_000
    assert mod.agent_state().session["cost"] >= 0.48


@each
def test_a_bug_during_compaction_is_not_reported_as_a_failed_compaction(mod, api, client,
                                                                       monkeypatch):
    def broken(*args):
        raise ValueError("a bug in the chapter, not an API failure")

    monkeypatch.setattr(mod, "loop_prefix", broken)
    with pytest.raises(ValueError, match="a bug in the chapter"):
        mod.compact(client, history_of(6))
    assert mod.agent_state().compaction["failures"] == 0


# --- 6. the disk layer, as the human sees it ---------------------------------------------

@each
def test_a_result_saved_to_disk_is_shown_as_the_model_gets_it(mod, api, client, workspace, capsys):
    call = tool("bash", {"command": "seq 1 60000"})
    api.script([reply(call), reply("done")])
    assert run(mod, client)[0] == "end_turn"
    err = capsys.readouterr().err.splitlines()
    after = err[next(k for k, ln in enumerate(err) if ln.startswith("> bash")) + 1:]
    path = f".agent/tool-results/{call['id']}.txt"
    assert any(path in ln and "348,894 characters" in ln for ln in after if ln.startswith("["))
    shown = next(ln for ln in after if ln.startswith("  ")       # the one-line preview (from s07
                 and not ln.startswith("  allowed ("))            # on, after the verdict's line)
    assert path in shown and "(+59999 lines)" not in shown


@each
def test_bash_description_says_large_output_goes_to_a_file(mod):
    desc = next(t for t in mod.TOOLS if t["name"] == "bash")["description"]
    assert "is cut" not in desc
    assert "saved to a file" in desc and "preview" in desc


@each
def test_the_saved_result_note_says_how_to_reach_long_lines(mod, workspace):
    block = {"type": "tool_result", "tool_use_id": "toolu_long", "content": "x" * 50_000}
    mod.persist_output(block)
    note = block["content"].split("Preview")[0]
    assert "2,000 characters" in note and "grep" in note and "bash" in note


# --- 7. documented defaults ---------------------------------------------------------------

@each
def test_documented_defaults_and_their_order(mod):
    # Literal numbers from the chapter's documentation, not the module's own values.
    assert mod.WORKING_BUDGET == 20_000 < mod.AUTO_COMPACT_AT == 167_000
    assert mod.AUTO_COMPACT_AT < mod.FORCE_COMPACT_AT == 177_000 < mod.CONTEXT_WINDOW == 200_000
    assert mod.SUMMARY_MAX_TOKENS <= mod.OUTPUT_RESERVE
    assert mod.MAX_CONTINUATIONS == 3 and mod.REATTACH_FILES == 5
    assert mod.KEEP_RESULTS == 1 and mod.CLEAR_PAYBACK == 10 and mod.MAX_COMPACT_FAILURES == 3
