"""Benchmarks record where their JSON came from (``provenance``: the command, commit, date, version,
MPI library and cores; the docs render it with the tables)."""
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from mpilaunch import launcher_family, mpirun_command, run_job
from support import load_script

from hxmpi import __version__
from hxmpi.baselines import baseline, ratio
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
    args = ["-m", "8:16", "-i", "2", "-x", "1", "-c", "--json", str(out)]
    proc = run_job(MPIRUN + ["-n", str(n), sys.executable, "benchmarks/osu_alltoallv.py", *args],
                   timeout=90, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    # MPI's persistent Alltoallv_init is timed and checked (-c) like every other column; plans are
    # set against the faster of it and the one-shot call.
    assert all(r["check"]["bare-plan"] and r["bare-plan"]["avg_us"] > 0 for r in data["results"])
    assert "check passed" in proc.stdout and "hier-plan/min(bare, bare-plan) @ 8 B" in data["ratios"]
    assert "| bare-plan | flat-plan |" in report_module().render_osu(data)
    prov = data["provenance"]
    assert prov["command"] == shlex.join(["mpirun", "-np", str(n), "python", "benchmarks/osu_alltoallv.py", *args])
    # The library the job ran on, as its launcher's family names it.
    assert {"openmpi": "Open MPI", "hydra": "MPICH"}[launcher_family()] in prov["mpi"], prov
    assert prov["commit"] == source_commit()[0]


@pytest.mark.skipif(not MPIRUN, reason="no mpirun on this machine")
@pytest.mark.watchdog(150)
@pytest.mark.parametrize("n", [4, 5])
def test_calibrate_writes_a_tuning_file_that_auto_loads(tmp_path, n):
    """calibrate.py on virtual nodes of 2 (the last one of 1 at 5 ranks): a tuning file
    ``CostModel.load`` reads back and a projection up to 4096 nodes of 8 ranks, in bounded memory
    (the walk of a 32768-rank layout once built a 32768 x 32768 count matrix on every rank)."""
    from hxmpi.comm.costmodel import CostModel
    tuning, report = tmp_path / "tuning.json", tmp_path / "calibrate.json"
    proc = run_job(MPIRUN + ["-n", str(n), sys.executable, "benchmarks/calibrate.py", "--ranks-per-node", "2",
                             "-m", "8:64", "-i", "3", "--out", str(tuning), "--json", str(report)],
                   timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    model = CostModel.load(str(tuning))
    assert model.alpha_inter >= 0 and model.beta_copy > 0
    data = json.loads(report.read_text())
    assert data["layout"]["node_sizes"] == [2] * (n // 2) + [1] * (n % 2)
    assert {(r["nodes"], r["per_node"]) for r in data["projection"]} >= {(4096, 8), (2, 2)}
    assert f"wrote {tuning}" in proc.stdout


def report_module():
    """benchmarks/report.py, loaded by path (benchmarks/ is not a package)."""
    return load_script("benchmarks/report.py", "hxmpi_report")


def test_plans_are_set_against_mpi_persistent_call_and_one_shot_calls_against_its_one_shot_call():
    """hxmpi.baselines: a plan over the faster of MPI's one-shot and persistent calls, a one-shot
    call (and MPI's own plan) over the one-shot; a plan without MPI's persistent call has none."""
    times = {"bare": 10.0, "bare-plan": 4.0, "flat": 12.0, "flat-plan": 5.0}
    assert (baseline("flat", times), baseline("flat-plan", times), ratio("bare-plan", times)) == (10.0, 4.0, 0.4)
    assert baseline("hier-plan", {"bare": 10.0, "hier-plan": 5.0}) is None
    assert ratio("hier-plan", {"bare": 10.0, "hier-plan": 5.0}) is None
    sim = {"bare_alltoallv": 3.0, "bare_alltoall": 2.5, "bare_alltoallv_plan": 2.0, "auto_plan": 1.0}
    assert (baseline("auto", sim), baseline("auto_plan", sim), ratio("auto_plan", sim)) == (2.5, 2.0, 0.5)


def test_report_sets_plans_beside_mpi_plan_and_says_na_where_a_file_has_none():
    """The osu table: one-shot columns after bare, plans after bare-plan, then the ratios; a file
    made before bare-plan was measured still renders, its plan ratios n/a."""
    report = report_module()
    row = {"size": 8, "check": {}, "bare": {"avg_us": 10.0}, "flat": {"avg_us": 12.0},
           "bare-plan": {"avg_us": 4.0}, "flat-plan": {"avg_us": 5.0}, "naive": {"avg_us": 20.0}}
    d = {"world_size": 2, "node_sizes": [2], "mpi": "Open MPI v5", "results": [row]}
    text = report.render_osu(d)
    assert "| block | bare | flat | naive | bare-plan | flat-plan |" in text
    assert "| 8 B | 1.20 | 2.00 | 0.40 | 1.25 |" in text  # flat/bare, naive/bare, bare-plan/bare, flat-plan/bare-plan
    old = {**d, "results": [{k: v for k, v in row.items() if k != "bare-plan"}]}
    text = report.render_osu(old)
    assert "| 8 B | 10.00 | 12.00 | 20.00 | n/a | 5.00 |" in text and "| 8 B | 1.20 | 2.00 | n/a | n/a |" in text
