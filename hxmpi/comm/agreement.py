"""The agreement of a one-shot call: one Allreduce of ``WORDS`` uint64, O(log P) at any P.

Before any data moves, every rank must learn the same verdict: is any rank's input bad, do the
per-call settings match, does any count need the large-count path, do senders and receivers agree on
every pair of counts, and may every rank run a cached plan. One ``MPI_Allreduce(SUM)`` of a fixed
record settles all of it::

  flags         number of ranks with a bad spec (then a second, diagnostic pass names them), plus
                2**32 times the number of ranks whose counts or displacements may pass a C int in
                some phase (the large-count path)
  validate      ranks that validate: the same everywhere exactly when the sum is 0 or P
  setting, its square   for the algorithm code, the row kind (``alltoallv``) and the cache slot:
                all ranks passed the same value exactly when P * sum(x^2) == sum(x)^2
  same_buffers  ranks whose cached run is still bound to this call's buffers
  over_budget   ranks whose plan cache holds more than its byte budget
  pattern       what ``algorithm="auto"`` prices (``costmodel.Pattern``): send bytes; the squares
                of each rank's receive KiB (the skew); non-empty blocks to other ranks; and each
                rank's pairwise term, sum over k of max(bytes to rank + k, bytes from rank - k)
  fingerprint   two lanes of a keyed hash of (source, destination, bytes), added by the sender and
                subtracted by the receiver (``csrc/_agree.pyx``): zero exactly when every pair
                agrees, up to a 2**-128 collision

Sums of uint64 wrap mod 2**64, as the fingerprint needs. The diagnostic pass (``Diagnosis``) runs
only after a failed verdict, and every rank takes it alike: one gather of a fixed-size row per rank
(its problem, settings and counts), blocking for a blocking call, nonblocking for a request, from
which every rank composes the same error.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
from mpi4py import MPI

from ..errors import ExchangeError, ExchangeKeyError, ExchangeTypeError, agreed_error, gathered_error
from ._agree import WORDS, Verdict, Word, fill_record, verdict
from .costmodel import AGREEMENT_BYTES, KIB_CAP, Pattern
from .plan import ALGORITHM_CHOICES

__all__ = ["Agreed", "Agreement", "Diagnosis"]

# The record's layout, names and indices, is ``Word`` of ``csrc/_agree.pyx`` (its one definition).
if WORDS * 8 != AGREEMENT_BYTES:
    raise ImportError(f"costmodel.AGREEMENT_BYTES ({AGREEMENT_BYTES}) is not the record's {WORDS} words")
# Verdict bits as plain ints: read on every call's path.
_FAILED = int(Verdict.PROBLEM | Verdict.SETTINGS | Verdict.PAIRS)
_PROBLEM, _SETTINGS, _HIT, _BIG = int(Verdict.PROBLEM), int(Verdict.SETTINGS), int(Verdict.HIT), int(Verdict.BIG)
_SAME_BUFFERS, _OVER_BUDGET = int(Verdict.ALL_SAME_BUFFERS), int(Verdict.ANY_OVER_BUDGET)


class Agreed:
    """What every rank of the call agreed on (identical on every rank), read from the summed record.

    ``big``: the large-count path (Alltoallw) for every phase; ``slot``: the cache slot every rank
    hit, 0 where any rank missed; ``same_buffers``: every rank's cached run is bound to this call's
    buffers; ``over_budget``: some rank's cache is over its byte budget (evict one entry);
    ``total_bytes``: bytes sent, summed over every rank; ``recv_kib_sq``: sum over ranks of
    (receive KiB)^2, each capped; ``messages``: non-empty blocks to other ranks, summed;
    ``pairwise_bytes``: the sum of every rank's pairwise term (see the module docstring).
    ``sums``: the summed record (16 ints); an ``Agreement``'s is reused, so read it before the
    next agreement.
    """
    __slots__ = ("flags", "slot", "sums")

    def __init__(self, flags: int, slot: int, sums):
        self.flags, self.slot, self.sums = flags, slot, sums

    big = property(lambda self: bool(self.flags & _BIG))
    same_buffers = property(lambda self: bool(self.flags & _SAME_BUFFERS))
    over_budget = property(lambda self: bool(self.flags & _OVER_BUDGET))
    total_bytes = property(lambda self: int(self.sums[Word.BYTES]))
    recv_kib_sq = property(lambda self: int(self.sums[Word.RECV_KIB_SQ]))
    messages = property(lambda self: int(self.sums[Word.MESSAGES]))
    pairwise_bytes = property(lambda self: int(self.sums[Word.PAIRWISE]))

    def mean_block(self, size: int) -> int:
        """Mean block of the call in bytes (total bytes / P^2)."""
        return self.total_bytes // max(size * size, 1)

    def pattern(self, size: int, uniform: bool) -> Pattern:
        """The call's count pattern as the cost model sees it (``uniform``: an ``Alltoall``)."""
        return Pattern(size, float(self.total_bytes), float(self.messages), float(self.recv_kib_sq),
                       uniform, float(self.pairwise_bytes))


