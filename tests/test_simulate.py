"""hxmpi.sim.simulate: replays of tiny layouts in SimGrid, traces built from hxmpi.comm.plan, clean CLI errors."""
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hxmpi.comm.costmodel import CPU_KEYS, CostModel, CpuTimes
from hxmpi.comm.plan import Layout
from hxmpi.errors import CpuFileError
from hxmpi.provenance import PROVENANCE_KEYS
from hxmpi.sim import actions, simulate
from hxmpi.sim.args import layouts_of
from hxmpi.sim.calls import Call, make_counts, node_of_sizes
from hxmpi.sim.errors import SimulateError
from hxmpi.sim.platform import Network, oversubscribe
from hxmpi.sim.presets import PRESETS
from hxmpi.sim.replay import replay_traces, smpirun_path
from hxmpi.sim.sweep import crossover, simulate_point
from hxmpi.sim.trace import rank_trace, trace_stats

ROOT = Path(__file__).resolve().parent.parent
#: The CPU file in the source tree, the one copy (package data of hxmpi.comm).
PACKAGED_CPU = ROOT / "hxmpi" / "comm" / "overhead.json"

try:
    smpirun_path()
    SKIP = None
except SimulateError as exc:
    SKIP = str(exc)
needs_simgrid = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "hxmpi.sim", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def plain_model(**kw):
    """No fixed costs and no copies unless given: times a reader can add up by hand."""
    base = dict(overhead_flat=0.0, overhead_hier=0.0, beta_copy=0.0, msg_overhead=0.0)
    return CostModel(**{**base, **kw})


@pytest.mark.parametrize("sizes", [[2, 2], [2, 2, 2], [2, 2, 1]])
def test_traces_send_what_the_plan_sends(sizes):
    """Every isend a rank's trace posts is received by its peer's trace, bytes and tags alike."""
    layout = Layout(node_of_sizes(sizes))
    counts = make_counts(layout.size, 24, uneven=True, seed=3)
    counts[0, 1] = counts[1, 2] = 0  # some empty blocks: Bruck's first run still sends every message
    calls = [Call(a, m, k) for a in ("flat", "bruck", "hier", "hier_pairwise", "hier_bruck")
             for m in ("oneshot", "plan") for k in ((2, 3) if "bruck" in a else (2,))]
    for call, phase in [(c, "shm") for c in calls] + [(c, "mpi") for c in calls if c.hier]:
        algo = call.algorithm
        sent, received = [], []
        for rank in range(layout.size):
            for line in rank_trace(layout, counts, rank, call, phase, CostModel()):
                r, verb, *rest = line.split()
                if verb == "isend":
                    sent.append((int(r), int(rest[0]), int(rest[1]), int(rest[2])))
                elif verb == "irecv":
                    received.append((int(rest[0]), int(r), int(rest[1]), int(rest[2])))
        assert sorted(sent) == sorted(received), (call, phase)
        if algo == "flat":  # every off-diagonal non-empty block is one message
            assert sum(s[3] for s in sent) == counts.sum() - np.trace(counts)
            assert len(sent) == np.count_nonzero(counts) - np.count_nonzero(np.diag(counts))


def test_bruck_trace_rounds_and_headers():
    """8 ranks, radix 2: 3 rounds of one message each way; the first run adds 8 B per slot moved
    (4 slots a round), a plan does not; hxmpi's CPU, the agreement's Allreduce first."""
    layout = Layout(node_of_sizes([4, 4]))
    counts = make_counts(8, 16, False)
    first = rank_trace(layout, counts, 3, Call("bruck", "oneshot", 2), "shm", plain_model(overhead_flat=1e-6))
    plan = rank_trace(layout, counts, 3, Call("bruck", "plan", 2), "shm", plain_model())
    assert first[1:3] == ["3 sleep 1e-06", "3 allreduce 128 0"]
    assert trace_stats(first)["round"] == {"messages": 3, "bytes": 3 * 4 * (16 + 8)}
    assert trace_stats(plan)["round"] == {"messages": 3, "bytes": 3 * 4 * 16}
    assert sum(ln.endswith("waitall") for ln in plan) == 3
    hier = rank_trace(layout, counts, 3, Call("hier", "oneshot"), "shm", plain_model())
    assert trace_stats(hier)["agree"] == {"messages": 2, "bytes": 8 * 8 * (1 + 2)}  # node Allgather, 2 rounds


