"""Checks for exercises/s01.md. Each point: (what must hold, a hint, fn(x))."""
import contextlib
import io
import re

from fake_api import reply, tool


def endless(n):
    """n replies that each ask for another command: a model that never finishes."""
    return [reply(tool("bash", {"command": f"echo step {i}"})) for i in range(n)]


# s01.1: --max-turns ---------------------------------------------------------
def flag_not_in_prompt(x):
    x.api.script([reply("hi")])
    code, out, err = x.main(["--max-turns", "3", "say", "hi"])
    first = x.bodies()[0]["messages"][0]["content"]
    assert first == "say hi", f"the model was asked {first!r}"
    assert code == 0, f"exit status {code}: {err.strip()[-200:]}"


def flag_limits_calls(x):
    x.api.script(endless(5))
    code, out, err = x.main(["--max-turns", "2", "loop forever"])
    assert len(x.bodies()) == 2, f"{len(x.bodies())} model calls were made, not 2"
    assert code != 0, "a run stopped by the limit must not exit 0"


def flag_beats_env(x):
    x.mod.os.environ["AGENT_MAX_TURNS"] = "4"       # put back after the point
    x.api.script(endless(5))
    x.main(["--max-turns", "1", "loop forever"])
    assert len(x.bodies()) == 1, f"{len(x.bodies())} model calls with --max-turns 1 and AGENT_MAX_TURNS=4"


def bad_value_one_line(x):
    code, out, err = x.main(["--max-turns", "zero", "task"])
    assert code == 2, f"exit status {code}, not 2"
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, f"stderr was {err!r}"
    assert not x.bodies(), "the model was called anyway"


EXERCISES = {
    1: ("a --max-turns flag", [
        ("the flag and its value are not sent to the model",
         "Look at how main() builds the prompt from argv: what does it do with your two words?",
         flag_not_in_prompt),
        ("--max-turns 2 stops after two model calls, with a non-zero exit",
         "The limit has to reach turn_limit(), which agent_loop() asks each time.",
         flag_limits_calls),
        ("the flag wins over AGENT_MAX_TURNS",
         "turn_limit() reads AGENT_MAX_TURNS: where does your flag's value come into it, and which one wins?",
         flag_beats_env),
        ("a bad value gets one line on stderr and exit status 2, before any model call",
         "Validate like turn_limit() does and print the ValueError, as main() already does.",
         bad_value_one_line),
    ]),
}


