"""s06: context management and error recovery, against the scripted server.

Every test runs on s06 and on every later chapter. What is asserted is what the
model received (the request bodies the server logged), what is on disk (saved
results, transcripts) and what the loop returned; the `api` fixture fails a test
if any request the chapter sent was invalid.
"""
import copy
import importlib.util
import json
import math
import re
import subprocess
import time
from types import SimpleNamespace

import pytest

from conftest import TESTS, chapters_from, run_chapter, strip_cache, message_bodies
from fake_api import error, hangup, reply, text, tool

each = pytest.mark.parametrize("mod", chapters_from("s06"), indirect=True)

SUMMARY = "<analysis>DRAFT-NOTES</analysis>\n<summary>1. Primary request: SUMMARY-TEXT</summary>"
TOO_LONG = "prompt is too long: 210000 tokens > 200000 maximum"


# --- helpers -------------------------------------------------------------------

def is_summary(body):
    return body.get("tool_choice") == {"type": "none"}


def kinds(api):
    return ["summary" if is_summary(b) else "main" for b in message_bodies(api)]


strip_cc = strip_cache


def dump(obj):
    return json.dumps(obj, ensure_ascii=False)


def results_in(body):
    """tool_use_id -> content of every tool_result in a request."""
    return {b["tool_use_id"]: b.get("content") for m in body["messages"] if m["role"] == "user"
            for b in m["content"] if b["type"] == "tool_result"}


def check_history(messages):
    """The history itself pairs every call with its result (normalize_messages
    would silently drop an orphaned result, so validity of the request alone
    does not prove nothing was lost)."""
    for i, m in enumerate(messages):
        blocks = [] if isinstance(m["content"], str) else m["content"]
        results = [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]
        if results:
            prev = messages[i - 1] if i else {"role": "user", "content": []}
            calls = [b["id"] for b in prev["content"] if b["type"] == "tool_use"]
            assert prev["role"] == "assistant" and sorted(results) == sorted(calls), i
        calls = [b["id"] for b in blocks if b["type"] == "tool_use"]
        if calls and i + 1 < len(messages):
            nxt = messages[i + 1]["content"]
            assert sorted(calls) == sorted(b["tool_use_id"] for b in nxt if b["type"] == "tool_result"), i


def run(mod, client, prompt="do the work"):
    history = [{"role": "user", "content": prompt}]
    return mod.agent_loop(client, history), history


def history_of(rounds, size=200, parallel=()):
    """A valid history: a prompt, then `rounds` tool rounds; rounds listed in
    `parallel` make three calls at once (one reply, one message of results)."""
    h = [{"role": "user", "content": "start the work"}]
    for r in range(rounds):
        n = 3 if r in parallel else 1
        ids = [f"toolu_h{r:02d}_{k}" for k in range(n)]
        h.append({"role": "assistant", "content": [text(f"round {r}")] + [
            {"type": "tool_use", "id": i, "name": "bash", "input": {"command": f"echo {i}"}} for i in ids]})
        h.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": i, "content": f"out {i} " + "x" * size} for i in ids]})
    h.append({"role": "assistant", "content": [text("All rounds done.")]})
    return h


# --- context size ----------------------------------------------------------------

@each
def test_context_size_is_reported_usage_plus_estimate_of_what_came_since(mod, api, client):
    usage = {"input_tokens": 5_000, "cache_read_input_tokens": 40_000,
             "cache_creation_input_tokens": 2_000, "output_tokens": 300}
    api.script([reply("noted", usage=usage)])
    reason, history = run(mod, client)
    assert reason == "end_turn"
    assert mod.CONTEXT_WINDOW == 200_000 and mod.OUTPUT_RESERVE == 20_000
    assert mod.SAFETY_MARGIN == 13_000 and mod.AUTO_COMPACT_AT == 167_000
    assert abs(mod.context_tokens(history) - 47_300) <= 2  # the API's own numbers
    mod.add_user_text(history, "y" * 4_000)                  # ~1,000 tokens appended since
    assert 48_250 <= mod.context_tokens(history) <= 48_350


@each
def test_context_size_after_a_tool_round_adds_only_the_results(mod, api, client):
    seen = []
    history = [{"role": "user", "content": "go"}]

    def second(body):               # runs while the chapter waits for this reply
        seen.append(mod.context_tokens(history))
        return reply("done")

    api.script([reply(tool("bash", {"command": "printf 'x%.0s' $(seq 1 400)"}),
                      usage={"input_tokens": 9_000, "output_tokens": 40}), second])
    assert mod.agent_loop(client, history) == "end_turn"
    assert 9_040 + 95 <= seen[0] <= 9_040 + 130            # 400 chars of output ~ 100 tokens


