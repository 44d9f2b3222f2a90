"""s11 demo: a lead and two teammates, each its own process, share a task board and talk by mail.

Watch the lead's stderr, and .agent/team/<team>/ (with --keep): config.json (the
roster), inbox/<name>.jsonl, messages.jsonl (the log), and each teammate's
output: <name>.log when detached, its own tmux pane when the demo runs in tmux.
In --show-requests each request is headed by its sender (lead, alice or bob,
read from the request) and compared with that sender's earlier requests.
  1. The lead plans three tasks on the board: #1 wc.py, #2 its test (blocked by
     #1), #3 the README.
  2. It spawns alice and bob (the human answers y twice: spawning asks in
     acceptEdits mode). Each is `python s11_teams.py --teammate NAME --team
     TEAM`, in a tmux pane beside the demo's when $TMUX is set, else detached;
     its first prompt waits in its inbox.
  3. Each works on that prompt (a hello to the lead), then goes idle and claims
     the first ready task: one takes #1, the other #3 (#2 is still blocked).
  4. Completing #1 makes #2 ready. Whoever is idle first claims it; if both
     look at once, the claim under the task lock has exactly one winner. Which
     of them wins varies from run to run; the board at the end shows it.
  5. Each reports to the lead with send_message. The lead reads the reports
     as <teammate-message> blocks after its tool results ("[inbox: ...]" on
     stderr) and answers who did what.
  6. The user leaves (end of input): the lead sends each teammate a
     shutdown_request; each answers shutdown_response and stops, and no
     teammate process outlives the lead. The team's message log is printed.
"""
import json
import os
import re
import signal
import time
from pathlib import Path

from fake_api import reply, text, tool

PROMPT = ("Build wc.py (count_words) with a team of two: plan it as tasks on the board, spawn "
          "alice and bob to do them, and tell me who did what.")
ENV = {"AGENT_PERMISSION_MODE": "acceptEdits",   # teammates inherit it: their writes need no question
       "AGENT_AUTO_MEMORY": "0"}                 # no memory side calls (s09 shows those)
INPUT = "y\ny\n"  # the human's yes to each spawn_teammate (acceptEdits asks before any tool but edits)
FAKED = ("The model, for all three members: one scripted server answers the lead and both teammates "
         "in whatever order they call it. Each request is answered from its sender's part of the script "
         "(a teammate's first message names it: \"You are alice, a teammate\"), and a teammate's "
         "replies follow the task it says it claimed; so the replies are fixed, but who does which "
         "task is the real race. The model's pace: the lead's third reply waits until the board is "
         "done and both teammates are idle (it watches .agent/), as a model busy elsewhere would; a "
         "teammate's first task reply waits until both teammates hold a task, so each gets one. "
         "The human: two y answers are piped to the lead's stdin, and the end of input is the user "
         "leaving.")

TEAMMATES = ("alice", "bob")
FIRST = "Say hello to the lead in one line (send_message). Then take ready tasks from the board."
TASKS = {  # id: (subject, file, content)
    "1": ("Write wc.py", "wc.py",
          'def count_words(text):\n    """The number of words in text."""\n    return len(text.split())\n'),
    "2": ("Test wc.py", "test_wc.py",
          'from wc import count_words\n\nassert count_words("one two  three\\n") == 3\n'
          'assert count_words("") == 0\nprint("ok: count_words")\n'),
    "3": ("Write the README", "README.md",
          "# wc\n\n`count_words(text)` counts the words in a text.\n\nTest: `python3 test_wc.py`\n"),
}
WAIT = 120  # seconds: a hang guard for the scripted model's waits, never a pace the demo needs
WORKSPACE = []  # SETUP's workspace: the scripted model's pace watches it
LEAD = []       # the lead's replies still to come, in order (SETUP fills it)


def hello(name):
    return f"Hello from {name}: ready for the board."


def SETUP(workspace):
    # The workspace starts empty; the scripted model keeps its path (see wait_for)
    # and starts the lead's part of the script from the top.
    WORKSPACE[:] = [Path(workspace)]
    LEAD[:] = [plan, spawn, wait_for_team, answer]


# --- what the scripted model reads from a request, and from the workspace ---

def blocks(message):
    content = message["content"]
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def newest_text(body):
    return "\n".join(b.get("text", "") for b in blocks(body["messages"][-1]) if b.get("type") == "text")


def results(body):
    return [b for b in blocks(body["messages"][-1]) if b.get("type") == "tool_result"]


def calls_before(body):
    """The tool calls of the reply the newest results answer."""
    return [b for b in blocks(body["messages"][-2]) if b.get("type") == "tool_use"] \
        if len(body["messages"]) > 1 else []


def sender(body):
    """lead, alice or bob: a teammate's first message names it ("You are alice, a teammate")."""
    first = json.dumps(body["messages"][0]["content"])
    return next((n for n in TEAMMATES if f"You are {n}, a teammate" in first), "lead")


SENDER = sender


def team_dir(workspace):
    found = sorted((workspace / ".agent" / "team").glob("*/config.json"))
    return found[0].parent if found else None


