"""The boundary's third rule, for files: one list of credential stores (s07's
HOME_SECRETS, their XDG places, and the files the tools' own variables name),
used by every way of reading. read_file, grep, glob and the @includes refuse
them through built-in read-deny rules; bash inside the sandbox finds them
masked; daemon sockets under HOME (and the SSH agent's) are masked as well.
Before, read_file asked about them (outside the workspace) while a sandboxed
`cat` printed Claude Code's credentials, shell history, .pgpass, the Hugging
Face token and a KUBECONFIG file.
"""
import os
import shutil
import socket
import tempfile
from pathlib import Path

import pytest

from conftest import chapters_from
from test_s07_sandbox import bash, sandboxed, unsandboxed  # noqa: F401 (fixture)

in_s07 = pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
STORES = {".claude/.credentials.json": "CLAUDE-CRED", ".bash_history": "HISTORY-LINE",
          ".pgpass": "PG-PASS", ".cache/huggingface/token": "HF-TOKEN", ".aws/credentials": "AWS-KEY"}


@pytest.fixture
def outside_tmp(monkeypatch):
    """A HOME the sandbox shows (its /tmp is a private one): under /var/tmp."""
    home = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="agent-home-"))
    monkeypatch.setenv("HOME", str(home))
    yield home
    shutil.rmtree(home, ignore_errors=True)


def plant(home, kubeconfig):
    for name, text in STORES.items():
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text(text + "\n")
    kubeconfig.write_text("KUBE-TOKEN\n")


@in_s07
def test_read_file_refuses_every_credential_store(mod, workspace, monkeypatch, tmp_path):
    kube = tmp_path / "elsewhere" / "kube.yaml"
    kube.parent.mkdir()
    plant(Path.home(), kube)
    monkeypatch.setenv("KUBECONFIG", f"{kube}{os.pathsep}/nonexistent/config")
    state = mod.agent_state()
    state.permissions = mod.load_permissions(state.workdir)
    for path in [Path.home() / name for name in STORES] + [kube]:
        effect, layer, reason = mod.decide("read_file", {"path": str(path)}, state)
        assert (effect, layer) == ("deny", "rule"), (path, effect, reason)


@pytest.mark.permissions
@in_s07
def test_a_sandboxed_cat_finds_the_credential_stores_masked(sandboxed, workspace, monkeypatch, outside_tmp):
    mod = sandboxed
    kube = outside_tmp / "elsewhere" / "kube.yaml"
    kube.parent.mkdir()
    plant(Path.home(), kube)
    monkeypatch.setenv("KUBECONFIG", str(kube))
    names = " ".join(f"~/{n}" for n in STORES) + f" {kube}"
    out = bash(mod, f"cat {names} 2>&1; true")
    assert not [t for t in [*STORES.values(), "KUBE-TOKEN"] if t in out], out
    assert "KUBE-TOKEN" in unsandboxed(mod, f"cat {kube}")              # the test can fail


@pytest.mark.permissions
@in_s07
def test_the_ssh_agents_socket_is_out_of_reach_in_the_sandbox(sandboxed, workspace, monkeypatch, outside_tmp):
    mod = sandboxed
    path = Path.home() / ".ssh-agent.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(1)
    monkeypatch.setenv("SSH_AUTH_SOCK", str(path))
    probe = ('python3 -c "import socket,os; s=socket.socket(socket.AF_UNIX); '
             's.connect(os.environ[\'SSH_AUTH_SOCK\']); print(\'CONNECTED\')" 2>&1; true')
    try:
        assert "CONNECTED" not in bash(mod, probe)
        assert "CONNECTED" in unsandboxed(mod, probe)                   # the test can fail
    finally:
        server.close()