@each
def test_without_reported_usage_count_tokens_is_the_fallback(mod, api, client, monkeypatch):
    monkeypatch.setattr(mod, "WORKING_BUDGET", 1_000)
    history = history_of(4, size=2_000)                     # no usage recorded: a resumed session
    mod.add_user_text(history, "continue")
    api.script([reply("ok")])
    assert mod.agent_loop(client, history) == "end_turn"
    assert any(r["path"].endswith("/count_tokens") for r in api.requests)
    assert api.requests[0]["path"].endswith("/count_tokens")


# --- layer 1: large results to disk ------------------------------------------------

@each
def test_huge_output_is_saved_to_disk_and_replaced_once_by_preview_and_path(mod, api, client, workspace):
    call = tool("bash", {"command": "seq 1 60000"})
    api.script([reply(call), reply(tool("bash", {"command": "echo next"})), reply("done")])
    reason, history = run(mod, client)
    assert reason == "end_turn"
    full = "".join(f"{n}\n" for n in range(1, 60001))
    saved = workspace / ".agent" / "tool-results" / f"{call['id']}.txt"
    assert saved.read_text() == full                        # the file holds all of it
    seen = [results_in(b).get(call["id"]) for b in message_bodies(api)[1:]]
    assert seen[0] == seen[1]                               # replaced once, then stable
    shown = seen[0]
    assert shown.startswith("<persisted-output>") and shown.endswith("</persisted-output>")
    assert f".agent/tool-results/{call['id']}.txt" in shown and "1\n2\n3\n" in shown
    assert len(shown) < 2_000 + 500 and "59999" not in shown   # the preview: 2,000 characters
    assert history[2]["content"][0]["content"] == shown      # the history holds the preview


@each
def test_results_of_one_message_over_budget_save_the_largest_first(mod, workspace):
    sizes = {"a": 24_000, "b": 28_000, "c": 26_000, "d": 22_000, "r": 29_000}
    calls = [SimpleNamespace(id=f"toolu_{k}", name="read_file" if k == "r" else "bash") for k in sizes]
    results = [{"type": "tool_result", "tool_use_id": f"toolu_{k}", "content": k * n}
               for k, n in sizes.items()]
    mod.persist_large_results(calls, results)
    saved = {r["tool_use_id"] for r in results if r["content"].startswith("<persisted-output>")}
    assert saved == {"toolu_b", "toolu_c"}     # largest movable first, until within budget
    assert sum(len(r["content"]) for r in results) <= 90_000     # the documented message budget
    assert (workspace / ".agent" / "tool-results" / "toolu_b.txt").read_text() == "b" * 28_000
    assert results[4]["content"] == "r" * 29_000   # read_file is exempt, even when largest


@each
def test_reading_a_saved_result_with_read_file_does_not_save_it_again(mod, api, client, workspace):
    big = tool("bash", {"command": "seq 1 20000"})
    saved = f".agent/tool-results/{big['id']}.txt"
    again = tool("read_file", {"path": saved, "offset": 100, "limit": 19_900})
    api.script([reply(big), reply(again), reply("done")])
    assert run(mod, client)[0] == "end_turn"
    shown = results_in(message_bodies(api)[2])[again["id"]]
    assert not shown.startswith("<persisted-output>") and "   100\t100\n" in shown
    assert len(shown) > 30_000                              # over the persist line, yet left alone
    assert len(list((workspace / ".agent" / "tool-results").glob("*.txt"))) == 1


@each
def test_saved_results_stay_out_of_git(mod, api, client, workspace):
    """A saved result is the agent's scratch, not a project file: the folder keeps
    a .gitignore of "*", so git status in a repository workspace stays clean of it."""
    subprocess.run(["git", "init", "-q"], cwd=workspace, check=True)
    call = tool("bash", {"command": "seq 1 60000"})
    api.script([reply(call), reply("done")])
    assert run(mod, client)[0] == "end_turn"
    assert (workspace / ".agent" / "tool-results" / f"{call['id']}.txt").exists()
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=workspace,
                            capture_output=True, text=True, check=True).stdout
    assert "tool-results" not in status


@each
def test_a_planted_gitignore_link_in_the_results_folder_is_not_written_through(mod, workspace, tmp_path):
    """The .gitignore is made through the door with O_EXCL: a link already there,
    even one pointing nowhere yet, is left alone and the result is still saved."""
    folder = workspace / ".agent" / "tool-results"
    folder.mkdir(parents=True)
    (folder / ".gitignore").symlink_to(tmp_path / "planted")
    block = {"type": "tool_result", "tool_use_id": "toolu_big", "content": "x" * 40_000}
    mod.persist_output(block)
    assert not (tmp_path / "planted").exists()
    assert (folder / "toolu_big.txt").read_text() == "x" * 40_000


# --- old tool results: batch clearing --------------------------------------------

