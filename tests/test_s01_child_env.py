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
