"""The compiled hit path of a one-shot call: recognise the specs, agree, run the bound run.

A ``CallTable`` belongs to one ``HierComm``. It keeps, for each plan-cache slot whose specs were
seen again, a ``Slot``: what recognises those specs (their structure, data buffers and datatypes
by identity, count and displacement arrays by content, the buffers' dtypes, writability and
data addresses), the
rank's agreement record for them, and the persistent run bound to their buffers. A call whose
specs a slot recognises then runs from ``HierComm.Alltoallv``'s entry to its return here: fill
the record from the slot's, Start and Wait the agreement's persistent Allreduce, read the
verdict, and Start and Wait the run's persistent requests, with no Python frame between the MPI
calls and without the GIL while MPI works. Every other call, and a recognised call whose verdict
is not a clean hit, goes on in Python (``HierComm._general``), which also fills and empties the
table.

Misses of the common spec form (``CallTable.miss_path``) are parsed, agreed and run here too: flat
(``MPI_Alltoallv``/``MPI_Alltoall``), flat Bruck (``BruckOnce``), or hierarchical on plain,
pairwise or Bruck lanes (the node ``MPI_Allgather``, the planner's step program, and ``Runner``,
which runs any step program: one C loop over its steps). So are hits of a cached pattern on new
buffers, which run the entry's kept program.

MPI is reached through ``MPI_Start`` and ``MPI_Wait`` pointers that ``dlsym`` finds through the
mpi4py extension that is loaded (``docs/performance/exchange.md``, "Reaching MPI from compiled
code"): both take request handles by pointer, alike in every MPI family, so this module needs no
MPI header. Every request is built by mpi4py; a handle is passed by its address
(``MPI._addressof``). Statuses go to a scratch buffer: ``MPI_STATUS_IGNORE`` differs by family.
"""
cimport numpy as cnp
import numpy as np
from mpi4py import MPI

cnp.import_array()

# One include per job, in the order their C declarations need (each file's header says what it holds).
include "_record.pxi"      # the agreement record, its verdict and the pattern key's hash
include "_copy.pxi"        # copy lists: the one bounds check and the one copy loop
include "_spec.pxi"        # reading one side of a vector spec
include "_steps.pxi"       # a step program's layout
include "_mpi.pxi"         # MPI through dlsym: the symbols, and thin C wrappers of the calls
include "_memo.pxi"        # spec memos: Saved, SavedType, spec_unchanged, TypedCall, find_typed
include "_program.pxi"     # the request state machine: Program
include "_bruck_once.pxi"  # a Bruck exchange's first run, compiled: BruckOnce
include "_runner.pxi"      # the compiled runner of step programs: Runner
include "_calltable.pxi"   # the call table: Slot, CallTable
include "_persistent.pxi"  # a persistent request's Start and Wait: Persisted
include "_hit_request.pxi" # a nonblocking call's compiled hit: HitLane, HitRequest
