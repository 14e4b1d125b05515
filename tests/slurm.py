"""A real SLURM cluster on this machine for the tests: munged, slurmctld and one slurmd per node
(Debian's slurm-wlm 22.05), all started here with a configuration of their own in a temporary
folder, so nothing of the machine's /etc/slurm or /etc/munge is used or changed.

The nodes are named like the Ferry nodes of `ferry up` (node-1, node-2, ...), so that a step's
SLURMD_NODENAME is its Ferry node. Each slurmd has a configuration file of its own that differs
from the controller's in its pid file and log only (Debian builds SLURM without
--enable-multiple-slurmd, which would substitute %n in those paths): DebugFlags=NO_CONF_HASH
keeps the controller from warning about that difference. The slurmds share one SlurmdSpoolDir,
as the nodes of a real cluster have the same one: a batch script that bash still reads is at
`<spool>/job<ID>/slurm_script` wherever SLURM starts the job again, where CRIU finds it on restore.
Processes are tracked with proctrack/cgroup on the machine's cgroup v1 hierarchies: SLURM signals
only the task itself (not its descendants) with anything but SIGKILL, which is what lets the
launcher checkpoint the job on SIGTERM before it stops.

The plugin is the one ./setup.sh built and installed (FERRY_SPANK_PLUGIN overrides the path):
a test fails, never skips, when it is missing.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ferry.common import ports
from ferry.common.scontrol import parse_fields
from tests.conftest import BIN, wait_until

PLUGIN_DIR = Path("/usr/lib/x86_64-linux-gnu/slurm-wlm")
PLUGIN = Path(os.environ.get("FERRY_SPANK_PLUGIN", PLUGIN_DIR / "ferry_spank.so"))
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue")


def require_slurm() -> None:
    """Fails (never skips) when SLURM, munge or the plugin is missing: ./setup.sh installs them."""
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    assert not missing, f"{', '.join(missing)} not found: ./setup.sh installs SLURM and munge"
    assert PLUGIN.is_file(), f"{PLUGIN} not found: ./setup.sh builds and installs the Ferry SPANK plugin"


@dataclass
class Slurm:
    """A running SLURM cluster; `env` is what its client commands need (SLURM_CONF)."""

    root: Path
    nodes: list[str]
    ferry_addr: str
    grace_s: int = 4  # partition lowc's GraceTime: a batch script gets SIGTERM when it ends
    kill_wait_s: int = 30
    # nodes under power saving (State=CLOUD): powered down at start; ResumeProgram starts their
    # slurmd, SuspendProgram stops it (the scripts log what SLURM asked to power.log)
    powered: list[str] = field(default_factory=list)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and out.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {out.returncode}: {out.stderr.strip()}")
        return out

    def sbatch(self, *args: str) -> int:
        """Submits a job that runs in this cluster's folder (its default output and any core file land there)."""
        out = self.run("sbatch", "--parsable", f"--chdir={self.root}", *args)
        return int(out.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """`scontrol show job`'s fields (JobState, Restarts, NodeList, ExitCode, ...)."""
        return parse_fields(self.run("scontrol", "show", "job", "-o", str(job_id)).stdout)

    def node(self, name: str) -> dict[str, str]:
        return parse_fields(self.run("scontrol", "show", "node", "-o", name).stdout, last="Reason")

    def wait_job(self, job_id: int, states: set[str], timeout: float = 180) -> dict[str, str]:
        return wait_until(lambda: (j := self.job(job_id))["JobState"] in states and j, timeout,  # type: ignore[no-any-return]
                          f"SLURM job {job_id} to be {' or '.join(sorted(states))}", interval=0.5)

    def write_config(self) -> None:
        host = socket.gethostname()
        ctld_port = ports.free_port()
        node_ports = {n: ports.free_port() for n in self.nodes}
        (self.root / "plugstack.conf").write_text(
            f"required {PLUGIN} ferry={BIN / 'ferry-slurm-task'} addr={self.ferry_addr}\n")
        (self.root / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n"
                                               "CgroupMountpoint=/sys/fs/cgroup\n")
        common = f"""ClusterName=ferrytest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.root}/munge/sock,cred_expire=5
SlurmUser=root
SlurmdUser=root
StateSaveLocation={self.root}/ctld
SlurmctldPidFile={self.root}/ctld.pid
SlurmctldLogFile={self.root}/ctld.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmdTimeout=5
ReturnToService=2
ProctrackType=proctrack/cgroup
TaskPlugin=task/none
SchedulerType=sched/builtin
# the main loop passes over the pending jobs every second (default 60 s): a requeued job starts
# as soon as it may (cred_expire + 1 s after the requeue) instead of up to a minute later
SchedulerParameters=sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
KillWait={self.kill_wait_s}
MinJobAge=600
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
DebugFlags=NO_CONF_HASH
PlugStackConfig={self.root}/plugstack.conf
"""
        nodes = "".join(f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={node_ports[n]} CPUs=2 "
                        f"State={'CLOUD' if n in self.powered else 'UNKNOWN'}\n" for n in self.nodes)
        names = ",".join(self.nodes)
        if self.powered:
            common += self.power_saving()
        # low: preempted jobs are requeued (SLURM's REQUEUE); lowc: cancelled after GraceTime (CANCEL)
        parts = (f"PartitionName=low Nodes={names} Default=YES PriorityTier=1 MaxTime=INFINITE State=UP\n"
                 f"PartitionName=lowc Nodes={names} PriorityTier=1 PreemptMode=CANCEL GraceTime={self.grace_s} "
                 f"MaxTime=INFINITE State=UP\n"
                 f"PartitionName=high Nodes={names} PriorityTier=10 MaxTime=INFINITE State=UP\n")
        self.conf.write_text(common + nodes + parts)
        spool = self.root / "spool"  # one path on every node, as on a real cluster (see the module's doc)
        spool.mkdir()
        for n in self.nodes:
            (self.root / f"slurm-{n}.conf").write_text(
                common + f"SlurmdSpoolDir={spool}\nSlurmdPidFile={self.root}/{n}.pid\n"
                f"SlurmdLogFile={self.root}/{n}.log\n" + nodes + parts)

    def power_saving(self) -> str:
        """SLURM's power saving (ResumeProgram and SuspendProgram get a host list): here they start
        and stop the node's slurmd, as a cloud's or an IPMI script would boot and halt the machine."""
        log = self.root / "power.log"
        # slurmctld runs them with an empty environment: every command by its full path
        scontrol, slurmd, pkill = (shutil.which(c) or c for c in ("scontrol", "slurmd", "pkill"))
        resume = self.root / "resume.sh"
        resume.write_text(
            "#!/bin/bash\n"
            f"echo \"resume $1\" >> {log}\n"
            f"for n in $({scontrol} show hostnames \"$1\"); do\n"
            f"  FERRY_TEST_SLURM={self.root}:slurmd-$n setsid {slurmd} -b -D -N \"$n\" -f {self.root}/slurm-$n.conf "
            f"> {self.root}/slurmd-$n.out 2>&1 < /dev/null &\n"
            "done\n")
        suspend = self.root / "suspend.sh"
        suspend.write_text(
            "#!/bin/bash\n"
            f"echo \"suspend $1\" >> {log}\n"
            f"for n in $({scontrol} show hostnames \"$1\"); do\n"
            f"  {pkill} -f \"slurmd -b -D -N $n -f {self.root}/slurm-$n.conf\" || true\n"
            "done\n")
        resume.chmod(0o755)
        suspend.chmod(0o755)
        # SLURM never powers a node down by itself here (a day of idling): Ferry decides
        return (f"ResumeProgram={resume}\nSuspendProgram={suspend}\nSuspendTime=86400\nResumeTimeout=60\n"
                "SuspendTimeout=5\nResumeRate=0\nSuspendRate=0\nPrivateData=cloud\n")

    def start(self) -> None:
        require_slurm()
        munge = self.root / "munge"
        munge.mkdir(mode=0o711)
        key = munge / "key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o400)
        (self.root / "ctld").mkdir()
        self.write_config()
        self._spawn("munged", "munged", "-F", "-f", f"--socket={munge}/sock", f"--key-file={key}",
                    f"--pid-file={munge}/pid", f"--log-file={munge}/log", f"--seed-file={munge}/seed")
        wait_until(lambda: (munge / "sock").exists(), 10, "munged's socket")
        self._spawn("slurmctld", "slurmctld", "-D", "-i", "-f", str(self.conf))
        wait_until(lambda: self.run("scontrol", "ping", check=False).stdout.count("UP") > 0, 30, "slurmctld")
        up = [n for n in self.nodes if n not in self.powered]
        for n in up:
            self._spawn(f"slurmd-{n}", "slurmd", "-D", "-N", n, "-f", str(self.root / f"slurm-{n}.conf"))
        wait_until(lambda: all(self.node(n).get("State", "").startswith("IDLE") for n in up), 60,
                   "the slurmd nodes to be idle", interval=0.5)

    def _spawn(self, name: str, *argv: str) -> None:
        log = open(self.root / f"{name}.out", "wb")  # noqa: SIM115 - the daemon writes to it until stopped
        # slurmstepds inherit slurmd's environment (not the jobs: theirs is the job's): the marker finds them
        env = {**self.env, "FERRY_TEST_SLURM": f"{self.root}:{name}"}
        self.procs[name] = subprocess.Popen(list(argv), env=env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        log.close()

    def kill_node(self, name: str) -> None:
        """A node's SLURM side dies as in a crash: its slurmd, every slurmstepd and all below them,
        and its local disk: the batch folders of its jobs in the spool the test's slurmds share
        (left there, they keep another node from starting the requeued job: 'Slurmd could not
        create a batch directory')."""
        self.procs.pop(f"slurmd-{name}").kill()
        stepds = _stepds(f"{self.root}:slurmd-{name}")
        batch = [m.group(1) for pid in stepds
                 if (m := re.search(rb"\[(\d+)\.batch\]", _cmdline(pid))) is not None]
        doomed = stepds + [p for stepd in stepds for p in _descendants(stepd)]
        for pid in doomed:  # stopped first, so that none reaps or restarts another meanwhile
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for job in batch:
            shutil.rmtree(self.root / "spool" / f"job{int(job):05d}", ignore_errors=True)

    def start_bridge(self) -> None:
        """`ferry slurm bridge` against this cluster and the Ferry at ferry_addr, every second."""
        log = open(self.root / "bridge.out", "wb")  # noqa: SIM115 - the bridge writes to it until stopped
        env = {**self.env, "FERRY_ADDR": self.ferry_addr, "PYTHONUNBUFFERED": "1"}
        self.procs["bridge"] = subprocess.Popen([str(BIN / "ferry"), "slurm", "bridge", "--interval", "1s"], env=env,
                                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        wait_until(lambda: b"ready" in (self.root / "bridge.out").read_bytes(), 30, "the bridge to be ready")

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.run("scancel", "--full", "--signal=KILL", "--user=root", check=False)
        for name in ["bridge", *[n for n in self.procs if n.startswith("slurmd-")], "slurmctld", "munged"]:
            proc = self.procs.pop(name, None)
            if proc is None:
                continue
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for n in self.nodes:
            for pid in _stepds(f"{self.root}:slurmd-{n}") + _stepds(f"{self.root}:slurmd-{n}", "slurmd"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def logs(self) -> str:
        out = []
        for f in sorted(self.root.glob("*.log")) + sorted(self.root.glob("*.out")):
            lines = f.read_text(errors="replace").splitlines()[-20:]
            out.append(f"--- {f.name}\n" + "\n".join(lines))
        return "\n".join(out)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _descendants(pid: int) -> list[int]:
    """Every process below `pid`, read from /proc (children first found, grandchildren after)."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(proc.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _stepds(marker: str, comm: str = "slurmstepd") -> list[int]:
    """The slurmstepds a slurmd started (they carry its FERRY_TEST_SLURM marker); with comm
    "slurmd", the slurmd a ResumeProgram started."""
    want = f"FERRY_TEST_SLURM={marker}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stepd = (proc / "comm").read_text().strip() == comm
            if stepd and want in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:
            pass
    return found


def start_slurm(ferry_addr: str, nodes: list[str], **kwargs: object) -> Slurm:
    slurm = Slurm(Path(tempfile.mkdtemp(prefix="ferry-slurm-")), nodes, ferry_addr, **kwargs)  # type: ignore[arg-type]
    try:
        slurm.start()
    except BaseException:
        slurm.stop()
        raise
    return slurm


def stop_slurm(slurm: Slurm) -> None:
    slurm.stop()
    if not os.environ.get("FERRY_TEST_KEEP_DATA"):
        shutil.rmtree(slurm.root, ignore_errors=True)

