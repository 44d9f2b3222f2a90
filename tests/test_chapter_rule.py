"""The chapter rule (README, "The chapter rule"), checked on the files as they are.

1. consecutive chapters differ by additions plus a small number of changed
   lines (the docstring aside, which every chapter rewrites);
2. no chapter imports another, and importing one has no side effects;
3. every file keeps the same section skeleton, in the same order;
4. names fixed in s01/s02 never disappear later;
5. reading tiers (SPEC 3.7): every sub-ruler of a chapter's own section says what it
   is, [core], [hardening: skip on first read] or [extra]; the core comes first and
   fits one sitting (CORE_BUDGET lines, or the chapter's declared exception); each
   hardening sub-section opens with what it stops and a test that exists.
"""
import ast
import difflib
import itertools
import re
import subprocess
import sys

import pytest

from conftest import CHAPTERS, ROOT

MAX_REMOVED = 25           # carried lines a chapter may change (hook lines), docstring aside
MAX_REMOVED_IN = {"s12_worktree_mcp": 40}  # two mechanisms (worktrees, MCP), and in a lane every
                           # place that finds the project's data (memory, skills, schedules) hooked
PAIRS = list(zip(CHAPTERS, CHAPTERS[1:]))
FIXED_NAMES = ["agent_loop", "call_model", "run_bash", "run_tool", "run_tools", "TOOLS",
               "TOOL_HANDLERS", "ToolError", "check_dangerous", "make_client", "main", "repl"]

# Reading tiers. A sub-section is its ruler and every line up to the next ruler.
TIERED = CHAPTERS[1:]      # s01 has no section of its own: the whole file is its lesson
CORE_BUDGET = 450          # lines of a chapter's [core] sub-sections: one sitting (SPEC 3.7;
                           # careful reading takes 200-400 lines of code at a time, and these
                           # lines carry their comments)
CORE_BUDGET_IN = {         # declared exceptions: (lines, why)
    "s12_worktree_mcp": (2 * CORE_BUDGET, "two mechanisms the design puts in one chapter (SPEC "
                         "3.7): worktrees (a lane made or reused, its three tools) and MCP (its "
                         "config, the stdio transport written by hand as one class, connecting "
                         "and its tools)"),
}
TIERS = {"[core]": "core", "[hardening: skip on first read]": "hardening", "[extra]": "extra"}
SUB_RULER = re.compile(r"# --- (?:s\d\d|full)\.(\d+): (.+?) (\[[^]]*\]) ---$")


def own_sub_sections(name):
    """[(ruler, tier or None, lines)] of the chapter's own section, in file order."""
    key = "full" if name == "agent_full" else name[:3]
    lines = body_lines(name)
    start = next(i for i, line in enumerate(lines) if line.startswith(f"# --- {key}: "))
    out = []
    for line in lines[start + 1:]:
        if re.match(r"# --- .+ ---$", line) and not line.startswith(f"# --- {key}."):
            break
        if line.startswith(f"# --- {key}."):
            m = SUB_RULER.match(line)
            out.append((line, TIERS.get(m.group(3)) if m else None, []))
        if out:
            out[-1][2].append(line)
    return out


@pytest.mark.parametrize("name", TIERED)
def test_every_sub_ruler_carries_a_tier_and_the_core_comes_first(name):
    subs = own_sub_sections(name)
    assert subs, f"{name}: its own section has no sub-sections"
    untiered = [ruler for ruler, tier, _ in subs if tier is None]
    assert not untiered, f"{name}: sub-rulers without [core], [hardening: skip on first read] " \
                         f"or [extra]:\n" + "\n".join(untiered)
    tiers = [tier for _, tier, _ in subs]
    assert tiers[0] == "core" and "core" not in tiers[tiers.index("core") + tiers.count("core"):], \
        f"{name}: the core sub-sections come first, together:\n" + \
        "\n".join(ruler for ruler, _, _ in subs)
    numbers = [int(SUB_RULER.match(ruler).group(1)) for ruler, _, _ in subs]
    assert numbers == list(range(1, len(subs) + 1)), f"{name}: sub-sections numbered {numbers}"


@pytest.mark.parametrize("name", TIERED)
def test_the_core_fits_its_budget(name):
    budget, why = CORE_BUDGET_IN.get(name, (CORE_BUDGET, ""))
    core = [(ruler, len(lines)) for ruler, tier, lines in own_sub_sections(name) if tier == "core"]
    total = sum(n for _, n in core)
    assert total <= budget, (
        f"{name}'s core is {total} lines, over its budget of {budget}"
        + (f" ({why})" if why else "") + ". Its [core] sub-sections:\n"
        + "\n".join(f"  {n:5}  {ruler}" for ruler, n in core)
        + "\nMove what a hostile review or a crash test added to a [hardening] sub-section, and "
          "what goes beyond the mechanism to an [extra] one: never the mechanism itself.")


