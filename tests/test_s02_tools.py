"""s02: registry, file tools, path sandbox, normalisation, parallel tool calls."""
import contextvars
import os
import re
import shutil
import threading
import time
from types import SimpleNamespace

import pytest

from conftest import chapters_from
from fake_api import reply, text, tool

pytestmark = pytest.mark.parametrize("mod", chapters_from("s02"), indirect=True)
needs_rg = pytest.mark.skipif(not shutil.which("rg"), reason="ripgrep is not installed")


def call(mod, name, **args):
    """Run one tool exactly as the loop does; return (content, is_error)."""
    r = mod.run_tool(SimpleNamespace(id="toolu_t", name=name, input=args))
    return r["content"], r.get("is_error", False)


def ok(mod, name, **args):
    content, err = call(mod, name, **args)
    assert not err, content
    return content


def refused(mod, name, **args):
    content, err = call(mod, name, **args)
    assert err, f"{name}{args} was allowed: {content[:200]}"
    return content


# --- registry ---------------------------------------------------------------

def test_registry_tables_agree(mod):
    names = [t["name"] for t in mod.TOOLS]
    assert len(names) == len(set(names))
    assert set(names) == set(mod.TOOL_HANDLERS) == set(mod.TOOL_FLAGS)
    for t in mod.TOOLS:
        sentences = [s for s in re.split(r"[.!?](?:\s|$)", t["description"]) if s.strip()]
        assert len(sentences) >= 3, f"{t['name']}: description needs 3+ sentences"
        assert t["input_schema"]["type"] == "object"
    for name in ("read_file", "glob", "grep"):
        assert mod.TOOL_FLAGS[name] == {"read_only": True, "concurrency_safe": True}
    for name in ("bash", "write_file", "edit_file"):
        assert mod.TOOL_FLAGS[name]["concurrency_safe"] is False


# --- read / write / edit ------------------------------------------------------

