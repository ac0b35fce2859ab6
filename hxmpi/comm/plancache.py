"""The agreed plan cache behind one-shot calls: a repeated count pattern runs its cached plan.

A cache entry holds what a call decided and planned for one count pattern (algorithm, large-count
path, the hierarchical plan) and, once the same buffers come back, a persistent run bound to them.
Each rank looks its own pattern up locally; the call's agreement (``hxmpi/comm/agreement.py``) then says
whether every rank found the same slot. Slots are numbered 1..``max_entries`` and filled, used and
evicted only at agreed points, from agreed numbers (the call counter, the slot), so every rank's
cache holds the same slots at every call and a hit on one slot everywhere means the whole world's
pattern is the one that slot was made for.

Bounds: ``max_entries`` entries, and ``max_bytes`` per rank of plan arrays plus the buffers its
persistent runs keep alive (bytes). A rank over its byte budget says so in the next agreement, and
every rank then evicts its least recently used entry.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ._agree import pattern_key, same_arrays

__all__ = ["CacheEntry", "PlanCache"]

DEFAULT_ENTRIES = 16
DEFAULT_BYTES = 256 << 20


@dataclass(eq=False)
class CacheEntry:
    """One cached count pattern of one rank."""
    slot: int                  # 1..max_entries, the same on every rank for the same agreed call
    parts: Optional[tuple]     # this rank's int64 arrays of the pattern; None: not findable here
    settings: tuple            # (algorithm code, validate, row kind, uniform)
    algorithm: Any             # the ``plan.Algorithm`` that runs, as agreed when it was made
    big: bool                  # large-count path, as agreed
    plan: Any = None           # the step program (``plan.StepProgram``) of a hierarchical algorithm, else None
    run: Any = None            # persistent run bound to ``bound``, or None
    bound: Optional[tuple] = None  # buffer identity the last call used (execute + exchange decide)
    last_use: int = 0          # agreed call counter
    key: int = 0
    pinned: int = 0            # bytes of caller buffers the persistent run keeps alive
    radix: int = 2             # the Bruck radix ("bruck", "hier_bruck"), as agreed
    stats: Any = None          # what a compiled run of ``plan`` on new buffers leaves (made at its first)

    @property
    def nbytes(self) -> int:
        """Bytes this entry holds on this rank."""
        return (self.plan.nbytes if self.plan is not None else 0) + self.pinned


@dataclass
class PlanCache:
    """The cache of one ``HierComm`` (see the module docstring); ``hits``/``misses`` count calls."""
    max_entries: int = DEFAULT_ENTRIES
    max_bytes: int = DEFAULT_BYTES
    entries: dict = field(default_factory=dict)   # slot -> CacheEntry, least recently used first
    index: dict = field(default_factory=dict)     # pattern key -> CacheEntry
    hits: int = 0
    misses: int = 0
    #: bytes the entries hold on this rank (plan arrays and pinned buffers)
    held: int = 0
    #: called with the slot of every dropped entry (the compiled hit path forgets it)
    on_drop: Optional[Callable[[int], Any]] = None

    def lookup(self, parts: tuple, settings: tuple) -> tuple[Optional[CacheEntry], int]:
        """This rank's entry for ``parts`` (int64 arrays) and ``settings``, or None; and the key."""
        key = pattern_key(parts)
        entry = self.index.get(key)
        if entry is not None and entry.settings == settings and same_arrays(entry.parts, parts):
            return entry, key
        return None, key

    @property
    def over_budget(self) -> bool:
        """Whether this rank holds more than ``max_bytes``."""
        return self.held > self.max_bytes

    def pin(self, entry: CacheEntry, nbytes: int) -> None:
        """Record that ``entry``'s persistent run keeps ``nbytes`` of caller buffers alive (0: none)."""
        self.held += nbytes - entry.pinned
        entry.pinned = nbytes

    def insert(self, entry: CacheEntry, tick: int) -> CacheEntry:
        """Put a new entry in the next slot (collective by construction: call on every rank at the
        same agreed miss). Evicts the least recently used entry when full."""
        self.misses += 1
        if self.max_entries <= 0:
            return entry
        if len(self.entries) < self.max_entries:
            free = next(s for s in range(1, self.max_entries + 1) if s not in self.entries)
        else:
            free = self._lru().slot
            self._drop(free)
        entry.slot, entry.last_use = free, tick
        self.entries[free] = entry
        if entry.parts is not None:
            old = self.index.get(entry.key)
            if old is not None and old is not entry:
                old.parts = None  # still holds its slot, no longer findable here
            self.index[entry.key] = entry
        self.held += entry.nbytes
        return entry

    def evict_one(self, keep: int = 0) -> bool:
        """Drop the least recently used entry other than slot ``keep`` (agreed: same on every rank);
        False if there is none."""
        victim = self._lru(keep)
        if victim is not None:
            self._drop(victim.slot)
        return victim is not None

    def drop(self, slot: int) -> None:
        """Drop the entry of ``slot`` (at an agreed point, as every eviction)."""
        if slot in self.entries:
            self._drop(slot)

    def clear(self) -> None:
        """Drop every entry (collective, as eviction is)."""
        for slot in list(self.entries):
            self._drop(slot)

    def _lru(self, keep: int = 0) -> Optional[CacheEntry]:
        # ``entries`` is kept in order of use (insert and ``_call.CallTable.touch``, a hit, move an
        # entry to the end).
        return next((e for e in self.entries.values() if e.slot != keep), None)

    def _drop(self, slot: int) -> None:
        if self.on_drop is not None:
            self.on_drop(slot)
        entry = self.entries.pop(slot)
        if self.index.get(entry.key) is entry:
            del self.index[entry.key]
        if entry.run is not None:
            entry.run.free()
            entry.run = None
        self.held -= entry.nbytes