def _same(total: int, squares: int, size: int) -> bool:
    return size * squares == total * total


class Agreement:
    """The reused record and key of one communicator's agreements.

    ``key``: two 64-bit hash keys, the same on every rank (agreed when the ``HierComm`` is built).
    """

    def __init__(self, comm: MPI.Intracomm, key: tuple[int, int]):
        self.comm, self.key = comm, key
        #: this rank's record and the summed one, reused (the persistent Allreduce is bound to them)
        self.record = np.zeros(WORDS, dtype=np.uint64)
        self.sums = np.zeros(WORDS, dtype=np.uint64)
        # An MPI-4 persistent Allreduce where the library has one (bound once to the record): Open MPI
        # starts a bound collective faster than it runs a blocking one. Collective, as construction is.
        try:
            self._request = comm.Allreduce_init(self.record, self.sums, op=MPI.SUM)
        except (NotImplementedError, AttributeError):
            self._request = None
        self._pending: Optional[MPI.Request] = None  # the sum ``start`` started

    @property
    def request(self) -> Optional[MPI.Prequest]:
        """The persistent Allreduce (MPI-4 ``Allreduce_init``, bound to ``record`` and ``sums``), or None."""
        return self._request

    @property
    def handle(self) -> int:
        """Address of the persistent Allreduce's MPI handle (what compiled code Starts), or 0 without one."""
        return MPI._addressof(self._request) if self._request is not None else 0

    def free(self) -> None:
        """Release the persistent Allreduce."""
        if self._request is not None:
            self._request.Free()
            self._request = None

    def exchange(self) -> None:
        """Sum every rank's ``record`` into ``sums`` (one Allreduce; collective)."""
        if self._request is not None:
            self._request.Start()
            self._request.Wait()
        else:
            self.comm.Allreduce(self.record, self.sums, op=MPI.SUM)

    def start(self) -> None:
        """Start summing the records, nonblocking (complete it with ``test``); one at a time."""
        if self._request is not None:
            self._request.Start()
            self._pending = self._request
        else:
            self._pending = self.comm.Iallreduce(self.record, self.sums, op=MPI.SUM)

    def test(self) -> bool:
        """Whether the sum ``start`` started has completed (``sums`` then holds it)."""
        return self._pending.Test()

    def fill(self, problem: Optional[str], call_code: int, validate: bool, kind: int, slot: int,
             same_buffers: bool, over_budget: bool, big: bool, sent: Optional[np.ndarray] = None,
             expected: Optional[np.ndarray] = None, fingerprint: bool = True) -> None:
        """Write this rank's record of one call, for ``exchange`` (blocking) or ``start`` (nonblocking).

        ``call_code``: 2 * the algorithm's code + 1 for an Alltoall (0 for an Alltoallv), so that
        both must match; ``kind``: a 20-bit code of the row kind (``alltoallv``), else 0; ``slot``:
        this rank's cached slot for the call, 0 if none; ``same_buffers``: its cached run is bound to
        the call's buffers; ``over_budget``: its plan cache is over its byte budget; ``big``: it
        needs the large-count path; ``sent``/``expected``: this rank's int64 send and receive byte
        counts (None only with a ``problem``); ``fingerprint``: check every pair of them (not with
        ``validate=False``; counts learned from their senders are still checked, which names a row
        size that differs between ranks)."""
        fill_record(self.record, bool(problem), big, call_code, validate, kind, slot, same_buffers, over_budget,
                    KIB_CAP, sent, expected, fingerprint, self.comm.rank, self.key[0], self.key[1])

    def verdict(self) -> int:
        """The verdict bits of the summed record (``_agree.Verdict``)."""
        return verdict(self.sums, self.comm.size)

    def conclude(self, flags: int, problem: Optional[str], call_code: int, validate: bool, kind_text: str,
                 sent: Optional[np.ndarray], expected: Optional[np.ndarray], slot: int) -> Agreed:
        """The ``Agreed`` of verdict bits ``flags`` (of ``sums``), or, after a failed verdict, the
        diagnostic pass's ``ExchangeError`` on every rank (blocking; arguments as ``fill``'s, and
        ``kind_text``, the row kind as the error names it)."""
        if flags & _FAILED:
            diagnosis = Diagnosis(self.comm, flags, self.sums, problem, call_code, validate, kind_text, sent,
                                  expected)
            diagnosis.gather()
            raise diagnosis.error()
        return self.agreed(flags, slot)

    def agreed(self, flags: int, slot: int) -> Agreed:
        """What verdict bits ``flags`` (of a verdict that did not fail) agree on, ``slot`` being this
        rank's cached slot."""
        return Agreed(flags, slot if flags & _HIT else 0, self.sums)

    @staticmethod
    def failed(flags: int) -> bool:
        """Whether verdict bits ``flags`` call for the diagnostic pass."""
        return bool(flags & _FAILED)


