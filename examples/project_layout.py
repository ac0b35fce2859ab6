"""Project a layout before you have it: the cost model that HierComm(algorithm="auto") uses
prices every algorithm for a machine of N nodes x G ranks, here on the simulator's calibrated
``slingshot`` platform. No MPI job of that size is needed (the SimGrid replay of the same layout
is ``python -m hxmpi.sim``; see the how-to).

Run: python examples/project_layout.py   (or under mpirun: rank 0 prints)
"""
import hxmpi  # noqa: F401
from mpi4py import MPI
from hxmpi.comm.costmodel import CpuTimes, choose_call, predict_call
from hxmpi.sim.presets import PRESETS

model = PRESETS["slingshot"]  # a CostModel: latencies, bandwidths, CPU per message
cpu = CpuTimes.from_env_or_default()  # hxmpi's own CPU per call, as measured and shipped
if MPI.COMM_WORLD.rank == 0:
    for nodes, per_node in ((32, 8), (128, 8)):
        for block in (8, 4096):
            algorithm, radix, seconds = choose_call(model, "plan", nodes, per_node, block, cpu=cpu)
            # A plan's baselines: MPI's one-shot call and its own persistent MPI_Alltoallv_init.
            bare = predict_call(model, "flat", "bare", nodes, per_node, block)
            mpi_plan = predict_call(model, "flat", "bare_plan", nodes, per_node, block)
            print(f"{nodes} x {per_node}, {block} B blocks: plan {algorithm}"
                  f"{'/' + str(radix) if 'bruck' in algorithm else ''} {seconds * 1e6:.1f} us,"
                  f" bare MPI_Alltoallv {bare * 1e6:.1f} us, MPI_Alltoallv_init {mpi_plan * 1e6:.1f} us")
    print("projection ok")