def test_pairwise_and_linear_follow_open_mpi_rule():
    """64 ranks: pairwise rounds (one message each way, then wait); 8 ranks: every message posted,
    then a wait for each of the 14 requests (more than WAITALL_MAX), naming it."""
    layout = Layout(node_of_sizes([32, 32]))
    lines = rank_trace(layout, make_counts(64, 8, False), 5, "flat", "shm", plain_model())
    assert sum(ln.endswith("waitall") for ln in lines) == 63
    assert trace_stats(lines) == {"flat": {"messages": 63, "bytes": 8 * 63}}
    layout = Layout(node_of_sizes([4, 4]))
    lines = rank_trace(layout, make_counts(8, 8, False), 5, "flat", "shm", plain_model())
    assert trace_stats(lines) == {"flat": {"messages": 7, "bytes": 8 * 7}}
    verbs = [ln.split()[1] for ln in lines]
    first_wait = verbs.index("wait")
    assert {"isend", "irecv"}.isdisjoint(verbs[first_wait:]) and "waitall" not in verbs
    posted = {(v, int(ln.split()[2]), int(ln.split()[3])) for v, ln in zip(verbs, lines) if v in ("isend", "irecv")}
    waits = [ln.split()[2:] for v, ln in zip(verbs, lines) if v == "wait"]
    waited = {("irecv", int(src), int(tag)) if int(dst) == 5 else ("isend", int(dst), int(tag))
              for src, dst, tag in waits}
    assert waited == posted and len(waits) == 14


@needs_simgrid
def test_waits_end_when_waitall_ends(tmp_path):
    """A linear phase replayed with a wait per request ends when one waitall would (2 x 4 ranks,
    one 100 KB message and the rest 8 B: the waits are not in completion order)."""
    layout = Layout(node_of_sizes([4, 4]))
    counts = make_counts(8, 8, False)
    counts[3, 6] = counts[6, 1] = 100_000
    model = plain_model(alpha_inter=2e-6, beta_inter=1 / 1e9, msg_overhead=0.3e-6)
    times = []
    for limit in (actions.WAITALL_MAX, 10**6):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(actions, "WAITALL_MAX", limit)
            traces = [rank_trace(layout, counts, r, Call("flat", "bare"), "shm", model) for r in range(8)]
        assert any(" waitall" in ln for ln in traces[0]) == (limit > 100)
        times.append(replay_traces(layout, traces, model, Network(), str(tmp_path / str(limit))))
    assert times[0] == times[1] and times[0] > 100_000 / 1e9


@needs_simgrid
def test_two_ranks_replay_adds_up_by_hand(tmp_path):
    """2 nodes x 1 rank: one pairwise round = overhead + latency + bytes/bandwidth + overhead, no hier;
    a one-shot call adds the agreement: one recursive-doubling step of 128 B."""
    model = plain_model(alpha_inter=3e-6, beta_inter=1 / 1e9, msg_overhead=0.5e-6)
    rec = simulate_point([1, 1], 4000, model, Network(), workdir=str(tmp_path))
    assert rec["hier_sim_s"] is None and rec["model_hier_s"] is None  # one rank per node: flat only
    assert rec["bare_alltoallv_sim_s"] == pytest.approx(0.5e-6 + 3e-6 + 4e-6 + 0.5e-6, rel=1e-2)
    assert rec["agreement_sim_s"] == pytest.approx(0.5e-6 + 3e-6 + 0.128e-6 + 0.5e-6, rel=2e-2)
    assert rec["flat_sim_s"] == pytest.approx(rec["bare_alltoallv_sim_s"] + rec["agreement_sim_s"], rel=1e-2)
    assert rec["model_flat_s"] == pytest.approx(rec["flat_sim_s"], rel=2e-2)


