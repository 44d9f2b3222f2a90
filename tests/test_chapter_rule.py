"""The chapter rule (README, "The chapter rule"), checked on the files as they are.

1. consecutive chapters differ by additions plus a small number of changed
   lines (the docstring aside, which every chapter rewrites);
2. no chapter imports another, and importing one has no side effects;
3. every file keeps the same section skeleton, in the same order;
4. names fixed in s01/s02 never disappear later.
"""
import ast
import difflib
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
