"""The platform SimGrid replays on: the network (``Network``, its oversubscription) as a SimGrid
cluster (``platform_xml``)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from ..comm.costmodel.model import CostModel
from ..comm.plan import Layout
from .actions import Nic
from .errors import SimulateError

__all__ = ["NETWORKS", "Network", "oversubscription", "oversubscribe", "platform_xml"]

NETWORKS = ("backbone", "fat-tree")


@dataclass(frozen=True)
class Network:
    """How hosts connect: "backbone" (one shared switch) or "fat-tree" (two levels, ``leaf`` hosts per
    leaf switch). The model's ``beta_backbone`` sets the oversubscription (see ``oversubscribe``)."""
    kind: str = "backbone"
    leaf: int = 16



def oversubscription(model: CostModel) -> float:
    """R: how many times slower the backbone (or spine) is than all node links together."""
    return 1.0 + model.beta_backbone / model.beta_inter


def oversubscribe(model: CostModel, ratio: float) -> CostModel:
    """The model on a network whose backbone carries 1/ratio of all node links' bandwidth."""
    return replace(model, beta_backbone=(ratio - 1.0) * model.beta_inter)


def platform_xml(layout: Layout, model: CostModel, network: Network, nic: Optional[Nic] = None) -> str:
    """SimGrid cluster: one host per node, a private full-duplex link (the NIC's bandwidth with a
    ``nic``), backbone or fat tree, loopback."""
    n, g = layout.num_nodes, layout.max_node_size
    bw_inter, bw_intra = (nic.bandwidth if nic else 1 / model.beta_inter), 1 / model.beta_intra
    attrs = dict(id="cluster", prefix="node-", suffix="", radical=f"0-{n - 1}", speed="1Gf", core=str(g),
                 bw=f"{bw_inter:.6g}Bps", loopback_bw=f"{bw_intra:.6g}Bps",
                 loopback_lat=f"{model.alpha_intra:.6g}s", sharing_policy="SPLITDUPLEX")
    if network.kind == "backbone":
        # Host -> backbone -> host crosses two private links: each carries half the latency.
        attrs.update(lat=f"{model.alpha_inter / 2:.6g}s", bb_lat="0s",
                     bb_bw=f"{n * bw_inter / oversubscription(model):.6g}Bps")
    else:
        leaf = min(network.leaf, n)
        if n % leaf:
            raise SimulateError(f"fat-tree: {n} nodes do not fill leaf switches of {leaf} hosts")
        up = max(1, round(leaf / oversubscription(model)))
        # Host -> leaf -> spine -> leaf -> host crosses four links: each carries a quarter.
        attrs.update(lat=f"{model.alpha_inter / 4:.6g}s", topology="FAT_TREE",
                     topo_parameters=f"2;{leaf},{n // leaf};1,{up};1,1")
    attr_text = " ".join(f'{k}="{v}"' for k, v in attrs.items())
    return ("<?xml version='1.0'?>\n<!DOCTYPE platform SYSTEM \"https://simgrid.org/simgrid.dtd\">\n"
            f"<platform version=\"4.1\">\n  <cluster {attr_text}/>\n</platform>\n")
