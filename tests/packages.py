"""The first thing each tool here checks: are the packages installed?

A learner who runs `python tests/demo.py s01` before `pip install` should read one
line that names the missing module and the install command, not a traceback
(and not a demo that fails three times for a reason it never names). The line is
the chapters' own (their import guard), so every entry point says the same thing.
"""
import importlib.util
import os
import sys
from pathlib import Path

REQUIREMENTS = Path(__file__).resolve().parent.parent / "requirements.txt"
# The modules the chapters import (agent_full's prompt_toolkit only at a terminal).
RUNTIME_MODULES = ("anthropic", "dotenv", "yaml", "rich")


def install_line(module):
    """The chapters' line for a missing module. Outside a virtual environment it makes
    one first: many systems' Python refuses a global pip install (PEP 668). On a
    Python older than 3.10 no version of the packages installs, so it names a newer one."""
    venv = "" if sys.prefix != sys.base_prefix else "python3 -m venv .venv && . .venv/bin/activate && "
    if sys.version_info < (3, 10):  # no version of the packages installs there (macOS's own python3 is 3.9)
        venv = (f"a Python of 3.10 or later (this is {sys.version.split()[0]}), e.g. "
                "python3.12 -m venv .venv && . .venv/bin/activate && ")
    return (f"No module named {module!r}: install the packages with {venv}pip install -r "
            f"{os.path.relpath(REQUIREMENTS)}")


def require(*modules, status=2):
    """Exit with `status` and one line on stderr when any of the modules is missing."""
    missing = [m for m in RUNTIME_MODULES + modules if importlib.util.find_spec(m) is None]
    if missing:
        print(install_line(missing[0]), file=sys.stderr)
        sys.exit(status)
