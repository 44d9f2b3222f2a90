"""Before `pip install`: every entry point a learner may try first says, in one
line, which module is missing and the command that installs it (exit status 2),
never a traceback. `python -E -S` starts Python without its site-packages (and
without PYTHONPATH), which is exactly a clean Python without the packages."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

ENTRY_POINTS = {  # the introducing chapter and the newest file, as the subprocess rule says
    "chapter": ["s01_agent_loop.py", "hello"],
    "newest file": ["agent_full.py", "-p", "hello"],
    "demo": ["tests/demo.py", "s01"],
    "book": ["tests/book.py"],
    "exercise checker": ["tests/exercise.py", "s01.1"],
}


@pytest.mark.parametrize("what", ENTRY_POINTS)
def test_without_the_packages_each_entry_point_says_how_to_install_them(what, tmp_path):
    script, *args = ENTRY_POINTS[what]
    run = subprocess.run([sys.executable, "-E", "-S", str(ROOT / script), *args], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    assert run.stdout == ""
    [line] = run.stderr.splitlines()
    assert line.startswith("No module named 'anthropic'") and "Traceback" not in line
    installing = line.split("pip install -r ", 1)[1]
    assert (tmp_path / installing).resolve() == ROOT / "requirements.txt"   # the path works from there


def test_an_importer_still_gets_the_import_error(tmp_path):
    """A test or a tool that imports a chapter decides what to say: the chapter
    exits only when it is the program being run."""
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); import s01_agent_loop"
    run = subprocess.run([sys.executable, "-E", "-S", "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
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
