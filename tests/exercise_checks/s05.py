"""Checks for exercises/s05.md. Each point: (what must hold, a hint, fn(x))."""
import contextlib
import io
import json
from pathlib import Path

from fake_api import reply, tool


def turn(x, steps, prompt="do the work"):
    """One scripted turn, output captured; returns the tool results."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return x.tool_results(x.turn(steps, prompt))


def skill(name, body, extra=""):
    """A user skill (the human's own: its commands run without a question)."""
    folder = Path.home() / ".agent" / "skills" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "SKILL.md").write_text(f"---\nname: {name}\ndescription: The {name} skill.\n{extra}---\n{body}\n")
    return folder / "SKILL.md"


def load(name, arguments=None):
    args = {"name": name} | ({"arguments": arguments} if arguments is not None else {})
    return reply(tool("load_skill", args))


# s05.1: a skill is loaded once per conversation --------------------------------
STYLE = "STYLE-BODY-1: four spaces, no tabs. Applies to: $ARGUMENTS"


def twice_is_once(x):
    skill("style", STYLE)
    results = turn(x, [load("style"), load("style")])
    assert "STYLE-BODY-1" in results[0]["content"], f"the first load has no body: {results[0]['content'][:200]!r}"
    assert "STYLE-BODY-1" not in results[1]["content"], ("the second load of the same skill, same arguments, "
                                                         "sent the whole body again")


def new_arguments_load_again(x):
    skill("style", STYLE)
    results = turn(x, [load("style", "a.py"), load("style", "b.py")])
    assert "b.py" in results[1]["content"] and "STYLE-BODY-1" in results[1]["content"], \
        f"a load with other arguments did not get the body: {results[1]['content'][:200]!r}"


def changed_skill_load_again(x):
    path = skill("style", STYLE)

    def edit_then_load(body):
        path.write_text(path.read_text().replace("STYLE-BODY-1", "STYLE-BODY-2"))
        return load("style")
    results = turn(x, [load("style"), edit_then_load])
    assert "STYLE-BODY-2" in results[1]["content"], ("SKILL.md changed after the first load, and the "
                                                     f"second load did not send it: {results[1]['content'][:200]!r}")


def child_gets_it(x):
    skill("style", STYLE)
    brief = "check the style of app.py"
    turn(x, [load("style"), reply(tool("agent", {"prompt": brief})), load("style"), reply("Style is fine.")])
    child = [b for b in x.bodies() if b["messages"][0]["content"] in (brief, [{"type": "text", "text": brief}])]
    seen = [r.get("content") for b in child for m in b["messages"] if m["role"] == "user"
            for r in (m["content"] if isinstance(m["content"], list) else []) if r.get("type") == "tool_result"]
    assert any("STYLE-BODY-1" in json.dumps(c) for c in seen), ("a subagent loading the skill got no body: its "
                                                                "context is its own, it never saw the parent's")


# s05.2: named arguments ---------------------------------------------------------
NAMES = "arguments: [file, style]\n"


def named_replaced(x):
    skill("review", "Review $file in the $style style.", NAMES)
    results = turn(x, [load("review", "src/app.py terse"), load("review", "src/other.py")])
    assert "Review src/app.py in the terse style." in results[0]["content"], \
        f"$file and $style were not replaced by the words: {results[0]['content'][:300]!r}"
    assert "$style" not in results[1]["content"] and "Review src/other.py in the" in results[1]["content"], \
        f"a missing word must become nothing, as $1 does: {results[1]['content'][:300]!r}"


def named_quoted_in_commands(x):
    skill("list", "Files: !`printf '[%s]' $file`", NAMES)
    results = turn(x, [load("list", '"a b; touch pwned" second')])
    assert "[a b; touch pwned]" in results[0]["content"], \
        f"in a !`command`, $file must be one shell-quoted word: {results[0]['content'][:300]!r}"
    assert not (x.ws / "pwned").exists(), "an argument ran as a shell command"


def undeclared_untouched(x):
    skill("review", "Home is $HOME; $filename and $styles stay; $file is replaced.", NAMES)
    results = turn(x, [load("review", "app.py terse")])
    content = results[0]["content"]
    assert "Home is $HOME; $filename and $styles stay" in content, \
        f"only the declared names, as whole words, are placeholders: {content[:300]!r}"
    assert "app.py is replaced" in content, f"$file was not replaced: {content[:300]!r}"


def one_scan(x):
    skill("review", "Review $file in the $style style.", NAMES)
    results = turn(x, [load("review", "'$style' '!`touch hacked`'")])
    content = results[0]["content"]
    assert "Review $style in the !`touch hacked` style." in content, \
        f"an argument's text was scanned again for placeholders or commands: {content[:300]!r}"
    assert not (x.ws / "hacked").exists(), "an argument ran as a command"