def quiet(x, fn, *args, **kw):
    """Run fn with stdout and stderr captured: (its value, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        value = fn(*args, **kw)
    return value, out.getvalue(), err.getvalue()


def same(n, command="echo same"):
    return [reply(tool("bash", {"command": command})) for _ in range(n)]


# s01.2: a model that repeats itself -----------------------------------------
def repeats_stop(x):
    history, _, _ = quiet(x, x.turn, same(6), finish=None)
    calls = len(x.bodies())
    assert calls == 3, f"{calls} model calls for six identical bash calls in a row, not 3"
    assert x.reason != "end_turn", f"agent_loop returned {x.reason!r} for a turn it stopped"


def repeats_said(x):
    _, out, err = quiet(x, x.turn, same(4, "echo stuck-here"), finish=None)
    lines = [ln for ln in err.splitlines() if "echo stuck-here" in ln and not ln.lstrip().startswith(">")]
    assert lines, f"no line on stderr (besides the '> bash' ones) names the repeated call; stderr ended {err[-300:]!r}"
    assert "stuck-here" not in out, "the note went to stdout, which carries only the answer"


def alternating_is_fine(x):
    steps = [reply(tool("bash", {"command": f"echo {'ab'[i % 2]}"})) for i in range(6)]
    quiet(x, x.turn, steps)
    assert x.reason == "end_turn", f"agent_loop returned {x.reason!r}: two calls taking turns are no loop"
    assert len(x.bodies()) == 7, f"{len(x.bodies())} model calls, not 7"


def valid_after_stop(x):
    history, _, _ = quiet(x, x.turn, same(3), finish=None)
    x.mod.add_user_text(history, "try something else")
    x.api.script([reply("Fine, done.")])
    reason, _, _ = quiet(x, x.mod.agent_loop, x.client, history)
    assert reason == "end_turn", f"the next prompt's turn ended with {reason!r}"


def fresh_each_turn(x):
    x.api.script(same(2) + [reply("one")] + same(2) + [reply("two")])
    code, out, err = x.main([], stdin="first\nsecond\n")
    assert len(x.bodies()) == 6, (f"{len(x.bodies())} model calls over two prompts that each ran "
                                  f"'echo same' twice, not 6: the count must start again each turn")
    assert "two" in out, "the second prompt's answer never came"


# s01.3: what a turn cost ----------------------------------------------------
USAGE = {"input_tokens": 1_234, "output_tokens": 56}


def priced(steps):
    """The same steps, each with the usage figures above."""
    return [dict(s, usage=USAGE) for s in steps]


def numbers(line):
    return set(re.findall(r"\d+", line.replace(",", "").replace("_", "")))


def bill_line(err, calls):
    """The stderr line that carries calls, input and output totals for `calls` model calls."""
    want = {str(calls), str(calls * USAGE["input_tokens"]), str(calls * USAGE["output_tokens"])}
    return [ln for ln in err.splitlines() if want <= numbers(ln)]


def cost_line(x):
    x.api.script(priced(same(2) + [reply("Finished.")]))
    code, out, err = x.main(["count", "it"])
    assert code == 0, f"exit status {code}"
    assert bill_line(err, 3), ("no stderr line with the turn's 3 model calls, 3702 input and 168 "
                               f"output tokens; stderr ended {err[-300:]!r}")


def cost_not_stdout(x):
    x.api.script(priced([reply("The answer.")]))
    code, out, err = x.main(["answer", "me"])
    assert out.strip() == "The answer.", f"stdout was {out!r}: it must carry only the answer"
    assert bill_line(err, 1), "the cost line is not on stderr"


def cost_when_stopped(x):
    x.mod.os.environ["AGENT_MAX_TURNS"] = "2"
    x.api.script(priced(same(1) + [reply(tool("bash", {"command": "echo other"}))] * 3))
    code, out, err = x.main(["loop"])
    assert code != 0, "a turn stopped by the limit exits 0"
    assert bill_line(err, 2), ("a turn stopped by the turn limit reports no cost line for its 2 "
                               f"calls; stderr ended {err[-300:]!r}")


def cost_per_turn(x):
    x.api.script(priced(same(1) + [reply("one")] + [reply("two")]))
    code, out, err = x.main([], stdin="first\nsecond\n")
    assert bill_line(err, 2), "the first prompt (2 model calls) got no cost line of its own"
    assert bill_line(err, 1), "the second prompt (1 model call) got no cost line of its own: each turn counts from zero"


EXERCISES[2] = ("stop a model that repeats itself", [
    ("the same call three times in a row stops the turn after the third",
     "Read how agent_loop() counts unknown tools in a row and stops on the third: a repeat is "
     "another thing to count in a row.",
     repeats_stop),
    ("one line on stderr says the turn stopped and names the repeated call",
     "say() writes to stderr; the line has to name the call, so what of the call goes in it?",
     repeats_said),
    ("two calls taking turns (a, b, a, b, ...) are not a repeat",
     "'In a row': what happens to your count when a different call comes in between?",
     alternating_is_fine),
    ("after the stop the history is valid: the next prompt runs normally",
     "Print the last two messages of the history your stop leaves, and read agent_loop()'s "
     "docstring: what does the next request need of every tool_use?",
     valid_after_stop),
    ("each turn counts from zero (two calls at the end of one turn and one at the start of the next are no repeat)",
     "Where does your count live, and what sets it back to zero? Compare with `unknown`.",
     fresh_each_turn),
])

EXERCISES[3] = ("what a turn cost", [
    ("after a turn, one stderr line gives its model calls, input tokens and output tokens",
     "call_model() returns the message, and message.usage has the two token counts; say() writes "
     "to stderr. Where in agent_loop() does a turn end?",
     cost_line),
    ("stdout still carries only the answer",
     "Use say() (stderr), not print().",
     cost_not_stdout),
    ("a turn stopped by the turn limit still reports what it spent",
     "A turn cut by the limit leaves agent_loop() by another way than end_turn: does your "
     "report run on that way out, and on the others?",
     cost_when_stopped),
    ("each turn reports its own totals",
     "Where are your totals set to zero, and how often does that line run?",
     cost_per_turn),
])