@needs_simgrid
@pytest.mark.parametrize("sizes", [[2, 2], [2, 2, 2], [2, 2, 1], [4]])
def test_small_layouts_replay(sizes):
    model = PRESETS["25gbe"]
    recs = [simulate_point(sizes, b, model, Network()) for b in (8, 65536)]
    for r in recs:
        assert r["flat_sim_s"] > model.overhead_flat
        if len(sizes) == 1:  # one node: no hierarchical algorithm (Bruck's rounds may beat flat there)
            assert r["hier_sim_s"] is None and r["model_pick"] in ("flat", "bruck", "alltoall")
            assert r["auto_sim_s"] <= 1.05 * min(r["flat_sim_s"], r["bruck_sim_s"])
        else:
            assert r["hier_sim_s"] > model.overhead_hier
    # Both carry the same inter-node bytes: more bytes cost both more time.
    assert recs[1]["flat_sim_s"] > recs[0]["flat_sim_s"]
    if len(sizes) > 1:
        assert recs[1]["hier_sim_s"] > recs[0]["hier_sim_s"]


@needs_simgrid
def test_hier_wins_where_messages_are_many_and_small():
    """16 nodes x 4 ranks at 8 B with no fixed costs: hier sends 15 lane messages instead of 60."""
    model = plain_model(alpha_inter=2e-6, msg_overhead=0.5e-6, beta_copy=1 / 10e9)
    small = simulate_point([4] * 16, 8, model, Network())
    assert small["hier_sim_s"] < 0.5 * small["flat_sim_s"] and small["sim_pick"] == "hier"
    # Log rounds beat both there; the model's pick is the fastest replayed call (within 5%).
    assert small["bruck_sim_s"] < small["hier_sim_s"]
    best = min(small[f"{k}_sim_s"] for k in ("flat", "hier", "bruck", "hier_bruck"))
    assert small["auto_sim_s"] <= 1.05 * best


@needs_simgrid
def test_oversubscribed_backbone_costs_what_the_model_says():
    """8 nodes x 2 ranks, 64 KiB blocks, backbone at 1/4 of the links: bandwidth-bound, both slower."""
    model = plain_model(alpha_inter=1e-6, beta_inter=1 / 10e9)
    fast = simulate_point([2] * 8, 65536, model, Network())
    slow = simulate_point([2] * 8, 65536, oversubscribe(model, 4.0), Network())
    for algo in ("flat", "hier"):
        assert slow[f"{algo}_sim_s"] > 2.5 * fast[f"{algo}_sim_s"]
        assert slow[f"model_{algo}_s"] == pytest.approx(slow[f"{algo}_sim_s"], rel=0.25)


def test_crossover_interpolates():
    rows = [{"block_bytes": b, "flat_sim_s": 1.0, "hier_sim_s": h} for b, h in ((8, 0.5), (32, 2.0))]
    assert crossover(rows) == pytest.approx(16.0)
    assert crossover(rows[:1]) is None
    assert crossover([{"block_bytes": 8, "flat_sim_s": 1.0, "hier_sim_s": 2.0}]) == 0.0


def test_shapes_and_pairs_make_the_layouts():
    parsed = simulate.build_parser().parse_args(["--nodes", "2", "--ranks-per-node", "3,1", "--shape", "128x8",
                                                 "--shape", "4X2", "--layout", "2+1"])
    assert layouts_of(parsed) == [[3, 3], [1, 1], [8] * 128, [2] * 4, [2, 1]]


@pytest.mark.parametrize("args,needle", [
    (["--nodes", "0", "--ranks-per-node", "2"], "--nodes must be positive"),
    (["--nodes", "2", "-m", "64:8"], "size range is empty"),
    (["--nodes", "2", "--preset", "myrinet"], "unknown preset 'myrinet'"),
    (["--layout", "2+x"], "--layout must be comma-separated integers"),
    (["--ranks-per-node", "2"], "give --nodes"),
    (["--shape", "12"], "--shape must be NODESxRANKS, e.g. 128x8, got '12'"),
    (["--shape", "0x8"], "--shape must be positive integers, got '0'"),
    (["--nodes", "2", "--only", "auto,bogus"], "--only: unknown field(s) ['bogus']"),
])
def test_bad_flags_give_one_error_line(args, needle):
    proc = cli(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], proc.stderr