def reading_session(mod, api, client, workspace, n, size=2_000):
    for i in range(n):
        (workspace / f"f{i:02d}.txt").write_text(f"FILE-{i:02d}\n" + "z" * size + f"\nEND-{i:02d}\n")
    calls = [tool("read_file", {"path": f"f{i:02d}.txt"}) for i in range(n)]
    api.script([reply(c) for c in calls] + [reply("read them all")])
    reason, history = run(mod, client, "read every file")
    assert reason == "end_turn"
    return calls, history


@each
def test_old_results_are_cleared_in_batches_after_the_model_saw_them(mod, api, client, workspace,
                                                                     monkeypatch):
    monkeypatch.setattr(mod, "WORKING_BUDGET", 6_000)
    monkeypatch.setattr(mod, "KEEP_RESULTS", 2)
    calls, history = reading_session(mod, api, client, workspace, 16)
    reqs = message_bodies(api)
    for call in calls:   # each result arrives in full before any request shows it cleared
        states = [("END-" in c) if c else None for c in (results_in(b).get(call["id"]) for b in reqs)]
        first = states.index(True)
        assert False not in states[:first] and None not in states[first:]
        assert all(states[first:first + 2])              # full while among the 2 newest (KEEP_RESULTS)
        shown = states[first:]                           # and once cleared, cleared for good
        assert shown == sorted(shown, reverse=True), shown
    cleared = [c for c in calls if "old tool result cleared" in results_in(reqs[-1])[c["id"]]]
    assert len(cleared) >= 8 and calls[-1] not in cleared and calls[-2] not in cleared
    breaks = [k for k in range(1, len(reqs))
              if strip_cc(reqs[k]["messages"][:len(reqs[k - 1]["messages"])]) != strip_cc(reqs[k - 1]["messages"])]
    assert 1 <= len(breaks) <= len(reqs) // 3              # batches, not every turn
    # the history itself still holds every result; only the copy sent was cleared
    kept = "".join(dump(m) for m in history)
    assert all(f"END-{i:02d}" in kept for i in range(16))


@each
def test_a_result_is_never_cleared_before_the_model_has_seen_it(mod, api, client, workspace,
                                                                monkeypatch):
    monkeypatch.setattr(mod, "WORKING_BUDGET", 0)
    monkeypatch.setattr(mod, "KEEP_RESULTS", 0)
    monkeypatch.setattr(mod, "CLEAR_PAYBACK", math.inf)     # any batch pays: clear every turn
    calls, _ = reading_session(mod, api, client, workspace, 4)
    reqs = message_bodies(api)
    for k, call in enumerate(calls):
        assert f"END-{k:02d}" in results_in(reqs[k + 1])[call["id"]]       # full, once
        if k + 2 < len(reqs):
            assert "old tool result cleared" in results_in(reqs[k + 2])[call["id"]]


@each
def test_a_cold_cache_clears_old_results_even_under_budget(mod, api, client, workspace):
    calls, history = reading_session(mod, api, client, workspace, 5)
    assert "END-00" in results_in(message_bodies(api)[-1])[calls[0]["id"]]          # warm: kept
    mod.last_usage(history)["at"] -= 5 * 60 + 1                              # 5 minutes idle
    mod.add_user_text(history, "and now?")
    api.script([reply("fine")])
    assert mod.agent_loop(client, history) == "end_turn"
    last = results_in(message_bodies(api)[-1])
    # all but the newest KEEP_RESULTS
    keep = mod.KEEP_RESULTS
    assert [("old tool result cleared" in last[c["id"]]) for c in calls] == [True] * (5 - keep) + [False] * keep


@each
def test_a_batch_clear_waits_until_it_frees_a_meaningful_amount(mod, api, client, workspace,
                                                               monkeypatch):
    # A big write (its tool_use input is never cleared: floor) and a budget so small
    # that the results pass it every turn; small results age out one per turn.
    # Clearing each one as it ages out would break the cached prefix, and make the
    # next request write all its messages again, on every turn for ~1K tokens: a
    # batch waits until it frees about half the messages (CLEAR_PAYBACK).
    monkeypatch.setattr(mod, "WORKING_BUDGET", 1_000)
    steps = [reply(tool("write_file", {"path": "big.txt", "content": "w" * 16_000}))]
    steps += [reply(tool("bash", {"command": f"head -c 4000 big.txt; echo {i}"})) for i in range(14)]
    api.script(steps + [reply("done")])
    assert run(mod, client)[0] == "end_turn"
    reqs = message_bodies(api)
    cleared = [sum("old tool result cleared" in str(c) for c in results_in(b).values()) for b in reqs]
    breaks = [k for k in range(1, len(reqs)) if cleared[k] != cleared[k - 1]]
    assert 1 <= len(breaks) <= 3 and cleared[-1] >= 5      # a few big batches, not one a turn
    assert all(cleared[k] - cleared[k - 1] >= 4 for k in breaks)