def test_read_file_numbers_lines_and_pages(mod, workspace):
    (workspace / "a.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    out = ok(mod, "read_file", path="a.txt")
    assert out.splitlines()[0] == "     1\tline 1" and "line 10" in out
    part = ok(mod, "read_file", path="a.txt", offset=4, limit=2)
    assert part.splitlines()[:2] == ["     4\tline 4", "     5\tline 5"]
    assert "offset=6" in part                       # says where to continue
    assert "past the end" in refused(mod, "read_file", path="a.txt", offset=99)


def test_read_file_caps_large_files_with_a_hint(mod, workspace):
    (workspace / "big.txt").write_text("x" * 200 + "\n" * 1 + ("y" * 100 + "\n") * 5000)
    out = ok(mod, "read_file", path="big.txt")
    assert len(out) <= 30_000 + 200                 # the documented 30,000 characters, plus the hint
    assert re.search(r"continue with offset=\d+", out)


def test_read_file_refuses_binary_and_missing(mod, workspace):
    (workspace / "img.bin").write_bytes(b"\x89PNG\x00\x00\x01")
    assert "binary" in refused(mod, "read_file", path="img.bin")
    assert "glob" in refused(mod, "read_file", path="nope.txt")


def test_write_file_creates_parents_and_reports_bytes(mod, workspace):
    assert ok(mod, "write_file", path="deep/er/f.txt", content="héllo") == "Wrote 6 bytes to deep/er/f.txt"
    assert (workspace / "deep/er/f.txt").read_text() == "héllo"
    (workspace / "old.txt").write_text("keep")
    assert "read_file" in refused(mod, "write_file", path="old.txt", content="clobber")
    assert (workspace / "old.txt").read_text() == "keep"


def test_edit_file_rules(mod, workspace):
    f = workspace / "c.py"
    f.write_text("a = 1\nb = 1\n")
    assert "read_file" in refused(mod, "edit_file", path="c.py", old_string="a = 1", new_string="a = 2")
    ok(mod, "read_file", path="c.py")
    assert "identical" in refused(mod, "edit_file", path="c.py", old_string="a", new_string="a")
    assert "2 times" in refused(mod, "edit_file", path="c.py", old_string="= 1", new_string="= 2")
    assert "not found" in refused(mod, "edit_file", path="c.py", old_string="zzz", new_string="y")
    ok(mod, "edit_file", path="c.py", old_string="a = 1", new_string="a = 2")
    assert f.read_text() == "a = 2\nb = 1\n"
    ok(mod, "edit_file", path="c.py", old_string="= ", new_string=":= ", replace_all=True)
    assert f.read_text() == "a := 2\nb := 1\n"
    time.sleep(0.01)
    f.write_text("changed behind our back\n")
    assert "changed on disk" in refused(mod, "edit_file", path="c.py", old_string="changed",
                                        new_string="x")


# --- glob / grep --------------------------------------------------------------

def make_tree(ws):
    (ws / ".gitignore").write_text("build/\n*.log\n")
    for rel, body in {"src/app.py": "import os\nTODO = 1\n", "src/lib/util.py": "def todo(): pass\n",
                      "README.md": "# TODO list\n", "build/gen.py": "TODO generated\n",
                      "run.log": "TODO in log\n", "docs/notes.txt": "nothing\n",
                      "docs/.gitignore": "", "src/lib/.gitignore": "secret.py\n",
                      "src/lib/secret.py": "TODO secret\n"}.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(body)
    (ws / "blob.bin").write_bytes(b"TODO\x00\x01")


def test_glob_respects_gitignore_and_sorts_newest_first(mod, workspace):
    make_tree(workspace)
    now = time.time()
    os.utime(workspace / "src/lib/util.py", (now + 100, now + 100))
    out = ok(mod, "glob", pattern="**/*.py").splitlines()
    assert out[0] == "src/lib/util.py"
    assert set(out) == {"src/app.py", "src/lib/util.py"}        # build/ and secret.py ignored
    assert ok(mod, "glob", pattern="*.py", path="src") == "src/app.py"
    assert set(ok(mod, "glob", pattern="**/*.{md,txt}").splitlines()) == {"README.md", "docs/notes.txt"}
    assert "No files" in ok(mod, "glob", pattern="*.rs")


def test_glob_caps_at_200(mod, workspace):
    for i in range(230):
        (workspace / f"f{i}.txt").write_text("")
    out = ok(mod, "glob", pattern="*.txt").splitlines()
    assert len(out) == 201 and "30 more" in out[-1]


GREP_CASES = [dict(pattern="TODO"), dict(pattern="todo", ignore_case=True),
              dict(pattern="TODO", output_mode="content"), dict(pattern="o", output_mode="count"),
              dict(pattern="TODO|todo", glob="*.py", output_mode="content"),
              dict(pattern="import", path="src"), dict(pattern="^def ", path="src/lib/util.py")]


@needs_rg
@pytest.mark.parametrize("case", GREP_CASES, ids=lambda c: "-".join(map(str, c.values())))
def test_grep_ripgrep_and_python_fallback_agree(mod, workspace, monkeypatch, case):
    make_tree(workspace)
    with_rg = ok(mod, "grep", **case)
    monkeypatch.setattr(mod.shutil, "which", lambda name: None)
    assert ok(mod, "grep", **case) == with_rg
    assert "build/" not in with_rg and "run.log" not in with_rg and "secret" not in with_rg
    assert "blob.bin" not in with_rg


def test_grep_output_modes(mod, workspace):
    make_tree(workspace)
    assert ok(mod, "grep", pattern="TODO").splitlines() == ["README.md", "src/app.py"]
    assert ok(mod, "grep", pattern="TODO", output_mode="content").splitlines() == [
        "README.md:1:# TODO list", "src/app.py:2:TODO = 1"]
    assert ok(mod, "grep", pattern="o", output_mode="count", path="src").splitlines() == [
        "src/app.py:1", "src/lib/util.py:1"]
    assert "output_mode" in refused(mod, "grep", pattern="x", output_mode="lines")


# --- path sandbox: every escape attempt is refused ----------------------------
# Each case must be refused by the sandbox itself: a refusal for another reason
# (read-before-edit, a missing file, a crash after walking outside) would pass
# just as well with the sandbox gone. So the targets exist, the message must
# be the sandbox's, and the path actually targeted is checked afterwards.

@pytest.fixture
def escape_room(workspace, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("TOP SECRET root:x:0:0\n")
    (workspace / "sub").mkdir()
    (workspace / "inside.txt").write_text("fine\n")
    (tmp_path / "home" / ".bashrc").write_text("BASHRC SECRET\n")   # the test's HOME
    os.symlink(outside, workspace / "linkdir")
    os.symlink(outside / "secret.txt", workspace / "linkfile")
    os.symlink(outside / "missing.txt", workspace / "dangling")
    os.symlink(workspace / "linkdir", workspace / "chain")
    os.symlink("/etc", workspace / "etc")
    return outside


ESCAPES = [
    ("read_file", dict(path="../outside/secret.txt")),
    ("read_file", dict(path="sub/../../outside/secret.txt")),
    ("read_file", dict(path="/etc/passwd")),
    ("read_file", dict(path="OUTSIDE/secret.txt")),            # absolute path, filled in below
    ("read_file", dict(path="linkfile")),
    ("read_file", dict(path="linkdir/secret.txt")),
    ("read_file", dict(path="chain/secret.txt")),
    ("read_file", dict(path="etc/passwd")),
    ("read_file", dict(path="~/.bashrc")),
    ("write_file", dict(path="../escape.txt", content="x")),
    ("write_file", dict(path="linkdir/new.txt", content="x")),  # new file under a linked dir
    ("write_file", dict(path="dangling", content="x")),         # would create the link target
    ("write_file", dict(path="a/b/../../../escape.txt", content="x")),
    ("write_file", dict(path="OUTSIDE/escape.txt", content="x")),
    ("edit_file", dict(path="linkfile", old_string="TOP", new_string="x")),
    ("edit_file", dict(path="../outside/secret.txt", old_string="TOP", new_string="x")),
    ("glob", dict(pattern="*", path="..")),
    ("glob", dict(pattern="*", path="/etc")),
    ("glob", dict(pattern="../*")),                            # the pattern guard, not safe_path
    ("glob", dict(pattern="/etc/*")),
    ("glob", dict(pattern="*", path="linkdir")),
    ("grep", dict(pattern="SECRET", path="..")),
    ("grep", dict(pattern="root", path="/etc")),
    ("grep", dict(pattern="SECRET", path="linkdir")),
    ("grep", dict(pattern="SECRET", path="linkfile")),
    ("grep", dict(pattern="SECRET", glob="../**")),
]


def escape_target(workspace, path):
    """Where an unguarded tool would act: the path resolved as safe_path would."""
    return (workspace / os.path.expanduser(path)).resolve()


def escape_id(name, args):
    return name + ":" + ",".join(f"{k}={v}" for k, v in args.items() if k in ("path", "pattern", "glob"))


@pytest.mark.parametrize("name,args", ESCAPES, ids=[escape_id(n, a) for n, a in ESCAPES])
def test_sandbox_refuses_escape(mod, escape_room, workspace, name, args):
    args = {k: v.replace("OUTSIDE", str(escape_room)) for k, v in args.items()}
    target = escape_target(workspace, args.get("path", "."))
    assert not target.is_relative_to(workspace) or "pattern" in args and "path" not in args
    before = target.read_bytes() if target.is_file() else None
    if name in ("read_file", "edit_file"):
        assert before, f"{target} must exist, or a refusal proves nothing"
    message = refused(mod, name, **args)
    if "path" in args:
        assert "outside the workspace" in message, message   # the sandbox's own refusal
    else:
        assert "must be relative" in message, message        # the pattern's
    if before:                                                # not read, not changed
        assert before.decode(errors="replace").strip()[:40] not in message
        assert target.read_bytes() == before
    elif name == "write_file":
        assert not target.exists() and not os.path.lexists(target)
    assert "TOP SECRET" not in message and "BASHRC" not in message


def test_walks_never_follow_links_out(mod, escape_room, workspace):
    assert "TOP SECRET" not in ok(mod, "grep", pattern="SECRET|root", output_mode="content")
    listing = ok(mod, "glob", pattern="**/*")
    assert "secret.txt" not in listing and "passwd" not in listing
    assert "inside.txt" in listing
    ok(mod, "read_file", path=str(workspace / "inside.txt"))     # absolute inside is fine


# --- normalisation --------------------------------------------------------------

def test_normalize_repairs_every_kind_of_damage(mod):
    broken = [
        {"role": "assistant", "content": "I start oddly"},
        {"role": "user", "content": [{"type": "text", "text": "do it"}]},
        {"role": "user", "content": "and this", "_ts": 1},
        {"role": "assistant", "content": [{"type": "text", "text": ""},
                                          {"type": "tool_use", "id": "t1", "name": "bash", "input": {}},
                                          {"type": "tool_use", "id": "t2", "name": "bash", "input": {}}]},
        {"role": "user", "content": [{"type": "text", "text": "reminder"},
                                     {"type": "tool_result", "tool_use_id": "t2", "content": "two",
                                      "_persisted": True},
                                     {"type": "tool_result", "tool_use_id": "zz", "content": "orphan"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t3", "name": "bash", "input": {}}]},
    ]
    out = mod.normalize_messages(broken)
    assert [m["role"] for m in out] == ["user", "assistant", "user", "assistant", "user", "assistant", "user"]
    assert out[2]["content"] == [{"type": "text", "text": "do it"}, {"type": "text", "text": "and this"}]
    assert [b["type"] for b in out[3]["content"]] == ["tool_use", "tool_use"]   # empty text gone
    results = out[4]["content"]
    assert [b.get("tool_use_id") for b in results] == ["t1", "t2", None]        # order, orphan gone
    assert results[0]["is_error"] and "_persisted" not in results[1]
    assert out[6]["content"][0]["tool_use_id"] == "t3"
    assert broken[2]["_ts"] == 1 and len(broken) == 6                          # input untouched


def test_normalized_history_is_accepted_by_the_api(mod, api, client):
    broken = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
              {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "bash",
                                                 "input": {"command": "ls"}}]}]
    api.script([reply("fine")])
    client.messages.create(model="m", max_tokens=10, messages=mod.normalize_messages(broken),
                           tools=mod.TOOLS)
    assert api.requests[0]["valid"]


# --- parallel tools --------------------------------------------------------------

def test_safe_calls_run_together_and_results_keep_order(mod, monkeypatch, workspace):
    barrier = threading.Barrier(4, timeout=10)   # only passable if 4 run at once
    def slow_read(path, offset=1, limit=None):
        barrier.wait()
        return f"read {path}"
    monkeypatch.setitem(mod.TOOL_HANDLERS, "read_file", slow_read)
    calls = [SimpleNamespace(id=f"t{i}", name="read_file", input={"path": f"f{i}"}) for i in range(4)]
    results = mod.run_tools(calls, [])
    assert [r["content"] for r in results] == [f"read f{i}" for i in range(4)]
    assert not any(r.get("is_error") for r in results)


def test_unsafe_calls_run_alone_in_order(mod, monkeypatch, workspace):
    active, peak, log = [0], [0], []
    lock = threading.Lock()
    def tracked(name):
        def handler(**kw):
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0]) if name == "write_file" else peak[0]
            time.sleep(0.05)
            with lock:
                active[0] -= 1
                log.append(name)
            return name
        return handler
    for name in ("read_file", "write_file"):
        monkeypatch.setitem(mod.TOOL_HANDLERS, name, tracked(name))
    calls = [SimpleNamespace(id=f"t{i}", name=n, input={"path": "x", **({"content": ""} if n == "write_file" else {})})
             for i, n in enumerate(["read_file", "read_file", "write_file", "read_file"])]
    results = mod.run_tools(calls, [])
    assert [r["content"] for r in results] == ["read_file", "read_file", "write_file", "read_file"]
    assert peak[0] == 1 and log.index("write_file") == 2


