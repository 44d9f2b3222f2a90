"""The boundary's third rule, for environments: a command the model runs never
inherits the agent's own configuration (ANTHROPIC_*, what its .env set) nor a
variable whose name looks like a secret (*KEY*, *TOKEN*, *SECRET*, *PASSWORD*,
*CREDENTIAL*). s01's child_env() is its one home; from s07 the user's own config
may pass names (env_allow) or set variables (env); from s08 the human's own hooks
keep the environment, a project's hooks get what the model's commands get.
"""
import pytest

from conftest import chapters_from, run_turn
from fake_api import reply, tool

SECRETS = {"GITHUB_TOKEN": "ghp-1", "AWS_SECRET_ACCESS_KEY": "aws-2", "DB_PASSWORD": "pw-3",
           "OPENAI_API_KEY": "sk-4", "MY_CREDENTIALS": "cr-5", "ANTHROPIC_BASE_URL": "http://agent-only",
           "FROM_AGENT_DOTENV": "dotenv-6"}
PLAIN = {"LANG": "C.UTF-8", "PROJECT_MODE": "dev"}


@pytest.fixture
def environment(mod, monkeypatch, tmp_path):
    for k, v in (SECRETS | PLAIN).items():
        monkeypatch.setenv(k, v)
    dotenv = tmp_path / "agent.env"                     # the agent's own .env, wherever it is
    dotenv.write_text("FROM_AGENT_DOTENV=dotenv-6\n")
    monkeypatch.setattr(mod, "find_dotenv", lambda *a, **k: str(dotenv))
    return mod


def env_seen(mod, api, client):
    """What `env` printed for the model."""
    history = run_turn(mod, api, client, [reply(tool("bash", {"command": "env"}))])
    return history[2]["content"][0]["content"]


@pytest.mark.parametrize("mod", chapters_from("s01"), indirect=True)
def test_the_models_commands_inherit_no_secret_and_none_of_the_agents_configuration(environment, api,
                                                                                    client):
    out = env_seen(environment, api, client)
    assert not [v for v in SECRETS.values() if v in out]          # before: all but the key were printed
    assert "PROJECT_MODE=dev" in out and "LANG=C.UTF-8" in out and "PATH=" in out and "HOME=" in out


@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_the_users_own_config_passes_and_sets_variables_a_projects_cannot(environment, api, client,
                                                                         workspace):
    import yaml
    from pathlib import Path
    user = Path.home() / ".agent" / "config.yaml"
    user.parent.mkdir(parents=True, exist_ok=True)
    user.write_text(yaml.safe_dump({"env_allow": ["GITHUB_TOKEN"], "env": {"CI": "1"}}))
    project = workspace / ".agent" / "config.yaml"
    project.parent.mkdir(parents=True, exist_ok=True)
    project.write_text(yaml.safe_dump({"env_allow": ["DB_PASSWORD"], "env": {"PROJECT_SET": "x"}}))
    state = environment.agent_state()
    state.permissions = environment.load_permissions(state.workdir) | {"sandbox": {"enabled": False}}
    state.mode = "bypassPermissions"
    out = env_seen(environment, api, client)
    assert "GITHUB_TOKEN=ghp-1" in out and "CI=1" in out
    assert "pw-3" not in out and "PROJECT_SET" not in out


@pytest.mark.parametrize("mod", chapters_from("s08"), indirect=True)
def test_your_own_hooks_keep_your_tokens_a_projects_hooks_do_not(environment, api, client, workspace):
    from test_s08_hooks import hook, use_hooks
    echo = hook("pre_tool_use", "echo \"token=$GITHUB_TOKEN key=${ANTHROPIC_BASE_URL:-none}\" >> seen.txt")
    use_hooks(environment, echo, scope="user")
    run_turn(environment, api, client, [reply(tool("bash", {"command": "true"}))])
    use_hooks(environment, echo, scope="project")
    api.reset()
    run_turn(environment, api, client, [reply(tool("bash", {"command": "true"}))])
    assert (workspace / "seen.txt").read_text().splitlines() == ["token=ghp-1 key=none", "token= key=none"]


@pytest.mark.parametrize("mod", chapters_from("s08"), indirect=True)
def test_a_projects_http_hook_names_no_token_its_command_hooks_lack(environment, api, client, workspace):
    """Review: header_value read the user's whole environment for every hook, so a
    project's http hook sent GITHUB_TOKEN where its command hook saw nothing."""
    import http.server
    import threading
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            seen.append(self.headers.get("Authorization"))
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *a):
            pass
    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    from test_s08_hooks import hook, use_hooks
    posting = hook("pre_tool_use", action={"type": "http", "url": f"http://127.0.0.1:{server.server_port}/",
                                           "allowed_env_vars": ["GITHUB_TOKEN"],
                                           "headers": {"Authorization": "Bearer ${GITHUB_TOKEN}"}})
    try:
        for scope in ("user", "project"):
            use_hooks(environment, posting, scope=scope)
            api.reset()
            run_turn(environment, api, client, [reply(tool("bash", {"command": "true"}))])
    finally:
        server.shutdown()
    assert [s.strip() for s in seen] == ["Bearer ghp-1", "Bearer"]


@pytest.mark.parametrize("mod", chapters_from("s01"), indirect=True)
def test_names_that_only_contain_a_secret_word_and_gits_config_triples_are_kept(mod, api, client, monkeypatch):
    """Review: a substring match dropped GIT_CONFIG_KEY_0 but kept its COUNT and VALUE
    (every git command then failed), and KEYTIMEOUT, XKB_KEYMAP, TOKENIZERS_PARALLELISM."""
    kept = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*",
            "KEYTIMEOUT": "1", "XKB_KEYMAP": "us", "TOKENIZERS_PARALLELISM": "false"}
    for k, v in kept.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("DB_PASS", "pw-7")
    history = run_turn(mod, api, client, [reply(tool("bash", {"command": "env; git config --get safe.directory"}))])
    out = history[2]["content"][0]["content"]
    assert all(f"{k}={v}" in out for k, v in kept.items()) and out.rstrip().endswith("*")
    assert "pw-7" not in out
