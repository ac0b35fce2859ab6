"""Fault matrix on the emulated cluster (issue 13 item 7): a host's network link taken down while
the job trains. With --stall-abort the job must end within --stall-timeout + 10 s.

Cluster tier: builds network namespaces with fixed names, so its tests hold the machine's
cluster-test lock (``emulated_cluster``, tests/conftest.py); skipped where namespaces are not permitted.
"""
import re
import subprocess
import sys
import time

import pytest
from support import cluster_unavailable, cluster_up, epochs_logged, kill_session

from hxmpi.sim import cluster

SKIP = cluster_unavailable()
pytestmark = [pytest.mark.skipif(SKIP is not None, reason=f"emulated cluster unavailable: {SKIP}"),
              pytest.mark.emulated_cluster]  # one suite's cluster tests at a time (conftest)
NAME, SUBNET = "hxf", "10.213.12.0/24"


@pytest.fixture(scope="module")
def hosts():
    yield from cluster_up(NAME, SUBNET, [1, 1, 1])


def _ranks_alive(marker, launcher):
    """Pids of processes whose command line holds ``marker``, but ``launcher`` (mpirun): the ranks
    of one job, on any host."""
    out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    return [int(p) for p in out.split() if int(p) != launcher]


REACH = """
import socket, sys, time
t0 = time.monotonic()
while time.monotonic() - t0 < 20:
    try:
        socket.create_connection((sys.argv[1], 9), timeout=1).close()
        sys.exit(0)
    except ConnectionRefusedError:  # an answer: the host reaches the bridge
        sys.exit(0)
    except OSError:
        time.sleep(0.1)
sys.exit(1)
"""


def _link_up(hosts, victim):
    """Bring the victim's link back, and wait until it reaches the bridge again: address entries
    that failed while the link was down otherwise refuse the next job's first connections for a
    while ("No route to host", seen as Hydra's proxy failing to call back)."""
    subprocess.run(["ip", "link", "set", victim["veth"], "up"], check=True)
    subprocess.run(["ip", "-n", victim["netns"], "neigh", "flush", "all"])
    subprocess.run(["ip", "neigh", "flush", "dev", hosts["bridge"]])
    reach = subprocess.run(["ip", "netns", "exec", victim["netns"], sys.executable, "-c", REACH, hosts["bridge_ip"]])
    assert reach.returncode == 0, f"host {victim['name']} does not reach the bridge again"


@pytest.mark.watchdog(240)
@pytest.mark.parametrize("update", ["sync", "async"])
def test_host_link_down_ends_every_rank_within_the_stall_timeout(hosts, tmp_path, update):
    timeout, victim = 3.0, hosts["hosts"][2]
    log = tmp_path / "log.jsonl"
    cmd = [cluster.find_mpirun(), *cluster.mpirun_args(hosts), "-n", "3", sys.executable, "-m", "hxmpi.train",
           "--quiet", "--update", update, "--epochs", "100000", "--log", str(log),
           "--stall-timeout", str(timeout), "--stall-abort"]
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        t0 = time.monotonic()
        while not epochs_logged(log):
            assert time.monotonic() - t0 < 120 and job.poll() is None, job.stderr.read() if job.poll() else ""
            time.sleep(0.2)
        assert len(_ranks_alive(str(log), job.pid)) == 3
        subprocess.run(["ip", "link", "set", victim["veth"], "down"], check=True)
        cut = time.monotonic()
        while _ranks_alive(str(log), job.pid) and time.monotonic() - cut < timeout + 30:
            time.sleep(0.2)
        ended = time.monotonic() - cut
        # mpirun itself waits for the cut-off host's daemon; it ends once the link is back.
        _link_up(hosts, victim)
        _, err = job.communicate(timeout=60)
    finally:
        _link_up(hosts, victim)
        kill_session(job.pid)
        for pid in _ranks_alive(str(log), job.pid):
            subprocess.run(["kill", "-9", str(pid)])
    assert job.returncode != 0
    assert ended < timeout + 10, (ended, err[-2000:])
    # The cut-off rank is named by the others (a rank whose TCP link to it broke first may fail
    # with the MPI's own error and be named too).
    assert re.search(r"stall: ranks \[([0-9], )*2\] missing at step \d+", err), err