def roster(workspace):
    folder = team_dir(workspace)
    return json.loads((folder / "config.json").read_text()) if folder else {"members": []}


def board(workspace):
    folder = workspace / ".agent" / "tasks"
    return {p.stem: json.loads(p.read_text()) for p in folder.glob("*.json")} if folder.exists() else {}


def wait_for(condition):
    """The scripted model's pace: until condition() holds on disk (WAIT is a hang guard)."""
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def board_done():
    """Every task completed and both teammates idle: nothing more will happen by itself."""
    ws = WORKSPACE[-1]
    status = {m["name"]: m["status"] for m in roster(ws)["members"]}
    tasks = board(ws)
    return sorted(tasks) == sorted(TASKS) and all(t["status"] == "completed" for t in tasks.values()) \
        and all(status.get(n) == "idle" for n in TEAMMATES)


def everyone_holds_a_task():
    owners = {t.get("owner") for t in board(WORKSPACE[-1]).values()}
    return all(n in owners for n in TEAMMATES)


# --- the lead's part ---

def plan(body):
    return reply(text("Three tasks on the board; the test waits for the code."),
                 *[tool("task_create", {"subject": s, "description": f"Write {f}.",
                                        **({"blocked_by": ["1"]} if i == "2" else {})})
                   for i, (s, f, _) in TASKS.items()])


def spawn(body):
    made = [r["content"] for r in results(body)]
    if len(made) != 3 or not all(str(r).startswith(f"Created task #{i}") for r, i in zip(made, TASKS)):
        return reply(f"(demo: expected tasks #1-#3 to be created, got {made})")
    return reply(text("Two teammates; they take the tasks from the board themselves."),
                 tool("spawn_teammate", {"name": "alice", "role": "writes the code", "prompt": FIRST}),
                 tool("spawn_teammate", {"name": "bob", "role": "writes tests and docs", "prompt": FIRST}))


def wait_for_team(body):
    """Both spawned; then the scripted lead takes its time until the team is done."""
    out = [str(r["content"]) for r in results(body)]
    if len(out) != 2 or not all(o.startswith(f"Spawned {n} ") for o, n in zip(out, TEAMMATES)):
        return reply(f"(demo: expected alice and bob to be spawned, got {[o[:100] for o in out]})")
    if not wait_for(board_done):
        return reply(f"(demo: the team did not finish the board within {WAIT} s)")
    return reply(text("The board says all three are done; their reports are in my inbox."),
                 tool("task_list", {}))


def reports(body):
    """Every teammate message, as its <teammate-message> block: (from, content)."""
    found = []
    for m in body["messages"]:
        for b in blocks(m):
            if b.get("type") == "text" and b["text"].startswith("<teammate-message "):
                head, _, rest = b["text"].partition(">\n")
                who = re.search(r'from="([^"]+)"', head)[1]
                found.append((who, rest.removesuffix("\n</teammate-message>")))
    return found


def answer(body):
    """The answer names who did what, from the reports the lead read."""
    got = reports(body)
    done = {m[1]: who for who, content in got if (m := re.match(r"#(\d) done", content))}
    hellos = sorted(who for who, content in got if content.startswith("Hello"))
    if sorted(done) != sorted(TASKS) or hellos != sorted(TEAMMATES) or len(got) != 5:
        return reply(f"(demo: expected two hellos and three reports, each once, got {got})")
    return reply("Done: wc.py, its test and the README. " +
                 ", ".join(f"#{i} {TASKS[i][0]}: {done[i]}" for i in sorted(done)) + ".")


# --- a teammate's part: its replies follow what the request carries ---

def work(task_id):
    """A claimed task: once both teammates hold one, write its file and complete it."""
    wait_for(everyone_holds_a_task)
    subject, path, content = TASKS[task_id]
    return reply(text(f"I claimed #{task_id} from the board: {subject}."),
                 tool("write_file", {"path": path, "content": content}),
                 tool("task_update", {"id": task_id, "status": "completed"}))


def report(body, update):
    """The task's file is written and the task completed: tell the lead."""
    out = [str(r["content"]) for r in results(body)]
    if len(out) != 2 or any(r.get("is_error") for r in results(body)):
        return reply(f"(demo: a task step failed: {out})")
    ready = re.search(r"Now ready: (#\d+)", out[1])
    tid = update["input"]["id"]
    note = f" {ready[1]} is ready now." if ready else ""
    return reply(tool("send_message", {"to": "lead", "content": f"#{tid} done: {TASKS[tid][1]} is written." + note}))


def teammate(name, body):
    newest, calls = newest_text(body), [c["name"] for c in calls_before(body)]
    if claimed := re.search(r"You claimed task #(\d+)", newest):
        return work(claimed[1])
    if calls == ["write_file", "task_update"]:
        return report(body, calls_before(body)[1])
    if calls == ["send_message"]:
        return reply("Reported to the lead; back to the board.")
    if FIRST in newest:
        return reply(tool("send_message", {"to": "lead", "content": hello(name)}))
    return reply(f"(demo: {name} got a request the script does not expect: {newest[:200]!r})")


