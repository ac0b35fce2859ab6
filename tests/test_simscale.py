"""The simulator at scale: the NIC (platform, fit), the coarse replay of linear phases against the
full one, Open MPI's tuned decision and the baselines with their CPU, the runtime's multi-leader replayed."""
import tempfile

import pytest

from hxmpi.comm.costmodel import CpuTimes, predict_call, settings_of
from hxmpi.comm.costmodel.collectives import dissemination_distances
from hxmpi.comm.plan import BarrierStep, Layout, program_steps
from hxmpi.sim.reference import RefCpu, mbw_mr_trace, reference_trace, tuned_alltoall
from hxmpi.sim.scale import scale_point
from hxmpi.sim.actions import PHASE_TAG, TAG_STRIDE, Coarse, Nic, nic_lines
from hxmpi.sim.calls import Call, make_counts, node_of_sizes
from hxmpi.sim.platform import Network
from hxmpi.sim.presets import PRESET_NICS, calibrated_preset
from hxmpi.sim.replay import replay, replay_traces
from hxmpi.sim.trace import rank_trace, trace_stats
from support import simgrid_missing


SKIP = simgrid_missing()
needs_simgrid = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
MODEL, PRESET = calibrated_preset()
NIC = PRESET_NICS["slingshot"]
#: How far the coarse replay of a linear phase may land from the full replay (fraction).
COARSE_TOLERANCE = 0.08


def messages(traces):
    """(src, dst, tag, bytes) of every send and of every receive in a set of rank traces."""
    sent, received = [], []
    for lines in traces:
        for ln in lines:
            r, verb, *rest = ln.split()
            if verb in ("isend", "send"):
                sent.append((int(r), int(rest[0]), int(rest[1]), int(rest[2])))
            elif verb in ("irecv", "recv"):
                received.append((int(rest[0]), int(r), int(rest[1]), int(rest[2])))
    return sorted(sent), sorted(received)


def test_preset_has_its_nic():
    """The slingshot preset carries the fitted NIC under the cost model's names."""
    m = PRESET["model"]
    assert m["nic_msg_rate"] >= 43.5e6 and m["nic_bandwidth"] == pytest.approx(1 / m["beta_inter"])
    assert NIC == Nic(m["nic_msg_rate"], m["nic_bandwidth"], m["nic_send_share"])
    assert NIC.surcharge == round(NIC.bandwidth / NIC.msg_rate)
    o_send, o_recv = NIC.overheads(MODEL.msg_overhead)
    assert o_send + o_recv == pytest.approx(2 * MODEL.msg_overhead)


def test_nic_surcharge_between_nodes_only():
    """Inter-node messages carry the surcharge on both sides; node-local ones and collectives do not."""
    layout = Layout(node_of_sizes([2, 2]))
    lines = ["0 init", "0 isend 1 5 10", "0 isend 2 5 10", "0 irecv 3 5 7", "0 send 2 6 1", "0 allreduce 128 0",
             "0 sleep 1e-06"]
    out = nic_lines(lines, layout, Nic(1e6, 1e9))
    assert out == ["0 init", "0 isend 1 5 10", "0 isend 2 5 1010", "0 irecv 3 5 1007", "0 send 2 6 1001",
                   "0 allreduce 128 0", "0 sleep 1e-06"]
    assert nic_lines(lines, layout, None) == lines


@needs_simgrid
def test_nic_reproduces_osu_mbw_mr():
    """osu_mbw_mr with 1 B messages on the preset: about 2.2 M messages/s per rank with one pair and
    43.5 M per node with 20, each within 20% (the published curve the NIC is fitted to)."""
    for pairs, published in ((1, 2.2e6), (20, 43.5e6)):
        layout = Layout(node_of_sizes([pairs, pairs]))
        with tempfile.TemporaryDirectory() as tmp:
            t = replay_traces(layout, (mbw_mr_trace(r, pairs, 1, 10) for r in range(2 * pairs)), MODEL, Network(),
                              tmp, nic=NIC)
        assert abs(pairs * 10 * 64 / t - published) / published < 0.2, (pairs, t)


@needs_simgrid
def test_nic_rate_caps_a_node():
    """With a NIC of a quarter the rate, 20 pairs stream slower than with the fitted one: the NIC,
    not the ranks, caps the node."""
    layout = Layout(node_of_sizes([20, 20]))
    rates = []
    for nic in (NIC, Nic(NIC.msg_rate / 4, NIC.bandwidth, NIC.send_share)):
        with tempfile.TemporaryDirectory() as tmp:
            rates.append(20 * 640 / replay_traces(layout, (mbw_mr_trace(r, 20, 1, 10) for r in range(40)), MODEL,
                                                  Network(), tmp, nic=nic))
    assert rates[1] < 0.6 * rates[0]
    assert rates[1] <= NIC.msg_rate / 4 * 1.05


