"""hxmpi.sim.reference: Open MPI's reference schedules, their cost formulas, and the slingshot fit."""
import json
from pathlib import Path

import numpy as np
import pytest
from support import load_script

from hxmpi.comm.costmodel import CostModel
from hxmpi.comm.plan import Layout
from hxmpi.comm.costmodel.collectives import bruck_schedule
from hxmpi.sim.reference import REFERENCES, RefCpu, predict_reference, reference_trace, ring_partner
from hxmpi.sim.calls import node_of_sizes
from hxmpi.sim.errors import SimulateError
from hxmpi.sim.platform import Network
from hxmpi.sim.presets import PRESETS
from hxmpi.sim.replay import replay_traces, simgrid

ROOT = Path(__file__).resolve().parent.parent
try:
    simgrid()
    SKIP = None
except SimulateError as exc:
    SKIP = str(exc)
needs_simgrid = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")


def load_fit_script():
    return load_script("benchmarks/fit_slingshot.py", "fit_slingshot")


def test_bruck_schedule_counts_the_set_bits():
    """Round d of Open MPI's modified Bruck sends the blocks whose index has bit d set."""
    assert bruck_schedule(8, 16) == ((1, 4, 64), (2, 4, 64), (4, 4, 64))
    assert [r[:2] for r in bruck_schedule(5)] == [(1, 2), (2, 2), (4, 1)]
    assert [r[:2] for r in bruck_schedule(192)[-2:]] == [(64, 64), (128, 64)] and len(bruck_schedule(192)) == 8


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
def test_ring_partners_send_to_every_node_once_own_last(n):
    for node in range(n):
        met = [ring_partner(node, j, n) for j in range(n)]
        assert sorted(met) == list(range(n)) and met[-1] == node


@pytest.mark.parametrize("sizes", [[3, 3], [4, 4, 4], [1, 1]])
@pytest.mark.parametrize("name", REFERENCES)
def test_every_send_is_received(name, sizes):
    layout = Layout(node_of_sizes(sizes))
    sent, received = [], []
    for rank in range(layout.size):
        for line in reference_trace(name, layout, 16, rank, CostModel(), RefCpu(1e-7, 2e-7)):
            r, verb, *rest = line.split()
            if verb in ("isend", "send"):
                sent.append((int(r), int(rest[0]), int(rest[1]), int(rest[2])))
            elif verb == "irecv":
                received.append((int(rest[0]), int(r), int(rest[1]), int(rest[2])))
    assert sorted(sent) == sorted(received)
    if name == "ompi_bruck":  # every rank sends each round's k blocks once
        p = layout.size
        assert sum(s[3] for s in sent) == p * sum(r.nbytes for r in bruck_schedule(p, 16))


def test_unknown_reference_and_unequal_nodes_are_refused():
    layout = Layout(node_of_sizes([2, 1]))
    with pytest.raises(ValueError, match="unknown reference schedule 'x'"):
        reference_trace("x", layout, 8, 0, CostModel(), RefCpu())
    with pytest.raises(ValueError, match="nodes of equal size"):
        reference_trace("han_alltoall", layout, 8, 0, CostModel(), RefCpu())
    with pytest.raises(ValueError, match="unknown reference schedule"):
        predict_reference("x", 2, 2, 8, CostModel(), RefCpu())


@needs_simgrid
def test_two_rank_bruck_adds_up_by_hand(tmp_path):
    """2 ranks on 2 nodes: one round of one block: datatype CPU + overhead + latency + bytes + overhead;
    the formula and the replay agree."""
    model = CostModel(alpha_inter=3e-6, beta_inter=1 / 1e9, msg_overhead=0.5e-6, beta_copy=0.0)
    cpu = RefCpu(ddt_block=2e-6)
    layout = Layout(node_of_sizes([1, 1]))
    traces = [reference_trace("ompi_bruck", layout, 4000, r, model, cpu) for r in range(2)]
    sim = replay_traces(layout, traces, model, Network(), str(tmp_path))
    by_hand = 2e-6 + 0.5e-6 + 3e-6 + 4e-6 + 0.5e-6
    assert sim == pytest.approx(by_hand, rel=1e-2)
    assert predict_reference("ompi_bruck", 2, 1, 4000, model, cpu) == pytest.approx(by_hand, rel=1e-12)


def test_fit_reproduces_the_preset_and_holds_on_checked_points():
    """The shipped preset is what benchmarks/fit_slingshot.py fits; the model is within the issue's
    bar (35%) on every published point, fitted or not, and within 20% on the 1 B and 64 B ones."""
    fit = load_fit_script()
    pts = fit.points()
    assert len(pts) == 30 and sum(p["fitted"] for p in pts) == 12
    model, cpu = fit.fit(pts)
    shipped = json.loads((ROOT / "hxmpi" / "sim" / "slingshot.json").read_text())
    for k, v in shipped["model"].items():
        if k.startswith("nic_"):  # fitted by replaying osu_mbw_mr (--replay), not by the least squares
            continue
        assert getattr(model, k) == pytest.approx(v, rel=1e-9, abs=1e-18), k
    assert cpu.__dict__ == pytest.approx(shipped["reference_cpu"], rel=1e-9)
    for k in ("alpha_inter", "beta_inter", "msg_overhead", "beta_copy"):
        assert getattr(PRESETS["slingshot"], k) == pytest.approx(shipped["model"][k], rel=1e-12)
    errors = {}
    for p in pts:
        t = predict_reference(p["algorithm"], fit.NODES, fit.PER_NODE, p["block_bytes"],
                              fit.transport_model(model, p["transport"]), cpu)
        errors[(p["transport"], p["algorithm"], p["block_bytes"])] = abs(t - p["published_s"]) / p["published_s"]
    assert max(errors.values()) < 0.35
    assert max(e for (t, a, b), e in errors.items() if b in (1, 64)) < 0.20


def test_nnls_solves_a_known_system():
    fit = load_fit_script()
    a = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    assert fit.nnls(a, np.array([1.0, 2.0, 3.0])) == pytest.approx([1.0, 2.0])
    assert fit.nnls(a, np.array([-1.0, 2.0, 1.0])) == pytest.approx([0.0, 1.5])  # the negative one pinned at 0
