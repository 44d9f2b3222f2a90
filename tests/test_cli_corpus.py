"""The scripted API accepts what the real Claude Code CLI sends.

The fake's validator is modelled on the real Messages API; the real CLI is the
best witness of what that API takes, since everything it sends the service
serves. So the CLI bundled with claude-agent-sdk (requirements-oracle.txt)
runs here offline, in -p mode, against the scripted API, and every request it
makes must pass: a plain answer, then a Bash call (with a thinking block)
and its result.

tests/corpus/claude_cli_requests.jsonl keeps a snapshot of those requests, so
the validator meets them even where the CLI is not installed. Paths, ids and
the OS version are replaced by placeholders, and long prose (prompts, tool
descriptions) is shortened; the structure is kept as sent. Re-record it after
an update of the CLI:

    python tests/test_cli_corpus.py
"""
import http.client
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import once_per_run
from fake_api import ScriptedAPI, reply, tool

CORPUS = Path(__file__).resolve().parent / "corpus" / "claude_cli_requests.jsonl"
THINK = {"type": "thinking", "thinking": "The user wants the output of echo.", "signature": "sig-corpus-1"}
# name: (prompt, scripted replies, what the CLI prints as its result)
SCENARIOS = {
    "text": ("hi", [reply("Hello from the script.")], "Hello from the script."),
    "tool": ("run echo hi",
             [reply(THINK, "Running it.", tool("Bash", {"command": "echo hi", "description": "Print hi"})),
              reply("Done: hi.")],
             "Done: hi."),
}
SHORTEN = 240     # characters of prose kept in the snapshot


def cli_binary():
    """(path of the bundled CLI, None), or (None, why it cannot run here)."""
    spec = importlib.util.find_spec("claude_agent_sdk")
    if spec is None or spec.origin is None:
        return None, "claude-agent-sdk is not installed (pip install -r requirements-oracle.txt)"
    path = Path(spec.origin).parent / "_bundled" / "claude"
    if not path.is_file():
        return None, f"this claude-agent-sdk wheel bundles no CLI ({path.name} missing)"
    try:
        probe = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=60)
    except OSError as exc:
        return None, f"the bundled CLI cannot run here: {exc}"
    if probe.returncode != 0:
        return None, f"the bundled CLI cannot run here: {(probe.stderr or probe.stdout).strip()[:200]}"
    return path, None