def test_coarse_trace_moves_the_same_bytes():
    """The coarse trace of a linear flat phase sends every rank's bytes (plus the saved messages'
    surcharges), every send matched by a receive, with N - 1 + G - 1 messages a rank."""
    layout = Layout(node_of_sizes([4, 4, 4]))
    counts = make_counts(12, 40, False)
    how = Coarse(1e-7, 2e-7, 100)
    traces = [rank_trace(layout, counts, r, Call("flat", "bare"), "shm", MODEL, coarse=how) for r in range(12)]
    sent, received = messages(traces)
    assert sent == received
    stats = trace_stats(traces[5])["flat"]
    assert stats["messages"] == 2 + 3
    assert stats["bytes"] == 11 * 40 + 2 * 3 * 100
    assert any(ln.split()[1] == "sleep" and float(ln.split()[2]) == pytest.approx(2 * 3 * 2e-7) for ln in traces[5])


def test_coarse_leaves_uneven_layouts_and_pairwise_alone():
    """Nodes of unequal size, and phases Open MPI runs pairwise (64 ranks), replay in full."""
    for sizes, p in (([2, 2, 1], 5), ([32, 32], 64)):
        layout = Layout(node_of_sizes(sizes))
        counts = make_counts(p, 8, False)
        full = rank_trace(layout, counts, 1, Call("flat", "bare"), "shm", MODEL)
        assert rank_trace(layout, counts, 1, Call("flat", "bare"), "shm", MODEL, coarse=Coarse.of(MODEL, NIC)) == full


@needs_simgrid
@pytest.mark.parametrize("shape,block", [((4, 8), 8), ((4, 8), 512), ((6, 4), 64)])
def test_coarse_replay_matches_full(shape, block):
    """Bare MPI_Alltoallv and a flat one-shot call (linear at these sizes) on the preset with its
    NIC: the coarse replay within COARSE_TOLERANCE of the full one."""
    n, g = shape
    layout = Layout(node_of_sizes([g] * n))
    counts = make_counts(n * g, block, False)
    for call in (Call("flat", "bare"), Call("flat")):
        with tempfile.TemporaryDirectory() as tmp:
            full = replay(layout, counts, call, "shm", MODEL, Network(), tmp, nic=NIC)
            coarse = replay(layout, counts, call, "shm", MODEL, Network(), tmp, nic=NIC, coarse=True)
        assert abs(coarse - full) / full < COARSE_TOLERANCE, (shape, block, call, full, coarse)


def test_tuned_alltoall_follows_open_mpi_rule():
    """Open MPI's fixed decision: modified Bruck for small blocks on mid-size worlds, linear above,
    pairwise for large blocks on 128-1023 ranks, pairwise on 2 ranks."""
    assert tuned_alltoall(192, 1) == tuned_alltoall(192, 1023) == "ompi_bruck"
    assert tuned_alltoall(192, 1024) == "ompi_linear"
    assert tuned_alltoall(1024, 8) == "ompi_bruck" and tuned_alltoall(1024, 512) == "ompi_linear"
    assert tuned_alltoall(512, 1 << 20) == "ompi_pairwise"
    assert tuned_alltoall(8, 8) == "ompi_linear" and tuned_alltoall(2, 8) == "ompi_pairwise"
    assert tuned_alltoall(4096, 1024) == "ompi_bruck" and tuned_alltoall(4096, 4096) == "ompi_linear"


@pytest.mark.parametrize("name", ["ompi_tuned", "ompi_pairwise", "ompi_linear", "han_alltoall"])
def test_reference_traces_match(name):
    """Every send of a reference schedule is received, bytes and tags alike (3 x 4 ranks)."""
    layout = Layout(node_of_sizes([4, 4, 4]))
    traces = [reference_trace(name, layout, 16, r, MODEL, RefCpu(1e-7, 1e-7)) for r in range(12)]
    sent, received = messages(traces)
    assert sent == received and sent


@needs_simgrid
def test_baselines_carry_their_cpu():
    """scale_point on 2 x 8 ranks: Open MPI tuned and HAN replayed with their CPU per block take
    longer than with none, by at least the CPU the model charges; the lower bound is the best bare."""
    ref = RefCpu(**PRESET["reference_cpu"])
    with_cpu = scale_point([8, 8], 8, MODEL, ref, NIC)
    without = scale_point([8, 8], 8, MODEL, RefCpu(), NIC)
    assert with_cpu["ompi_tuned_schedule"] == "ompi_bruck"
    for key in ("ompi_tuned", "han"):
        extra = with_cpu[f"model_{key}_s"] - without[f"model_{key}_s"]
        assert extra > 0
        assert with_cpu[f"{key}_sim_s"] - without[f"{key}_sim_s"] >= 0.5 * extra, key
    assert with_cpu["lower_bound_s"] == min(with_cpu["bare_alltoallv_sim_s"], with_cpu["ompi_tuned_free_sim_s"])
    assert with_cpu["ompi_tuned_free_sim_s"] == without["ompi_tuned_sim_s"]
    assert with_cpu["auto_vs_lower_bound"] == pytest.approx(with_cpu["auto_sim_s"] / with_cpu["lower_bound_s"])


