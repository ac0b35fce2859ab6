"""Benchmarks record where their JSON came from (``provenance``: the command, commit, date, version,
MPI library and cores; the docs render it with the tables)."""
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from mpilaunch import launcher_family, mpirun_command, run_job

from hxmpi import __version__
from hxmpi.provenance import PROVENANCE_KEYS, source_commit

MPIRUN = mpirun_command()
ROOT = Path(__file__).resolve().parent.parent


def test_a_serial_benchmark_records_its_command(tmp_path):
    out = tmp_path / "pack result.json"  # a space: the recorded command must quote it
    args = ["--min", "8", "--max", "16", "--total-mb", "1", "--repeat", "1", "--json", str(out)]
    subprocess.run([sys.executable, "benchmarks/bench_pack.py", *args], cwd=ROOT, check=True,
                   capture_output=True, timeout=120)
    prov = json.loads(out.read_text())["provenance"]
    assert list(prov) == list(PROVENANCE_KEYS)
    recorded = prov["command"]
    assert recorded == shlex.join(["python", "benchmarks/bench_pack.py", *args])
    assert shlex.split(recorded)[-1] == str(out)
    # The tree it ran from, this version, and no MPI: bench_pack never starts it.
    assert (prov["commit"], prov["dirty"]) == source_commit() and prov["version"] == __version__
    assert prov["mpi"] == "none" and prov["cores"] >= 1


@pytest.mark.skipif(not MPIRUN, reason="no mpirun on this machine")
@pytest.mark.watchdog(120)
@pytest.mark.parametrize("n", [2, 3])
def test_an_mpi_benchmark_records_its_command_and_ranks(tmp_path, n):
    out = tmp_path / "osu.json"
    args = ["-m", "8:16", "-i", "2", "-x", "1", "--json", str(out)]
    proc = run_job(MPIRUN + ["-n", str(n), sys.executable, "benchmarks/osu_alltoallv.py", *args],
                   timeout=90, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    prov = json.loads(out.read_text())["provenance"]
    assert prov["command"] == shlex.join(["mpirun", "-np", str(n), "python", "benchmarks/osu_alltoallv.py", *args])
    # The library the job ran on, as its launcher's family names it.
    assert {"openmpi": "Open MPI", "hydra": "MPICH"}[launcher_family()] in prov["mpi"], prov
    assert prov["commit"] == source_commit()[0]
