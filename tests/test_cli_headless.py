"""agent_full's -p result and init objects, held against the real Claude Code CLI (full.7).

The same scripted sessions run once through the CLI bundled with claude-agent-sdk,
offline against the scripted API (as tests/test_cli_corpus.py runs it), and once
through `agent_full.py -p`: a plain reply (stream-json: the init object too), a tool
call then a reply, an API error (a 404, which the CLI does not retry), --max-turns 1
hit, and --resume of an id no session has (json and stream-json). Every run has its
own scripted API, and as many run at once as there are CPUs.
Then: the same keys in the result and the init objects, the same num_turns,
terminal_reason, api_error_status, subtype, is_error and exit status, and modelUsage
in the CLI's shape. INTENDED is every difference left, with its reason.
"""
import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import ROOT, once_per_run
from fake_api import ScriptedAPI, error, reply, tool
from test_cli_corpus import cli_binary, cli_env

UNKNOWN = "0b7e5e3c-1111-4222-8333-444455556666"
OLD_ID = "20261201-101500-1a2b"  # a session file named the way agent_full named them before UUIDs
# Differences left, and why (docs/agent_full.md's Claude Code compatibility section lists them too).
INTENDED = {"resume exit status": "a --resume that finds nothing is a start-up error here, exit 2 as for "
                                  "every bad flag or config; the CLI exits 1",
            "resume json stdout": "with --output-format json the CLI prints the error on stderr only; "
                                  "agent_full prints the stream-json error object on stdout too, so a "
                                  "script reading stdout always gets one object"}


def bash(claude):
    return tool("Bash", {"command": "echo hi", "description": "Say hi"}) if claude else \
        tool("bash", {"command": "echo hi"})


# name: (format, extra flags, script(claude))
SCENARIOS = {
    "plain": ("stream-json", [], lambda c: [reply("Hello.")]),
    "tool": ("json", [], lambda c: [reply(bash(c)), reply("Done.")]),
    "api_error": ("json", [], lambda c: [error(404, "no such model")] * 4),
    "max_turns": ("json", ["--max-turns", "1"], lambda c: [reply(bash(c)), reply("Done.")]),
    "resume_json": ("json", ["--resume", UNKNOWN], lambda c: []),
    "resume_stream": ("stream-json", ["--resume", UNKNOWN], lambda c: []),
}


def old_session(work, home):
    """A session file with an old-style name, registered as this user's own."""
    folder = work / ".agent" / "sessions"
    folder.mkdir(parents=True)
    records = [{"type": "mode", "mode": "bypassPermissions"},
               {"type": "message", "i": 0, "message": {"role": "user", "content": "remember 7"}},
               {"type": "message", "i": 1, "message": {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}}]
    (folder / f"{OLD_ID}.jsonl").write_text("".join(json.dumps(r | {"ts": time.time()}) + "\n" for r in records))
    (home / ".agent").mkdir(parents=True)
    (home / ".agent" / "sessions.txt").write_text(f"{work}\t{OLD_ID}\n")


