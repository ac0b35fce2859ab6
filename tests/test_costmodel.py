"""Cost model: fitting recovers known parameters, decisions follow predictions, bad files fail."""
import json
from dataclasses import replace

import numpy as np
import pytest

from hxmpi.comm.costmodel import CPU_KEYS, CostModel, CpuTimes, alltoallv_algorithm, fit, fixed_cpu, predict_call

# Linear and pairwise flat worlds, node sizes 2 to 8, one single-node world (intra-node latency
# apart from the fixed costs): every parameter shows in some feature.
LAYOUTS = ((2, 2), (4, 2), (2, 4), (8, 4), (16, 4), (8, 8), (1, 3))


def synthetic(model, layouts=LAYOUTS, node_phase="shm"):
    return [(a, n, g, b, model.predict(a, n, g, b, node_phase)) for n, g in layouts for a in ("flat", "hier")
            for b in (8, 512, 8192, 65536, 1 << 20)]


@pytest.mark.parametrize("node_phase", ["shm", "mpi"], ids=["shm-phase", "mp-phase"])  # an "mpi" id would mark it an MPI test
def test_fit_recovers_parameters(node_phase):
    truth = CostModel(alpha_intra=1e-6, beta_intra=1 / 5e9, alpha_inter=5e-6, beta_inter=1 / 2e9,
                      beta_copy=1 / 8e9, overhead_flat=30e-6, overhead_hier=80e-6, msg_overhead=0.3e-6)
    # Backbone and link seconds per byte have the same feature: only their sum can be fitted.
    got = fit(synthetic(truth, node_phase=node_phase), fixed={"beta_backbone": 0.0}, node_phase=node_phase)
    for name in truth.__dict__:
        assert getattr(got, name) == pytest.approx(getattr(truth, name), rel=1e-6), name


def test_open_mpi_rule_and_phase_costs():
    assert [alltoallv_algorithm(p) for p in (2, 3, 4, 63, 64, 127, 128, 255, 256, 1023, 1024)] == \
        ["pairwise"] * 2 + ["linear"] * 2 + ["pairwise"] * 2 + ["linear"] * 2 + ["pairwise"] * 2 + ["linear"]
    m = CostModel(overhead_flat=0, overhead_hier=0, beta_copy=0, beta_inter=0, beta_intra=0, msg_overhead=0)
    # Pairwise flat pays one latency per peer (of its own kind: 56 on other nodes, 7 on its own),
    # linear flat one in all; hier's lane phase is linear.
    assert m.predict("flat", 8, 8, 8) == pytest.approx(56 * m.alpha_inter + 7 * m.alpha_intra)
    assert m.predict("flat", 4, 4, 8) == pytest.approx(m.alpha_inter)
    assert m.predict("hier", 8, 8, 8) == pytest.approx(m.alpha_inter + 6 * m.alpha_intra)  # 2 barriers of 3
    # An oversubscribed backbone slows the inter-node bytes of both algorithms alike.
    fat = CostModel(beta_backbone=3 * CostModel().beta_inter)
    for algo in ("flat", "hier"):
        slower = fat.predict(algo, 8, 8, 1 << 20) - CostModel().predict(algo, 8, 8, 1 << 20)
        assert slower == pytest.approx(8 * 56 * (1 << 20) * fat.beta_backbone)
    # The message-passing node phase copies more than the shared-memory one.
    c = CostModel(overhead_hier=0)
    assert c.predict("hier", 8, 8, 1 << 20, "mpi") > c.predict("hier", 8, 8, 1 << 20, "shm")
    with pytest.raises(ValueError, match="node_phase"):
        c.predict("hier", 8, 8, 8, "window")


def test_fit_with_pinned_parameters_and_no_negative_values():
    truth = CostModel()
    pinned = {k: v for k, v in truth.__dict__.items() if not k.startswith("overhead")}
    got = fit(synthetic(truth, layouts=((2, 2),)), fixed=pinned)
    assert got.overhead_hier == pytest.approx(truth.overhead_hier, rel=1e-6)
    # Samples faster than the pinned parts allow: the fitted overheads clip at zero.
    fast = [(a, n, g, b, t * 0.1) for a, n, g, b, t in synthetic(truth, layouts=((2, 2),))]
    assert min(fit(fast, fixed=pinned).__dict__.values()) >= 0


