"""What the README's test command costs: wall time of each part, and the memory of the whole job.

    python3 benchmarks/bench_suite.py --json suite.json                 # the README's test command
    python3 benchmarks/bench_suite.py --json suite.json -- python tests/run.py --sizes 2

Runs the command (by default the README's second one, read from README.md: a fresh venv, the
install, every test, the docs build) through ``bash -c`` from the repository's root, streams its
output, and records: the wall seconds of the whole command and of each ``tests/run.py`` run (its
own lines), the closing ``N passed, N failed, N skipped`` counts, and the peak proportional set
size of the whole process tree (``Pss`` from ``/proc/PID/smaps_rollup``, summed over the command
and its descendants every ``--interval`` seconds, so shared pages count once). Linux only. It
needs only the standard library, so it runs before any venv exists.
"""
from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # hxmpi.provenance (standard library only; nothing is built yet)

from hxmpi.cli import command_line  # noqa: E402
from hxmpi.provenance import provenance  # noqa: E402

#: A tests/run.py line: "  mpi -n 3: exit 0 in   45.7 s, 486 passed, 4 skipped".
RUN_LINE = re.compile(r"^\s*(serial|mpi -n \d+): (exit \d+|TIMEOUT[^,]*) in\s+([\d.]+) s, (.*)$")
TOTAL_LINE = re.compile(r"^(\d+) passed, (\d+) failed(?:, (\d+) skipped)?$")


def readme_test_command() -> str:
    """The README's second bash block: the command that runs every test and builds the docs."""
    blocks = re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text(), re.S)
    return blocks[1]


def pss_of_tree(root_pid: int) -> int:
    """Bytes: the Pss of ``root_pid`` and every process descended from it (0 for those gone)."""
    parent = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(stat.parent.name)] = int(fields[1])
    tree, grew = {root_pid}, True
    while grew:
        more = {pid for pid, ppid in parent.items() if ppid in tree} - tree
        tree |= more
        grew = bool(more)
    total = 0
    for pid in tree:
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        m = re.search(r"^Pss:\s+(\d+) kB", text, re.M)
        total += int(m.group(1)) * 1024 if m else 0
    return total


def venv_mpi() -> str:
    """The MPI library the command's venv (``.venv``, as the README makes it) runs on, or "none"."""
    python = ROOT / ".venv" / "bin" / "python"
    if not python.exists():
        return "none"
    proc = subprocess.run([str(python), "-c", "from mpi4py import MPI; print(MPI.Get_library_version())"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    lines = proc.stdout.replace("\x00", "").strip().splitlines()
    return lines[0].strip() if proc.returncode == 0 and lines else "unknown"


def run(command: str, interval: float) -> dict:
    """Run ``command`` under bash from the repository root, echoing its output; its figures."""
    t0 = time.monotonic()
    proc = subprocess.Popen(["bash", "-c", command], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace")
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.wait(interval):
            peak[0] = max(peak[0], pss_of_tree(proc.pid))
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    runs, total, lines = [], None, 0
    for line in proc.stdout:
        sys.stdout.write(line)
        lines += 1
        m = RUN_LINE.match(line.rstrip("\n"))
        if m:
            counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|errors|skipped)", m.group(4))}
            runs.append({"run": m.group(1), "status": m.group(2), "seconds": float(m.group(3)), **counts})
        m = TOTAL_LINE.match(line.strip())
        if m:
            total = {"passed": int(m.group(1)), "failed": int(m.group(2)), "skipped": int(m.group(3) or 0)}
    code = proc.wait()
    done.set()
    sampler.join()
    return {"exit_code": code, "wall_s": time.monotonic() - t0, "peak_pss_bytes": peak[0], "runs": runs,
            "tests_s": sum(r["seconds"] for r in runs), "total": total, "output_lines": lines}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default=None, help="write the figures here")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between memory samples (default 1)")
    p.add_argument("command", nargs="*", help="the command to measure (after --); default: the README's test command")
    args = p.parse_args(argv)
    command = shlex.join(args.command) if args.command else readme_test_command()
    result = run(command, args.interval)
    result = {"benchmark": "suite", "provenance": provenance(command_line("benchmarks/bench_suite.py"), mpi=venv_mpi()),
              "measured_command": command, "readme_command": not args.command, **result}
    print(f"# bench_suite: exit {result['exit_code']} in {result['wall_s']:.0f} s (tests {result['tests_s']:.0f} s), "
          f"peak memory {result['peak_pss_bytes'] / 2**30:.2f} GiB")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return result["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
