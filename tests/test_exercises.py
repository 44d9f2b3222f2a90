"""Every workshop exercise's checker passes on its reference solution and fails on
the untouched chapter (exercises/README.md), so neither can rot: a chapter change
that breaks a solution's patch, or a checker that passes on anything, fails here."""
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
