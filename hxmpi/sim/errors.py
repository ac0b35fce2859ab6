"""The simulator's errors: a flag, file or replay that cannot work, and a replay over its time."""
from __future__ import annotations

from ..errors import HxmpiError

__all__ = ["SimulateError", "ReplayTimeout"]


class SimulateError(HxmpiError):
    """A flag, file or replay that cannot work; the CLI prints it as one ``error:`` line."""


class ReplayTimeout(SimulateError):
    """A replay that did not finish within ``--timeout``."""