# The diagnostic row of one rank: fixed-size text fields, then the send and expected counts.
_PROBLEM_BYTES, _KIND_BYTES = 1000, 200
_HEAD = 6  # int64 words: problem bytes, error kind, call code, validate, kind text bytes, has counts
_TEXT_AT = 8 * _HEAD
_KIND_AT = _TEXT_AT + _PROBLEM_BYTES
_COUNTS_AT = _KIND_AT + _KIND_BYTES  # a multiple of 8
#: the error kinds a problem may name (``msgspec.Problem.error``), by their index in a row
_ERRORS = (ExchangeError, ExchangeTypeError, ExchangeKeyError)


def _kind_index(problem) -> int:
    kind = getattr(problem, "error", ExchangeError)
    return _ERRORS.index(kind) if kind in _ERRORS else 0


class Diagnosis:
    """The diagnostic pass of a failed verdict (``flags``, of the summed record ``sums``): every
    rank's row (its problem, the call's settings, its send and expected byte counts) gathered, the
    same ``ExchangeError`` composed from them on every rank (``error``). ``gather`` is one
    blocking Allgather; ``start`` an ``Iallgather`` (a request's), whose request it returns."""

    def __init__(self, comm: MPI.Intracomm, flags: int, sums: np.ndarray, problem: Optional[str], call_code: int,
                 validate: bool, kind_text: str, sent: Optional[np.ndarray], expected: Optional[np.ndarray]):
        size = comm.size
        self.comm, self.flags, self.sums = comm, flags, sums.copy()
        self.row = np.zeros(_COUNTS_AT + 16 * size, dtype=np.uint8)
        head = self.row[:_TEXT_AT].view(np.int64)
        text = (problem or "").encode()[:_PROBLEM_BYTES]
        kind = kind_text.encode()[:_KIND_BYTES]
        head[:] = (len(text), _kind_index(problem) if problem else 0, call_code, bool(validate), len(kind),
                   sent is not None and expected is not None)
        self.row[_TEXT_AT:_TEXT_AT + len(text)] = np.frombuffer(text, np.uint8)
        self.row[_KIND_AT:_KIND_AT + len(kind)] = np.frombuffer(kind, np.uint8)
        if head[5]:
            counts = self.row[_COUNTS_AT:].view(np.int64)
            counts[:size], counts[size:] = sent, expected
        self.table = np.empty((size, self.row.shape[0]), dtype=np.uint8)

    def gather(self) -> None:
        """Gather every rank's row (collective, blocking)."""
        self.comm.Allgather(self.row, self.table)

    def start(self) -> MPI.Request:
        """Gather every rank's row, nonblocking: the request to complete."""
        return self.comm.Iallgather(self.row, self.table)

    def error(self) -> ExchangeError:
        """The error every rank raises, from the gathered rows."""
        size = self.comm.size
        heads = self.table[:, :_TEXT_AT].copy().view(np.int64)
        if self.flags & _PROBLEM:
            problems = []
            for r in range(size):
                n = int(heads[r, 0])
                text = bytes(self.table[r, _TEXT_AT:_TEXT_AT + n]).decode(errors="replace") if n else None
                problems.append(_Named(text, _ERRORS[int(heads[r, 1])]) if text else None)
            return gathered_error(problems, ExchangeError)
        if self.flags & _SETTINGS:
            return self._settings_error(heads)
        counts = self.table[:, _COUNTS_AT:].copy().view(np.int64)
        return _pair_mismatch(counts[:, :size], counts[:, size:])

    def _settings_error(self, heads: np.ndarray) -> ExchangeError:
        """Name the differing settings, the same text on every rank."""
        t, size = self.sums.tolist(), self.comm.size
        bad = [name for name, x, sq in (("algorithm", Word.ALGO, Word.ALGO_SQ), ("row kind", Word.KIND, Word.KIND_SQ))
               if not _same(t[x], t[sq], size)]
        if t[Word.VALIDATE] not in (0, size):
            bad.append("validate")
        views = [(int(heads[r, 2]), bool(heads[r, 3]),
                  bytes(self.table[r, _KIND_AT:_KIND_AT + int(heads[r, 4])]).decode(errors="replace"))
                 for r in range(size)]
        parts = []
        if "algorithm" in bad:  # the code is 2 * algorithm + (1 for Alltoall, 0 for Alltoallv)
            algos = {a // 2 for a, _, _ in views}
            if len(algos) > 1:
                names = sorted({repr(ALGORITHM_CHOICES[a]) if 0 <= a < len(ALGORITHM_CHOICES) else "an unknown name"
                                for a in algos})
                parts.append("algorithm differs between ranks (" + ", ".join(names) + ")")
            else:
                odd = next(r for r, v in enumerate(views) if v[0] != views[0][0])
                kinds = ("Alltoallv", "Alltoall")
                parts.append(f"rank {odd} calls {kinds[views[odd][0] % 2]} but rank 0 calls "
                             f"{kinds[views[0][0] % 2]} (every rank must make the same call)")
        if "validate" in bad:
            parts.append("validate differs between ranks")
        if "row kind" in bad and not parts:
            odd = next(r for r, v in enumerate(views) if v[2] != views[0][2])
            parts.append(f"rank {odd} sends {views[odd][2]} but rank 0 sends {views[0][2]} "
                         f"(dtype and row shape must match on every rank)")
        return agreed_error(ExchangeError("; ".join(parts)))


class _Named(str):
    """A gathered problem text with the error kind its rank named (as ``msgspec.Problem``)."""

    def __new__(cls, text: str, error: type):
        obj = super().__new__(cls, text)
        obj.error = error
        return obj


def _pair_mismatch(sent: np.ndarray, expected: np.ndarray) -> ExchangeError:
    """The error naming the pairs whose counts disagree (``sent[a, b]``: bytes rank a sends rank b;
    ``expected[b, a]``: bytes rank b expects from rank a)."""
    src, dst = np.nonzero(sent != expected.T)
    parts = [f"rank {int(a)} sends {int(sent[a, b])} B to rank {int(b)}, which expects "
             f"{int(expected[b, a])} B" for a, b in zip(src[:3], dst[:3])]
    return agreed_error(ExchangeError("; ".join(parts) + (f" (+{src.size - 3} more pairs)" if src.size > 3 else "")))