def test_without_smpirun_says_what_to_install(tmp_path):
    env = {**os.environ, "PATH": "/nonexistent", "HXMPI_SIMGRID_PREFIX": str(tmp_path / "none")}
    env.pop("HXMPI_SMPIRUN", None)
    proc = cli("--nodes", "2", "--ranks-per-node", "2", env=env)
    assert proc.returncode == 2
    assert "python -m hxmpi.sim.simgrid build" in proc.stderr and "apt-get install libsimgrid-dev" in proc.stderr
    assert proc.stderr.startswith("error:") and len(proc.stderr.strip().splitlines()) == 1


@needs_simgrid
def test_cli_json(tmp_path):
    out = tmp_path / "r.json"
    proc = cli("--nodes", "2", "--ranks-per-node", "2", "--layout", "1+1", "-m", "8:64", "--factor", "8",
               "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    records = doc["records"]
    assert doc["provenance"]["mpi"] == f"SimGrid {doc['simgrid']}" and doc["provenance"]["command"].startswith(
        "python -m hxmpi.sim --nodes 2")
    assert set(PROVENANCE_KEYS) <= set(doc["provenance"])
    assert all(r["simgrid"] == doc["simgrid"] for r in records)
    keys = {"nodes", "ranks_per_node", "block_bytes", "flat_sim_s", "hier_sim_s", "model_flat_s",
            "model_hier_s", "model_pick", "hier_pairwise_sim_s", "hier_pairwise_plan_sim_s", "model_hier_pairwise_s"}
    assert len(records) == 4 and all(keys <= set(r) for r in records)
    assert [r["hier_sim_s"] is None for r in records] == [False, False, True, True]
    assert [r["hier_pairwise_plan_sim_s"] is None for r in records] == [False, False, True, True]
    assert "model's pick within 5% of the fastest replayed algorithm at 4/4 points" in proc.stdout
    new = {"bare_alltoallv_sim_s", "bare_alltoall_sim_s", "agreement_sim_s", "auto_sim_s", "hier_plan_sim_s",
           "auto_plan_sim_s", "auto_pick", "model_auto_s"}
    assert all(new <= set(r) for r in records)
    for r in records:  # uniform counts: MPI_Alltoall is a baseline; a one-shot call pays its agreement
        assert r["bare_alltoall_sim_s"] > 0 and r["flat_sim_s"] > r["bare_alltoallv_sim_s"] + r["agreement_sim_s"]


def cpu_file(path, **seconds) -> str:
    """A CPU file with every path at 1 us but those given (seconds); returns its path."""
    table = {**dict.fromkeys(CPU_KEYS, 1e-6), **seconds}
    path.write_text(json.dumps({"benchmark": "overhead", "cpu_s_per_call": table}))
    return str(path)


def test_cpu_times_come_from_the_file_as_given(tmp_path):
    """Measured seconds per path are used as given; the trace starts with the measured CPU of its path."""
    cpu = CpuTimes.load(cpu_file(tmp_path / "overhead.json", flat=3e-6, hier_plan=7e-6))
    assert cpu("flat") == 3e-6 and cpu("hier_plan") == 7e-6 and cpu("bruck_hit") == 1e-6
    line = rank_trace(Layout(node_of_sizes([2, 2])), make_counts(4, 8, False), 0, Call("flat", "oneshot"), "shm",
                      CostModel(), cpu)[1]
    assert line == "0 sleep 3e-06"
    model = CostModel()
    fixed = CpuTimes.fixed(model)
    assert fixed("hier_bruck_hit") == model.overhead_hier and fixed("bruck") == model.overhead_flat
    assert set(fixed.seconds) == set(CPU_KEYS) and "fixed costs" in fixed.source


def test_packaged_cpu_file_is_complete():
    """The CPU file shipped with hxmpi has every path, and is what CpuTimes reads by default."""
    cpu = CpuTimes.load()
    assert set(cpu.seconds) == set(CPU_KEYS) and cpu.source.startswith(str(PACKAGED_CPU))
    assert cpu.seconds == {k: v for k, v in json.loads(PACKAGED_CPU.read_text())["cpu_s_per_call"].items()}


@pytest.mark.parametrize("content,needle", [
    (None, "cannot read it: No such file or directory"),
    ("{not json", "not JSON"),
    ('{"benchmark": "overhead"}', "no cpu_s_per_call mapping"),
    ('[1, 2]', "no cpu_s_per_call mapping"),
    (json.dumps({"cpu_s_per_call": {"flat": 1e-6}}), "cpu_s_per_call lacks flat_hit, flat_plan, bruck"),
    (json.dumps({"cpu_s_per_call": {**dict.fromkeys(CPU_KEYS, 1e-6), "hier": -1.0, "bruck": "2"}}),
     "values must be seconds >= 0, not bruck='2', hier=-1.0"),
])
def test_bad_cpu_file_is_an_error_naming_it(tmp_path, content, needle):
    """A missing or malformed CPU file raises CpuFileError naming the file and the problem (no fallback);
    python -m hxmpi.sim --overhead FILE prints it as one error line and exits 2, before any replay."""
    path = tmp_path / "cpu.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(CpuFileError) as err:
        CpuTimes.load(str(path))
    assert str(path) in str(err.value) and needle in str(err.value), err.value
    proc = cli("--nodes", "2", "--ranks-per-node", "2", "--overhead", str(path), env={**os.environ, "PATH": "/nonexistent"})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: --overhead: CPU file") and str(path) in lines[0] and needle in lines[0]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """hxmpi installed from a copy of this source tree by ``pip install --no-deps --target`` (not
    editable: a wheel's files only), as a directory for PYTHONPATH."""
    tmp = tmp_path_factory.mktemp("install")
    src, target = tmp / "src", tmp / "target"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv*", ".git", "build", "*.egg-info", "*.so",
                                                              "__pycache__", "docs", "benchmarks", "tests"))
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                           str(src)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return target