def start(side, name, api, root, binary):
    fmt, extra, steps = SCENARIOS.get(name) or ("json", ["--resume", OLD_ID], lambda c: [reply("It was 7.")])
    home, work = root / side / name / "home", root / side / name / "work"
    home.mkdir(parents=True)
    work.mkdir(parents=True)
    if name == "resume_old":
        old_session(work, home)
    api.script(steps(side == "cli"))
    flags = ["--output-format", fmt] + ["--verbose"] * (fmt == "stream-json") + \
        ["--permission-mode", "bypassPermissions"] + extra
    if side == "cli":
        cmd, env = [str(binary), "-p", "hi"] + flags, cli_env(api, home)
    else:
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG")}
        env |= {"HOME": str(home), "ANTHROPIC_API_KEY": "test", "ANTHROPIC_BASE_URL": api.url,
                "AGENT_AUTO_MEMORY": "0"}
        cmd = [sys.executable, str(ROOT / "agent_full.py"), "-p", "hi"] + flags
    proc = subprocess.Popen(cmd, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return proc, work


def run_all(root, binary, why):
    """Every run, as many at once as there are CPUs, each against its own scripted API."""
    jobs = [(side, name) for side in ("cli", "full") if side == "full" or binary
            for name in [*SCENARIOS, "resume_old"] if side == "full" or name != "resume_old"]
    out, running = {"cli": {} if binary else {"skip": why}, "full": {}}, []
    while jobs or running:
        while jobs and len(running) < max(2, os.cpu_count() or 1):
            job, api = jobs.pop(0), ScriptedAPI().start()
            running.append((job, api, *start(*job, api, root, binary)))
        (side, name), api, proc, work = running.pop(0)
        try:
            stdout, stderr = proc.communicate(timeout=120)
            api.settle()
            requests = [r["body"] for r in api.requests if r["path"].startswith("/v1/messages")]
        finally:
            api.close()
        sessions = work / ".agent" / "sessions"
        out[side][name] = {"returncode": proc.returncode, "stdout": stdout, "stderr": stderr[-3000:],
                           "objects": [json.loads(line) for line in stdout.splitlines() if line.strip()],
                           "sessions": sorted(p.stem for p in sessions.glob("*.jsonl")) if sessions.is_dir() else [],
                           "requests": requests}
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Once per test run, shared by the workers (once_per_run)."""
    return once_per_run(tmp_path_factory, "cli-headless", lambda root: run_all(root, *cli_binary()))


def pair(runs, name):
    if "skip" in runs["cli"]:
        pytest.skip(runs["cli"]["skip"])
    return runs["cli"][name], runs["full"][name]


def result(run):
    return next(o for o in reversed(run["objects"]) if o.get("type") == "result")


def full_run(runs, name):
    return runs["full"][name]


def init(run):
    return next(o for o in run["objects"] if o.get("subtype") == "init")


# --- the tests ------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["plain", "tool", "api_error", "max_turns", "resume_stream"])
def test_the_result_has_the_clis_keys(runs, name):
    cli, full = pair(runs, name)
    assert sorted(result(full)) == sorted(result(cli)), full["stderr"]


def test_init_has_the_clis_keys_and_a_version_the_sdk_takes(runs):
    cli, full = pair(runs, "plain")
    assert sorted(init(full)) == sorted(init(cli))
    from claude_agent_sdk._internal.transport import subprocess_cli as sdk
    version = init(full)["claude_code_version"]
    match = re.match(r"(\d{1,9})\.(\d{1,9})\.(\d{1,9})", version)       # the SDK's own test
    assert match and [int(x) for x in match.groups()] >= [int(x) for x in sdk.MINIMUM_CLAUDE_CODE_VERSION.split(".")]
    assert version.partition("+")[0] == init(cli)["claude_code_version"] and version.endswith("+agent-full")


@pytest.mark.parametrize("name", ["plain", "tool", "api_error", "max_turns"])
def test_the_result_means_what_the_clis_means(runs, name):
    cli, full = pair(runs, name)
    c, f = result(cli), result(full)
    for key in ("type", "subtype", "is_error", "num_turns", "terminal_reason", "api_error_status",
                "api_error_type", "stop_reason", "errors"):
        if key != "stop_reason" or name != "api_error":  # the CLI's: a made-up reply's "stop_sequence"
            assert f.get(key) == c.get(key), (key, f, c)
    assert full["returncode"] == cli["returncode"]
    if name == "plain":
        assert (f["result"], cli["returncode"]) == (c["result"], 0)


def test_api_error_has_the_http_status(runs):
    cli, full = pair(runs, "api_error")
    f = result(full)
    assert (f["api_error_status"], f["terminal_reason"], f["subtype"], f["is_error"]) == (404, "api_error", "success", True)
    assert "no such model" in f["result"] and full["returncode"] == 1 and len(full["requests"]) == 1


def test_model_usage_is_per_model_in_the_clis_shape(runs):
    cli, full = pair(runs, "tool")
    c, f = result(cli), result(full)
    [(model, entry)] = f["modelUsage"].items()
    [cli_entry] = c["modelUsage"].values()
    assert sorted(entry) == sorted(cli_entry) and model == full["requests"][0]["model"]
    assert entry["inputTokens"] == f["usage"]["input_tokens"] and entry["outputTokens"] == f["usage"]["output_tokens"]
    assert entry["cacheReadInputTokens"] == f["usage"]["cache_read_input_tokens"] > 0
    assert entry["cacheCreationInputTokens"] == f["usage"]["cache_creation_input_tokens"]
    assert entry["costUSD"] == pytest.approx(f["total_cost_usd"]) and entry["costUSD"] > 0
    assert entry["contextWindow"] > 0 and entry["maxOutputTokens"] > 0
    stream = result(full_run(runs, "plain"))
    assert stream["model_usage_since_last_result"] == stream["modelUsage"] != {}


def test_new_sessions_get_uuids_and_old_ids_still_resume(runs):
    f = result(full_run(runs, "tool"))
    assert str(uuid.UUID(f["session_id"])) == f["session_id"] and full_run(runs, "tool")["sessions"] == [f["session_id"]]
    old = full_run(runs, "resume_old")
    r = result(old)
    assert old["returncode"] == 0 and r["session_id"] == OLD_ID and r["result"] == "It was 7.", old["stderr"]
    assert old["sessions"] == [OLD_ID]
    assert "remember 7" in json.dumps(old["requests"][0]["messages"][0])  # the old history was sent


def test_resume_of_an_unknown_id_is_one_json_error_object(runs):
    cli, full = pair(runs, "resume_json")
    assert cli["returncode"] == 1 and cli["stdout"] == "" and UNKNOWN in cli["stderr"]   # INTENDED: see above
    [obj] = full["objects"]
    assert full["returncode"] == 2 and full["stdout"].count("\n") == 1 and full["requests"] == []
    assert (obj["type"], obj["subtype"], obj["is_error"]) == ("result", "error_during_execution", True)
    assert UNKNOWN in obj["errors"][0] and obj["startup_failure_reason"] == "resume_target_not_found"
    cli_s, full_s = pair(runs, "resume_stream")
    assert [o["type"] for o in full_s["objects"]] == [o["type"] for o in cli_s["objects"]] == ["result"]
    assert result(full_s)["startup_failure_reason"] == result(cli_s)["startup_failure_reason"]