@each
def test_placeholder_names_the_file_the_result_is_in(mod):
    plain = {"type": "tool_result", "tool_use_id": "t1", "content": "model saved to: /tmp/m.bin\nok"}
    stub = mod.cleared_stub(plain)["content"]
    assert ".agent/tool-results/t1.txt" in stub and "/tmp/m.bin" not in stub  # kept_path, not its text
    saved = ("<persisted-output>\nOutput too large (40,000 characters). Full output saved to: "
             ".agent/tool-results/t2.txt\nRead it with read_file")
    shown = mod.cleared_stub({"type": "tool_result", "tool_use_id": "t2", "content": saved})["content"]
    assert ".agent/tool-results/t2.txt" in shown


# --- prompt caching -----------------------------------------------------------

def breakpoints(obj):
    return dump(obj).count('"cache_control"')


@each
def test_cache_breakpoints_on_tools_system_and_newest_messages(mod, api, client, workspace):
    (workspace / "a.txt").write_text("alpha\n")
    api.script([reply(tool("read_file", {"path": "a.txt"})),
                reply(tool("bash", {"command": "echo hi"})), reply("done")])
    reason, history = run(mod, client)
    assert reason == "end_turn"
    reqs = message_bodies(api)
    for body in reqs:
        assert breakpoints(body) <= 4
        assert "cache_control" in body["tools"][-1] and "cache_control" in body["system"][-1]
        assert "cache_control" in body["messages"][-1]["content"][-1]
        if len(body["messages"]) >= 3:
            assert "cache_control" in body["messages"][-3]["content"][-1]
    assert all(b["system"] == reqs[0]["system"] and b["tools"] == reqs[0]["tools"] for b in reqs)
    for prev, cur in zip(reqs, reqs[1:]):   # each request extends the last one byte for byte
        assert strip_cc(cur["messages"][:len(prev["messages"])]) == strip_cc(prev["messages"])
    assert "cache_control" not in dump(history) and "cache_control" not in dump(mod.TOOLS)


@each
def test_status_line_shows_cache_tokens_and_cost(mod, api, client, capsys):
    api.script([reply("hi", usage={"input_tokens": 100, "cache_read_input_tokens": 1_000,
                                   "cache_creation_input_tokens": 200, "output_tokens": 10})])
    assert run(mod, client)[0] == "end_turn"
    err = capsys.readouterr().err
    assert "cache read 1,000" in err and "cache write 200" in err
    assert "~$0.0015" in err        # (100 + 1000*0.1 + 200*1.25) * $3/M + 10 * $15/M


# --- layer 2: auto-compaction --------------------------------------------------------

@each
def test_usage_near_the_window_triggers_compaction(mod, api, client, workspace, monkeypatch):
    monkeypatch.setattr(mod, "KEEP_TAIL_MESSAGES", 2)
    for name in "abc":
        (workspace / f"{name}.txt").write_text(f"{name.upper()} version 1\n")

    def summary_step(body):          # b.txt changes while the summary is written
        (workspace / "b.txt").write_text("B version 2\n")
        return reply(SUMMARY)

    api.script([reply(tool("read_file", {"path": "a.txt"})),
                reply(tool("read_file", {"path": "b.txt"})),
                reply(tool("read_file", {"path": "c.txt"}), usage={"input_tokens": 168_000}),
                summary_step, reply("done")])
    history = [{"role": "user", "content": "PROMPT-ONE: read the three files"}]
    before = []
    real = mod.save_transcript
    monkeypatch.setattr(mod, "save_transcript", lambda m: before.append(copy.deepcopy(m)) or real(m))
    assert mod.agent_loop(client, history) == "end_turn"
    assert kinds(api) == ["main", "main", "main", "summary", "main"]
    summary_req, after = message_bodies(api)[3], message_bodies(api)[4]
    # the summary call: the 9-section prompt, analysis then summary, no tool usable
    prompt = dump(summary_req["messages"][-1])
    for section in ("<analysis>", "<summary>", "1. Primary request", "6. All user messages",
                    "9. Possible next step", "Do NOT call any tool"):
        assert section in prompt
    assert "PROMPT-ONE" in dump(summary_req["messages"])
    first = dump(after["messages"][0])
    assert "SUMMARY-TEXT" in first and "DRAFT-NOTES" not in first     # only the summary kept
    assert "B version 2" in first and "A version 1" in first           # recent files, re-read
    assert "PROMPT-ONE" not in dump(after["messages"])                 # summarised away...
    transcript = next((workspace / ".agent" / "transcripts").glob("*.jsonl"))
    lines = [json.loads(line) for line in transcript.read_text().splitlines()]
    assert lines == before[0]                                          # ...but saved in full
    assert str(transcript.relative_to(workspace)) in first
    assert "C version 1" in dump(after["messages"][1:])                # the tail, verbatim
    check_history(history)