@pytest.mark.parametrize("node_phase", ["shm", "mpi"], ids=["shm-phase", "mp-phase"])  # an "mpi" id would mark it an MPI test
def test_choice_and_crossover_agree(node_phase):
    m = CostModel()
    for nodes, g in ((64, 8), (512, 4), (4096, 2)):
        c = m.crossover(nodes, g, node_phase)
        assert c is not None and c > 0
        assert m.choose(nodes, g, c * 0.5, node_phase) == "hier"
        assert m.choose(nodes, g, c * 2.0, node_phase) == "flat"
    assert m.choose(1, 8, 8) == "flat" and m.choose(64, 1, 8) == "flat"  # degenerate layouts
    assert m.crossover(1, 8) == 0.0


def test_save_load_roundtrip_and_errors(tmp_path):
    path = tmp_path / "t.json"
    CostModel(alpha_inter=9e-6).save(str(path), layout={"nodes": 2})
    assert CostModel.load(str(path)).alpha_inter == 9e-6
    path.write_text(json.dumps({"model": {"alpha_inter": 2e-6}}))  # older files lack newer parameters
    assert CostModel.load(str(path)).msg_overhead == CostModel().msg_overhead
    path.write_text(json.dumps({"model": {"alpha_inter": -1}}))
    with pytest.raises(ValueError, match="non-negative"):
        CostModel.load(str(path))
    path.write_text(json.dumps({"model": {"gamma": 1}}))
    with pytest.raises(ValueError, match="unknown"):
        CostModel.load(str(path))


def test_env_tuning(tmp_path, monkeypatch):
    path = tmp_path / "t.json"
    CostModel(overhead_hier=1.0).save(str(path))
    monkeypatch.setenv("HXMPI_TUNING", str(path))
    assert CostModel.from_env_or_default().overhead_hier == 1.0
    monkeypatch.delenv("HXMPI_TUNING")
    assert CostModel.from_env_or_default() == CostModel()


def _latency_only():
    return CostModel(overhead_flat=0, overhead_hier=0, beta_copy=0, beta_inter=0, beta_intra=0, msg_overhead=0,
                     alpha_inter=1e-6, alpha_intra=0.0)


def test_whole_call_parts():
    from hxmpi.comm.costmodel import predict_agreement
    m = _latency_only()
    # Bruck pays one latency per round: ceil(log_k 512) rounds.
    for k, rounds in ((2, 9), (8, 3), (16, 3), (512, 1)):
        assert predict_call(m, "bruck", "bare", 64, 8, 8, radix=k) == pytest.approx(rounds * 1e-6)
    # A round of k messages each way costs max(L + (k + 1) o, 2 k o) (LogP): the rank posts its k
    # sends, and receives each arrival as it comes; only where posting outlasts the latency is it
    # 2 k o of CPU. 8 ranks on 2 nodes, radix 8: one round of 7 messages, some to the other node.
    with_o = replace(m, msg_overhead=0.1e-6)
    assert predict_call(with_o, "bruck", "bare", 2, 4, 8, radix=8) == pytest.approx(1e-6 + 8 * 0.1e-6)
    cpu_bound = replace(with_o, alpha_inter=0.5e-6)
    assert predict_call(cpu_bound, "bruck", "bare", 2, 4, 8, radix=8) == pytest.approx(14 * 0.1e-6)
    # On one node every message is the node's own: its latency is the intra-node one.
    assert predict_call(with_o, "bruck", "bare", 1, 8, 8, radix=8) == pytest.approx(14 * 0.1e-6)
    # A one-shot call is its plan plus the agreement (9 recursive-doubling steps at 512 ranks, the
    # first 3 on the node, at intra-node latency, here 0) and the CPU difference between the two paths.
    cpu = {"hier": 30e-6, "hier_plan": 10e-6}.get
    one = predict_call(m, "hier", "oneshot", 64, 8, 8, cpu=cpu)
    plan = predict_call(m, "hier", "plan", 64, 8, 8, cpu=cpu)
    assert predict_agreement(m, 64, 8, hier=False) == pytest.approx(6e-6)
    assert one - plan == pytest.approx(predict_agreement(m, 64, 8, hier=True) + 20e-6)
    # The numpy form also exchanges the counts first.
    assert predict_call(m, "flat", "oneshot", 64, 8, 8, numpy=True) > predict_call(m, "flat", "oneshot", 64, 8, 8)


