"""Before `pip install`: every entry point a learner may try first says, in one
line, which module is missing and the command that installs it (exit status 2),
never a traceback.

A clean Python is made, not assumed: the Python running the suite has the
packages, and a system Python may have some of them (Debian ships pyyaml and
pygments) or all. Two kinds, as learners have them:
- a new virtual environment (`venv --without-pip`, made once per test run): no
  package but the standard library, and pip alone is the way forward;
- the interpreter the suite's venv was made from, without its site-packages
  (`-S`) and outside any venv: there the line makes a venv first, because many
  systems' pip refuses a global install (PEP 668, "externally managed").

Every chapter file runs here, not only the introducing one and the newest, as the
subprocess rule would have it: each carries its own copy of the guard and a copy
that fell behind would fail only in that chapter; without the packages a run stops
at its imports, a few hundredths of a second, not the ~2 s of an e2e run.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import CHAPTERS, once_per_run

ROOT = Path(__file__).resolve().parent.parent
BASE_PYTHON = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"

ENTRY_POINTS = {  # what a learner types, as the README says it (a task for a chapter: one run)
    **{c: [f"{c}.py", "hello"] for c in CHAPTERS},
    "agent_full -p": ["agent_full.py", "-p", "hello"],
    "demo": ["tests/demo.py", "s01", "--show-requests"],
    "book": ["tests/book.py"],
    "exercise checker": ["tests/exercise.py", "s01.1"],
}
VENV_FIRST = "python3 -m venv .venv && . .venv/bin/activate && "


@pytest.fixture(scope="session")
def clean_venv(tmp_path_factory):
    """The python of a virtual environment with nothing installed, made once per run."""
    def make(root):
        subprocess.run([str(BASE_PYTHON), "-m", "venv", "--without-pip", str(root / "venv")], check=True,
                       capture_output=True, timeout=120)
        return str(root / "venv" / "bin" / "python")
    return once_per_run(tmp_path_factory, "clean-venv", make)


def run_clean(python_args, script, args, cwd):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}  # no PYTHONPATH to the packages
    return subprocess.run([*python_args, str(ROOT / script), *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("what", ENTRY_POINTS)
@pytest.mark.parametrize("python", ["new venv", "no venv"])
def test_without_the_packages_each_entry_point_says_how_to_install_them(what, python, clean_venv, tmp_path):
    python_args, first = ([clean_venv], "") if python == "new venv" else ([str(BASE_PYTHON), "-S"], VENV_FIRST)
    script, *args = ENTRY_POINTS[what]
    run = run_clean(python_args, script, args, tmp_path)
    assert "Traceback" not in run.stderr, run.stderr
    assert run.returncode == 2 and run.stdout == "", (run.returncode, run.stdout)
    [line] = run.stderr.splitlines()
    requirements = os.path.relpath(ROOT / "requirements.txt", tmp_path)   # works from where it ran
    assert line == f"No module named 'anthropic': install the packages with {first}pip install -r {requirements}"


# A Python as an older one reports itself (sys.version_info is what the guard reads), then
# the entry point run as a program, as `python3 script args` would run it.
AS_PYTHON_39 = ("import runpy, sys; sys.version_info = (3, 9, 6, 'final', 0); sys.version = '3.9.6 (default)'; "
                "script = sys.argv[1]; sys.argv = sys.argv[1:]; sys.path.insert(0, script.rpartition('/')[0]); "
                "runpy.run_path(script, run_name='__main__')")


@pytest.mark.parametrize("what", ENTRY_POINTS)
def test_on_a_python_older_than_3_10_the_line_names_a_newer_one(what, clean_venv, tmp_path):
    """No version of the packages installs on Python 3.9 (macOS's own python3): there
    the usual line sent the learner to a pip that can only fail (no anthropic 1.0 or
    later for it), so the line says which Python it needs and which one this is."""
    script, *args = ENTRY_POINTS[what]
    run = run_clean([clean_venv, "-c", AS_PYTHON_39], script, args, tmp_path)
    assert "Traceback" not in run.stderr, run.stderr
    assert run.returncode == 2 and run.stdout == "", (run.returncode, run.stdout)
    [line] = run.stderr.splitlines()
    requirements = os.path.relpath(ROOT / "requirements.txt", tmp_path)
    assert line == ("No module named 'anthropic': install the packages with a Python of 3.10 or later (this is "
                    f"3.9.6), e.g. python3.12 -m venv .venv && . .venv/bin/activate && pip install -r {requirements}")


def test_an_importer_still_gets_the_import_error(clean_venv, tmp_path):
    """A test or a tool that imports a chapter decides what to say: the chapter
    exits only when it is the program being run."""
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); import s01_agent_loop"
    run = subprocess.run([clean_venv, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "ModuleNotFoundError: No module named 'anthropic'" in run.stderr


@pytest.mark.parametrize("mod", ["agent_full"], indirect=True)
def test_agent_full_at_a_terminal_without_prompt_toolkit_falls_back_to_plain_input(mod, monkeypatch, capsys):
    """prompt_toolkit is imported only at a terminal; missing, it was a traceback there."""
    monkeypatch.setitem(sys.modules, "prompt_toolkit", None)   # import prompt_toolkit: ModuleNotFoundError
    monkeypatch.setattr(mod, "is_terminal", lambda stream: True)
    monkeypatch.setattr(mod, "FRONT_END", {})
    front = mod.interactive_front_end()
    assert "editor" not in mod.FRONT_END and front is not None
    [line] = capsys.readouterr().err.splitlines()
    assert "No module named 'prompt_toolkit'" in line and "pip install -r" in line
