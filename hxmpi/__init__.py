"""hxmpi: hierarchical all-to-all over MPI, data staging and update policies for distributed training."""
import os

# Open MPI 5 probes its UCX one-sided component whenever a window is created, and where UCX has no
# usable transport that probe prints "OSC UCX component priority ... failed" on every rank. hxmpi
# creates only shared-memory windows, which the "sm" component serves, so leave UCX out of the
# choice, unless the user chose. Must happen before MPI initialises (mpi4py's first import).
os.environ.setdefault("OMPI_MCA_osc", "^ucx")

from .errors import ExchangeError, ExchangeKeyError, ExchangeTypeError, HxmpiError, TopologyError
from .exchange import HierComm
from .topology import Topology

__version__ = "0.1.0"
__all__ = ["Topology", "HierComm", "ExchangeError", "ExchangeTypeError", "ExchangeKeyError", "TopologyError", "HxmpiError", "__version__"]