@pytest.mark.parametrize("mode", ["plan", "bare"])
def test_mpi_alltoall_calls_run_open_mpis_schedule(mode):
    """hxmpi's MPI_Alltoall (auto's "alltoall" pick) is traced as Open MPI's tuned decision runs it:
    point-to-point messages (so they pay the NIC's surcharge), its Bruck with the library's CPU per
    block unless the call is bare (the lower bound), never SMPI's own collective."""
    layout = Layout(node_of_sizes([8, 8]))
    counts = make_counts(16, 8, False)
    ref = RefCpu(ddt_block=MODEL.mpi_ddt_block) if mode == "plan" else RefCpu()
    lines = rank_trace(layout, counts, 3, Call("alltoall", mode), "shm", MODEL)
    assert not any(ln.split()[1] == "alltoall" for ln in lines)
    body = [ln for ln in lines if ln.split()[1] not in ("init", "finalize")]
    mine = reference_trace("ompi_tuned", layout, 8, 3, MODEL, ref)[1:-1]
    assert body[-len(mine):] == mine  # after hxmpi's own CPU (a plan's), the library's schedule
    assert MODEL.mpi_ddt_block == PRESET["reference_cpu"]["ddt_block"] > 0
    changed = [(a, b) for a, b in zip(lines, nic_lines(lines, layout, NIC)) if a != b]
    assert changed and all(int(b.split()[4]) - int(a.split()[4]) == NIC.surcharge for a, b in changed)
    assert trace_stats(lines)["library"]["messages"] == sum(ln.split()[1] == "isend" for ln in body)


@needs_simgrid
def test_alltoall_pick_replays_slower_than_its_lower_bound():
    """On the preset (its NIC and Open MPI's Bruck CPU), auto's MPI_Alltoall with the library's
    CPU replays slower than the CPU-free bare call, and the model prices the difference within 35%."""
    counts = make_counts(64, 8, False)
    layout = Layout(node_of_sizes([16] * 4))
    with tempfile.TemporaryDirectory() as tmp:
        plan = replay(layout, counts, Call("alltoall", "plan"), "shm", MODEL, Network(), tmp + "/p", nic=NIC)
        bare = replay(layout, counts, Call("alltoall", "bare"), "shm", MODEL, Network(), tmp + "/b", nic=NIC)
    fixed = CpuTimes.fixed(MODEL)
    model_gap = predict_call(MODEL, "alltoall", "plan", 4, 16, 8, cpu=fixed) - \
        predict_call(MODEL, "alltoall", "bare", 4, 16, 8)
    assert plan > bare
    assert plan - bare == pytest.approx(model_gap, rel=0.35)


def test_multi_leader_replays_the_planners_program():
    """The simulator's multi-leader is the runtime's (``LeaderPlanner``), at each k the runtime tries
    (``settings_of``): a node sends k (N - 1) inter-node messages carrying the same bytes whatever
    k, and every rank's trace has the planner program's node barriers, each its dissemination's
    rounds."""
    layout, g = Layout(node_of_sizes([4, 4, 4])), 4
    counts = make_counts(12, 8, False)
    totals = {}
    ks = settings_of("hier_leaders", layout.node_sizes)
    assert ks == [1, 2]
    for k in ks:
        traces = [rank_trace(layout, counts, r, Call("hier_leaders", "plan", k), "shm", MODEL) for r in range(12)]
        sent, received = messages(traces)
        assert sent == received
        inter = [s for s in sent if layout.node_of[s[0]] != layout.node_of[s[1]]]
        assert len(inter) == 3 * k * 2
        totals[k] = sum(s[3] for s in inter)
        barrier_tags = range(PHASE_TAG["barrier"] * TAG_STRIDE, (PHASE_TAG["barrier"] + 1) * TAG_STRIDE)
        for r in range(12):
            prog = layout.rank_program(r, "hier_leaders", counts, radix=k)
            barriers = sum(isinstance(st, BarrierStep) for st in program_steps(prog))
            rounds = [s for s in sent if s[0] == r and s[2] in barrier_tags]
            assert barriers == 3 and len(rounds) == barriers * len(dissemination_distances(g))
    assert len(set(totals.values())) == 1


@needs_simgrid
def test_multi_leader_model_tracks_replay():
    """The cost model's price of the runtime's multi-leader within 10% of its replay on 4 x 16
    ranks, 8 B blocks, at every k the runtime tries, and of the lanes beside it."""
    layout, counts = Layout(node_of_sizes([16] * 4)), make_counts(64, 8, False)
    cpu = CpuTimes.fixed(MODEL)
    for algo, k in [("hier", 2)] + [("hier_leaders", k) for k in settings_of("hier_leaders", layout.node_sizes)]:
        with tempfile.TemporaryDirectory() as tmp:
            sim = replay(layout, counts, Call(algo, "plan", k), "shm", MODEL, Network(), tmp, cpu=cpu, nic=NIC)
        model = predict_call(MODEL, algo, "plan", 4, 16, 8, "shm", k, cpu)
        assert abs(model - sim) / sim < 0.1, (algo, k, model, sim)