def cli_env(api, home):
    """The CLI's environment: nothing of the caller's ANTHROPIC_/CLAUDE_ settings, a
    fresh HOME, no traffic but the scripted API. IS_SANDBOX lets it take
    bypassPermissions when run as root (as CI is)."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "NO_PROXY", "no_proxy")}
    return env | {"HOME": str(home), "ANTHROPIC_BASE_URL": api.url, "ANTHROPIC_API_KEY": "test",
                  "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
                  "DISABLE_TELEMETRY": "1", "IS_SANDBOX": "1"}


def run_cli(binary, api, scenario, root):
    """One `claude -p` run of a scenario; its result JSON, its requests, its places."""
    prompt, steps, _ = SCENARIOS[scenario]
    home, cwd = Path(root) / scenario / "home", Path(root) / scenario / "work"
    home.mkdir(parents=True)
    cwd.mkdir(parents=True)
    api.reset(full=True)
    api.script(steps)
    started = time.monotonic()
    proc = subprocess.run([str(binary), "-p", prompt, "--output-format", "json",
                           "--permission-mode", "bypassPermissions"],
                          cwd=cwd, env=cli_env(api, home), capture_output=True, text=True, timeout=120)
    api.settle()
    assert proc.returncode == 0, f"claude -p exited {proc.returncode}: {proc.stderr[-2000:]}{proc.stdout[-2000:]}"
    return {"result": json.loads(proc.stdout), "requests": api.requests, "remaining": api.remaining(),
            "exhausted": api.exhausted, "seconds": time.monotonic() - started,
            "home": str(home), "cwd": str(cwd)}


def record(binary, root):
    """Every scenario against one scripted API: {scenario: run}."""
    with ScriptedAPI() as api:
        return {name: run_cli(binary, api, name, root) for name in SCENARIOS}


# --- the snapshot: scrubbed, shortened, re-readable ---------------------------------

def _betas(headers):
    return [b.strip() for b in headers.get("anthropic-beta", "").split(",") if b.strip()]


def scrub(obj, run):
    """obj with what belongs to this machine and run replaced by placeholders."""
    session = run["result"].get("session_id", "")
    places = [(run["cwd"], "<CWD>"), (run["home"], "<HOME>"),
              (re.sub(r"[^A-Za-z0-9]", "-", run["cwd"]), "<CWD_AS_NAME>")]
    text = json.dumps(obj)
    for real, mark in places:
        text = text.replace(json.dumps(real)[1:-1], mark)
    if session:
        text = text.replace(session, "<SESSION_ID>")
    text = text.replace(platform.release(), "<OS_RELEASE>")
    text = re.sub(r'(device_id\\?":\\?")[0-9a-f]{16,}', r"\1<DEVICE_ID>", text)
    text = re.sub(r"(cc_version=[0-9.]+)\.[0-9a-z]+;", r"\1.<BUILD>;", text)
    return json.loads(text)


def shorten(obj):
    """Long strings cut to SHORTEN characters, except in tool input schemas (the
    validator reads those) and tool inputs."""
    if isinstance(obj, dict):
        return {k: v if k in ("input_schema", "input") else shorten(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [shorten(v) for v in obj]
    if isinstance(obj, str) and len(obj) > SHORTEN:
        return obj[:SHORTEN].rstrip() + " [...]"
    return obj


def snapshot_lines(runs, version):
    lines = []
    for name, run in runs.items():
        for n, entry in enumerate(run["requests"]):
            lines.append({"cli_version": version, "scenario": name, "request": n,
                          "method": "POST", "path": entry["path"], "anthropic_beta": _betas(entry["headers"]),
                          "body": shorten(scrub(entry["body"], run))})
    return lines


def cli_version(binary):
    return subprocess.run([str(binary), "--version"], capture_output=True, text=True).stdout.split()[0]


def write_snapshot(binary, path=CORPUS):
    with tempfile.TemporaryDirectory() as root:
        lines = snapshot_lines(record(binary, root), cli_version(binary))
    path.parent.mkdir(exist_ok=True)
    path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
    return lines


def read_snapshot():
    """The recorded requests; none if the file is missing (then the parametrised
    test below fails at collection, as an empty parameter set does here)."""
    if not CORPUS.exists():
        return []
    return [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]


def shape(path, betas, body):
    """What the validator judges, without the prose: keys, roles, block types, tools."""
    def blocks(content):
        return "str" if isinstance(content, str) else [sorted(b) for b in content]
    return {"path": path, "betas": betas, "keys": sorted(body),
            "messages": [(m["role"], sorted(m), blocks(m.get("content", []))) for m in body["messages"]],
            "tools": [(t["name"], sorted(t)) for t in body.get("tools", [])],
            "system": blocks(body.get("system", [])),
            "settings": {k: body[k] for k in ("thinking", "context_management", "output_config", "max_tokens")
                         if k in body}}


# --- the tests ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory):
    """Each scenario run once by the real CLI (under a second each), once per test
    run, shared by the workers (once_per_run)."""
    binary, why = cli_binary()
    if binary is None:
        pytest.skip(why)
    def kept(root):
        runs, keep = record(binary, root / "runs"), ("path", "headers", "body", "valid", "error")
        for run in runs.values():
            run["requests"] = [{k: e[k] for k in keep} for e in run["requests"]]
        return runs
    return once_per_run(tmp_path_factory, "claude-cli", kept)


def test_every_request_of_the_cli_is_accepted(cli_runs):
    for name, run in cli_runs.items():
        bad = [(e["path"], e["error"]) for e in run["requests"] if not e["valid"]]
        assert not bad, f"{name}: the scripted API refused what the CLI sent: {bad}"
        assert run["remaining"] == 0 and run["exhausted"] == 0, f"{name}: script not used up exactly"
        result = run["result"]
        assert not result["is_error"] and result["result"] == SCENARIOS[name][2], result


def test_the_cli_sends_messages_requests_only(cli_runs):
    # One Messages request per model turn: no count_tokens, no side calls,
    # nothing else (the scripted API answers 404 to any other path).
    for name, run in cli_runs.items():
        paths = {e["path"] for e in run["requests"]}
        assert paths == {"/v1/messages?beta=true"}, (name, paths)
        assert len(run["requests"]) == len(SCENARIOS[name][1])


def test_the_cli_runs_the_tool_and_sends_back_its_result(cli_runs):
    first, second = (e["body"] for e in cli_runs["tool"]["requests"])
    assembled = second["messages"][len(first["messages"]):]
    assert [m["role"] for m in assembled] == ["assistant", "user"]
    assert assembled[0]["content"][0] == THINK         # thinking goes back as it came
    (answer,) = assembled[1]["content"]
    assert answer["type"] == "tool_result" and answer["content"].strip() == "hi"


def test_the_cli_uses_the_fields_this_validator_learnt(cli_runs):
    # What made the scripted API refuse the CLI before: if the CLI stops
    # sending one of them, these lines say so (and the snapshot wants re-recording).
    body = cli_runs["text"]["requests"][0]["body"]
    assert "context_management" in body
    assert any(t.get("defer_loading") for t in body["tools"])
    assert any(m["role"] == "system" for m in body["messages"])


def test_the_snapshot_matches_the_installed_cli(cli_runs):
    binary, _ = cli_binary()
    version = cli_version(binary)
    snap = read_snapshot()
    if snap[0]["cli_version"] != version:
        pytest.skip(f"snapshot from CLI {snap[0]['cli_version']}, installed {version}: "
                    "re-record with python tests/test_cli_corpus.py")
    live = snapshot_lines(cli_runs, version)
    assert [shape(e["path"], e["anthropic_beta"], e["body"]) for e in live] == \
           [shape(e["path"], e["anthropic_beta"], e["body"]) for e in snap]
    text = CORPUS.read_text()
    for run in cli_runs.values():
        assert run["home"] not in text and run["cwd"] not in text


def post(api, entry):
    host, port = api.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    headers = {"content-type": "application/json", "x-api-key": "test", "anthropic-version": "2023-06-01"}
    if entry["anthropic_beta"]:
        headers["anthropic-beta"] = ",".join(entry["anthropic_beta"])
    conn.request(entry["method"], entry["path"], body=json.dumps(entry["body"]).encode(), headers=headers)
    resp = conn.getresponse()
    status, data = resp.status, resp.read().decode()
    conn.close()
    return status, data


@pytest.fixture(scope="module")
def server():
    with ScriptedAPI() as api:
        yield api


@pytest.mark.parametrize("entry", read_snapshot(), ids=lambda e: f"{e['scenario']}-{e['request']}")
def test_the_snapshot_is_accepted(server, entry):
    # No CLI needed: the recorded bodies, sent as the CLI sent them.
    server.reset(full=True)
    server.script([reply("ok")])
    status, data = post(server, entry)
    assert status == 200 and not server.invalid(), data


def test_the_snapshot_has_nothing_of_the_machine_it_was_recorded_on():
    text = CORPUS.read_text()
    assert "/tmp/" not in text and "/home/" not in text and "/root" not in text
    assert not re.search(r"device_id\\?\":\\?\"[0-9a-f]{16}", text)
    assert "<CWD>" in text and "<SESSION_ID>" in text


if __name__ == "__main__":
    binary, why = cli_binary()
    if binary is None:
        sys.exit(f"cannot record: {why}")
    lines = write_snapshot(binary)
    print(f"{len(lines)} requests of CLI {lines[0]['cli_version']} written to {CORPUS.relative_to(Path.cwd())}"
          if CORPUS.is_relative_to(Path.cwd()) else f"{len(lines)} requests written to {CORPUS}")