def test_pattern_sees_skew_and_sparsity():
    import numpy as np

    from hxmpi.comm.costmodel import Pattern, choose_call
    from hxmpi.sim.calls import make_counts
    even, skew = Pattern.from_counts(make_counts(64, 1024, False)), Pattern.from_counts(make_counts(64, 1024, True))
    assert even.uniform and not skew.uniform
    assert even.rank_bytes == pytest.approx(64 * 1024) and skew.total_bytes == even.total_bytes
    assert skew.rank_bytes > even.rank_bytes  # skewed receivers handle more than the mean
    small = Pattern.from_counts(make_counts(512, 8, True))  # small skewed blocks round down to empty ones
    assert small.rank_messages < 0.7 * 511
    sparse = np.eye(64, dtype=np.int64) * 0 + np.diag(np.full(63, 8), 1)
    assert Pattern.from_counts(sparse).rank_messages == pytest.approx(63 / 64)
    # Pairwise rounds wait for the larger block of each pair: a rank-local sum, agreed by SUM.
    assert even.pairwise_bytes == pytest.approx(64 * 63 * 1024)
    assert skew.pairwise_bytes > 1.5 * even.pairwise_bytes
    m = CostModel()
    assert predict_call(m, "flat", "bare", 8, 8, skew) > 1.4 * predict_call(m, "flat", "bare", 8, 8, even) - \
        0.4 * predict_call(m, "flat", "bare", 8, 8, 0)
    # MPI_Alltoall is a candidate for uniform counts only.
    assert choose_call(m, "plan", 8, 8, skew)[0] != "alltoall"
    with pytest.raises(ValueError, match="uniform"):
        predict_call(m, "alltoall", "plan", 8, 8, skew)
    with pytest.raises(ValueError, match="algorithm must be one of"):
        predict_call(m, "ring", "plan", 8, 8, 8)
    with pytest.raises(ValueError, match="mode must be"):
        predict_call(m, "flat", "persistent", 8, 8, 8)


def test_auto_pick_is_choose_call_per_pattern_class():
    """What HierComm's "auto" runs: the model's pick for the pattern's class, hxmpi's names only."""
    from dataclasses import replace

    from hxmpi.comm.costmodel import CpuTimes, Pattern, auto_pick, choose_call, pattern_class
    from hxmpi.sim.presets import PRESETS
    hdr = PRESETS["hdr"]
    small = Pattern.even(512, 8)
    # 64 x 8 at 8 B: Bruck at a radix above 2 as a plan. 16 KiB blocks one-shot: MPI_Alltoall, which
    # is hxmpi's flat for uniform counts.
    algo, radix = auto_pick(hdr, "plan", 64, 8, small)
    assert algo == "bruck" and radix > 2 and radix == choose_call(hdr, "plan", 64, 8, small)[1]
    assert choose_call(hdr, "oneshot", 64, 8, Pattern.even(512, 16384))[0] == "alltoall"
    assert auto_pick(hdr, "oneshot", 64, 8, Pattern.even(512, 16384)) == ("flat", 2)
    # Mid blocks go hierarchical, large ones flat; without a hierarchy, never a hier algorithm.
    # (with hxmpi's measured CPU per path, as HierComm prices: the fixed costs overcharge hier)
    assert auto_pick(hdr, "plan", 32, 8, Pattern.even(256, 512), cpu=CpuTimes.load())[0] == "hier"
    assert auto_pick(hdr, "plan", 32, 8, Pattern.even(256, 512), hier_possible=False)[0] in ("flat", "bruck")
    assert auto_pick(hdr, "plan", 64, 8, Pattern.even(512, 65536)) == ("flat", 2)
    # One class: sums within a few percent of each other; a factor 2 is another class.
    a = Pattern.from_counts(np.full((8, 8), 1000))
    assert pattern_class(replace(a, total_bytes=a.total_bytes * 1.02)) == pattern_class(a)
    assert pattern_class(replace(a, total_bytes=a.total_bytes * 2)) != pattern_class(a)
    assert pattern_class(replace(a, uniform=False)) != pattern_class(a)