@each
def test_compaction_never_splits_parallel_tool_calls(mod, api, client, monkeypatch):
    base = history_of(6, size=300, parallel={1, 2, 4, 5})
    for keep in range(1, len(base)):
        monkeypatch.setattr(mod, "KEEP_TAIL_MESSAGES", keep)
        api.reset()
        history = copy.deepcopy(base)
        api.script([reply(SUMMARY), reply("continuing")])
        mod.compact_now(client, history)
        assert is_summary(message_bodies(api)[0])
        check_history(history)
        assert history[0]["role"] == "user" and "SUMMARY-TEXT" in dump(history[0])
        ids = lambda h, kind: {b.get("id") or b.get("tool_use_id") for m in h if not isinstance(m["content"], str)
                               for b in m["content"] if b["type"] == kind}
        assert ids(history, "tool_use") == ids(history, "tool_result")
        mod.add_user_text(history, "go on")
        assert mod.agent_loop(client, history) == "end_turn"  # and the api fixture checks validity
        assert not api.invalid(), (keep, api.invalid()[0]["error"])


@each
def test_compaction_tail_is_about_ten_thousand_tokens_or_five_messages(mod):
    small = history_of(8, size=100)
    start = mod.tail_start(small)
    assert len(small) - start in (5, 6)                     # 5, or 6 to keep a call with its result
    big = history_of(8, size=50_000)                        # ~12.5K tokens per result
    assert len(big) - mod.tail_start(big) == 3              # last reply + one call with its result


