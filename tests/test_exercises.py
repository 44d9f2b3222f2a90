"""Every workshop exercise's checker passes on its reference solution and fails on
the untouched chapter (exercises/README.md), so neither can rot: a chapter change
that breaks a solution's patch, or a checker that passes on anything, fails here."""
import importlib.util
import re
from pathlib import Path

import pytest

import exercise

ROOT = Path(__file__).resolve().parents[1]
NAMES = [f"{p.stem}.{k}" for p in sorted((ROOT / "tests" / "exercise_checks").glob("s*.py"))
         for k in exercise.load_checks(p.stem)]


def test_every_chapter_has_at_least_two_exercises_each_with_a_page_a_patch_and_a_check_command():
    chapters = sorted(p.stem.split("_")[0] for p in ROOT.glob("s[0-9][0-9]_*.py"))
    for chapter in chapters:
        mine = [n for n in NAMES if n.split(".")[0] == chapter]
        assert len(mine) >= 2, f"{chapter} has {len(mine)} exercises"
        page = (ROOT / "exercises" / f"{chapter}.md").read_text()
        for name in mine:
            assert exercise.solution_patch(*exercise.parse_name(name)).exists(), name
            assert re.search(rf"^## {re.escape(name)} ", page, re.M), f"{chapter}.md has no section for {name}"
            assert f"python tests/exercise.py {name}" in page, f"{chapter}.md does not say how to check {name}"


def sub_section_titles(chapter):
    """{"s07.2": ("the decision", "core"), ...}: the sub-rulers of a chapter's own section."""
    path = next(ROOT.glob(f"{chapter}_*.py"))
    rulers = re.findall(rf"^# --- ({chapter}\.\d+): (.+?) \[(core|hardening|extra)\b[^]]*\] ---$",
                        path.read_text(encoding="utf-8"), re.M)
    return {ref: (title, tier) for ref, title, tier in rulers}


@pytest.mark.parametrize("chapter", sorted({n.split(".")[0] for n in NAMES} - {"s01"}))
def test_each_page_names_the_sub_sections_to_read_by_their_titles(chapter):
    """The page's reading order lists the core sub-sections, and every exercise has a
    **Read.** line; each sub-section named there carries its current title, so a
    sub-section renumbered or renamed leaves no page pointing at the wrong code."""
    titles = sub_section_titles(chapter)
    page = (ROOT / "exercises" / f"{chapter}.md").read_text(encoding="utf-8")
    core = [ref for ref, (_, tier) in titles.items() if tier == "core"]
    span = core[0] if len(core) == 1 else f"{core[0]} to {core[-1]}"
    intro = " ".join(page.split("\n## ")[0].split())
    assert f"{span} ({'; '.join(titles[ref][0] for ref in core)})" in intro, \
        f"{chapter}.md: the reading order does not list the core, {span}, by its titles"
    for part in page.split("\n## ")[1:]:
        name, text = part.split()[0], " ".join(part.split())
        read = re.search(r"\*\*Read\.\*\* (.*?)(?= \*\*\w+\.\*\*|$)", text)
        assert read, f"{chapter}.md: exercise {name} has no **Read.** line"
        refs = re.findall(rf"{chapter}\.\d+", read[1])
        assert refs, f"{chapter}.md: {name}'s **Read.** line names no sub-section"
        for ref in refs:
            assert ref in titles and f"{ref} ({titles[ref][0]})" in read[1], \
                f"{chapter}.md: {name} reads {ref}, which is {titles.get(ref, ('no sub-section',))[0]!r}"


@pytest.mark.parametrize("name", NAMES)
def test_the_reference_solution_passes(name):
    chapter, k = exercise.parse_name(name)
    results = exercise.check(name, exercise.chapter_file(chapter), exercise.solution_source(chapter, k))
    failed = [(point, failure) for point, _, failure in results if failure is not None]
    assert not failed, failed


@pytest.mark.parametrize("name", NAMES)
def test_the_untouched_chapter_fails(name):
    results = exercise.check(name)
    assert any(failure is not None for _, _, failure in results), f"{name} passes before it is done"


