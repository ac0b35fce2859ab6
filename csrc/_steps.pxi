# A step program's layout: its one definition. Included by ``_plan.pyx`` (the planners, which write
# programs) and ``_call.pyx`` (the compiled runner, which executes them); ``hxmpi/comm/plan.py``
# reads programs through the names made from it (``RowWord``, ``HeaderWord``). What a program is
# and how each runner and the simulator use it: ``hxmpi/comm/plan.py``'s docstring.
#
# A program is one int64 array: a header, then its rows (one per step), then a pool of int64
# vectors that the rows name by offset (block lists and per-peer counts, all in bytes).
from libc.stdint cimport int64_t


cpdef enum StepKind:
    STEP_COPY = 0        # copy a list of blocks from one buffer to another
    STEP_EXCHANGE = 1    # an all-to-all on one communicator (its messages: ``Rounds``)
    STEP_BARRIER = 2     # the node window's barrier (memory fences around a node barrier)
    STEP_WAIT = 3        # wait for the exchanges in flight (those started with ``IN_FLIGHT``)


cpdef enum Buffer:
    # The buffers a program names: the caller's two, and two of hxmpi's scratch.
    BUF_SEND = 0
    BUF_RECV = 1
    BUF_SCRATCH = 2      # private: pack, and what the node phase sends
    BUF_STAGE = 3        # what the lanes receive into: the node window (``STAGE_SHARED``) or private


cpdef enum Comm:
    # An exchange's communicator; lanes are numbered 0, 1, ... (``Topology.served_lanes``).
    COMM_WORLD = -2
    COMM_NODE = -1


cpdef enum Rounds:
    # How an exchange's messages go.
    ROUNDS_LINEAR = 0    # one MPI all-to-all (every message posted at once)
    ROUNDS_PAIRWISE = 1  # size - 1 rounds: send to rank + k, receive from rank - k, wait
    ROUNDS_BRUCK = 2     # radix-k Bruck rounds (``hxmpi.comm.bruck``)


cpdef enum StepFlag:
    WITH_NEXT = 1        # posted with the next exchange (all started, then all waited for)
    BLOCKING = 2         # run whole as one blocking MPI call (else nonblocking, then waited for)
    UNIFORM = 4          # equal blocks back to back: MPI_Alltoall
    IN_FLIGHT = 8        # on a group's last exchange: started, and left in flight while the rows
                         # after it run, up to the next STEP_WAIT (one group in flight at a time;
                         # linear exchanges only): the wire beside the copies


cpdef enum Copied:
    # What a copy step is, for the simulator's and the tests' accounts.
    COPY_PACK = 0        # this rank's blocks for other nodes, grouped by node
    COPY_SELF = 1        # this rank's block for itself
    COPY_OWN = 2         # this rank's blocks for its node's other ranks
    COPY_OUT = 3         # received blocks to the receive buffer
    COPY_REPACK = 4      # received blocks regrouped for the node phase
    COPY_UNPACK = 5      # the node phase's blocks to the receive buffer


cpdef enum HeaderFlag:
    STAGE_SHARED = 1     # the stage buffer is the node's shared window


cdef struct Header:
    int64_t rows             # steps
    int64_t pool             # where the pool starts (words from the array's start)
    int64_t words            # words in use
    int64_t scratch_bytes    # the scratch buffer the program needs
    int64_t stage_bytes      # the stage buffer it needs (the whole node's window when shared)
    int64_t copied           # bytes its copy steps move
    int64_t flags            # ``HeaderFlag``


cdef struct Row:
    int64_t kind             # ``StepKind``
    int64_t what             # copy: ``Copied``
    int64_t src              # the buffer read (``Buffer``)
    int64_t dst              # the buffer written
    int64_t n                # copy: blocks; exchange: the communicator's size
    int64_t comm             # exchange: ``Comm`` or a lane number
    int64_t rounds           # exchange: ``Rounds``
    int64_t radix            # exchange: the Bruck radix (``ROUNDS_BRUCK``)
    int64_t flags            # exchange: ``StepFlag``
    int64_t v0               # pool offsets of n words each: a copy's source offsets, destination
    int64_t v1               # offsets and lengths; an exchange's send counts, send displacements,
    int64_t v2               # receive counts and receive displacements
    int64_t v3


cdef enum:
    # Words of each: checked against the structs at import (``_plan.pyx``, ``_call.pyx``).
    HEADER_WORDS = 7
    ROW_WORDS = 13


cdef inline Header* _header(int64_t* words) noexcept nogil:
    return <Header*>words


cdef inline Row* _rows(int64_t* words) noexcept nogil:
    return <Row*>(words + HEADER_WORDS)