def test_bad_model_output_never_crashes_the_loop(mod, api, client, workspace):
    (workspace / "b.bin").write_bytes(b"\x00\x01\x02")
    calls = [tool("read_file", {}), tool("read_file", {"path": 7}), tool("grep", {"pattern": "("}),
             tool("read_file", {"path": "b.bin"}), tool("read_file", {"path": "/etc/shadow"}),
             tool("summon", {"x": 1}), tool("bash", {"command": "python3 -c \"print('z'*90000)\""})]
    api.script([reply(*calls), reply("done")])
    assert mod.agent_loop(client, [{"role": "user", "content": "go"}]) == "end_turn"
    results = api.requests[1]["body"]["messages"][-1]["content"]
    assert [r["tool_use_id"] for r in results[:7]] == [c["id"] for c in calls]
    assert all(r.get("is_error") for r in results[:6])
    hints = ["missing required field", "must be of type", "regex", "binary", "outside the workspace",
             "Unknown tool"]
    for r, hint in zip(results, hints):
        assert hint.lower() in str(r["content"]).lower(), r
    huge = str(results[6]["content"])   # cut with a marker; from s06 on, saved to disk instead
    assert "[truncated" in huge or ("<persisted-output>" in huge and len(huge) < 10_000)


# --- edge cases found in review ----------------------------------------------------

