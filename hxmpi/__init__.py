"""hxmpi: hierarchical all-to-all over MPI, data staging and update policies for distributed training.

Three subpackages, whose imports run one way (root -> comm -> data/models -> train; sim beside train):

- ``hxmpi.comm``: the exchange engine (``HierComm``, ``Topology``, plans, the agreement, the cost model);
- ``hxmpi.train``: the trainer behind ``python -m hxmpi.train``, its update policy, balancing, checkpoints;
- ``hxmpi.sim``: the SimGrid simulator (``python -m hxmpi.sim``) and the emulated cluster
  (``python -m hxmpi.sim.cluster``);

beside ``hxmpi.data`` (dataset store and staging) and ``hxmpi.models`` (numpy models). The root holds
what they all share: errors, the settings schema, the CLI helper, the MPI launcher and the run log.

The package's names load lazily, so ``import hxmpi.comm.plan``, ``hxmpi.comm.costmodel`` or
``hxmpi.sim.simulate`` does not initialise MPI; ``hxmpi.HierComm`` (or any name below) does, on first use.
"""
import os

# Open MPI 5 probes its UCX one-sided component whenever a window is created, and where UCX has no
# usable transport that probe prints "OSC UCX component priority ... failed" on every rank. hxmpi
# creates only shared-memory windows, which the "sm" component serves, so leave UCX out of the
# choice, unless the user chose. Must happen before MPI initialises (mpi4py's first import).
os.environ.setdefault("OMPI_MCA_osc", "^ucx")

#: The package version, defined here once (pyproject.toml reads it; CHANGELOG.md says what each has).
__version__ = "0.2.0.dev0"
_EXPORTS = {"Topology": "comm.topology", "HierComm": "comm.exchange", "CartHierComm": "comm.exchange",
            "ExchangeError": "errors", "ExchangeTypeError": "errors", "ExchangeKeyError": "errors",
            "TopologyError": "errors", "HxmpiError": "errors", "HierRequest": "comm.nonblocking",
            "waitall": "comm.nonblocking"}
__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hxmpi' has no attribute {name!r}")
    from importlib import import_module
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)
