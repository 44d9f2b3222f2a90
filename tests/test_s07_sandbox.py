"""s07.24: bash inside an OS sandbox (bubblewrap), and child processes without
the agent's credentials (s01).

The sandbox tests run real bwrap. They skip, with the chapter's own reason,
only when its trial run says the sandbox cannot work on this machine (bwrap
missing, user namespaces disabled, /proc not mountable, not Linux); finding
the bwrap binary is not enough. Each confinement test also runs the same
command unsandboxed and sees it succeed, so it cannot pass by accident.

The suite may run as root. bwrap run by root keeps every capability unless
told otherwise, and a root command could then remount / read-write: the
remount attempts below fail only because the chapter passes --cap-drop ALL.
"""
import os
import shlex
import socket
import tempfile
import threading
import time
import uuid
from pathlib import Path

import dotenv
import pytest

from conftest import chapters_from

S01 = chapters_from("s01")
S07 = chapters_from("s07")
in_s07 = pytest.mark.parametrize("mod", S07, indirect=True)


# --- credentials never reach a child process (s01 onwards) ---
@pytest.mark.parametrize("mod", S01, indirect=True)
def test_bash_never_sees_the_agents_credentials(mod, workspace, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-the-shell")
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", "placeholder")  # undone after the test...
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN")                 # ...whatever .env sets below
    (workspace / ".env").write_text("ANTHROPIC_AUTH_TOKEN=tok-from-dotenv\n")
    dotenv.load_dotenv(workspace / ".env", override=False)  # as make_client does: into os.environ
    out = mod.run_bash('echo "[$ANTHROPIC_API_KEY][$ANTHROPIC_AUTH_TOKEN]"; env')
    assert out.splitlines()[0] == "[][]"
    assert "sk-ant" not in out and "tok-from" not in out
    assert f"HOME={workspace.parent / 'home'}" in out  # the rest of the environment is kept


# --- helpers ---
@pytest.fixture
def sandboxed(mod):
    ok, why = mod.sandbox_available()
    if not ok:
        pytest.skip(f"the OS sandbox does not work here: {why}")
    mod.agent_state().permissions["sandbox"]["enabled"] = True   # the test default turns it off
    return mod


def settings(mod, monkeypatch, **changes):
    monkeypatch.setattr(mod, "sandbox_settings", lambda: {**mod.SANDBOX_DEFAULTS, "writable": (), **changes})


def unsandboxed(mod, command):
    """The same command with the sandbox turned off: proves the test can fail."""
    with pytest.MonkeyPatch.context() as mp:
        settings(mod, mp, enabled=False)
        return mod.run_bash(command)


def bash(mod, command):
    """run_bash's text whether the command succeeded or failed."""
    try:
        return mod.run_bash(command)
    except mod.ToolError as e:
        return str(e)


@pytest.fixture
def on_root_fs():
    """A directory outside the workspace and outside /tmp (which the sandbox
    replaces with a private one), so a write to it meets the read-only root."""
    base = Path("/var/tmp")
    if not (base.is_dir() and os.access(base, os.W_OK)):
        pytest.skip("no writable /var/tmp for a directory outside /tmp")
    with tempfile.TemporaryDirectory(dir=base) as d:
        yield Path(d)


@pytest.fixture
def listener():
    """A TCP server on 127.0.0.1 (random port) that greets every connection."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"hello")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


# --- the trial run ---
@in_s07
def test_availability_is_decided_by_a_trial_run_once(mod, tmp_path, monkeypatch, request):
    request.addfinalizer(mod.sandbox_available.cache_clear)  # the real answer again after
    runs = tmp_path / "runs"
    stub = tmp_path / "bwrap"  # found, executable, but namespaces are off on this "machine"
    stub.write_text(f"#!/bin/sh\necho run >> {shlex.quote(str(runs))}\n"
                    "echo 'bwrap: No permissions to create a new namespace' >&2\nexit 1\n")
    stub.chmod(0o755)
    monkeypatch.setattr(mod, "BWRAP", str(stub))
    mod.sandbox_available.cache_clear()
    ok, why = mod.sandbox_available()
    assert not ok and "No permissions to create a new namespace" in why
    assert mod.sandbox_available() == (ok, why) and runs.read_text() == "run\n"  # cached
    monkeypatch.setattr(mod, "BWRAP", str(tmp_path / "missing"))
    mod.sandbox_available.cache_clear()
    assert mod.sandbox_available() == (False, f"{tmp_path / 'missing'} is not installed "
                                              f"(the package is called bubblewrap)")


@in_s07
def test_without_a_sandbox_bash_falls_back_or_refuses(mod, workspace, monkeypatch, capsys):
    monkeypatch.setattr(mod, "sandbox_available", lambda: (False, "user namespaces are off"))
    mod.agent_state().permissions["sandbox"]["enabled"] = True   # the test default turns it off
    assert mod.run_bash("echo hi").strip() == "hi"
    assert "bash runs unsandboxed: user namespaces are off" in capsys.readouterr().err
    settings(mod, monkeypatch, fail_if_unavailable=True)
    with pytest.raises(mod.ToolError, match="required but unavailable .user namespaces are off"):
        mod.run_bash("echo hi")


# --- what a sandboxed command cannot do ---
@in_s07
@pytest.mark.parametrize("where", ["tmp_path", "home", "root_fs"])
def test_cannot_write_outside_the_workspace(sandboxed, workspace, tmp_path, on_root_fs,
                                            monkeypatch, where):
    mod = sandboxed
    target = {"tmp_path": tmp_path / "outside", "home": on_root_fs / "home",
              "root_fs": on_root_fs / "data"}[where]
    target.mkdir()
    if where == "home":
        monkeypatch.setenv("HOME", str(target))
    dest = '"$HOME/f"' if where == "home" else shlex.quote(str(target / "f"))
    # As root, a remount would make / writable again if capabilities were kept.
    out = bash(mod, f"mount -o remount,rw,bind / 2>/dev/null; echo x > {dest}")
    assert not (target / "f").exists()
    if where != "tmp_path":  # tmp_path lives under /tmp, which the sandbox replaces
        assert "Read-only file system" in out and mod.SANDBOX_WRITE_HINT in out
    unsandboxed(mod, f"echo x > {dest}")
    assert (target / "f").read_text() == "x\n"


@in_s07
def test_root_gets_no_capabilities(sandboxed, workspace):
    status = sandboxed.run_bash("grep CapEff /proc/self/status")
    assert status.split() == ["CapEff:", "0000000000000000"]


@in_s07
@pytest.mark.parametrize("network", [False, True])
def test_no_network_not_even_host_loopback(sandboxed, workspace, listener, monkeypatch, network):
    mod = sandboxed
    connect = f"bash -c 'exec 3<>/dev/tcp/127.0.0.1/{listener} && head -c 5 <&3'"
    assert unsandboxed(mod, connect) == "hello"
    settings(mod, monkeypatch, network=network)
    out = bash(mod, connect)
    assert (out == "hello") is network, out


@in_s07
def test_host_daemon_sockets_are_out_of_reach(sandboxed, workspace, on_root_fs, monkeypatch):
    mod = sandboxed
    assert "/run" in mod.SANDBOX_HIDDEN  # docker, dbus, databases listen there
    monkeypatch.setattr(mod, "SANDBOX_HIDDEN", [str(on_root_fs)])  # a socket dir of our own
    path = on_root_fs / "daemon.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen()
    try:
        code = f"import socket; socket.socket(socket.AF_UNIX).connect({str(path)!r}); print('connected')"
        connect = f"python3 -c {shlex.quote(code)}"
        assert unsandboxed(mod, connect) == "connected\n"
        assert "connected" not in bash(mod, connect)
    finally:
        server.close()


@in_s07
def test_protected_paths_cannot_be_changed_or_swapped(sandboxed, workspace):
    mod = sandboxed
    files = {".agent/config.yaml": "mode: ask\n", ".git/hooks/pre-commit": "#!/bin/sh\n",
             ".git/config": "[core]\n", ".agent/skills/s/SKILL.md": "be careful\n"}
    for name, text in files.items():
        (workspace / name).parent.mkdir(parents=True, exist_ok=True)
        (workspace / name).write_text(text)
    attacks = [
        "echo evil > .agent/config.yaml", "echo evil >> .git/config",
        "echo evil > .git/hooks/pre-commit", "echo evil > .git/hooks/post-checkout",
        "rm -f .agent/config.yaml .git/config", "rm -rf .git/hooks .agent/skills",
        "mv .git/hooks .git/old-hooks",
        "mv .git .git-old && mkdir -p .git/hooks && echo evil > .git/hooks/pre-commit",
        "mv .agent .agent-old && mkdir .agent && echo evil > .agent/config.yaml",
        "mount -o remount,rw,bind .agent/config.yaml 2>/dev/null; echo evil > .agent/config.yaml",
    ]
    for command in attacks:
        out = bash(mod, command)
        assert "Read-only file system" in out or "busy" in out, (command, out)
    for name, text in files.items():
        assert (workspace / name).read_text() == text, name
    assert not (workspace / ".git/hooks/post-checkout").exists()
    assert sorted(p.name for p in workspace.iterdir()) == [".agent", ".git"]
    # git's data stays writable (commits need it); any other name in .git is put back (rule 1)
    assert mod.run_bash("echo ok > .git/COMMIT_EDITMSG && cat .git/COMMIT_EDITMSG") == "ok\n"
    out = mod.run_bash("echo ok > .git/description && cat .git/description")
    assert out.startswith("ok\n") and ".git/description set aside" in out
    assert not (workspace / ".git/description").exists()


@in_s07
def test_masked_paths_cannot_be_read(sandboxed, workspace, on_root_fs, monkeypatch):
    mod = sandboxed
    (workspace / "secret.txt").write_text("TOP SECRET\n")
    (workspace / "private").mkdir()
    (workspace / "private" / "key").write_text("TOP SECRET KEY\n")
    agent_env = on_root_fs / ".env"  # the agent's own .env, outside the workspace
    agent_env.write_text("ANTHROPIC_API_KEY=sk-ant-TOP-SECRET\n")
    monkeypatch.setattr(mod, "find_dotenv", lambda: str(agent_env))
    protected, masked = mod.sandbox_paths(workspace)
    assert masked == [str(agent_env)]
    monkeypatch.setattr(mod, "sandbox_paths", lambda root: (
        protected, masked + [str(workspace / "secret.txt"), str(workspace / "private")]))
    peek = f"cat secret.txt private/key {shlex.quote(str(agent_env))}; ls -A private"
    assert unsandboxed(mod, peek).count("TOP SECRET") == 2 and "sk-ant-TOP" in unsandboxed(mod, peek)
    out = bash(mod, f"{peek}; echo x > private/new; mv private elsewhere; mv secret.txt moved")
    assert "TOP SECRET" not in out and "No such file" in out  # private/ looks empty
    assert "private/new: Read-only file system" in out  # and takes nothing in
    assert sorted(p.name for p in workspace.iterdir()) == [".agent", "private", "secret.txt"]
    assert not (workspace / "private" / "new").exists()


@in_s07
def test_project_tests_run_inside_the_workspace(sandboxed, workspace):
    (workspace / "test_app.py").write_text(
        "import pathlib, tempfile, unittest\n"
        "class T(unittest.TestCase):\n"
        "    def test_it(self):\n"
        "        pathlib.Path('cache.txt').write_text('cached')\n"
        "        with tempfile.NamedTemporaryFile() as f:\n"
        "            self.assertTrue(f.name.startswith('/tmp/'))\n")
    out = sandboxed.run_bash("python3 -m unittest -q 2>&1; git init -q && git add -A && "
                             "git -c user.name=t -c user.email=t@t commit -qm first && git log --oneline")
    assert "OK" in out and "first" in out, out
    assert (workspace / "cache.txt").read_text() == "cached"


@in_s07
def test_tmp_is_private_and_discarded(sandboxed, workspace):
    name = f"/tmp/sandbox-{uuid.uuid4().hex}"
    assert sandboxed.run_bash(f"echo x > {name} && cat {name} && echo $TMPDIR") == "x\n/tmp\n"
    assert not Path(name).exists()
    assert "No such file" in bash(sandboxed, f"cat {name}")  # not even the next command sees it


@in_s07
def test_odd_workspace_paths_and_extra_writable_dirs(sandboxed, tmp_path, monkeypatch):
    mod = sandboxed
    ws, extra = tmp_path / "my 'proj' $(x) ;", tmp_path / "extra dir"
    ws.mkdir()
    extra.mkdir()
    settings(mod, monkeypatch, writable=(str(extra),))
    with mod.acting_as(mod.AgentState(ws)):
        out = mod.run_bash(f"pwd && touch made && touch {shlex.quote(str(extra / 'also'))}")
    assert out.strip() == str(ws) and (ws / "made").exists() and (extra / "also").exists()


@in_s07
def test_refusal_note_only_on_a_failed_sandboxed_write(sandboxed, workspace):
    assert sandboxed.run_bash("echo 'Read-only file system' && true") == "Read-only file system\n"
    assert sandboxed.SANDBOX_WRITE_HINT in bash(sandboxed, "touch /usr/x")
    assert sandboxed.SANDBOX_WRITE_HINT not in bash(sandboxed, "ls /nowhere")


# --- the argv itself (no bwrap needed) ---
@in_s07
def test_argv_binds_only_what_exists_and_never_widens_through_links(mod, tmp_path):
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    (ws / ".git" / "hooks").mkdir(parents=True)
    (ws / "masked dir").mkdir()
    outside.mkdir()
    (outside / "config.yaml").write_text("x")
    (ws / ".agent").symlink_to(outside)  # a cloned repo's link out of the workspace
    argv = mod.sandbox_argv("echo hi", ws, protected=[ws / ".git/hooks", ws / ".git/config",
                                                      ws / ".agent/config.yaml"],
                            masked=[ws / "masked dir", ws / "nothing"], network=True)
    pairs = list(zip(argv, argv[1:]))
    assert argv[-4:] == ["bash", "-c", "--", "echo hi"] and argv[-6:-4] == ["--chdir", str(ws)]
    assert ("--ro-bind", str(ws / ".git/hooks")) in pairs and ("--bind", str(ws / ".git")) in pairs
    assert str(ws / ".git/config") not in argv and str(ws / "nothing") not in argv
    assert ("--bind", str(outside)) not in pairs  # pinning never makes a link target writable
    assert ("--ro-bind", str(outside / "config.yaml")) in pairs
    assert ("--tmpfs", str(ws / "masked dir")) in pairs and ("--remount-ro", str(ws / "masked dir")) in pairs
    assert "--unshare-net" not in argv and "--unshare-pid" in argv
    assert argv.index("/tmp") < argv.index(str(ws))  # the private /tmp first: ws may live in it
    assert argv[argv.index("--setenv"):][:3] == ["--setenv", "TMPDIR", "/tmp"]


@in_s07
def test_a_sandboxed_command_that_times_out_or_is_interrupted_still_has_its_git_redirect_undone(
        sandboxed, workspace, monkeypatch):
    mod = sandboxed
    import subprocess
    subprocess.run(["git", "init", "-q"], cwd=workspace, check=True)
    plant = "mkdir -p evil && echo ../evil > .git/commondir && sleep 30"
    real_watch, commondir = mod.watch_command, workspace / ".git" / "commondir"

    def planted(p, sink, timeout):                                   # the clock starts once the write is
        deadline = time.monotonic() + 30                             # made: bwrap may take over 1 s to start
        while not (commondir.exists() and commondir.read_text()) and time.monotonic() < deadline:
            time.sleep(0.01)
        return real_watch(p, sink, timeout)
    monkeypatch.setattr(mod, "watch_command", planted)
    with pytest.raises(mod.ToolError, match=r"\.git/commondir set aside"):
        mod.run_bash(plant, timeout=1)                               # stopped by its timeout
    assert not commondir.exists()

    def interrupted(p, sink, timeout):
        planted(p, sink, 0.01)                                       # the write happens, then Ctrl+C
        raise KeyboardInterrupt
    monkeypatch.setattr(mod, "watch_command", interrupted)
    with pytest.raises(KeyboardInterrupt):
        mod.run_bash(plant)
    assert not (workspace / ".git" / "commondir").exists()


@in_s07
def test_git_cannot_be_pointed_elsewhere_from_the_sandbox(sandboxed, workspace):
    mod = sandboxed
    import subprocess
    subprocess.run(["git", "init", "-q"], cwd=workspace, check=True)
    out = bash(mod, "mkdir -p evil/objects evil/refs && echo ../evil > .git/commondir && "
                    "printf '[core]\\n\\tfsmonitor = touch PWNED\\n' > evil/config")
    assert not (workspace / ".git" / "commondir").exists()
    assert ".git/commondir set aside" in out
    subprocess.run(["git", "status"], cwd=workspace, capture_output=True)
    assert not (workspace / "PWNED").exists()
    assert bash(mod, "git add -A && git -c user.email=a@b -c user.name=a commit -qm x && echo ok").strip() \
        .endswith("ok")                                             # commits still work