@each
def test_recently_read_files_are_reattached_at_most_five_and_capped(mod, api, client, workspace):
    # r0..r7 are read in turn, then r3 again: the kept tail (the last 5
    # messages) holds the reads of r7 and r3, the part summarised the reads of
    # r0..r6: seven files, so the cap of five applies, and r3 is not re-attached
    # (the tail already has it).
    history = [{"role": "user", "content": "read them"}]
    for n, i in enumerate([0, 1, 2, 3, 4, 5, 6, 7, 3]):
        (workspace / f"r{i}.txt").write_text(f"R{i}-HEAD\n" + f"line {i}\n" * 10_000)
        history += [{"role": "assistant", "content": [
                        {"type": "tool_use", "id": f"toolu_r{n}", "name": "read_file",
                         "input": {"path": f"r{i}.txt"}}]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": f"toolu_r{n}", "content": "(read)"}]}]
    history.append({"role": "assistant", "content": [text("read them all")]})
    api.script([reply(SUMMARY)])
    mod.compact_now(client, history)
    tail = dump(history[1:])
    assert "r7.txt" in tail and "r3.txt" in tail and "r6.txt" not in tail   # the cut assumed above
    attached = [b["text"] for b in history[0]["content"][1:]]
    heads = [next(w for w in a.split() if w.endswith("-HEAD")) for a in attached]
    assert heads == ["R6-HEAD", "R5-HEAD", "R4-HEAD", "R2-HEAD", "R1-HEAD"]  # newest first, five
    assert all(len(a) < 20_000 + 300 for a in attached)                   # capped...
    assert all("line" in a and "[truncated" in a for a in attached)      # ...with a marker


@each
def test_circuit_breaker_after_three_failures_and_the_forced_line_above_it(mod, api, client,
                                                                            monkeypatch, capsys):
    monkeypatch.setattr(mod, "KEEP_TAIL_MESSAGES", 1)
    near, past = {"input_tokens": 170_000}, {"input_tokens": 178_000}
    step = lambda n, usage: reply(tool("bash", {"command": f"echo {n}"}), usage=usage)
    api.script([step(1, near), error(500), step(2, near), error(500), step(3, near), error(500),
                step(4, near),                 # breaker open: no compaction attempt
                step(5, past),                 # past the forced line: compaction anyway
                reply(SUMMARY), reply("done")])
    reason, history = run(mod, client)
    assert reason == "end_turn"
    assert kinds(api) == ["main", "summary", "main", "summary", "main", "summary",
                          "main", "main", "summary", "main"]
    assert "compaction failed (3/3" in capsys.readouterr().err
    assert mod.agent_state().compaction["failures"] == 0              # a success closes the breaker
    assert "SUMMARY-TEXT" in dump(message_bodies(api)[-1]["messages"][0])
    check_history(history)


@each
def test_the_model_can_ask_for_compaction_with_a_focus(mod, api, client):
    api.script([reply(tool("compact", {"focus": "FOCUS-PARSER"})), reply(SUMMARY), reply("done")])
    reason, history = run(mod, client, "PROMPT-TWO")
    assert reason == "end_turn"
    assert kinds(api) == ["main", "summary", "main"]
    assert "FOCUS-PARSER" in dump(message_bodies(api)[1]["messages"][-1])
    assert "SUMMARY-TEXT" in dump(message_bodies(api)[2]["messages"][0])
    check_history(history)


@each
def test_compact_now_mutates_the_history_in_place(mod, api, client):
    history = history_of(6)
    api.script([reply(SUMMARY)])
    assert mod.compact_now(client, history, "the tests") is history
    assert "SUMMARY-TEXT" in dump(history[0]) and len(history) < 14
    assert "the tests" in dump(message_bodies(api)[0]["messages"][-1])


@each
def test_a_one_message_history_has_nothing_to_compact_and_never_crashes(mod, api, client,
                                                                        monkeypatch, capsys):
    history = [{"role": "user", "content": "first prompt"}]      # after a failed first turn
    ctx = {"client": client, "history": history}
    assert mod.handle_slash("/compact", ctx) is None
    assert "error" not in ctx and history == [{"role": "user", "content": "first prompt"}]
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "nothing to compact" in err[0] and message_bodies(api) == []
    monkeypatch.setattr(mod, "AUTO_COMPACT_AT", 1_000)          # a huge first prompt
    api.script([reply("read it all")])
    reason, history = run(mod, client, "x " * 5_000)
    assert reason == "end_turn" and kinds(api) == ["main"]    # nothing older: sent as it is
    check_history(history)


# --- error recovery -----------------------------------------------------------

@each
def test_prompt_too_long_compacts_and_retries_the_same_turn(mod, api, client, monkeypatch):
    monkeypatch.setattr(mod, "KEEP_TAIL_MESSAGES", 2)
    api.script([reply(tool("bash", {"command": "echo one"})),
                reply(tool("bash", {"command": "echo two"})),
                error(400, TOO_LONG), reply(SUMMARY), reply("done")])
    reason, history = run(mod, client, "PROMPT-THREE")
    assert reason == "end_turn"
    assert kinds(api) == ["main", "main", "main", "summary", "main"]
    failed, retried = message_bodies(api)[2], message_bodies(api)[4]
    assert strip_cc(failed["messages"][-1]) == strip_cc(retried["messages"][-1])   # same turn
    assert "SUMMARY-TEXT" in dump(retried["messages"][0]) and "PROMPT-THREE" not in dump(retried)
    check_history(history)


@each
def test_prompt_too_long_twice_fails_with_one_line_and_a_valid_history(mod, api, client,
                                                                      monkeypatch, capsys):
    monkeypatch.setattr(mod, "KEEP_TAIL_MESSAGES", 2)
    api.script([reply(tool("bash", {"command": "echo one"})), error(400, TOO_LONG),
                reply(SUMMARY), error(400, TOO_LONG)])
    reason, history = run(mod, client)
    assert reason == "api_error" and kinds(api) == ["main", "main", "summary", "main"]
    assert len([ln for ln in capsys.readouterr().err.splitlines() if "API error" in ln]) == 1
    check_history(history)
    mod.add_user_text(history, "try again")
    api.script([reply("ok now")])
    assert mod.agent_loop(client, history) == "end_turn"


@each
def test_max_tokens_stop_is_continued(mod, api, client):
    api.script([reply(text("PART-ONE of the answer"), tool("bash", {"command": "ec"}),
                      stop_reason="max_tokens"),
                reply("PART-TWO, finished")])
    reason, history = run(mod, client)
    assert reason == "end_turn"
    second = message_bodies(api)[1]["messages"]
    assert second[-2] == {"role": "assistant", "content": [text("PART-ONE of the answer")]}
    assert "Continue exactly where it stopped" in dump(second[-1])
    assert "tool_use" not in dump(second)                   # the cut call is dropped
    assert history[-1]["content"] == [text("PART-TWO, finished")]


@each
def test_max_tokens_continuations_are_bounded(mod, api, client):
    n = 3 + 1                                               # the documented 3 continuations
    api.script([reply(f"piece {k}", stop_reason="max_tokens") for k in range(n)] + [reply("never")])
    reason, history = run(mod, client)
    assert reason == "end_turn" and len(message_bodies(api)) == n and api.remaining() == 1
    check_history(history)


@each
def test_repeated_overload_backs_off_then_succeeds(fast, api, client, capsys):
    api.script([error(529), error(529), error(429), reply("made it")])
    reason, history = run(fast, client)
    assert reason == "end_turn" and len(message_bodies(api)) == 4
    assert history[-1]["content"] == [text("made it")]
    assert capsys.readouterr().err.count("retry ") == 3


@each
@pytest.mark.slow("s06")                     # real waits: 0.35 s of backoff, then a 0.4 s retry-after
def test_backoff_is_exponential_and_honours_retry_after(mod, api, client, monkeypatch):
    monkeypatch.setattr(mod, "RETRY_BASE_DELAY", 0.05)
    monkeypatch.setattr(mod, "RETRY_JITTER", 0.0)
    api.script([error(529), error(529), error(529), reply("ok")])
    began = time.monotonic()
    assert run(mod, client)[0] == "end_turn"
    assert time.monotonic() - began >= 0.05 + 0.1 + 0.2
    assert [round(mod.backoff_delay(k, None), 2) for k in range(3)] == [0.05, 0.1, 0.2]
    monkeypatch.setattr(mod, "RETRY_BASE_DELAY", 0.0)
    api.reset()
    api.script([error(429, headers={"retry-after": "0.4"}), reply("ok")])
    began = time.monotonic()
    assert run(mod, client)[0] == "end_turn"
    assert time.monotonic() - began >= 0.4


@each
def test_retries_are_bounded_then_one_clear_line_and_a_valid_history(fast, api, client, capsys):
    api.script([error(529)] * (4 + 1) + [reply("later")])   # the documented 4 retries
    reason, history = run(fast, client)
    assert reason == "api_error" and len(message_bodies(api)) == 4 + 1
    failures = [ln for ln in capsys.readouterr().err.splitlines() if "API error" in ln]
    assert len(failures) == 1 and "529" in failures[0]
    assert history == [{"role": "user", "content": "do the work"}]
    fast.add_user_text(history, "again")
    assert fast.agent_loop(client, history) == "end_turn"


@each
def test_a_stream_cut_mid_reply_is_retried(fast, api, client, capsys):
    api.script([reply("a" * 60, cut_after=5), hangup(), reply("a" * 36 + ", the whole answer")])
    reason, history = run(fast, client)
    assert reason == "end_turn" and len(message_bodies(api)) == 3
    first, retried = message_bodies(api)[0], message_bodies(api)[2]         # the same request, continued
    assert strip_cc(retried["messages"][:-1]) == strip_cc(first["messages"])
    assert strip_cc(retried["messages"][-1]) == {"role": "assistant", "content": [text("a" * 24)]}
    assert history[-1]["content"] == [text("a" * 60 + ", the whole answer")]
    assert capsys.readouterr().err.count("retry ") == 2


@each
def test_other_errors_fail_the_turn_at_once_with_one_line(fast, api, client, capsys):
    api.script([error(400, "messages: something odd"), reply("unused")])
    reason, history = run(fast, client)
    assert reason == "api_error" and len(message_bodies(api)) == 1
    err = capsys.readouterr().err.splitlines()
    assert len([ln for ln in err if "API error" in ln]) == 1 and "retry" not in " ".join(err)
    check_history(history)


@each
def test_prompt_too_long_on_the_first_message_fails_with_one_clear_line(fast, api, client, capsys):
    api.script([error(400, TOO_LONG), reply("unused")])
    reason, history = run(fast, client, "PASTED-LOG")
    assert reason == "api_error" and kinds(api) == ["main"]   # no summary of nothing
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "prompt itself is too large" in err[0], err
    assert history == []                  # dropped: it would fail every later turn too
    fast.add_user_text(history, "shorter")
    api.script([reply("ok")])
    assert fast.agent_loop(client, history) == "end_turn"
    assert "PASTED-LOG" not in str(api.requests[-1]["body"]["messages"])


@each
def test_a_stream_cut_ends_the_partial_line_and_says_so(fast, api, client, capsys):
    answer = "The answer is forty-two, because reasons."
    call = tool("bash", {"command": "echo 42"})              # cut inside it: no prefill possible
    api.script([reply(answer, call, cut_after=9), reply(answer, call), reply("Done.")])
    reason, history = run(fast, client)
    assert reason == "end_turn"
    out, err = capsys.readouterr()
    partial, full, done = out.splitlines()                   # the cut line ended on its own
    assert full == partial == answer and done == "Done."
    assert "[stream cut in a reply that cannot be continued" in err


# --- subagents: each loop its own context ----------------------------------------

@each
def test_a_child_loop_keeps_its_own_compaction_state_and_prefix(mod, api, client, capsys):
    mod.agent_state().compaction["failures"] = 2                      # the parent's breaker: one from open
    api.script([reply(tool("agent", {"prompt": "look around"})),
                reply(tool("compact", {"focus": "CHILD-FOCUS"})),   # child
                error(400, "summary refused"),                      # child's summary call fails
                reply("child report"),                              # child
                reply("parent final")])
    reason, history = run(mod, client)
    assert reason == "end_turn"
    assert kinds(api) == ["main", "main", "summary", "main", "main"]
    assert mod.agent_state().compaction["failures"] == 2 and not mod.agent_state().compaction["requested"]
    assert mod.agent_state().compaction["focus"] is None
    child, summary = message_bodies(api)[1], message_bodies(api)[2]        # the child's own prompt prefix
    assert strip_cc(summary["system"]) == strip_cc(child["system"])
    assert strip_cc(summary["tools"]) == strip_cc(child["tools"])
    err = capsys.readouterr().err                          # cost: one session total
    costs = [float(c) for c in re.findall(r"~\$([\d.]+), session", err)]
    session = float(re.findall(r"session ~\$([\d.]+)", err)[-1])
    assert len(costs) == 4 and abs(session - sum(costs)) < 0.0005


@each
def test_compaction_requests_never_cross_between_parent_and_child(mod, api, client, workspace):
    history = history_of(3)
    mod.add_user_text(history, "tidy up, then count the files")
    api.script([reply(tool("compact", {"focus": "PARENT-FOCUS"}), tool("agent", {"prompt": "count"})),
                reply("child report"),          # the child: not a compaction
                reply(SUMMARY),                 # the parent's own, with its focus
                reply("parent final")])
    assert mod.agent_loop(client, history) == "end_turn"
    assert kinds(api) == ["main", "main", "summary", "main"]
    assert "PARENT-FOCUS" in dump(message_bodies(api)[2]["messages"][-1])
    assert "start the work" in dump(message_bodies(api)[2]["messages"])
    check_history(history)
    agents = workspace / ".agent" / "agents"
    agents.mkdir(parents=True)
    (agents / "one.md").write_text("---\nname: one\ndescription: d\nmax_turns: 1\n---\nbody\n")
    api.reset()
    mod.add_user_text(history, "once more")
    api.script([reply(tool("agent", {"prompt": "x", "agent_type": "one"})),
                reply(tool("compact", {"focus": "CHILD-FOCUS"})),   # the child's last turn
                reply("parent final")])
    assert mod.agent_loop(client, history) == "end_turn"
    assert kinds(api) == ["main", "main", "main"]           # the parent did not compact
    assert not mod.agent_state().compaction["requested"]


@each
def test_a_subagent_report_continued_after_max_tokens_is_whole(mod, api, client):
    api.script([reply(tool("agent", {"prompt": "write the report"})),
                reply("PART-ONE of the report, ", stop_reason="max_tokens"),   # child, cut
                reply("PART-TWO."),                                            # child, continued
                reply("done")])
    reason, history = run(mod, client)
    assert reason == "end_turn"
    report = history[2]["content"][0]["content"]
    assert report.startswith("PART-ONE of the report, PART-TWO.") and "Continue" not in report


@each
def test_a_fork_sees_old_results_as_cleared_as_the_parent_sent_them(mod, api, client, workspace,
                                                                    monkeypatch):
    monkeypatch.setattr(mod, "WORKING_BUDGET", 1_500)       # results of ~500 tokens (a line is cut at 2,000)
    for i in range(6):
        (workspace / f"f{i}.txt").write_text(f"FILE-{i}\n" + "z" * 4_000 + f"\nEND-{i}\n")
    calls = [tool("read_file", {"path": f"f{i}.txt"}) for i in range(6)]
    api.script([reply(c) for c in calls] + [reply(tool("agent", {"prompt": "sum up", "fork": True})),
                                            reply("Scope: fork report"), reply("done")])
    assert run(mod, client)[0] == "end_turn"
    parent, fork = message_bodies(api)[6], message_bodies(api)[7]          # the agent call's request, the fork's
    assert "<fork_boilerplate>" in dump(fork["messages"][-1])
    cleared = {i for i, c in results_in(parent).items() if "old tool result cleared" in c}
    assert cleared and all("old tool result cleared" in results_in(fork)[i] for i in cleared)


# --- end to end ------------------------------------------------------------------

@each
@pytest.mark.e2e("s06")
def test_repl_compact_line_runs_compaction_with_its_focus(mod, api, workspace):
    api.script([reply("hello back"), reply(SUMMARY), reply("still here")])
    p = run_chapter(mod.__name__, api=api, cwd=workspace,
                    input="hello there\n/compact the parser work\nwhat next?\n")
    assert p.returncode == 0, p.stderr
    assert kinds(api) == ["main", "summary", "main"]
    assert "the parser work" in dump(message_bodies(api)[1]["messages"][-1])
    assert "SUMMARY-TEXT" in dump(message_bodies(api)[2]["messages"])
    assert "[compacted (requested)" in p.stderr
    assert len(list((workspace / ".agent" / "transcripts").glob("*.jsonl"))) == 1


# On the newest file only: `demo.py s06` runs this scenario on s06 (test_demos.py).
@pytest.mark.parametrize("mod", chapters_from("s06")[-1:], indirect=True)
@pytest.mark.e2e("s06")
def test_demo_scenario_compacts_visibly(mod, api, workspace):
    spec = importlib.util.spec_from_file_location("scenario_s06", TESTS / "scenarios" / "s06.py")
    scenario = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scenario)
    scenario.SETUP(workspace)
    api.script(list(scenario.STEPS))
    p = run_chapter(mod.__name__, scenario.PROMPT, api=api, cwd=workspace)
    assert p.returncode == 0, p.stderr
    assert "<persisted-output>" in dump(message_bodies(api))
    assert "[compacted (" in p.stderr and "summary" in kinds(api)
    assert api.remaining() == 0 and api.exhausted == 0
