"""hxmpi's own CPU per call by path: the table a call is charged besides its MPI time.

``CpuTimes`` reads a CPU file (``benchmarks/bench_overhead.py --json``'s ``cpu_s_per_call``; the
packaged ``overhead.json`` of ``hxmpi.comm`` by default); ``fixed_cpu`` is the cost model's fixed
costs where there is no table.
"""
from __future__ import annotations

import importlib.resources
import json
import math
import os
from dataclasses import dataclass
from typing import Mapping, Optional

from ...errors import CpuFileError
from ..plan import ALGORITHM, ALGORITHMS
from .params import Parameters

__all__ = ["ENV_OVERHEAD", "CPU_FILE", "CPU_KEYS", "CpuTimes", "fixed_cpu"]

#: Env var naming a CPU-per-path file for ``HierComm``'s "auto" (default: the packaged ``CPU_FILE``).
ENV_OVERHEAD = "HXMPI_OVERHEAD"
#: hxmpi's measured CPU per call by path, shipped as data of ``hxmpi.comm``: the output of
#: ``benchmarks/bench_overhead.py --json`` (``--combine-flat/--combine-hier`` on this project's runs).
CPU_FILE = "overhead.json"
#: Keys of a CPU file's ``cpu_s_per_call``: per algorithm with code of its own (``Algorithm.cpu_key``),
#: a one-shot miss (its name), a one-shot hit (``_hit``) and a persistent plan (``_plan``).
CPU_KEYS = tuple(a + kind for a in ALGORITHMS if ALGORITHM[a].cpu_key == a for kind in ("", "_hit", "_plan"))
#: The algorithm of each CPU key.
_KEY_ALGORITHM = {a + kind: ALGORITHM[a] for a in ALGORITHMS for kind in ("", "_hit", "_plan")}


def _hierarchical(name: str) -> bool:
    """Whether ``name`` (one of ``CALL_ALGORITHMS``, or a CPU key) is one of hxmpi's
    hierarchical algorithms (or a path of one)."""
    algo = _KEY_ALGORITHM.get(name)
    return algo is not None and algo.hierarchical


#: The package the CPU file ships in: ``hxmpi.comm`` (this one's parent).
_DATA_PACKAGE = __package__.rpartition(".")[0]


@dataclass(frozen=True)
class CpuTimes:
    """hxmpi's own CPU seconds per call by path (``cpu_s_per_call`` of ``bench_overhead.py --json``):
    what ``predict_call`` charges a call besides its MPI time. ``source``: where the numbers came
    from (a file, or the cost model's fixed costs). ``cpu(key)``: seconds for a key of ``CPU_KEYS``."""
    seconds: Mapping[str, float]
    source: str

    def __call__(self, key: str) -> float:
        return self.seconds[key]

    @classmethod
    def load(cls, path: Optional[str] = None) -> "CpuTimes":
        """Read a CPU file, or the packaged one (``CPU_FILE``) if ``path`` is None. A missing or
        malformed file raises ``CpuFileError`` naming it: never a silent fallback to fixed costs."""
        if path is None:
            res = importlib.resources.files(_DATA_PACKAGE).joinpath(CPU_FILE)
            source, read = f"{res} (packaged with hxmpi)", res.read_text
        else:
            source = str(path)

            def read() -> str:
                with open(path) as fh:
                    return fh.read()
        try:
            text = read()
        except OSError as exc:
            raise CpuFileError(f"CPU file {source}: cannot read it: {exc.strerror or exc}") from None
        return cls.parse(text, source)

    @classmethod
    def parse(cls, text: str, source: str) -> "CpuTimes":
        """The table in a CPU file's ``text``; ``source`` names the file in errors."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise CpuFileError(f"CPU file {source}: not JSON: {exc}") from None
        table = data.get("cpu_s_per_call") if isinstance(data, dict) else None
        if not isinstance(table, dict):
            raise CpuFileError(f"CPU file {source}: no cpu_s_per_call mapping (bench_overhead.py --json writes one)")
        missing = [k for k in CPU_KEYS if k not in table]
        if missing:
            raise CpuFileError(f"CPU file {source}: cpu_s_per_call lacks {', '.join(missing)}")
        bad = [k for k in CPU_KEYS if isinstance(table[k], bool) or not isinstance(table[k], (int, float))
               or not math.isfinite(table[k]) or table[k] < 0]
        if bad:
            raise CpuFileError(f"CPU file {source}: cpu_s_per_call values must be seconds >= 0, not "
                               + ", ".join(f"{k}={table[k]!r}" for k in bad))
        return cls({k: float(table[k]) for k in CPU_KEYS}, source)

    @classmethod
    def from_env_or_default(cls, path: Optional[str] = None) -> "CpuTimes":
        """The table of ``path``, else of env HXMPI_OVERHEAD's file, else the packaged one."""
        return cls.load(path or os.environ.get(ENV_OVERHEAD) or None)

    @classmethod
    def fixed(cls, model: Parameters) -> "CpuTimes":
        """The cost model's two fixed costs as a table: ``overhead_hier`` for the hier paths,
        ``overhead_flat`` for flat and Bruck (what ``predict_call`` charges without a table)."""
        return cls({k: fixed_cpu(model, k) for k in CPU_KEYS}, "the cost model's fixed costs")


def fixed_cpu(model: Parameters, key: str) -> float:
    """The cost model's fixed CPU seconds for path ``key``: ``overhead_hier`` for the hier paths,
    ``overhead_flat`` for flat and Bruck."""
    return model.overhead_hier if _hierarchical(key) else model.overhead_flat