def check_module(chapter):
    """tests/exercise_checks/<chapter>.py as a module, for its word checks."""
    spec = importlib.util.spec_from_file_location(f"word_checks_{chapter}",
                                                  ROOT / "tests" / "exercise_checks" / f"{chapter}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# A check that wants a word takes the forms a learner reasonably writes: case, plural, the
# markup a question shows its answers in, the obvious synonyms where the point is a concept;
# and still refuses text that does not say it (the usage line's "tokens", a number alone).
WORD_CHECKS = [
    ("s02", "names_edit_2", ["edit 2: old_string was not found", "Edit #2 failed", "edit no. 2",
                             "the second edit does not match", "2nd edit: not unique", "edits[1]: not found"],
     ["edit 1 failed", "edit 20 failed", "2 edits failed", "old_string was not found"]),
    ("s04", "says_budget", ["it used up its token budget of 2,500 tokens", "Budget exhausted",
                            "over its token limit (2500)", "it ran out of tokens", "hit the limit of 2,500 tokens",
                            "its tokens ran out"],
     ["[subagent cheap: 3 model calls, 3000 input + 300 output tokens]",
      "it used all 3 turns without finishing"]),
    ("s06", "mentions_a_plan", ["Plan:\n[x] a", "The plan is empty.", "Todo list: (none)", "Checklist: -",
                                "plans kept"],
     ["1. Primary request: SUMMARY-TEXT", "explanation of the parser", "planned work"]),
    ("s07", "offers_session", ["Allow bash? [y]es / [n]o / [a]lways / [s]ession: ", "(s)ession",
                               "s = for this session", "SESSION", "s: allow for this run",
                               "s: until you quit"],
     ["Allow bash? [y]es / [n]o / [a]lways / or tell it what to do instead: "]),
    ("s10", "says_timed_out", ["timed out after 0.5s", "Timeout (0.5 s)", "hit its time limit of 0.5s",
                               "ran longer than 0.5 s", "exceeded 0.5s", "time-out"],
     ["completed", "exit status 1", "killed"]),
    ("s10", "names_half_a_second", ["after 0.5s", "after .5 seconds", "0.50 s", "500 ms", "500ms"],
     ["after 1800s", "after 5 s", "after 1.5s", "0.55s", "5000 ms"]),
    ("s11", "says_idle", ["bob: idle, not woken", "skipped Bob (Idle)", "bob is idling", "bob is inactive",
                          "bob is asleep", "bob is not working right now"],
     ["sent to alice", "bob has stopped", "bob: working"]),
]


@pytest.mark.parametrize("chapter, check, said, not_said", WORD_CHECKS, ids=[w[1] for w in WORD_CHECKS])
def test_a_word_check_takes_the_learners_forms(chapter, check, said, not_said):
    says = getattr(check_module(chapter), check)
    assert [s for s in said if not says(s)] == [], f"{check} refuses these"
    assert [s for s in not_said if says(s)] == [], f"{check} takes these"


def test_a_team_status_line_takes_case_and_the_obvious_status_words():
    shows = check_module("s11").shows
    for line, status in [("alice (writes the parser): Working; unread: 3", "working"),
                         ("ALICE - busy - writes the parser", "working"),
                         ("bob (Writes the tests): IDLE", "idle"), ("bob: free, writes the tests", "idle"),
                         ("carol (reviews the code): exited", "stopped")]:
        role = check_module("s11").ROLES[line.split()[0].strip("(:").lower()]
        assert shows(line, status, role), line
    assert not check_module("s11").shows("bob (writes the tests): inactive", "working", "writes the tests")


# Reference solutions reworded as a learner might: each must still pass its checker.
VARIANTS = {
    "s07.2": [('[s]ession (until this session "', '[s]ession "'), ('f"ends) / or tell', 'f"/ or tell')],
    "s04.2": [("it used up its token budget of {budget:,} tokens", "it ran out of tokens ({budget:,} allowed)")],
    "s10.3": [('f"timed out after {limit:g}s, its timeout', 'f"Time limit reached: ran longer than {limit:g} s')],
    "s11.1": [('"idle, so not woken for this (include_idle true sends it anyway)"', '"Idle: not woken"')],
    "s11.2": [("{m['status']}; unread:", "{m['status'].upper()}; unread:")],
}


@pytest.mark.parametrize("name", VARIANTS)
def test_the_reference_solution_reworded_still_passes(name):
    chapter, k = exercise.parse_name(name)
    source = exercise.solution_source(chapter, k)
    for old, new in VARIANTS[name]:
        assert source.count(old) == 1, f"the reference solution no longer holds {old!r}"
        source = source.replace(old, new)
    results = exercise.check(name, exercise.chapter_file(chapter), source)
    failed = [(point, failure) for point, _, failure in results if failure is not None]
    assert not failed, failed