def test_undecodable_file_names_never_break_a_request(mod, api, client, workspace):
    (workspace / b"caf\xe9.txt".decode("utf-8", "surrogateescape")).write_text("x")
    api.script([reply(tool("glob", {"pattern": "*"})), reply("ok")])
    assert mod.agent_loop(client, [{"role": "user", "content": "list"}]) == "end_turn"
    assert "caf" in str(api.requests[1]["body"]["messages"][-1]["content"])


@needs_rg
def test_a_ripgrep_config_cannot_widen_the_sandbox(mod, escape_room, workspace, monkeypatch):
    rc = workspace.parent / "ripgreprc"
    rc.write_text("--follow\n--no-ignore\n")
    monkeypatch.setenv("RIPGREP_CONFIG_PATH", str(rc))
    assert "TOP SECRET" not in ok(mod, "grep", pattern="SECRET", output_mode="content")


@needs_rg
@pytest.mark.parametrize("mode", ["content", "count", "files_with_matches"])
def test_binary_files_are_skipped_by_both_backends(mod, workspace, monkeypatch, mode):
    (workspace / "text.txt").write_text("needle\n")
    (workspace / "late.dat").write_bytes(b"needle\n" + b"x" * 20_000 + b"\0tail")
    with_rg = ok(mod, "grep", pattern="needle", output_mode=mode)
    monkeypatch.setattr(mod.shutil, "which", lambda name: None)
    assert ok(mod, "grep", pattern="needle", output_mode=mode) == with_rg
    assert "late.dat" not in with_rg and "text.txt" in with_rg


