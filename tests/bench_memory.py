"""Peak memory of the agent process for two tool calls, before and after the
output bounds (a benchmark, not a test).

    python tests/bench_memory.py

Cases: `yes` through run_bash with a 3 s timeout, and read_file(limit=5) on a
400 MB log. Each runs in a fresh child process; its peak RSS comes from
os.wait4. "before" is s06_compact.py as of commit 8a66402, read from git into a
temporary file and loaded under another module name; "after" is the file as it
is now. "import" is the floor: loading the chapter (and the SDK) and nothing
else. Everything big (the log, the command's output file) lives in one
temporary folder that is removed at the end.
"""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "8a66402"          # the last commit before the bounds
LOG_MB = 400                # size of the log read_file reads five lines of

# The child: load a chapter file under a given module name, run one case as an
# agent on the workspace, print how long it took and the result's closing notes
# (for `yes` the truncation marker tells how much output was on disk).
CHILD = r'''
import importlib.util, sys, time
path, name, case = sys.argv[1:4]
spec = importlib.util.spec_from_file_location(name, path)
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
m.CURRENT.set(m.AgentState("."))
start = time.monotonic()
try:
    out = {"import": lambda: "",
           "yes": lambda: m.run_bash("yes", timeout=3),
           "read": lambda: m.read_file("big.log", limit=5)}[case]()
except m.ToolError as e:
    out = str(e)
print(f"{time.monotonic() - start:.2f}s")
print(" ".join(line for line in out.splitlines()[-2:] if line.startswith(("...", "["))))
'''


def run(path, name, case, folder):
    """Peak RSS (MB) of a child running one case, its time and last result line."""
    with open(folder / "child.out", "w+") as out:
        env = os.environ | {"TMPDIR": str(folder)}  # the command's output file lands here
        p = subprocess.Popen([sys.executable, "-c", CHILD, str(path), name, case],
                             cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        out.seek(0)
        took, _, last = out.read().partition("\n")
    return usage.ru_maxrss / 1024, took, last.strip()


def write_log(path):
    line = b"2024-01-01 12:00:00 INFO worker-7 request served in 12 ms, status 200, bytes 5120\n"
    block = line * (1_048_576 // len(line))
    with open(path, "wb") as fh:
        for _ in range(LOG_MB * 1_048_576 // len(block)):
            fh.write(block)


def main():
    old = subprocess.run(["git", "show", f"{BEFORE}:s06_compact.py"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "s06_before.py").write_text(old)
        write_log(folder / "big.log")
        files = {"before": (folder / "s06_before.py", "s06_before"),
                 "after": (ROOT / "s06_compact.py", "s06_after")}
        print(f"{'case':<24}{'before':>12}{'after':>12}   (peak RSS of the agent process)")
        for case, label in [("import", "import only"), ("yes", "yes, timeout 3 s"),
                            ("read", f"read_file limit=5, {LOG_MB} MB")]:
            got = {k: run(path, name, case, folder) for k, (path, name) in files.items()}
            print(f"{label:<24}{got['before'][0]:>10.0f}MB{got['after'][0]:>10.0f}MB")
            for k in files:
                print(f"    {k:<7} {got[k][1]:>7}  {got[k][2][:150]}")


if __name__ == "__main__":
    main()
