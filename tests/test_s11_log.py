"""s11: the team's message log, .agent/team/<team>/messages.jsonl.

An inbox is emptied when its owner reads it, so the log is the team's one record
of what was said: each record post() delivered, one line per delivery, appended
under the log's own lock, bounded by LOG_BYTES, never through a planted link.
"""
import json
import os

import pytest

from test_s11_teams import make_crew, member  # noqa: F401
from conftest import chapters_from

pytestmark = pytest.mark.parametrize("mod", chapters_from("s11"), indirect=True)


@pytest.fixture
def crew(mod, workspace):
    return make_crew(mod, bob_plans=False)


def log_path(workspace):
    return workspace / ".agent" / "team" / "crew" / "messages.jsonl"


def logged(workspace):
    path = log_path(workspace)
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_every_delivered_record_lands_in_the_log_in_order(crew, workspace):
    mod = crew
    sent = mod.post("alice", "message", "write the parser")[0]
    with mod.acting_as(member(mod, workspace, "alice")):
        sent += mod.post("lead", "message", "parser.py is done")[0]
        sent += mod.post("bob", "message", "parse(path) is ready for your tests")[0]
    sent += mod.post("bob", "shutdown_request", "we are done")[0]
    assert logged(workspace) == sent                                  # the same records, in order
    assert [(r["from"], r["to"], r["type"]) for r in logged(workspace)] == [
        ("lead", "alice", "message"), ("alice", "lead", "message"), ("alice", "bob", "message"),
        ("lead", "bob", "shutdown_request")]
    with mod.acting_as(member(mod, workspace, "bob")):
        taken = mod.take_inbox(mod.inbox_path("bob"))                 # reading empties the inbox ...
    assert [r["id"] for r in taken] == [r["id"] for r in sent[2:]]
    assert logged(workspace) == sent                                  # ... never the log


def test_a_broadcast_logs_one_line_per_recipient_and_a_refused_send_none(crew, workspace):
    mod = crew
    with mod.acting_as(member(mod, workspace, "alice")):
        mod.send_message("*", "interface changed: parse(path, ctx)")
        with pytest.raises(mod.ToolError):
            mod.send_message("alice", "note to self")                 # refused: nothing delivered
    lines = logged(workspace)
    assert [(r["from"], r["to"], r["type"]) for r in lines] == [("alice", "lead", "broadcast"),
                                                                ("alice", "bob", "broadcast")]
    assert lines[0]["id"] == lines[1]["id"] and lines[0]["content"] == lines[1]["content"]


def test_the_log_stops_at_its_cap_and_says_so_once(crew, workspace, monkeypatch):
    mod = crew
    monkeypatch.setattr(mod, "LOG_BYTES", 2_000)
    for n in range(40):                                               # ~150 bytes a record: past the cap
        mod.post("alice", "message", f"message {n}")
    mod.post("alice", "message", "x")                                 # small: still not logged
    data = log_path(workspace).read_bytes()
    assert len(data) <= 2_000
    lines = data.decode().splitlines()
    assert data.endswith(mod.LOG_FULL) and data.count(mod.LOG_FULL) == 1
    records = [json.loads(line) for line in lines[:-1]]
    assert [r["content"] for r in records] == [f"message {n}" for n in range(len(records))]
    assert 5 < len(records) < 40
    with mod.acting_as(member(mod, workspace, "alice")):           # every message was delivered
        assert len(mod.take_inbox(mod.inbox_path("alice"))) == 41
    for cap in range(1_500, 1_700, 7):                                # wherever the last record ends,
        log_path(workspace).unlink()                                  # the marker still fits
        monkeypatch.setattr(mod, "LOG_BYTES", cap)
        for n in range(15):
            mod.post("bob", "message", f"message {n}")
        data = log_path(workspace).read_bytes()
        assert len(data) <= cap and data.endswith(mod.LOG_FULL) and data.count(mod.LOG_FULL) == 1, cap


def test_a_link_planted_at_the_log_is_never_followed(crew, workspace, tmp_path, capsys):
    mod = crew
    outside = tmp_path / "outside.txt"
    outside.write_text("not a log\n")
    log_path(workspace).symlink_to(outside)
    assert mod.send_message("alice", "hello") == "Sent message to alice."   # delivered all the same
    assert outside.read_text() == "not a log\n" and log_path(workspace).is_symlink()
    assert "message log is not written" in capsys.readouterr().err
    lock = workspace / ".agent" / "team" / "crew" / "messages.lock"   # and at its lock file
    log_path(workspace).unlink()
    lock.unlink()
    lock.symlink_to(outside)
    assert mod.send_message("alice", "again") == "Sent message to alice."
    assert outside.read_text() == "not a log\n" and not log_path(workspace).exists()
    lock.unlink()
    os.mkfifo(log_path(workspace))                                    # a FIFO would hang a plain open()
    assert mod.send_message("alice", "and again") == "Sent message to alice."
    with mod.acting_as(member(mod, workspace, "alice")):
        assert [r["content"] for r in mod.take_inbox(mod.inbox_path("alice"))] == ["hello", "again", "and again"]