@pytest.mark.parametrize("name", TIERED)
def test_each_hardening_sub_section_names_what_it_stops_and_its_test(name):
    for ruler, tier, lines in own_sub_sections(name):
        if tier != "hardening":
            continue
        stops, proof = (lines[1:3] + ["", ""])[:2]
        assert re.match(r"# Stops: \S", stops), f"{name}: {ruler} does not open with '# Stops: ...'"
        assert re.fullmatch(r"# Test: (tests/test_\w+\.py)::(test_\w+)", proof), \
            f"{name}: {ruler}: the line after Stops is '# Test: tests/test_x.py::test_name'"
        for more in itertools.takewhile(lambda line: line.startswith("# Test: "), lines[2:]):
            m = re.fullmatch(r"# Test: (tests/test_\w+\.py)::(test_\w+)", more)  # a part another proves
            assert m, f"{name}: {ruler}: {more!r} is not '# Test: tests/test_x.py::test_name'"
            source = (ROOT / m.group(1)).read_text(encoding="utf-8") if (ROOT / m.group(1)).exists() else ""
            assert re.search(rf"^def {m.group(2)}\(", source, re.M), \
                f"{name}: {ruler} names {m.group(1)}::{m.group(2)}, which is no test there"


@pytest.mark.parametrize("name", CHAPTERS)
def test_every_sub_section_a_comment_names_exists(name):
    """A comment's pointer such as "(s07.8)" names a sub-section this file has: when
    sub-sections are renumbered, no comment is left pointing at nothing."""
    lines = body_lines(name)
    subs = {m.group(1) for line in lines if (m := re.match(r"# --- ((?:s\d\d|full)\.\d+): ", line))}
    dangling = [(ref, line.strip()[:80]) for line in lines if "#" in line and not line.startswith("# ---")
                for ref in re.findall(r"\b((?:s\d\d|full)\.\d+)\b", line[line.index("#"):])
                if ref not in subs]
    assert not dangling, f"{name}: comments name sub-sections it does not have: {dangling[:5]}"


@pytest.mark.parametrize("name", CHAPTERS)
def test_each_top_level_name_is_defined_once(name):
    """A function or class defined twice in one file: the later definition replaces
    the earlier for every caller. Splitting a function out under a name a carried
    chapter already uses breaks that chapter's callers in this file only."""
    seen = {}
    for node in ast.parse((ROOT / f"{name}.py").read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            seen.setdefault(node.name, []).append(node.lineno)
    twice = {n: lines for n, lines in seen.items() if len(lines) > 1}
    assert not twice, f"{name}: defined more than once (at these lines): {twice}"


def body_lines(name):
    """The file without its top docstring."""
    src = (ROOT / f"{name}.py").read_text(encoding="utf-8")
    doc = ast.get_docstring(ast.parse(src), clean=False)
    end = src.index('"""', src.index('"""') + 3) + 3 if doc is not None else 0
    return src[end:].splitlines()


def sections(name):
    return [line for line in body_lines(name) if re.match(r"# --- .+ ---$", line)]


@pytest.mark.parametrize("a,b", PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def test_consecutive_chapters_mostly_add(a, b):
    removed = [line for line in difflib.unified_diff(body_lines(a), body_lines(b), lineterm="", n=0)
               if line.startswith("-") and not line.startswith("---")]
    assert len(removed) <= MAX_REMOVED_IN.get(b, MAX_REMOVED), \
        f"{b} changes {len(removed)} carried lines:\n" + "\n".join(removed)


@pytest.mark.parametrize("a,b", PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def test_sections_only_grow(a, b):
    before, after = sections(a), sections(b)
    assert [s for s in after if s in before] == before, "sections reordered or dropped"
    new = [s for s in after if s not in before]
    loop = after.index("# --- agent loop ---")
    for s in new:
        assert after.index(s) < loop, f"{s} must sit before the agent loop"


@pytest.mark.parametrize("name", CHAPTERS)
def test_skeleton_and_docstring(name):
    found = sections(name)
    for label in ["# --- imports ---", "# --- config ---", "# --- model client ---",
                  "# --- tools ---", "# --- agent loop ---", "# --- REPL / main ---"]:
        assert label in found, f"{name} lacks {label}"
    assert found[-2:] == ["# --- agent loop ---", "# --- REPL / main ---"]
    doc = ast.get_docstring(ast.parse((ROOT / f"{name}.py").read_text()))
    assert doc.splitlines()[0].startswith(f"{name}.py - ") or name == "agent_full"
    for word in ("Run:", "Try:", "Key insight"):
        assert word in doc
    assert 15 <= len(doc.splitlines()) <= 60


@pytest.mark.parametrize("name", CHAPTERS)
def test_no_chapter_imports_another(name):
    tree = ast.parse((ROOT / f"{name}.py").read_text())
    stems = {c for c in CHAPTERS}
    for node in ast.walk(tree):
        mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        assert not any(m.split(".")[0] in stems for m in mods), f"{name} imports {mods}"


@pytest.mark.parametrize("name", CHAPTERS)
def test_fixed_names_survive(name):
    tree = ast.parse((ROOT / f"{name}.py").read_text())
    defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    defined |= {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets
                if isinstance(t, ast.Name)}
    assert not [n for n in FIXED_NAMES if n not in defined]


@pytest.mark.e2e("s01")
def test_import_has_no_side_effects(tmp_path):
    """Import every chapter with no API settings in an empty directory."""
    code = "import sys; sys.path.insert(0, sys.argv[1])\n" + "".join(
        f"import {c}\n" for c in CHAPTERS)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home")}
    r = subprocess.run([sys.executable, "-c", code, str(ROOT)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and list(tmp_path.iterdir()) == []
