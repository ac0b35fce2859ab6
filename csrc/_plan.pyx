"""The planners: every byte offset of one call, in one compiled pass, written as a step program.

A rank's program (``csrc/_steps.pxi``; what it is and who runs it: ``hxmpi/comm/plan.py``) is a
list of steps over four buffers (send, receive, scratch, stage): copy lists (source offset,
destination offset, length; int64 bytes), exchanges on one communicator with their per-peer
counts and displacements, and node barriers. ``HierPlanner`` makes the hierarchical one from the
static layout (who serves which lane, see ``hxmpi/comm/plan.py``), the rank's own send/receive
counts and displacements, and ``rc_node``: what every rank of its node receives from every source.
Nothing here allocates per call: a planner's program is one array it owns, overwritten by each
``plan`` call (``StepProgram.detach`` copies it).

Node phases:
  MODE_SHM  phase 1 receives into a node-shared window; after a node barrier each rank copies its
            blocks straight out of the window (no repack, no intra-node messages, no unpack).
  MODE_MPI  phase 1 receives into a private buffer; repack by destination local rank; phase 2 is an
            Alltoallv on the node; unpack.
"""
from libc.stdint cimport int64_t
from libc.string cimport memcpy, memset

from enum import IntEnum

cimport numpy as cnp
import numpy as np

cnp.import_array()

include "_steps.pxi"

cdef enum:
    _SHM = 0
    _MPI = 1

MODE_SHM = _SHM
MODE_MPI = _MPI

# Python's names of a program's words, in the structs' field order (a struct converts to a dict of
# its fields in declaration order), so that the layout is written once.
cdef Header _header_layout
cdef Row _row_layout
memset(&_header_layout, 0, sizeof(Header))
memset(&_row_layout, 0, sizeof(Row))
#: Index of each header word by name (``HeaderWord.ROWS``...).
HeaderWord = IntEnum("HeaderWord", [(name.upper(), i) for i, name in enumerate(<dict>_header_layout)],
                     module=__name__)
#: Index of each word of a row by name (``RowWord.KIND``...), from the row's start.
RowWord = IntEnum("RowWord", [(name.upper(), i) for i, name in enumerate(<dict>_row_layout)], module=__name__)
#: Words of the header, and of one row.
HEADER_SIZE, ROW_SIZE = <Py_ssize_t>HEADER_WORDS, <Py_ssize_t>ROW_WORDS
if len(HeaderWord) != HEADER_SIZE or len(RowWord) != ROW_SIZE:
    raise ImportError("a step program's header and rows must be int64 words only")


cdef int64_t _EMPTY = 0  # what an empty array's pointer stands for


cdef const int64_t* _vector(cnp.ndarray a, int64_t n, str name) except NULL:
    """The data of a contiguous int64 array of ``n`` items; ValueError naming ``name`` otherwise."""
    if a is None or cnp.PyArray_TYPE(a) != cnp.NPY_INT64 or not cnp.PyArray_IS_C_CONTIGUOUS(a) \
            or cnp.PyArray_SIZE(a) != n:
        raise ValueError(f"HierPlanner.plan: {name} must be a contiguous int64 array of {n} items (the layout's)")
    return <const int64_t*>cnp.PyArray_DATA(a) if n else <const int64_t*>&_EMPTY


# One include per job (each file's header says what it holds).
include "_step_program.pxi"    # writing a program: its rows and pool, StepProgram, flat_program
include "_hier_planner.pxi"    # the hierarchical planner: HierPlanner
include "_leader_planner.pxi"  # the multi-leader planner: LeaderPlanner