def old_forms_still(x):
    skill("review", "Review $file.", NAMES)
    skill("plain", "First $0, all: $ARGUMENTS.", NAMES)
    results = turn(x, [load("review", "app.py terse"), load("plain", "app.py terse")])
    assert "ARGUMENTS:" not in results[0]["content"], ("the arguments were appended although the body "
                                                       "uses a named placeholder")
    assert "First app.py, all: app.py terse." in results[1]["content"], \
        f"$0 and $ARGUMENTS no longer work: {results[1]['content'][:300]!r}"


# s05.3: /clear -------------------------------------------------------------------
def session(x, steps, *lines):
    """The REPL over typed lines; returns its stdout."""
    x.api.script(steps)
    code, out, err = x.main([], stdin="".join(line + "\n" for line in lines))
    assert code == 0, f"the REPL exited {code}: {err.strip()[-300:]!r}"
    return out


def clear_empties(x):
    session(x, [reply("One."), reply("Two.")], "first question", "/clear", "second question")
    bodies = x.bodies()
    assert len(bodies) == 2, f"{len(bodies)} model calls for two prompts and a /clear, not 2: /clear is local"
    sent = bodies[1]["messages"]
    assert len(sent) == 1 and "second question" in json.dumps(sent[0]), \
        f"after /clear the next request still carries the old conversation: {json.dumps(sent)[:300]}"


def clear_plan(x):
    plan = {"items": [{"content": "Write the parser", "status": "in_progress"}]}
    session(x, [reply(tool("todo_write", plan)), reply("Planned."), reply("Fresh.")],
            "make a plan", "/clear", "something else")
    assert x.mod.agent_state().plan["items"] == [], "after /clear the old plan is still the agent's plan"


def clear_reads(x):
    (x.ws / "a.txt").write_text("one\n")
    session(x, [reply(tool("read_file", {"path": "a.txt"})), reply("Read."),
                reply(tool("edit_file", {"path": "a.txt", "old_string": "one", "new_string": "two"})),
                reply("Edited.")], "read a.txt", "/clear", "change one to two in a.txt")
    last = x.bodies()[-1]["messages"][-1]["content"]
    result = next(b for b in last if b.get("type") == "tool_result")
    assert result.get("is_error") and (x.ws / "a.txt").read_text() == "one\n", \
        ("after /clear the model no longer has a.txt in its context, yet an edit without a new read was "
         "allowed: forget the file-read records too")


def clear_in_help(x):
    code, out, err = x.main(["/help"])
    assert "/clear" in out, f"/help does not list /clear: {out[:300]!r}"


EXERCISES = {
    1: ("a skill is loaded once per conversation", [
        ("loading the same skill twice with the same arguments sends the body once",
         "What does the running agent already have in its context, and how can load_skill() see it?",
         twice_is_once),
        ("other arguments load the skill again",
         "What differs between two loads with other arguments? Compare that.",
         new_arguments_load_again),
        ("a SKILL.md changed since the last load is sent again",
         "What changes when SKILL.md changes, and does your comparison see it?",
         changed_skill_load_again),
        ("a subagent loading it gets the body: its context is its own",
         "Where does your record of loaded skills live? A subagent is an AgentState of its own.",
         child_gets_it),
    ]),
    2: ("named arguments", [
        ("with `arguments: [file, style]`, $file and $style become the first and second word",
         "parse_skill() reads the names from the frontmatter; substitute() needs them to build its pattern.",
         named_replaced),
        ("in a !`command` a named argument is one shell-quoted word",
         "command_line() quotes $0, $1 with shlex.quote: treat a name as the index it stands for.",
         named_quoted_in_commands),
        ("only the declared names, as whole words, are placeholders ($HOME, $filename, $styles stay)",
         "Which names may be placeholders? And what in your pattern stops $filename reading as $file + 'name'?",
         undeclared_untouched),
        ("one scan: an argument's text is never scanned again (one that reads $style or !`cmd` stays as it is)",
         "After you put a word in for $file, is that word scanned again by a later step?",
         one_scan),
        ("$0 and $ARGUMENTS still work, and a body using a named placeholder gets no ARGUMENTS: line appended",
         "substitute() appends the arguments when the body has no placeholder: named ones count as placeholders.",
         old_forms_still),
    ]),
    3: ("a /clear command", [
        ("after /clear the next prompt starts a new conversation, and /clear itself never reaches the model",
         "Which object does repl() go on using after your handler returns? Read repl() and handle_slash().",
         clear_empties),
        ("the plan goes too",
         "The plan is on agent_state(): give it a fresh, empty one.",
         clear_plan),
        ("so do the file-read records: a file read before /clear must be read again before an edit",
         "agent_state().files is what check_fresh() consults.",
         clear_reads),
        ("/help lists /clear",
         "Register it with command(name, description, handler): /help reads the registry.",
         clear_in_help),
    ]),
}
