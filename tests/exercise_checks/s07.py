"""Checks for exercises/s07.md. Each point: (what must hold, a hint, fn(x))."""
import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

from fake_api import reply, tool

GIT_ID = ("-c", "user.name=learner", "-c", "user.email=learner@example.com")


def git(cwd, *args):
    return subprocess.run(["git", *GIT_ID, *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def human(x, *answers):
    """The human at the terminal: every question is kept, answered from `answers`
    in order, then "n". Returns the list of questions asked."""
    asked, left = [], list(answers)
    x.patch(x.mod, "ask_human", lambda question: asked.append(question) or (left.pop(0) if left else "n"))
    return asked


def turn(x, steps, prompt="do the work"):
    """x.turn with the agent's output kept (x.err: what it printed on stderr), not shown."""
    out, err = io.StringIO(), io.StringIO()
    x.patch(sys, "stdin", io.StringIO(""))  # a question nobody answers reads end of input: no
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        history = x.turn(steps, prompt)
    x.err = getattr(x, "err", "") + err.getvalue()
    return history


def results_of(x, body_index):
    """The tool results the request `body_index` carried back to the model."""
    bodies = x.bodies()
    assert len(bodies) > body_index, f"only {len(bodies)} model call(s) were made"
    return x.tool_results(bodies[body_index]["messages"][-1:])


# s07.1: git push asks, and shows the remote ----------------------------------------
def repo_with_remotes(x):
    """The workspace as a repository (one commit on main) with two bare remotes
    beside it, origin and upstream; the sandbox off in the user's config, so a
    yes really pushes. Returns {remote: its URL}."""
    git(x.ws, "init", "-q")
    git(x.ws, "symbolic-ref", "HEAD", "refs/heads/main")
    (x.ws / "README.md").write_text("hello\n")
    git(x.ws, "add", "README.md")
    git(x.ws, "commit", "-q", "-m", "first")
    remotes = {}
    for name in ("origin", "upstream"):
        path = x.ws.parent / f"{name}.git"
        git(x.ws.parent, "init", "-q", "--bare", str(path))
        git(x.ws, "remote", "add", name, str(path))
        remotes[name] = str(path)
    config = Path.home() / ".agent" / "config.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("sandbox: {enabled: false}\n")
    return remotes


def pushed(remote):
    return subprocess.run(["git", "--git-dir", remote, "rev-parse", "-q", "--verify", "refs/heads/main"],
                          capture_output=True).returncode == 0


def run_bypass(x, command, *answers, mode="bypassPermissions"):
    """One run of main() in `mode` whose model asks for one bash command.
    Returns (questions asked, everything on stderr, the command's tool result)."""
    asked = human(x, *answers)
    before = len(x.bodies())
    x.api.script([reply(tool("bash", {"command": command})), reply("Finished.")])
    code, out, err = x.main(["--permission-mode", mode, "push the branch"])
    results = results_of(x, before + 1)
    return asked, err, results[0] if results else None


def push_asks_in_bypass(x):
    remotes = repo_with_remotes(x)
    asked, err, result = run_bypass(x, "git push origin main", "n")
    assert asked, "git push origin main ran in bypassPermissions without a question"
    assert result and result.get("is_error"), f"after the human's no the model got {result!r}"
    assert not pushed(remotes["origin"]), "the push went through although the human said no"


def shows_the_named_remote(x):
    remotes = repo_with_remotes(x)
    asked, err, _ = run_bypass(x, "git push -u upstream main", "n")
    assert asked, "git push -u upstream main ran without a question"
    shown = err + "\n".join(asked)
    assert remotes["upstream"] in shown, (f"the human was not shown where upstream points "
                                          f"({remotes['upstream']})")
    assert remotes["origin"] not in shown, "for a push to upstream the human was shown origin's URL"


def bare_push_and_compound(x):
    remotes = repo_with_remotes(x)
    asked, err, _ = run_bypass(x, "git push", "n")
    assert asked, "a bare `git push` ran without a question"
    assert remotes["origin"] in err + "\n".join(asked), "a bare `git push` did not show origin's URL"
    asked, err, _ = run_bypass(x, "git add -A && git push origin main", "n")
    assert asked, "`git add -A && git push origin main` ran without a question"
    assert not pushed(remotes["origin"]), "the compound command pushed although the human said no"


def others_still_run_and_yes_pushes(x):
    remotes = repo_with_remotes(x)
    asked, err, result = run_bypass(x, "git status", "n")
    assert not asked, f"git status asked in bypassPermissions: {asked[0][:200]!r}"
    assert result and not result.get("is_error"), f"git status did not run: {result!r}"
    asked, err, result = run_bypass(x, "git push origin main", "y")
    assert pushed(remotes["origin"]), f"after a yes the branch was not pushed: {result and result['content']!r}"
    asked, err, _ = run_bypass(x, "git push upstream main", "n", mode="acceptEdits")
    assert asked, "git push asked in bypassPermissions but not in acceptEdits"
    (Path.home() / ".agent" / "config.yaml").write_text("sandbox: {enabled: true}\n")
    asked, err, _ = run_bypass(x, "git push upstream main", "n", mode="acceptEdits")
    assert asked, "with the sandbox on, git push ran without a question (the sandbox's auto-allow came first)"


# s07.2: yes for this session ---------------------------------------------------------
def default_mode(x):
    x.state.mode = "default"


def touch(name, n=1):
    return [reply(tool("bash", {"command": f"touch {name}"})) for _ in range(n)]


def answered_s(x, history):
    """The first call of the turn ran after the human answered s."""
    result = x.tool_results(history)[0]
    assert not result.get("is_error") and (x.ws / "made.txt").exists(), \
        f"after the answer s the command did not run: {result['content'][:200]!r}"


def offers_session(question):
    """Does the question name the session answer? The forms a question shows its answers
    in count: `[s]ession` (the chapter's own `[y]es` style), `(s)ession`, Sessions, and
    the obvious ways to say it without the word (this run, until you quit)."""
    text = re.sub(r"[\[\]()]", "", question).lower()
    return bool(re.search(r"session|this run\b|until (you |the agent )?(exit|quit|restart|close)", text))


def session_answer_runs(x):
    default_mode(x)
    asked = human(x, "s")
    history = turn(x, touch("made.txt"))
    assert asked, "the command did not ask in default mode"
    assert offers_session(asked[0]), f"the question does not offer the session answer: {asked[0]!r}"
    answered_s(x, history)


def session_answer_holds(x):
    default_mode(x)
    asked = human(x, "s")
    answered_s(x, turn(x, touch("made.txt", 3)))
    assert len(asked) == 1, f"the same command asked {len(asked)} times after the answer s"
    asked.clear()
    turn(x, touch("made.txt"), prompt="again")
    assert not asked, "the next prompt of the same session asked again"


def session_answer_is_not_saved(x):
    default_mode(x)
    human(x, "s")
    answered_s(x, turn(x, touch("made.txt")))
    local = x.ws / ".agent" / "config.local.yaml"
    assert not local.exists(), f"the session answer wrote {local.name}: {local.read_text()[:200]!r}"
    later = x.mod.AgentState(x.ws)  # the next session: a fresh agent
    later.permissions["sandbox"]["enabled"] = False
    with x.mod.acting_as(later):
        asked = human(x, "n")
        turn(x, touch("made.txt"), prompt="a new session")
    assert asked, "a new session (a fresh AgentState) did not ask again: the rule outlived its session"


def session_answer_is_narrow(x):
    default_mode(x)
    asked = human(x, "s", "n")
    history = turn(x, touch("made.txt") + touch("other.txt"))
    answered_s(x, history)
    assert len(asked) == 2, (f"{len(asked)} question(s) for `touch made.txt` then `touch other.txt`: "
                             f"the session rule must be as narrow as an always rule")
    assert x.tool_results(history)[1].get("is_error"), "`touch other.txt` ran after the human said no"


def other_answers_unchanged(x):
    default_mode(x)
    asked = human(x, "y", "n", "a")
    history = turn(x, touch("one.txt") + touch("two.txt") + touch("three.txt"))
    errors = [bool(r.get("is_error")) for r in x.tool_results(history)]
    assert errors == [False, True, False], f"y, n, a gave is_error {errors}, not [False, True, False]"
    local = x.ws / ".agent" / "config.local.yaml"
    assert local.exists() and "touch three.txt" in local.read_text(), "the answer a no longer writes its rule"


EXERCISES = {
    1: ("git push always asks, and shows where it goes", [
        ("git push origin main asks even in bypassPermissions; a no refuses it and nothing is pushed",
         "Which step of decide() does bypassPermissions never skip? Read decide() in order.",
         push_asks_in_bypass),
        ("the question shows the URL of the remote the command names (git push -u upstream main)",
         "Which word of `git push -u upstream main` is the remote? git can name its URL (the name is "
         "the model's text: never in a shell line).",
         shows_the_named_remote),
        ("a bare `git push` shows origin's URL; `git add -A && git push origin main` asks too",
         "How does the chapter split `a && b` before it matches rules? And which remote does a bare "
         "push go to?",
         bare_push_and_compound),
        ("other commands run as before; a yes pushes; acceptEdits and the sandbox ask too",
         "With the sandbox on, which step of decide() allows a command before yours is reached?",
         others_still_run_and_yes_pushes),
    ]),
    2: ("an answer that allows a call for this session only", [
        ("answering s runs the call, and the question offers it",
         "In ask_permission(), treat s (or session) like a yes, and name it in the question.",
         session_answer_runs),
        ("after s the same call runs without a question, this turn and the next",
         "Where does decide() read its allow rules from?",
         session_answer_holds),
        ("nothing is written to disk, and a new session asks again",
         "Which step of a writes to disk? And where does your rule live: what does a new AgentState "
         "start with?",
         session_answer_is_not_saved),
        ("the session rule is as narrow as an always rule",
         "How does a word its rule?",
         session_answer_is_narrow),
        ("y, n and a still do what they did",
         "Add the new answer beside the others; do not change them.",
         other_answers_unchanged),
    ]),
}