# ----------------------------------------------------------------------- pricing the step program
def _walk_model(**kw):
    """Every parameter non-zero and distinct, a NIC on: a price that sums every term."""
    base = dict(alpha_intra=0.3e-6, beta_intra=1 / 7e9, alpha_inter=2.1e-6, beta_inter=1 / 11e9, beta_copy=1 / 9e9,
                msg_overhead=0.17e-6, beta_backbone=0.5 / 11e9, nic_msg_rate=40e6, nic_bandwidth=30e9)
    return CostModel(**{**base, **kw})


def test_every_algorithm_is_priced_from_its_program():
    """predict_call's bare price of each algorithm is the walk of the programs its planner makes."""
    from hxmpi.comm.costmodel import layout_price
    from hxmpi.comm.plan import ALGORITHMS, Layout, algorithm_of
    m = _walk_model()
    layout = Layout(np.repeat(np.arange(4), 3))
    for name in ALGORITHMS:
        for phase in ("shm",) if algorithm_of(name).led else ("shm", "mpi"):
            for radix in (2, 3):
                want = layout_price(layout, name, radix, phase).price(m, 640.0)
                assert predict_call(m, name, "bare", 4, 3, 640, phase, radix) == pytest.approx(want, rel=1e-12)


def test_a_new_algorithm_is_priced_without_model_code():
    """An Algorithm the model has never seen (radix-3 Bruck lanes, pairwise flat rounds) is priced
    from its program: one inter-node latency per round, the node barriers' intra-node ones."""
    from hxmpi.comm.costmodel import layout_price
    from hxmpi.comm.plan import Algorithm, Layout, Rounds
    lat = CostModel(alpha_inter=1e-6, alpha_intra=0.25e-6, beta_inter=0, beta_intra=0, beta_copy=0, msg_overhead=0)
    lanes3 = Algorithm("lanes_bruck3", "lanes", Rounds.ROUNDS_BRUCK)
    # 27 nodes of 2: ceil(log3 27) = 3 lane rounds; shm: 2 barriers of ceil(log2 2) = 1 round each.
    got = layout_price(Layout(np.repeat(np.arange(27), 2)), lanes3, radix=3).price(lat, 8.0)
    assert got == pytest.approx(3e-6 + 2 * 0.25e-6)
    # Pairwise flat rounds on 4 nodes of 2: 6 rounds to other nodes, 1 on the node.
    pairwise = Algorithm("flat_pairwise", "flat", Rounds.ROUNDS_PAIRWISE)
    got = layout_price(Layout(np.repeat(np.arange(4), 2)), pairwise).price(lat, 8.0)
    assert got == pytest.approx(6e-6 + 0.25e-6)