def test_fallback_skips_fifos_and_unreadable_files(mod, workspace, monkeypatch):
    os.mkfifo(workspace / "pipe")
    (workspace / "a.txt").write_text("needle\n")
    monkeypatch.setattr(mod.shutil, "which", lambda name: None)
    done = []
    search = contextvars.copy_context().run  # the thread works as the test's agent
    worker = threading.Thread(target=lambda: done.append(search(ok, mod, "grep", pattern="needle")),
                              daemon=True)
    worker.start()
    worker.join(20)
    assert done == ["a.txt"]           # a FIFO would block read_bytes() forever


def test_gitignore_escapes_and_repository_scope_follow_git(mod, workspace, tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / ".gitignore").write_text("*.log\nnode_modules/\n\\#hash.txt\nlit\\*star\nspace\\ \n")
    ws = repo / "pkg"
    (ws / "node_modules").mkdir(parents=True)
    for name in ["debug.log", "node_modules/x.js", "#hash.txt", "lit*star", "litXstar", "space ", "keep.py"]:
        (ws / name).write_text("x")
    (ws / "inner" / ".git").mkdir(parents=True)           # a nested repository: own rules only
    (ws / "inner" / "trace.log").write_text("x")
    (ws / "sub").mkdir()
    (ws / "sub" / ".git").write_text("gitdir: ../../.git/worktrees/sub\n")  # a .git file
    mod.agent_state().workdir = ws.resolve()
    monkeypatch.chdir(ws)
    listed = set(ok(mod, "glob", pattern="**/*").splitlines())
    assert listed == {"litXstar", "keep.py", "inner/trace.log"}


def test_read_file_counts_lines_like_grep_and_crlf_files_edit(mod, workspace):
    (workspace / "j.js").write_text("a\fb\nneedle\n")
    assert ok(mod, "read_file", path="j.js").splitlines()[-1] == "     2\tneedle"
    assert ok(mod, "grep", pattern="needle", output_mode="content") == "j.js:2:needle"
    (workspace / "w.txt").write_bytes(b"one\r\ntwo\r\nthree\r\n")
    shown = ok(mod, "read_file", path="w.txt")
    assert "\r" not in shown
    ok(mod, "edit_file", path="w.txt", old_string="one\ntwo", new_string="1\n2")
    assert (workspace / "w.txt").read_bytes() == b"1\r\n2\r\nthree\r\n"


def test_dot_slash_and_negated_globs(mod, workspace):
    make_tree(workspace)
    assert ok(mod, "glob", pattern="./src/*.py") == "src/app.py"
    assert ok(mod, "grep", pattern="TODO", glob="!*.md") == "src/app.py"
    assert ok(mod, "grep", pattern="TODO", glob="./src/*.py") == "src/app.py"