def run_installed(target, *args, cwd):
    """``python *args`` seeing hxmpi only from ``target`` (numpy and mpi4py from this environment)."""
    env = {**os.environ, "PYTHONPATH": str(target)}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


@pytest.mark.watchdog(1200)
def test_non_editable_install_ships_the_cpu_file(installed, tmp_path):
    """A non-editable install carries the CPU file: CpuTimes reads it from inside the install, equal
    to the source tree's copy."""
    code = ("import hxmpi, json; from hxmpi.comm.costmodel import CpuTimes; c = CpuTimes.load(); "
            "print(json.dumps([hxmpi.__file__, c.source, c.seconds]))")
    proc = run_installed(installed, "-c", code, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    where, source, seconds = json.loads(proc.stdout)
    assert where.startswith(str(installed)) and source.startswith(str(installed / "hxmpi" / "comm" / "overhead.json"))
    assert seconds == json.loads(PACKAGED_CPU.read_text())["cpu_s_per_call"]


@needs_simgrid
@pytest.mark.watchdog(1200)
def test_simulator_from_a_non_editable_install_uses_the_packaged_cpu(installed, tmp_path):
    """python -m hxmpi.sim, run from a non-editable install, charges the packaged CPU per path."""
    out = tmp_path / "r.json"
    proc = run_installed(installed, "-m", "hxmpi.sim", "--layout", "1+1", "-m", "8:8", "--json", str(out),
                         cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr
    got = json.loads(out.read_text())
    assert got["overhead"].startswith(str(installed / "hxmpi" / "comm" / "overhead.json"))
    assert got["cpu_s_per_call"] == json.loads(PACKAGED_CPU.read_text())["cpu_s_per_call"]


def test_osu_columns_map_to_the_calls_they_measure():
    """bare -> MPI_Alltoallv; A -> a plan-cache hit; A-new -> a miss; A-plan -> a plan; auto, naive left out."""
    from hxmpi.sim.sweep import osu_calls
    cols = ("bare", "hier_bruck", "auto", "bruck-new", "hier_pairwise-plan", "naive")
    report = {"radix": 4, "results": [{"size": 8, "check": {}, "flat_stats": {"algorithm": "flat"},
                                       **{c: {"avg_us": 1.0} for c in cols}}]}
    assert osu_calls(report) == {"bare": Call("flat", "bare"), "hier_bruck": Call("hier_bruck", "hit", 4),
                                 "bruck-new": Call("bruck", "oneshot", 4),
                                 "hier_pairwise-plan": Call("hier_pairwise", "plan", 4)}
    # A hit pays the agreement's Allreduce but not the node Allgather of a miss, and the hit CPU.
    layout, counts = Layout(node_of_sizes([2, 2])), make_counts(4, 8, False)
    hit = rank_trace(layout, counts, 0, Call("hier", "hit"), "shm", CostModel())
    miss = rank_trace(layout, counts, 0, Call("hier", "oneshot"), "shm", CostModel())
    assert any("allreduce" in ln for ln in hit) and len(miss) > len(hit)
    assert Call("hier", "hit").cpu_key == "hier_hit" and Call("bruck", "plan").cpu_key == "bruck_plan"


@needs_simgrid
def test_compare_replays_an_osu_report(tmp_path):
    """--compare of an osu_alltoallv.py report replays each column as its Call, with --overhead's CPU."""
    report = {"benchmark": "osu_alltoallv", "node_sizes": [2, 2], "node_phase": "shm", "radix": 2,
              "results": [{"size": 64, "bare": {"avg_us": 10.0}, "bruck-plan": {"avg_us": 20.0}}]}
    src, cpu, out = tmp_path / "osu.json", tmp_path / "cpu.json", tmp_path / "cmp.json"
    src.write_text(json.dumps(report))
    cpu_file(cpu, bruck_plan=5e-6)
    tuning = tmp_path / "t.json"
    PRESETS["hdr"].save(str(tuning))
    proc = cli("--compare", str(src), "--tuning", str(tuning), "--overhead", str(cpu), "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    rows = {r["algorithm"]: r for r in result["rows"]}
    assert set(rows) == {"bare", "bruck-plan"}
    assert "--compare" in result["provenance"]["command"] and result["provenance"]["mpi"].startswith("SimGrid")
    from hxmpi.sim.replay import replay
    layout, counts = Layout(node_of_sizes([2, 2])), make_counts(4, 64, False)
    want = [replay(layout, counts, Call("bruck", "plan", 2), "shm", PRESETS["hdr"], Network(), str(tmp_path / d),
                   cpu=c) for d, c in (("a", CpuTimes.load(str(cpu))), ("b", CpuTimes.fixed(PRESETS["hdr"])))]
    assert rows["bruck-plan"]["sim_s"] == pytest.approx(want[0], abs=1e-9)
    # Its 5 us of measured CPU replaced the model's fixed flat cost.
    assert want[0] - want[1] == pytest.approx(5e-6 - PRESETS["hdr"].overhead_flat, abs=1e-8)
    assert rows["bare"]["rel_error"] == pytest.approx(abs(rows["bare"]["sim_s"] - 10e-6) / 10e-6)
    assert cli("--compare", str(src)).returncode == 2


def test_combined_cpu_file_takes_flat_keys_as_measured_and_deflates_hier_keys(tmp_path):
    """bench_overhead.py --combine: flat/Bruck keys are the one-rank-per-core medians; each hier key is
    the 2x2 median times the ratio of a flat path's CPU (miss: the Python miss path, ``python_miss_s``;
    hit and plan: flat_hit); bad use is refused."""
    keys = CPU_KEYS
    def report(path, sizes, scale):
        cpu = {k: scale * (i + 1) * 1e-6 for i, k in enumerate(keys)}
        path.write_text(json.dumps({"node_sizes": sizes, "block": 8, "radix": 2, "median_us": {}, "cpu_s_per_call": cpu,
                                    "python_miss_s": scale ** 2 * 1e-6}))
        return str(path)
    flat = [report(tmp_path / f"f{i}.json", [1, 1], s) for i, s in enumerate((1.0, 2.0, 3.0))]
    hier = [report(tmp_path / "h.json", [2, 2], 4.0)]
    out = tmp_path / "cpu.json"
    script = os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks", "bench_overhead.py")
    proc = subprocess.run([sys.executable, script, "--combine-flat", *flat, "--combine-hier", *hier, "--json", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(out.read_text())
    cpu = got["cpu_s_per_call"]
    assert cpu["flat"] == pytest.approx(2e-6) and cpu["bruck_plan"] == pytest.approx(12e-6)  # the median run
    assert got["deflation"] == {"miss": pytest.approx(0.25), "hit": pytest.approx(0.5)}  # 2**2 / 4**2; 2 / 4
    i = keys.index("hier_bruck_plan") + 1
    assert cpu["hier_bruck_plan"] == pytest.approx(4.0 * i * 1e-6 * 0.5)
    assert cpu["hier"] == pytest.approx(4.0 * (keys.index("hier") + 1) * 1e-6 * 0.25)
    assert "times 0.250" in got["source"]["hier"] and len(got["inputs"]) == 4
    assert "--combine-flat" in got["provenance"]["command"] and got["provenance"]["commit"]
    assert CpuTimes.load(str(out)).seconds == cpu  # what the simulator and auto read
    # A 2x2 set whose compiled flat hit measured 0: hits and plans take the miss ratio instead.
    zero = json.loads(open(hier[0]).read())
    zero["cpu_s_per_call"]["flat_hit"] = 0.0
    (tmp_path / "h0.json").write_text(json.dumps(zero))
    proc = subprocess.run([sys.executable, script, "--combine-flat", *flat, "--combine-hier", str(tmp_path / "h0.json"),
                           "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(out.read_text())
    assert got["deflation"] == {"miss": pytest.approx(0.25), "hit": pytest.approx(0.25)}
    assert got["cpu_s_per_call"]["hier_bruck_plan"] == pytest.approx(4.0 * i * 1e-6 * 0.25)
    assert "Python miss path" in got["source"]["hier_bruck_plan"]
    bad = subprocess.run([sys.executable, script, "--combine-flat", *flat, "--json", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "go together" in bad.stderr


@needs_simgrid
def test_only_replays_the_fields_given(tmp_path):
    """--only: the named fields are replayed (and equal a full point's), the others null and listed."""
    full = simulate_point([2, 2], 64, PRESETS["hdr"], Network())
    part = simulate_point([2, 2], 64, PRESETS["hdr"], Network(), only=["auto", "bare_alltoallv"])
    assert part["auto_sim_s"] == full["auto_sim_s"] and part["bare_alltoallv_sim_s"] == full["bare_alltoallv_sim_s"]
    assert part["hier_sim_s"] is None and full["hier_sim_s"] is not None
    assert "hier" in part["not_run"] and "auto" not in part["not_run"] and full["not_run"] == []
    assert set(part["replay_s"]) == {"flat bare", f"{part['auto_pick']} oneshot"}


@needs_simgrid
def test_replay_over_timeout_is_null_and_named(tmp_path):
    """A replay over --timeout is killed with its smpimain, recorded as null, and the point goes on."""
    rec = simulate_point([8] * 8, 4096, PRESETS["hdr"], Network(), workdir=str(tmp_path), timeout=0.01)
    assert rec["bare_alltoallv_sim_s"] is None and "flat bare" in rec["timed_out"]
    assert rec["flat_sim_s"] is None and any(t.startswith("flat oneshot") for t in rec["timed_out"])
    def cwd(pid):
        try:
            return os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            return ""
    left = [pid for pid in os.listdir("/proc") if pid.isdigit() and cwd(pid).startswith(str(tmp_path))]
    assert left == []  # no smpimain runs in this test's replay directories any more


def test_pairwise_lanes_of_one_rank_replay_in_turn():
    """A rank serving two lanes (nodes of 2, 2 and 1) runs each lane's pairwise rounds in turn, as
    the runner does, over that lane's members: not merged and ordered by world rank."""
    from hxmpi.sim.schedule import Exchange, rank_schedule
    layout = Layout(node_of_sizes([2, 2, 1]))
    counts = make_counts(layout.size, 16, uneven=False)
    steps = [s for s in rank_schedule(layout, counts, 4, "hier_pairwise") if isinstance(s, Exchange)]
    assert [(s.phase, s.schedule, s.members) for s in steps] == [("lane", "pairwise", (0, 2, 4)),
                                                                  ("lane", "pairwise", (1, 3, 4))]
    assert {p for p, _ in steps[0].recvs} == {0, 2} and {p for p, _ in steps[1].recvs} == {1, 3}
    lines = rank_trace(layout, counts, 4, Call("hier_pairwise", "plan"), "shm", plain_model())
    peers = [int(ln.split()[2]) for ln in lines if ln.split()[1] in ("isend", "irecv")]
    assert peers.index(1) > max(i for i, q in enumerate(peers) if q in (0, 2))  # lane 1 after lane 0


def test_mpi_persistent_collective_posts_the_flat_exchange_at_once():
    """MPI's persistent Alltoallv_init (mode "bare_plan", as Open MPI's libnbc runs it) on 64 ranks:
    the messages of the blocking call's 63 pairwise rounds, posted at once, with no hxmpi CPU and no
    agreement; its Alltoall_init the same trace."""
    layout, counts = Layout(node_of_sizes([32, 32])), make_counts(64, 8, False)
    model = plain_model(overhead_flat=1e-3)  # a CPU cost a bare call must not pay
    bare = rank_trace(layout, counts, 5, Call("flat", "bare"), "shm", model)
    plan = rank_trace(layout, counts, 5, Call("flat", "bare_plan"), "shm", model)
    assert trace_stats(plan) == trace_stats(bare) == {"flat": {"messages": 63, "bytes": 8 * 63}}
    verbs = [ln.split()[1] for ln in plan]
    assert "waitall" not in verbs and "allreduce" not in verbs
    assert [ln for ln in plan if " sleep " in ln] == [ln for ln in bare if " sleep " in ln]  # its copy, no CPU
    assert {"isend", "irecv"}.isdisjoint(verbs[verbs.index("wait"):])  # every message posted before any wait
    assert rank_trace(layout, counts, 5, Call("alltoall", "bare_plan"), "shm", model) == plan
    assert Call("flat", "bare_plan").bare and not Call("flat", "plan").bare


@needs_simgrid
def test_mpi_persistent_collective_replays_as_the_model_prices_it(tmp_path):
    """4 ranks (Open MPI's blocking rule is linear there too): MPI's plan replays as its one-shot
    call; 8 x 8 ranks at 8 B: linear beats the blocking call's pairwise rounds, and the model prices
    both within the tolerance the sweep's other checks use. A plan is set against the faster."""
    small = simulate_point([2, 2], 64, PRESETS["hdr"], Network(), only=["bare_alltoallv", "bare_alltoallv_plan"])
    assert small["bare_alltoallv_plan_sim_s"] == small["bare_alltoallv_sim_s"]
    rec = simulate_point([8] * 8, 8, PRESETS["hdr"], Network(),
                         only=["bare_alltoallv", "bare_alltoall", "bare_alltoallv_plan", "auto_plan"])
    assert rec["bare_alltoallv_plan_sim_s"] < rec["bare_alltoallv_sim_s"]
    for k in ("bare_alltoallv", "bare_alltoallv_plan"):
        assert rec[f"model_{k}_s"] == pytest.approx(rec[f"{k}_sim_s"], rel=0.25)
    bare = [rec[f"{k}_sim_s"] for k in ("bare_alltoallv", "bare_alltoall", "bare_alltoallv_plan")]
    assert rec["plan_baseline_sim_s"] == min(bare) and rec["best_bare_sim_s"] == min(bare[:2])
    assert "flat bare_plan" in rec["replay_s"]