@pytest.mark.parametrize("sizes", [(4, 8), (3, 2), (2, 5)])
def test_a_pipelined_node_phase_is_priced_at_the_block_it_runs(sizes):
    """The cached price of k chunks, scaled to any block, is the walk of the programs the planner
    makes at that block: every chunk's messages, waits and barriers priced (chunks carry whole
    blocks, so the 1-byte walk has them all), so more chunks cost more where blocks are small."""
    from hxmpi.comm.costmodel import layout_price, price_program, representative_ranks
    from hxmpi.comm.plan import Layout, algorithm_of
    n, g = sizes
    layout = Layout(np.repeat(np.arange(n), g))
    hier = algorithm_of("hier")
    ranks = representative_ranks(layout, hier)
    m, slow_nic = _walk_model(), _walk_model(nic_msg_rate=2e6, nic_bandwidth=2e9)
    for chunks in (1, 2, 3, 8):
        cached = layout_price(layout, "hier", chunks)
        for block in (3, 8, 4096):
            counts = np.full((layout.size, layout.size), block, dtype=np.int64)
            walked = price_program(layout, {r: layout.rank_program(r, hier, counts, "shm", chunks).detach()
                                            for r in ranks})
            for model in (m, slow_nic):
                assert cached.price(model, float(block)) == pytest.approx(walked.price(model, 1.0), rel=1e-9), \
                    (chunks, block)
    small = [layout_price(layout, "hier", k).price(m, 64.0) for k in (1, 2, 4, 8)]
    assert small == sorted(small) and small[0] < small[-1]


@pytest.mark.parametrize("sizes", [(2, 2), (4, 3), (3, 4), (2, 8), (8, 2)])
def test_the_representative_ranks_price_what_every_rank_prices(sizes):
    """Even layouts are priced from node 0's ranks (rank 0 for direct and lane exchanges; whole
    nodes for pipelining lanes): the same price as the walk of every rank's program, NIC and all."""
    from hxmpi.comm.costmodel import layout_price, representative_ranks
    from hxmpi.comm.plan import ALGORITHMS, Layout, algorithm_of
    n, g = sizes
    layout = Layout(np.repeat(np.arange(n), g))
    m, slow_nic = _walk_model(), _walk_model(nic_msg_rate=2e6, nic_bandwidth=2e9)
    for name in ALGORITHMS:
        algo = algorithm_of(name)
        led = algo.led  # multi-leader and pipelining lanes: whole nodes (the first, second and last)
        assert len(representative_ranks(layout, algo)) < layout.size or layout.size <= g \
            or ((led or algo.chunked) and n <= 3)
        for phase in ("shm",) if led else ("shm", "mpi"):
            for learned in (True, False):
                for radix in (1, 2, 3) if led else (2, 3):
                    short = layout_price(layout, name, radix, phase, learned)
                    full = layout_price(layout, name, radix, phase, learned, ranks=range(layout.size))
                    for model in (m, slow_nic):
                        for block in (8.0, 4096.0):
                            assert short.price(model, block) == pytest.approx(full.price(model, block), rel=1e-12), \
                                (name, phase, learned, radix, block)


def test_message_passing_node_phase_is_priced_as_it_runs():
    """hier's "mpi" node phase is a nonblocking Ialltoallv (linear, one latency), not Open MPI's
    blocking rule, which would run 64 ranks pairwise (63 latencies)."""
    lat = CostModel(alpha_inter=1e-6, alpha_intra=0.25e-6, beta_inter=0, beta_intra=0, beta_copy=0,
                    msg_overhead=0, overhead_hier=0)
    assert alltoallv_algorithm(64) == "pairwise"
    assert lat.predict("hier", 2, 64, 8, "mpi") == pytest.approx(1e-6 + 0.25e-6)


def test_the_nic_is_off_by_default_and_bounds_a_phase_when_given():
    """No NIC: the prices of per-rank costs alone. A NIC: a phase takes at least the node's
    inter-node messages at its message rate, and its bytes at its bandwidth."""
    base = CostModel()
    assert base.vector()[-2:].tolist() == [0.0, 0.0]
    assert replace(base, nic_msg_rate=0.0).predict("hier", 8, 8, 64) == base.predict("hier", 8, 8, 64)
    rate = 1e6
    slow = replace(base, nic_msg_rate=rate)
    # hier at 32 x 32: each rank sends 31 lane messages, the node's 32 ranks at once.
    assert predict_call(slow, "hier", "bare", 32, 32, 8) >= 32 * 31 / rate
    assert predict_call(slow, "hier", "bare", 32, 32, 8) > predict_call(base, "hier", "bare", 32, 32, 8)
    # flat: every rank 992 messages off the node; a node 32 times that.
    assert predict_call(slow, "flat", "bare", 32, 32, 8) >= 32 * 992 / rate
    bw = replace(base, nic_bandwidth=1e9)
    assert predict_call(bw, "flat", "bare", 8, 8, 1 << 20) >= 8 * 56 * (1 << 20) / 1e9
    # Fitting leaves the NIC out (off) and still recovers the rest.
    got = fit(synthetic(base), fixed={"beta_backbone": 0.0})
    assert got.nic_msg_rate == 0.0 and got.alpha_inter == pytest.approx(base.alpha_inter, rel=1e-6)


