"""A real one-node Slurm for the tests: munged, slurmctld and slurmd of their own, started from a conf in a
temporary folder, and stopped with every job they ran."""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

PARTITION = "debug"
BINARIES = ("slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol", "srun", "scancel", "munged")
MUNGE_KEY = Path("/etc/munge/munge.key")
START_S = 120.0
"""How long the daemons may take to come up (or the jobs to end at the stop) on a loaded machine."""


def why_no_slurm() -> str | None:
    """Why this machine cannot start its own Slurm for the tests, or None when it can."""
    if os.geteuid() != 0:
        return f"Slurm tests need root to start slurmctld/slurmd: this process runs as uid {os.geteuid()}"
    missing = [name for name in BINARIES if _binary(name) is None]
    if missing:
        return (
            "Slurm tests need slurm-wlm and munge (apt-get install -y slurm-wlm munge): "
            f"{', '.join(missing)} not found"
        )
    if not MUNGE_KEY.is_file():
        return f"Slurm tests need a munge key: {MUNGE_KEY} is absent (create it with mungekey)"
    return None


@dataclass(frozen=True)
class SlurmCluster:
    """A running one-node cluster: its conf (what SLURM_CONF names) and the folder holding its files."""

    conf: Path
    folder: Path
    node: str

    def env(self, **more: str) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf), **more}

    def command(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """A Slurm client command (scontrol, squeue, scancel, sinfo) against this cluster."""
        done = subprocess.run(args, env=self.env(), capture_output=True, text=True, timeout=60)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def queued(self) -> dict[str, str]:
        """Every job task in the queue, by id (``12_0``), with its state (``PENDING``, ``RUNNING`` ...)."""
        listed = self.command("squeue", "--noheader", "--array", "--format=%i %T").stdout.split()
        return dict(zip(listed[::2], listed[1::2], strict=True))

    def wait_for(self, what: str, condition, deadline_s: float = 300.0, every_s: float = 0.5):
        """Poll ``condition()`` until it returns something true; fail naming ``what`` past the deadline."""
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            found = condition()
            if found:
                return found
            time.sleep(every_s)
        raise AssertionError(f"waited {deadline_s:.0f} s for {what}; the queue holds {self.queued()}")


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for each in sockets:
            each.bind(("127.0.0.1", 0))
        return [each.getsockname()[1] for each in sockets]
    finally:
        for each in sockets:
            each.close()


def _write_conf(folder: Path, node: str, munge_socket: Path) -> Path:
    controller_port, node_port = _free_ports(2)
    lines = [
        "ClusterName=ggpotest",
        f"SlurmctldHost={node}",
        "SlurmUser=root",
        f"SlurmctldPort={controller_port}",
        f"SlurmdPort={node_port}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",  # this cluster's own munged: no other test run's daemon is used
        f"StateSaveLocation={folder}/state",
        f"SlurmdSpoolDir={folder}/spool",
        f"SlurmctldPidFile={folder}/slurmctld.pid",
        f"SlurmdPidFile={folder}/slurmd.pid",
        f"SlurmctldLogFile={folder}/slurmctld.log",
        f"SlurmdLogFile={folder}/slurmd.log",
        # What a machine without cgroup delegation needs (no cgroup.conf at all: 22.05 refuses disabling it).
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "ReturnToService=2",
        "JobRequeue=0",  # as many clusters: a task is requeued only when its job asked for it (--requeue)
        f"NodeName={node} CPUs={os.cpu_count()} State=UNKNOWN",
        f"PartitionName={PARTITION} Nodes={node} Default=YES MaxTime=INFINITE State=UP",
    ]
    conf = folder / "slurm.conf"
    conf.write_text("\n".join(lines) + "\n")
    return conf


def _start_munged() -> Path:
    """A munged of its own, run as the munge user as munged wants, in a folder of its own (the munge user
    must be able to enter every folder above it: pytest's are root's alone); that folder."""
    munge = Path(tempfile.mkdtemp(prefix="ggpo-test-munge-"))
    shutil.copy(MUNGE_KEY, munge / "key")
    shutil.chown(munge, "munge", "munge")
    shutil.chown(munge / "key", "munge", "munge")
    (munge / "key").chmod(0o600)
    munge.chmod(0o711)  # munged refuses a socket in a folder the others cannot enter
    options = [f"--{name}={munge / name}" for name in ("socket", "pid-file", "log-file", "seed-file", "key")]
    command = " ".join([_binary("munged"), *options]).replace("--key=", "--key-file=")
    subprocess.run(["su", "-s", "/bin/sh", "munge", "-c", command], check=True, timeout=60)
    return munge


def _binary(name: str) -> str | None:
    return shutil.which(name, path=f"{os.environ['PATH']}:/usr/sbin:/usr/bin")


def _start_daemon(name: str, conf: Path, log: Path) -> None:
    done = subprocess.run([_binary(name), "-f", str(conf)], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        tail = log.read_text()[-2000:] if log.is_file() else done.stderr
        raise RuntimeError(f"{name} did not start ({done.returncode}): {tail}")


def _stop(pid_files: list[Path]) -> None:
    """SIGTERM the daemons the pid files name, all at once, and wait for each to end (SIGKILL past the
    deadline)."""
    pids = [int(path.read_text().split()[0]) for path in pid_files if path.is_file()]
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + START_S
    for pid in pids:
        while _alive(pid) and time.monotonic() < end:
            time.sleep(0.1)
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@contextmanager
def running_cluster(folder: Path) -> Iterator[SlurmCluster]:
    """munged, slurmctld and slurmd started on this machine from a conf in ``folder``; once the node shows
    idle, the cluster; at the end its jobs are cancelled and every daemon started here is stopped."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("state", "spool"):
        (folder / name).mkdir()
    node = socket.gethostname().split(".")[0]
    munge = _start_munged()
    conf = _write_conf(folder, node, munge / "socket")
    cluster = SlurmCluster(conf, folder, node)
    try:
        _start_daemon("slurmctld", conf, folder / "slurmctld.log")
        _start_daemon("slurmd", conf, folder / "slurmd.log")
        cluster.wait_for("the node to show idle", lambda: _idle(cluster), deadline_s=START_S)
        yield cluster
    finally:
        with suppress(Exception):
            _cancel_all(cluster)
        _stop([folder / "slurmd.pid", folder / "slurmctld.pid", munge / "pid-file"])
        shutil.rmtree(munge, ignore_errors=True)


def _idle(cluster: SlurmCluster) -> bool:
    shown = cluster.command("sinfo", "--noheader", "--Node", "--format=%T", check=False)
    return shown.returncode == 0 and shown.stdout.strip() == "idle"


def _cancel_all(cluster: SlurmCluster) -> None:
    """Cancel every job and wait until none is left, so that no task outlives its slurmd."""
    jobs = sorted({task.split("_")[0] for task in cluster.queued()})
    if jobs:
        cluster.command("scancel", *jobs, check=False)
        cluster.wait_for("the cancelled jobs to end", lambda: not cluster.queued(), deadline_s=START_S)
