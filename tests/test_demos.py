"""The offline demos a workshop runs: `python tests/demo.py sNN`, no key, no network."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT, TESTS

DEMOS = sorted(p.stem for p in (TESTS / "scenarios").glob("s[0-9][0-9].py"))


@pytest.mark.parametrize("chapter", DEMOS)
def test_demo_runs_clean(chapter, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC")}
    env["HOME"] = str(tmp_path)
    r = subprocess.run([sys.executable, str(TESTS / "demo.py"), chapter], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "invalid request" not in r.stdout and "Traceback" not in r.stderr
    assert "(script exhausted)" not in r.stdout    # the chapter followed the scenario to its end