def test_agreement_steps_are_written_once():
    """The simulator replays, and the model prices, the one list of agreement steps."""
    from hxmpi.comm.costmodel import COUNT_BYTES, agreement_steps, predict_agreement
    from hxmpi.comm.plan import Layout
    from hxmpi.sim.calls import Call
    from hxmpi.sim.calls import agreement_steps as replayed
    layout = Layout(np.repeat(np.arange(4), 2))
    for call in (Call("hier"), Call("hier", "hit"), Call("flat", numpy=True), Call("hier_bruck", numpy=True),
                 Call("hier_leaders")):
        both = call.algorithm == "hier_leaders"
        steps = agreement_steps(layout.size, call.hier, call.numpy, call.mode != "hit", both)
        assert [(s.kind, s.nbytes) for s in replayed(layout, call)] == [(s.kind, s.nbytes) for s in steps]
    assert [s.kind for s in agreement_steps(8, True, True)] == ["alltoall", "allreduce", "allgather"]
    assert agreement_steps(8, True)[-1].nbytes == COUNT_BYTES * 8
    # Multi-leader gathers both sides' counts over the node: twice the bytes, priced so.
    assert agreement_steps(8, True, both=True)[-1].nbytes == 2 * COUNT_BYTES * 8
    assert replayed(layout, Call("hier_leaders"))[-1].nbytes == 2 * COUNT_BYTES * 8
    m0 = CostModel()
    assert predict_agreement(m0, 4, 2, True, both=True) > predict_agreement(m0, 4, 2, True)
    assert predict_call(m0, "hier_leaders", "oneshot", 4, 2, 64, radix=1) - \
        predict_call(m0, "hier_leaders", "plan", 4, 2, 64, radix=1) == pytest.approx(
            predict_agreement(m0, 4, 2, True, both=True) + fixed_cpu(m0, "hier") - fixed_cpu(m0, "hier_plan"))
    # On a layout without a hierarchy no node Allgather is replayed or priced.
    assert [s.kind for s in replayed(Layout([0] * 4), Call("hier"))] == ["allreduce"]
    m = CostModel()
    assert predict_agreement(m, 1, 4, hier=True) == predict_agreement(m, 1, 4, hier=False)
    assert predict_agreement(m, 4, 2, hier=True) > predict_agreement(m, 4, 2, hier=False)


def _grid():
    """Presets x layouts x blocks at the centres of pattern classes (total bytes + 1 a power of
    2**0.25): where ``auto_pick``'s representative is the pattern itself."""
    from hxmpi.sim.presets import PRESETS
    for preset in ("hdr", "slingshot"):
        for n, g in ((1, 8), (4, 8), (8, 8), (16, 4), (3, 5)):
            p = n * g
            for q in range(4 * 13, 4 * 27, 5):
                yield PRESETS[preset], n, g, (2.0 ** (q / 4) - 1.0) / (p * p)


