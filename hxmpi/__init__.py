"""hxmpi: hierarchical all-to-all over MPI, data staging and update policies for distributed training."""
from .errors import ExchangeError, HxmpiError, TopologyError
from .exchange import HierComm
from .topology import Topology

__version__ = "0.1.0"
__all__ = ["Topology", "HierComm", "ExchangeError", "TopologyError", "HxmpiError", "__version__"]
