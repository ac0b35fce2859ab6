# The call table: ``CallTable``, one ``HierComm``'s compiled hit and miss paths (the module
# docstring), and its ``Slot``s, what recognises one cached pattern's specs and runs its bound run.
# Included last by ``_call.pyx``: it calls everything before it (``_memo.pxi``'s recognition,
# ``_record.pxi``'s agreement record, ``_spec.pxi``'s spec reader, ``Program``, ``Runner``,
# ``BruckOnce`` and ``_mpi.pxi``'s MPI calls).
from libc.stdint cimport int64_t, uint64_t, uintptr_t
from libc.string cimport memcmp, memcpy

cimport numpy as cnp


#: ``CallTable.call``'s results: not recognised (nothing communicated), agreed but not a clean hit
#: or a miss the compiled path does not run (``take_pending``), done, done as a miss whose pattern
#: the plan cache keeps (``last_flags``: its verdict).
NOT_FOUND, AGREED, DONE, KEEP = 0, 1, 2, 3

cdef enum:
    # How ``CallTable._miss`` runs an agreed miss.
    ROUTE_PYTHON = 0
    ROUTE_FLAT = 1
    ROUTE_HIER = 2
    ROUTE_BRUCK = 3



cdef class Slot:
    """What recognises one cached pattern's specs and runs its bound run (see the module docstring)."""
    cdef readonly Py_ssize_t no
    #: the cache entry, and the sides parsed from the specs
    cdef readonly object entry, s, r
    cdef tuple then
    cdef object algorithm, send_leaf, recv_leaf, send_dtype, recv_dtype
    #: the persistent run bound to the specs' buffers (or None), what it leaves, and it compiled
    cdef readonly object run, stats
    cdef readonly Program program
    #: a nonblocking request's compiled hit of this slot, made on first use (``nonblocking.py``)
    cdef public object request
    cdef long long scratch_generation, window_generation   # what the run was bound to
    cdef bint validate, uniform
    cdef void* send_data
    cdef void* recv_data
    cdef Py_ssize_t send_nbytes, recv_nbytes
    cdef Record record


