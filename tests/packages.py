"""The first thing each tool here checks: are the packages installed?

A learner who runs `python tests/demo.py s01` before `pip install` should read one
line that names the missing module and the install command, not a traceback
(and not a demo that fails three times for a reason it never names).
"""
import importlib.util
import os
import sys
from pathlib import Path

REQUIREMENTS = Path(__file__).resolve().parent.parent / "requirements.txt"
# The modules the chapters import (agent_full's prompt_toolkit only at a terminal).
RUNTIME_MODULES = ("anthropic", "dotenv", "yaml", "rich")


def require(*modules, status=2):
    """Exit with `status` and one line on stderr when any of the modules is missing."""
    missing = [m for m in RUNTIME_MODULES + modules if importlib.util.find_spec(m) is None]
    if missing:
        print(f"No module named {missing[0]!r}{' (and more)' if len(missing) > 1 else ''}: install "
              f"the packages with pip install -r {os.path.relpath(REQUIREMENTS)}", file=sys.stderr)
        sys.exit(status)
