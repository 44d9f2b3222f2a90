#!/usr/bin/env python3
"""Offline demo: run one chapter end to end against the bundled scripted model.

No API key and no network: a local Messages API server (tests/fake_api.py) plays
the model, following the scenario in tests/scenarios/<chapter>.py, and the real
chapter file runs against it as a subprocess, exactly as `python sNN_x.py "task"`.

    python tests/demo.py s01            # fresh temporary workspace, removed after
    python tests/demo.py s02 --keep     # keep the workspace to look at the result

The scripted model does not think: its replies are fixed in the scenario. What
is real is everything the chapter does with them: streaming, tools, files.
"""
import argparse
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
sys.path.insert(0, str(TESTS))

from fake_api import ScriptedAPI  # noqa: E402


def chapter_file(name):
    hits = sorted(ROOT.glob(f"{name}_*.py")) or sorted(ROOT.glob(f"{name}.py"))
    if not hits:
        sys.exit(f"no chapter named {name!r}; try one of: "
                 + ", ".join(p.stem.split("_")[0] for p in sorted(ROOT.glob("s[0-9][0-9]_*.py"))))
    return hits[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("chapter", help="s01, s02, ...")
    ap.add_argument("--keep", action="store_true", help="keep the temporary workspace")
    args = ap.parse_args()
    path = chapter_file(args.chapter)
    scenario = importlib.import_module(f"scenarios.{args.chapter}")
    workspace = Path(tempfile.mkdtemp(prefix=f"agent-demo-{args.chapter}-"))
    if hasattr(scenario, "SETUP"):
        scenario.SETUP(workspace)
    server = ScriptedAPI().start()
    server.script(list(scenario.STEPS))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC")}
    env |= {"ANTHROPIC_API_KEY": "offline-demo", "ANTHROPIC_BASE_URL": server.url}
    env |= getattr(scenario, "ENV", {})
    print(f"$ python {path.name} {scenario.PROMPT!r}\n  (scripted model, workspace {workspace})\n",
          flush=True)
    code = subprocess.call([sys.executable, str(path), scenario.PROMPT], cwd=workspace, env=env)
    server.close()
    if server.invalid():
        print(f"demo: the chapter sent an invalid request: {server.invalid()[0]['error']}")
        code = code or 1
    if args.keep:
        print(f"\nworkspace kept: {workspace}")
    else:
        shutil.rmtree(workspace, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