cdef class CallTable:
    """The compiled hit path of one ``HierComm`` (see the module docstring).

    ``agreement``: its ``Agreement`` (the record and sums arrays, and the persistent Allreduce,
    Started here through ``agreement.handle``, or ``agreement.exchange()`` where the library has
    none); ``cache``: its ``PlanCache``; ``scratch`` and ``window``: what a bound run's buffers
    come from (their ``generation`` counts regrowths). ``tick`` and ``misses`` count agreed calls
    and agreed misses since the last hit; ``stats`` and ``state`` describe the last call.

    Once ``miss_path`` has configured it, a call that no slot recognises but whose specs have the
    common form (``_common_form``, ``_uniform_form``) is parsed, agreed and, where it runs flat,
    run here too (``MPI_Alltoallv`` on reused count arrays, or ``MPI_Alltoall``): a pattern the
    cache does not hold (a miss), or one a flat entry holds, on new buffers (a hit, rebound). Once
    ``hier_path`` and ``bruck_path`` have, misses and rebound hits that run hierarchically
    (``Runner``; a rebound hit runs its entry's kept program) or as flat Bruck (``BruckOnce``) run
    here as well.
    """
    cdef list _slots
    cdef object agreement, cache, scratch, window
    cdef cnp.ndarray _record, _sums
    cdef void* _agree_handle
    cdef uint64_t _size
    cdef char _status[STATUS_BYTES]
    cdef Slot _pending
    cdef int _pending_flags
    cdef object _pending_entry
    cdef public long long tick, misses
    #: calls this table finished itself (clean hits, from entry to return in compiled code)
    cdef readonly long long compiled
    #: misses this table parsed, agreed and ran itself (from entry to return in compiled code)
    cdef readonly long long compiled_misses
    #: hits on new buffers it parsed, agreed and ran itself (every entry off the large-count path), the same way
    cdef readonly long long compiled_rebound
    #: the verdict bits of the last ``KEEP`` call
    cdef readonly int last_flags
    #: what the last ``KEEP`` call leaves for its cache entry: its send and receive arrays, and for
    #: a hierarchical run the program it ran (the planner's own, until its next plan), else None;
    #: its sides are ``parsed``
    cdef readonly tuple kept
    cdef object _planned
    cdef public object stats, state
    # The miss path (``miss_path``): None until configured.
    cdef object _choices, _codes, _flat_codes, _predefined, _datatype_type, _limits, _miss_stats
    cdef long _auto_code
    cdef Py_ssize_t _me
    cdef uint64_t _key_a, _key_b, _byte, _comm
    cdef int64_t _kib_cap
    cdef cnp.ndarray _parsed, _ints, _lists, _stats_counts
    # Hierarchical misses (``hier_path``): None until configured.
    cdef Runner _runner
    cdef dict _hier_algorithms, _planners, _hier_stats
    cdef object _sides, _make_stats
    cdef int _mode
    cdef bint _shared
    cdef object _route_alg, _route_planner   # the hierarchical run a miss takes (``_route``)
    cdef long _route_radix, _leaders, _chunks
    cdef bint _route_both                    # its planner takes both sides of the node's counts
    cdef cnp.ndarray _both, _node_both       # this rank's send and receive counts; the node's
    # Bruck misses (``bruck_path``): None until configured.
    cdef object _bruck_codes, _bruck_stats, _bruck_once, _brucks
    cdef long _radix, _pick_radix
    cdef uint64_t _int64
    #: what every rank of this node receives from every rank (node size x world size, int64 bytes):
    #: the node ``Allgather`` of a hierarchical miss run here, what its plan was made from
    cdef readonly cnp.ndarray rc_node

    def __init__(self, agreement, cache, scratch, window, Py_ssize_t size):
        self._slots = []
        self.agreement, self.cache, self.scratch, self.window = agreement, cache, scratch, window
        self._record, self._sums = agreement.record, agreement.sums
        if self._record.dtype != np.uint64 or self._record.shape[0] * 8 != sizeof(Record) \
                or self._sums.dtype != np.uint64 or self._sums.shape[0] * 8 != sizeof(Record):
            raise ValueError("CallTable: the agreement's record and sums must be one Record of uint64 each")
        self._agree_handle = <void*><uintptr_t>agreement.handle
        self._size = <uint64_t>size
        self.tick = self.misses = self.compiled = self.compiled_misses = self.compiled_rebound = 0
        self.stats, self.state = None, "off"
        self._pending_flags, self._pending_entry = -1, None
        self._choices = None
        self._runner = None
        self._brucks = None

    def hier_path(self, dict algorithms, long radix, Runner runner, dict planners, int mode, bint shared,
                  make_stats, int64_type, long leaders=1, long chunks=1):
        """Let the miss path also run misses hierarchically (call after ``miss_path``): those of
        ``algorithms`` (algorithm code: ``Algorithm``, hierarchical ones, with Bruck lanes at
        radix ``radix``) and auto's picks of them: the node ``Allgather`` of the receive counts,
        the program of the algorithm's planner (``planners``, by ``Algorithm.planner``) for
        node phase ``mode`` (``shared``: its stage is the node window), run by ``runner``.
        ``make_stats(algorithm, radix, program)``: the ``ExchangeStats`` of such runs (made once
        per algorithm and radix, then kept); ``int64_type``: ``MPI.INT64_T``, the node
        ``Allgather``'s datatype (``HierComm._hier_plan``'s). Multi-leader: ``planners["leaders"]``
        maps the leaders per node to the planner (filled on first use), ``leaders`` an explicit call's
        count; its node ``Allgather`` carries the send and the receive counts. ``chunks``: an
        explicit call's pipelined node phase (linear lanes)."""
        if self._choices is None:
            return
        n = self._size
        self._hier_algorithms, self._radix, self._runner, self._planners = algorithms, radix, runner, planners
        self._mode, self._shared, self._make_stats, self._hier_stats = mode, shared, make_stats, {}
        self._int64 = <uint64_t>int64_type.handle
        self.rc_node = np.zeros((runner.node_peers.size, n), np.int64)
        self._leaders, self._chunks = leaders, chunks
        self._both = np.zeros(2 * n, np.int64)
        self._node_both = np.zeros((runner.node_peers.size, 2 * n), np.int64)
        self._sides = tuple(self._parsed[i * n:(i + 1) * n] for i in range(4))

    def bruck_path(self, frozenset codes, long radix, once, stats):
        """Let the miss path also run flat Bruck misses (call after ``miss_path``): those of
        ``codes`` at radix ``radix``, and auto's picks of "bruck" at theirs, through the
        ``BruckOnce`` that ``once(radix)`` gives (the runner's: one per radix, kept). ``stats``: the
        ``ExchangeStats`` such a run leaves (``flat_counts`` and ``radix`` overwritten by each)."""
        if self._choices is None or _mpi_isend == NULL or _mpi_mprobe == NULL or _mpi_imrecv == NULL \
                or _mpi_get_count == NULL:
            return
        self._bruck_codes, self._radix, self._bruck_once, self._bruck_stats = codes, radix, once, stats
        self._brucks = {}

    def miss_path(self, dict choices, dict codes, long auto_code, frozenset flat_codes, dict predefined,
                  datatype_type, limits, Py_ssize_t me, tuple key, int64_t kib_cap, comm, byte, stats):
        """Let the table run misses (see the class docstring). ``choices``: auto's picks by
        ("oneshot",) + pattern class, as ``HierComm._pick`` fills them; ``codes``: algorithm
        codes by name; ``auto_code``: auto's; ``flat_codes``: the codes that run flat whatever the
        pattern; ``predefined``: element bytes by datatype handle, ``datatype_type``: ``MPI.Datatype``;
        ``limits``: the module whose ``INT_LIMIT`` bounds a plain MPI call (``transfer``); ``me``,
        ``key``: this rank and the agreement's keys; ``kib_cap``: the record's KiB cap; ``comm``
        and ``byte``: the communicator and ``MPI.BYTE``; ``stats``: the ``ExchangeStats`` a miss
        run here leaves (its ``flat_counts``, int64 per rank, are overwritten by each one)."""
        cdef Py_ssize_t n = self._size
        if _handle_bytes == 0 or _mpi_alltoallv == NULL or _mpi_alltoall == NULL:
            return  # an MPI whose handles this module cannot pass: misses stay in Python
        self._choices, self._codes, self._auto_code, self._flat_codes = choices, codes, auto_code, flat_codes
        self._predefined, self._datatype_type, self._limits = predefined, datatype_type, limits
        self._me, self._key_a, self._key_b, self._kib_cap = me, key[0], key[1], kib_cap
        self._comm, self._byte = <uint64_t>comm.handle, <uint64_t>byte.handle
        self._parsed = np.zeros(4 * n, np.int64)   # send counts, displs; receive counts, displs (bytes)
        self._ints = np.zeros(4 * n, np.intc)      # the same, as MPI reads them
        self._lists = np.zeros(2 * n, np.int64)    # counts and displacements given as lists of ints
        self._miss_stats, self._stats_counts = stats, stats.flat_counts
        if self._stats_counts.dtype != np.int64 or self._stats_counts.shape[0] != n:
            raise ValueError("miss_path: stats.flat_counts must be int64, one per rank")

    cdef Slot _find(self, sendbuf, recvbuf, algorithm, validate, bint uniform):
        """The slot that recognises these specs, or None. The leaves must still hold the memory
        they held (an array resized in place has moved, and its parsed sides are stale)."""
        cdef Slot slot
        send, recv = _leaf(sendbuf), _leaf(recvbuf)
        for slot in self._slots:
            if slot.send_leaf is send and slot.recv_leaf is recv:
                if slot.uniform == uniform and slot.validate == bool(validate) \
                        and (slot.algorithm is algorithm or slot.algorithm == algorithm) \
                        and cnp.PyArray_DATA(<cnp.ndarray>send) == slot.send_data \
                        and cnp.PyArray_NBYTES(<cnp.ndarray>send) == slot.send_nbytes \
                        and cnp.PyArray_DATA(<cnp.ndarray>recv) == slot.recv_data \
                        and cnp.PyArray_NBYTES(<cnp.ndarray>recv) == slot.recv_nbytes \
                        and (<cnp.ndarray>send).dtype is slot.send_dtype \
                        and (<cnp.ndarray>recv).dtype is slot.recv_dtype \
                        and cnp.PyArray_ISWRITEABLE(<cnp.ndarray>recv) \
                        and _same_shape(sendbuf, slot.then[0]) and _same_shape(recvbuf, slot.then[1]):
                    return slot
                return None
        return None

    def request_slot(self, sendbuf, recvbuf, algorithm, validate, bint uniform):
        """The slot whose compiled run a nonblocking request of these specs may take whole (its
        specs recognised, its run bound to their buffers and compiled), or None."""
        cdef Slot slot = self._find(sendbuf, recvbuf, algorithm, validate, uniform)
        if slot is None or slot.program is None or not self._same_buffers(slot):
            return None
        return slot

    def ready(self, sendbuf, recvbuf, algorithm, validate):
        """Whether a clean hit of these specs would run a slot's bound run (``call``'s first case)."""
        cdef Slot slot = self._find(sendbuf, recvbuf, algorithm, validate, False)
        return slot is not None and self._same_buffers(slot)

    cdef bint _same_buffers(self, Slot slot):
        """Whether the slot's run is bound to its (recognised) buffers and the scratch of now."""
        return slot.run is not None and slot.scratch_generation == self.scratch.generation \
            and slot.window_generation == self._window_generation()

    cdef long long _window_generation(self):
        return self.window.generation if self.window is not None else 0

    def call(self, sendbuf, recvbuf, algorithm, validate, bint uniform, default_algorithm):
        """One call's compiled path: ``NOT_FOUND`` (not recognised nor of the form the miss path
        reads; nothing was communicated), ``AGREED`` (agreed, but not a clean hit nor a miss run
        here: ``take_pending``), ``DONE`` or ``KEEP``. ``default_algorithm``: the ``HierComm``'s,
        for ``algorithm`` None."""
        cdef Slot slot
        cdef Record* rec
        cdef int flags
        slot = self._find(sendbuf, recvbuf, algorithm, validate, uniform)
        if slot is not None and self._choices is not None and not self._same_buffers(slot):
            # No run bound to these buffers: the miss path runs the entry's plan on them (a hit,
            # rebound), or, the same buffers on every rank, leaves binding one to Python.
            slot = None
        if slot is None:
            if self._choices is None:
                return NOT_FOUND
            return self._miss(sendbuf, recvbuf, algorithm if algorithm is not None else default_algorithm,
                              bool(validate), uniform)
        rec = <Record*>cnp.PyArray_DATA(self._record)
        memcpy(rec, &slot.record, sizeof(Record))
        rec.same_buffers = self._same_buffers(slot)
        rec.over_budget = self.cache.held > self.cache.max_bytes
        flags = self._agree()
        if flags & _NOT_CLEAN or flags & _CLEAN != _CLEAN:
            self._pending, self._pending_flags, self._pending_entry = slot, flags, slot.entry
            return AGREED
        self.tick += 1
        self.misses = 0
        self.touch(slot.entry)
        if slot.program is not None:
            slot.program.execute()
        else:
            slot.run.run()
        self.stats, self.state = slot.stats, "hit"
        self.compiled += 1
        return DONE

    cdef int _agree(self) except -1:
        """Sum the records (the agreement's persistent Allreduce); the verdict bits."""
        cdef int err
        if self._agree_handle != NULL:
            with nogil:
                err = _start_wait(&self._agree_handle, 1, self._status)
            if err:
                raise MPI.Exception(err)
        else:
            self.agreement.exchange()
        return _verdict(<const Record*>cnp.PyArray_DATA(self._sums), self._size)

    cdef int _miss(self, sendbuf, recvbuf, algorithm, bint validate, bint uniform) except -1:
        """A call no slot recognises: parse, agree and run it here where its specs have the common
        form and it runs flat, as a miss or, on new buffers, as a hit of a flat cache entry
        (``call``'s results). ``uniform``: an ``Alltoall``, run as ``MPI_Alltoall``."""
        cdef Py_ssize_t n = self._size, i
        cdef int64_t* sc = <int64_t*>cnp.PyArray_DATA(self._parsed)
        cdef int64_t* sd = sc + n
        cdef int64_t* rc = sd + n
        cdef int64_t* rd = rc + n
        cdef int* ints = <int*>cnp.PyArray_DATA(self._ints)
        cdef int64_t elem, sent, received, sn, rn, limit, block = 0, rblock = 0
        cdef int64_t* lists
        cdef uint64_t h
        cdef long code
        cdef int flags, err, route
        cdef bint big
        cdef Record* rec = <Record*>cnp.PyArray_DATA(self._record)
        cdef cnp.ndarray sa, ra
        cdef Py_ssize_t slot_no = 0
        cdef bint same = False
        cdef int rebound = ROUTE_PYTHON
        entry = None
        got = self._codes.get(algorithm)
        if got is None:
            return NOT_FOUND
        code = got
        if code != self._auto_code and got not in self._flat_codes \
                and (self._runner is None or got not in self._hier_algorithms) \
                and (self._brucks is None or got not in self._bruck_codes):
            return NOT_FOUND
        if uniform:
            sa = _uniform_form(sendbuf, n, False, self._predefined, self._datatype_type, &block, &elem)
            ra = _uniform_form(recvbuf, n, True, self._predefined, self._datatype_type, &rblock, &elem)
            if sa is None or ra is None:
                return NOT_FOUND
            sn, rn = cnp.PyArray_NBYTES(sa), cnp.PyArray_NBYTES(ra)
            for i in range(n):  # the sides' bytes as the general reader gives them
                sc[i], sd[i], rc[i], rd[i] = block, i * block, rblock, i * rblock
            sent = n * block
        else:  # blocks out of order on the receive side too go to the general reader (overlap)
            lists = <int64_t*>cnp.PyArray_DATA(self._lists)
            sa = _read_vector(sendbuf, n, False, self._predefined, self._datatype_type, sc, sd, &elem, &sent, lists)
            ra = _read_vector(recvbuf, n, True, self._predefined, self._datatype_type, rc, rd, &elem, &received,
                              lists)
            if sa is None or ra is None:
                return NOT_FOUND
            sn, rn = cnp.PyArray_NBYTES(sa), cnp.PyArray_NBYTES(ra)
        if self.cache.max_entries:
            with nogil:
                h = _hash_array(_hash_array(_hash_array(_hash_array(PATTERN_SEED, sc, n), sd, n), rc, n), rd, n)
            entry = self.cache.index.get(<int64_t>(h >> 1))
            if entry is not None:  # cached here: on new buffers, its plan is run here too
                rebound = self._rebinds(entry, code, validate, uniform)
                if rebound == ROUTE_PYTHON:
                    return NOT_FOUND  # the general path looks it up
                slot_no = entry.slot
                same = self._bound_to(entry.bound, sa, ra)
        limit = self._limits.INT_LIMIT  # ``transfer.needs_big``, on this rank's numbers
        big = (sn if sn > rn else rn) > limit or sent > limit // n
        with nogil:
            _fill_record(rec, big, 2 * code + uniform, validate, 0, slot_no, same, False, self._kib_cap, sc, rc, n,
                         validate, self._me, self._key_a, self._key_b)
        rec.over_budget = self.cache.held > self.cache.max_bytes
        flags = self._agree()
        # On in Python: a failed verdict, the large-count path, eviction, a hit on the buffers its
        # entry was last used with (bound for good there), a miss anywhere of a rank's cached
        # pattern, and auto's first pick for a pattern class, or a pick other than flat, hier or bruck.
        route = rebound if slot_no else ROUTE_FLAT if flags & (_NOT_CLEAN | BIG) else self._route(code, uniform)
        if flags & (_NOT_CLEAN | BIG) or (flags & _CLEAN != HIT if slot_no else route == ROUTE_PYTHON):
            self._pending, self._pending_flags, self._pending_entry = None, flags, entry
            return AGREED
        if route == ROUTE_HIER and slot_no:  # the entry's program, kept (detached) with it
            self._run_program(entry.plan.words, sa, ra)
            self.stats = self._entry_stats(entry)
        elif route == ROUTE_HIER:
            self._run_hier(sa, ra)
            key = (self._route_alg.name, self._route_radix)
            self.stats = self._hier_stats.get(key)
            if self.stats is None:
                self.stats = self._hier_stats[key] = self._make_stats(self._route_alg, self._route_radix,
                                                                      self._planned)
        elif route == ROUTE_BRUCK:
            self._run_bruck(sa, ra)
            memcpy(cnp.PyArray_DATA(self._bruck_stats.flat_counts), sc, n * sizeof(int64_t))
            self._bruck_stats.radix = self._pick_radix
            self.stats = self._bruck_stats
        else:
            with nogil:
                # Counts and displacements below INT_LIMIT everywhere: the verdict has no BIG.
                if uniform:
                    err = _alltoall(cnp.PyArray_DATA(sa), <int>block, cnp.PyArray_DATA(ra), <int>rblock,
                                    self._byte, self._comm)
                else:
                    for i in range(4 * n):
                        ints[i] = <int>sc[i]
                    err = _alltoallv(cnp.PyArray_DATA(sa), ints, ints + n, cnp.PyArray_DATA(ra), ints + 2 * n,
                                     ints + 3 * n, self._byte, self._comm)
            if err:
                raise MPI.Exception(err)
            memcpy(cnp.PyArray_DATA(self._stats_counts), sc, n * sizeof(int64_t))
            self.stats = self._miss_stats
        self.tick += 1
        if slot_no:  # a hit on new buffers (``HierComm._run_entry``): its entry now names them
            self.misses = 0
            self.touch(entry)
            entry.bound = (<size_t>cnp.PyArray_DATA(sa), sn, <size_t>cnp.PyArray_DATA(ra), rn,
                           self.scratch.generation, self._window_generation())
            self.state = "hit-rebound"
            self.compiled_rebound += 1
            return DONE
        return self._missed(flags, sa, ra, route == ROUTE_HIER)

    @property
    def parsed(self):
        """The sides the last miss read here, bytes (int64: send counts, send displacements,
        receive counts, receive displacements, one per rank each; the next miss overwrites them)."""
        return self._parsed

    cpdef touch(self, entry):
        """Count a hit of cache ``entry`` at the agreed call ``tick``: it becomes the cache's most
        recently used (``PlanCache.entries`` is kept in order of use)."""
        entries = self.cache.entries
        entry.last_use = self.tick
        entries[entry.slot] = entries.pop(entry.slot)
        self.cache.hits += 1

    cdef int _missed(self, int flags, sa, ra, bint hier) except -1:
        """Count a miss run here on arrays ``sa`` and ``ra`` (``hier``: run hierarchically);
        ``KEEP`` where the cache keeps its pattern (``kept``), else ``DONE``."""
        self.state = "miss" if self.cache.max_entries else "off"
        self.compiled_misses += 1
        if self.count_miss() and self.cache.max_entries:
            self.last_flags = flags
            self.kept = (sa, ra, self._planned if hier else None)
            return KEEP
        return DONE

    cdef int _route(self, long code, bint uniform) except -1:
        """How an agreed clean miss of ``code`` runs: flat or hierarchical here, or in Python
        (auto's first pick for a pattern class, or a pick of another algorithm)."""
        if code == self._auto_code:
            pick = self._picked(uniform)
            return self._route_of(pick[0], pick[1]) if pick is not None else ROUTE_PYTHON
        if code in self._flat_codes:
            return ROUTE_FLAT
        if self._brucks is not None and code in self._bruck_codes:
            self._pick_radix = self._radix
            return ROUTE_BRUCK
        algorithm = self._hier_algorithms[code]
        return self._route_of(algorithm, self._leaders if algorithm.planner == "leaders" else
                              self._chunks if algorithm.rounds == ROUNDS_LINEAR else self._radix)

    cdef int _route_of(self, algorithm, long radix) except -1:
        """How a run of ``algorithm`` (an ``Algorithm``) at ``radix`` goes here (``ROUTE_PYTHON``:
        it does not), with the Bruck radix or the planner it takes."""
        cdef int rounds = algorithm.rounds
        planner = algorithm.planner
        if planner == "flat":
            if rounds == ROUNDS_LINEAR:
                return ROUTE_FLAT
            if rounds == ROUNDS_BRUCK and self._brucks is not None:
                self._pick_radix = radix
                return ROUTE_BRUCK
            return ROUTE_PYTHON
        if self._runner is not None and planner in self._planners:
            self._route_alg, self._route_planner = algorithm, self._planners[planner]
            self._route_both = planner == "leaders"
            if self._route_both:  # the planner of that many leaders (a dict: no Python frame on a hit)
                self._route_planner = self._route_planner[radix]
            # the setting its planner takes: a Bruck radix, leaders per node, or linear lanes' chunks
            self._route_radix = radix if rounds == ROUNDS_BRUCK or self._route_both or rounds == ROUNDS_LINEAR else 0
            return ROUTE_HIER
        return ROUTE_PYTHON

    cdef cnp.ndarray _scratch_of(self, str name, int64_t nbytes):
        """``scratch.get(name, nbytes)``, with no call where the buffer is already large enough."""
        buf = self.scratch.buffers.get(name)
        if buf is not None and cnp.PyArray_DIMS(<cnp.ndarray>buf)[0] >= nbytes:
            return <cnp.ndarray>buf
        return self.scratch.get(name, nbytes)

    cdef cnp.ndarray _window_of(self, int64_t nbytes):
        """``window.ensure(nbytes)``, with no call where the window is already large enough (every
        node rank sees the same window, so every one takes the same branch)."""
        view = self.window.view
        if self.window.win is not None and cnp.PyArray_DIMS(<cnp.ndarray>view)[0] >= nbytes:
            return <cnp.ndarray>view
        return self.window.ensure(nbytes)

    cdef object _entry_stats(self, entry):
        """What a run of hierarchical cache ``entry``'s program leaves (made once per entry)."""
        st = entry.stats
        if st is None:
            st = entry.stats = self._make_stats(entry.algorithm, entry.radix, entry.plan)
        return st

    cdef int _run_bruck(self, cnp.ndarray sa, cnp.ndarray ra) except -1:
        """A miss run as a flat Bruck exchange at radix ``_pick_radix`` (the sides are in ``_parsed``)."""
        cdef Py_ssize_t n = self._size
        cdef const int64_t* sc = <const int64_t*>cnp.PyArray_DATA(self._parsed)
        cdef BruckOnce once = self._brucks.get(self._pick_radix)
        if once is None:
            once = self._brucks[self._pick_radix] = self._bruck_once(self._pick_radix)
        return once.exchange(<const unsigned char*>cnp.PyArray_DATA(sa), cnp.PyArray_NBYTES(sa),
                             <unsigned char*>cnp.PyArray_DATA(ra), cnp.PyArray_NBYTES(ra), sc, sc + n, sc + 2 * n,
                             sc + 3 * n)

    cdef int _run_hier(self, cnp.ndarray sa, cnp.ndarray ra) except -1:
        """A miss run hierarchically: the node ``Allgather`` of the receive counts, the planner's
        program, then the runner (the sides are in ``_parsed``)."""
        cdef Py_ssize_t n = self._size
        cdef int64_t* sc = <int64_t*>cnp.PyArray_DATA(self._parsed)
        cdef int64_t* both = <int64_t*>cnp.PyArray_DATA(self._both)
        cdef int err
        cdef bint two = self._route_both
        with nogil:
            if two:  # multi-leader: the send counts, then the receive counts
                memcpy(both, sc, n * sizeof(int64_t))
                memcpy(both + n, sc + 2 * n, n * sizeof(int64_t))
                err = _allgather(both, <int>(2 * n), cnp.PyArray_DATA(self._node_both), self._int64,
                                 self._runner.node_peers.comm)
            else:
                err = _allgather(sc + 2 * n, <int>n, cnp.PyArray_DATA(self.rc_node), self._int64,
                                 self._runner.node_peers.comm)
        if err:
            raise MPI.Exception(err)
        self._planned = self._route_planner.plan(self._mode, *self._sides,
                                                 self._node_both if two else self.rc_node,
                                                 self._route_alg.rounds, self._route_radix)
        return self._run_program(self._planned.words, sa, ra)

    cdef int _run_program(self, cnp.ndarray words, cnp.ndarray sa, cnp.ndarray ra) except -1:
        """Run a program's ``words`` on the caller's arrays, with the scratch and stage it needs."""
        cdef Header* h = _header(<int64_t*>cnp.PyArray_DATA(words))
        a = self._scratch_of("a", h.scratch_bytes)
        buf = self._window_of(h.stage_bytes) if h.flags & STAGE_SHARED else self._scratch_of("b", h.stage_bytes)
        return self._runner.run_program(words, sa, ra, a, buf)

    cdef int _rebinds(self, entry, long code, bint validate, bint uniform) except -1:
        """How a call of these settings and of the parsed pattern runs cached ``entry`` here
        (``_route_of``), or ``ROUTE_PYTHON``: not here. It runs here when it has the same settings
        and pattern, is not on the large-count path, has no persistent run (one the general path
        must free first) and, if hierarchical, has its plan."""
        cdef Py_ssize_t n = self._size, i
        cdef const int64_t* mine = <const int64_t*>cnp.PyArray_DATA(self._parsed)
        cdef cnp.ndarray part
        settings, parts = entry.settings, entry.parts
        if entry.big or entry.run is not None or parts is None or settings != (code, validate, 0, uniform) \
                or (entry.algorithm.planner != "flat" and entry.plan is None):
            return ROUTE_PYTHON
        for i in range(4):
            part = <cnp.ndarray?>parts[i]
            if part.dtype != np.int64 or part.shape[0] != n or not cnp.PyArray_IS_C_CONTIGUOUS(part) \
                    or memcmp(cnp.PyArray_DATA(part), mine + i * n, n * sizeof(int64_t)) != 0:
                return ROUTE_PYTHON
        return self._route_of(entry.algorithm, entry.radix)

    cdef bint _bound_to(self, bound, cnp.ndarray sa, cnp.ndarray ra) except -1:
        """Whether ``bound`` (``HierComm._identity``) names these buffers and the scratch of now."""
        return bound is not None and bound == (<size_t>cnp.PyArray_DATA(sa), cnp.PyArray_NBYTES(sa),
                                               <size_t>cnp.PyArray_DATA(ra), cnp.PyArray_NBYTES(ra),
                                               self.scratch.generation, self._window_generation())

    cdef object _picked(self, bint uniform):
        """Auto's memoised pick, (algorithm, radix), for the agreed pattern's class, or None (none yet)."""
        cdef const Record* t = <const Record*>cnp.PyArray_DATA(self._sums)
        key = ("oneshot", <Py_ssize_t>self._size, uniform, _quarter_log2(<double>t.bytes),
               _quarter_log2(<double>t.messages), _quarter_log2(<double>t.recv_kib_sq),
               _quarter_log2(<double>t.pairwise))
        return self._choices.get(key)

    def count_miss(self):
        """Count an agreed miss; whether the cache keeps its pattern. A long run of misses (a new
        pattern every call) keeps only every 8th: the cache's bookkeeping is then nearly free.
        Misses are agreed, so every rank keeps the same ones."""
        self.misses += 1
        return self.misses <= 2 * self.cache.max_entries or self.misses % 8 == 0

    def take_pending(self):
        """(slot, verdict bits, entry) of the last ``AGREED`` call, once: the ``Slot`` that
        recognised its specs, or None for a call the miss path agreed, with the cache entry this
        rank agreed with (None: none); (None, -1, None) when nothing is pending."""
        slot, flags, entry = self._pending, self._pending_flags, self._pending_entry
        self._pending, self._pending_flags, self._pending_entry = None, -1, None
        return slot, flags, entry

    def remember(self, Py_ssize_t no, tuple then, entry, s, r, algorithm, bint validate, bint uniform,
                 run, Program program):
        """Recognise these specs as slot ``no`` from now on (replacing what that slot or these
        leaves had). ``then``: (send, receive) copies of the specs, count and displacement arrays
        as ``Saved`` (``exchange._spec_memo``); the agreement's record must still be this call's. ``run``: the persistent run bound to these
        buffers, or None; ``program``: that run compiled (``run.program()``), or None (then
        ``run.run()`` runs)."""
        cdef Slot slot = Slot.__new__(Slot)
        slot.no, slot.entry, slot.s, slot.r = no, entry, s, r
        slot.then = then
        slot.algorithm, slot.validate, slot.uniform = algorithm, validate, uniform
        slot.send_leaf, slot.recv_leaf = _leaf(slot.then[0]), _leaf(slot.then[1])
        for leaf in (slot.send_leaf, slot.recv_leaf):
            if type(leaf) is not np.ndarray:
                raise TypeError("remember: a spec's data buffer must be a numpy array")
        slot.send_data = cnp.PyArray_DATA(<cnp.ndarray>slot.send_leaf)
        slot.send_nbytes = cnp.PyArray_NBYTES(<cnp.ndarray>slot.send_leaf)
        slot.recv_data = cnp.PyArray_DATA(<cnp.ndarray>slot.recv_leaf)
        slot.recv_nbytes = cnp.PyArray_NBYTES(<cnp.ndarray>slot.recv_leaf)
        slot.send_dtype, slot.recv_dtype = slot.send_leaf.dtype, slot.recv_leaf.dtype
        memcpy(&slot.record, cnp.PyArray_DATA(self._record), sizeof(Record))
        slot.run, slot.stats = run, (run.stats if run is not None else None)
        slot.scratch_generation, slot.window_generation = self.scratch.generation, self._window_generation()
        slot.program = program if run is not None else None
        self._slots = [x for x in self._slots if (<Slot>x).no != no
                       and not ((<Slot>x).send_leaf is slot.send_leaf and (<Slot>x).recv_leaf is slot.recv_leaf)]
        self._slots.append(slot)

    def forget(self, Py_ssize_t no):
        """Stop recognising slot ``no`` (its entry was dropped or its run freed)."""
        self._slots = [x for x in self._slots if (<Slot>x).no != no]

    def clear(self):
        """Forget every slot."""
        self._slots = []
        self._pending, self._pending_flags, self._pending_entry = None, -1, None