def test_auto_pick_is_the_models_argmin_on_a_grid():
    """auto's pick, one-shot and plan, is the cheapest option the model prices (MPI_Alltoall is
    hxmpi's flat on uniform counts): every algorithm the layout runs at every radix of
    ``RADICES`` (capped at its communicator's size), and within 5% of every radix; the linear
    lanes at every chunk count of ``CHUNKS``."""
    from hxmpi.comm.costmodel import CALL_ALGORITHMS, CHUNKS, RADICES, CpuTimes, Pattern, auto_pick
    from hxmpi.comm.plan import ALGORITHM
    cpu = CpuTimes.load()
    for m, n, g, block in _grid():
        pat = Pattern.even(n * g, block)
        for mode in ("oneshot", "plan"):
            options, every = {}, []
            for name in CALL_ALGORITHMS:
                algo = ALGORITHM.get(name)
                if algo is not None and algo.hierarchical and (n < 2 or g < 2):
                    continue
                size = max(2, n if algo is not None and algo.hierarchical else n * g)
                radixed = algo is not None and algo.radixed
                chunked = algo is not None and algo.chunked
                for k in (range(2, size + 1) if radixed else CHUNKS if chunked else [2]):
                    t = predict_call(m, name, mode, n, g, pat, cpu=cpu, radix=k)
                    every.append(t)
                    if not radixed or k in RADICES or k == size:
                        options[name, k] = t
            (name, radix), best = min(options.items(), key=lambda kv: kv[1])
            assert best <= 1.05 * min(every)
            want = ("flat" if name == "alltoall" else name, radix)
            assert auto_pick(m, mode, n, g, pat, cpu=cpu, hier_possible=n > 1 and g > 1) == want, \
                (n, g, block, mode)


def test_mpi_alltoall_follows_open_mpis_decision_with_its_cpu():
    """MPI_Alltoall is priced as Open MPI's tuned decision runs it: its Bruck charges the library's
    CPU per block and round (``mpi_ddt_block``) and its copies, a bare call (the lower bound) only
    the copies; linear and pairwise no CPU per block."""
    from hxmpi.comm.costmodel import alltoall_algorithm, bruck_schedule
    assert alltoall_algorithm(1024, 8) == "bruck" and alltoall_algorithm(1024, 512) == "linear"
    assert alltoall_algorithm(512, 1 << 20) == "pairwise" and alltoall_algorithm(2, 8) == "pairwise"
    assert [r[:2] for r in bruck_schedule(8)] == [(1, 4), (2, 4), (4, 4)]
    base = CostModel()
    cpu = replace(base, mpi_ddt_block=0.35e-6)
    k = sum(r.blocks for r in bruck_schedule(1024))
    extra = predict_call(cpu, "alltoall", "plan", 32, 32, 8) - predict_call(base, "alltoall", "plan", 32, 32, 8)
    assert extra == pytest.approx(k * 0.35e-6, rel=1e-9)
    assert predict_call(cpu, "alltoall", "bare", 32, 32, 8) == predict_call(base, "alltoall", "bare", 32, 32, 8)
    # 512 B at 1024 ranks runs linear: the CPU per block does not apply.
    assert predict_call(cpu, "alltoall", "plan", 32, 32, 512) == predict_call(base, "alltoall", "plan", 32, 32, 512)
    # The Bruck's CPU grows as P log P blocks: at 1024 ranks it is most of the call.
    assert extra > 0.5 * predict_call(cpu, "alltoall", "plan", 32, 32, 8)


def test_mpi_persistent_collective_is_priced_as_libnbc_runs_it():
    """A bare plan (MPI_Alltoallv_init or MPI_Alltoall_init, then Start + Wait) costs the flat exchange
    with every message posted at once: what a bare one-shot call costs where Open MPI's blocking rule
    is linear (8 ranks), less than its pairwise rounds on 64 ranks, and no CPU of hxmpi's."""
    m = CostModel()
    assert predict_call(m, "flat", "bare_plan", 2, 4, 64) == pytest.approx(predict_call(m, "flat", "bare", 2, 4, 64))
    assert predict_call(m, "flat", "bare_plan", 8, 8, 8) < predict_call(m, "flat", "bare", 8, 8, 8)
    assert predict_call(m, "alltoall", "bare_plan", 8, 8, 8) == predict_call(m, "flat", "bare_plan", 8, 8, 8)
    costly = CpuTimes({k: 1.0 for k in CPU_KEYS}, "test")
    assert predict_call(m, "flat", "bare_plan", 8, 8, 8, cpu=costly) == predict_call(m, "flat", "bare_plan", 8, 8, 8)
    with pytest.raises(ValueError, match="persistent collective"):
        predict_call(m, "hier", "bare_plan", 8, 8, 8)
