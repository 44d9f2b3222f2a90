"""s07.4: bash inside an OS sandbox (bubblewrap), and child processes without
the agent's credentials (s01).

The sandbox tests run real bwrap. They skip, with bwrap's own reason, only
when the chapter's trial run says the sandbox cannot work on this machine
(bwrap missing, user namespaces disabled, not Linux); finding the bwrap
binary is not enough.
"""
import dotenv
import pytest

from conftest import chapters_from

S01 = chapters_from("s01")
S07 = chapters_from("s07")


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