def route(body):
    who = sender(body)
    if who != "lead":
        return teammate(who, body)
    return LEAD.pop(0)(body) if LEAD else reply("(demo: the lead asked once more than scripted)")


# The lead's 4 replies (LEAD); per teammate 2 for its hello; per task 3 (work, report, done).
STEPS = [route] * (4 + 2 * len(TEAMMATES) + 3 * len(TASKS))


# --- after the run ---

def message_log(workspace):
    folder = team_dir(workspace)
    path = folder / "messages.jsonl" if folder else None
    lines = path.read_text().splitlines() if path and path.exists() else []
    return [r for line in lines if "from" in (r := json.loads(line))]  # not the log_full marker


def teammate_pids(team, workspace):
    """Every process on the machine running as a teammate of `team` in `workspace` (from /proc)."""
    pids = []
    for p in filter(str.isdigit, os.listdir("/proc") if os.path.isdir("/proc") else []):
        try:
            argv = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
            cwd = Path(os.readlink(f"/proc/{p}/cwd"))
        except OSError:
            continue
        if b"--teammate" in argv and team.encode() in argv and cwd == workspace.resolve():
            pids.append(int(p))
    return pids


def SHOW(workspace):
    """the task board (who won each task) and the team's message log from
    .agent/team/<team>/messages.jsonl, one line per delivery: from -> to, type, content."""
    folder = team_dir(workspace)
    if folder is None:
        return "(no team was made)"
    lines = ["The task board (.agent/tasks): each task has one owner, the claim that won it."]
    for i, t in sorted(board(workspace).items()):
        lines.append(f"  #{i} {t['subject']:<18} {t['status']:<10} owner {t.get('owner') or '-':<6} "
                     f"claimed {t.get('claimed', '-')}")
    log = message_log(workspace)
    lines += ["", f"The team's message log (.agent/team/{folder.name}/messages.jsonl): "
                  f"{len(log)} deliveries."]
    for r in log:
        answer = f"[approve {str(r['approve']).lower()}] " if "approve" in r else ""
        content = " ".join(str(r["content"]).split())
        lines.append(f"  {r['from'] + ' -> ' + r['to']:<14} {r['type']:<17} {answer}"
                     f"{content[:70] + '...' * (len(content) > 70)}")
    return "\n".join(lines)


def CHECK(workspace, stdout, runs):
    """wc.py, its test and the README written; the three tasks completed, each by exactly one
    owner (a teammate), who reported it to the lead once; both teammates stopped and no teammate
    process left (from /proc); the log holds both first prompts, both hellos, the three reports,
    and a shutdown request to each teammate answered with approve true; the lead's answer names
    who did what, and each of the lead's status lines is a line of its own."""
    folder = team_dir(workspace)
    assert folder is not None, "no team folder in .agent/team"
    if left := teammate_pids(folder.name, workspace):  # this run's team, in this run's workspace: ours
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        raise AssertionError(f"teammate process(es) {left} outlived the lead (killed now)")
    for _, path, content in TASKS.values():
        assert (workspace / path).read_text() == content, f"{path} is not as written"
    tasks = board(workspace)
    assert sorted(tasks) == sorted(TASKS), f"unexpected task files: {sorted(tasks)}"
    assert all(t["status"] == "completed" and t["owner"] in TEAMMATES for t in tasks.values()), \
        f"not every task completed by a teammate: {[(t['status'], t['owner']) for t in tasks.values()]}"
    status = {m["name"]: m["status"] for m in roster(workspace)["members"]}
    assert all(status.get(n) == "stopped" for n in TEAMMATES), f"teammates not stopped: {status}"
    log = [(r["from"], r["to"], r["type"], r["content"]) for r in message_log(workspace)]
    for i, t in tasks.items():
        done = [(f, to) for f, to, kind, c in log if c.startswith(f"#{i} done")]
        assert done == [(t["owner"], "lead")], f"#{i} (owner {t['owner']}) was reported as {done}"
    for n in TEAMMATES:
        assert ("lead", n, "message", FIRST) in log, f"no first prompt to {n} in the log"
        assert (n, "lead", "message", hello(n)) in log, f"no hello from {n}"
        assert [x for x in log if x[:3] == ("lead", n, "shutdown_request")], f"no shutdown_request to {n}"
        answers = [r for r in message_log(workspace) if r["type"] == "shutdown_response" and r["from"] == n]
        assert len(answers) == 1 and answers[0]["approve"] is True, f"{n}'s shutdown_response: {answers}"
    who = ", ".join(f"#{i} {TASKS[i][0]}: {tasks[i]['owner']}" for i in sorted(tasks))
    assert f"Done: wc.py, its test and the README. {who}." in stdout, "no answer naming who did what"
    status = re.findall(r"^(.*)\[context \d", runs[0]["transcript"], re.M)
    assert len(status) == 4 and not any(status), f"a status line shares its line with: {status}"
