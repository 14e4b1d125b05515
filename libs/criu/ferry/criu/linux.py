"""Linux process primitives that Python 3.11's ``os`` lacks (unshare, prctl) and /proc readers."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import re
import signal
import socket
import struct
from collections.abc import Sequence
from functools import cache

import psutil

__all__ = [
    "CLONE_NEWNET",
    "CLONE_NEWNS",
    "CLONE_NEWPID",
    "PR_SET_CHILD_SUBREAPER",
    "catches_signal",
    "drop_capabilities",
    "hide_dirs",
    "is_gone",
    "isolate_network",
    "mount_own_proc",
    "mount_points",
    "ns_pids",
    "private_dev",
    "process_tree",
    "refuse_io_uring",
    "reset_signals",
    "runtime_points",
    "set_child_subreaper",
    "setns",
    "unshare",
]

CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 0x1000, 0x2000, 0x4000, 0x40000
MNT_DETACH, PR_CAPBSET_DROP, PR_SET_CHILD_SUBREAPER = 2, 24, 36
HIDDEN_SOURCE = "ferry-hidden"
"""The source name of the empty tmpfs mounted over each folder a workload must not see."""
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
"""The character devices of a job's own /dev (as the OCI runtime spec's default devices), bound
from the host's; GPUs' ``/dev/nvidia*`` join them where present. No block device is there: a job
that saw /dev/vda could read the node's disk, secrets and all, past any hidden folder."""
SHARED_DEV_MOUNTS = ("pts", "shm")
"""Submounts of the host's /dev that a job's /dev keeps (bound, so recorded as external)."""
DROPPED_CAPABILITIES = {
    "CAP_DAC_READ_SEARCH": 2,  # open_by_handle_at reaches any file of a filesystem, hidden or not
    "CAP_LINUX_IMMUTABLE": 9,
    "CAP_NET_ADMIN": 12,  # the node's firewall and routes, where the job shares its network
    "CAP_SYS_MODULE": 16,
    "CAP_SYS_RAWIO": 17,
    "CAP_SYS_PTRACE": 19,
    "CAP_SYS_PACCT": 20,
    "CAP_SYS_ADMIN": 21,  # mount and umount: would undo the hidden folders and the private /dev
    "CAP_SYS_BOOT": 22,
    "CAP_SYS_TIME": 25,
    "CAP_MKNOD": 27,  # a block device node made anew would reach the disk
    "CAP_AUDIT_CONTROL": 30,
    "CAP_MAC_OVERRIDE": 32,
    "CAP_MAC_ADMIN": 33,
    "CAP_SYSLOG": 34,
    "CAP_PERFMON": 38,
    "CAP_BPF": 39,
    "CAP_CHECKPOINT_RESTORE": 40,
}
"""What a workload, root as it may be, loses from its bounding set at launch (CRIU restores the
set as dumped): what would let it leave its mount namespace's view of the node, load code into
the kernel or reach the disk below the filesystem."""


@cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    """unshare(2). With CLONE_NEWPID the caller's next child is PID 1 of a new PID namespace."""
    _check(_libc().unshare(ctypes.c_int(flags)), "unshare")


def setns(path: str, flags: int) -> None:
    """setns(2) into the namespace at ``path`` (for CLONE_NEWPID: where the caller's next children go)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(_libc().setns(ctypes.c_int(fd), ctypes.c_int(flags)), f"setns {path}")
    finally:
        os.close(fd)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(s: str | None) -> bytes | None:
        return s.encode() if s is not None else None

    libc = _libc()
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    _check(libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def _umount_detach(target: str) -> None:
    libc = _libc()
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    _check(libc.umount2(target.encode(), ctypes.c_int(MNT_DETACH)), f"umount {target}")


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_points(mountinfo: str) -> list[str]:
    """The mount points listed in a /proc/PID/mountinfo text, in its order (parents first)."""
    return [_unescape(line.split()[4]) for line in mountinfo.splitlines() if len(line.split()) > 4]


def nsfs_points(mountinfo: str) -> list[str]:
    """The mount points of namespace files (fstype ``nsfs``: ``ip netns add`` pins a namespace so,
    under /run/netns) in a /proc/PID/mountinfo text."""
    points = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" in fields and fields.index("-") + 1 < len(fields) and fields[fields.index("-") + 1] == "nsfs":
            points.append(_unescape(fields[4]))
    return points


RUNTIME_MARKERS = (
    "/io.containerd.runtime.v2.task/", "/io.containerd.runtime.v1.linux/", "/io.containerd.grpc.v1.cri/",
    "/kubelet/pods/", "/docker/overlay2/", "/docker/containers/", "/containers/storage/overlay",
)
"""Path parts that mark a container runtime's mounts on a node: containers' root filesystems,
shm and volumes (containerd, the kubelet, Docker, CRI-O and Podman)."""


def runtime_points(mountinfo: str) -> list[str]:
    """The mount points of container runtimes' mounts (``RUNTIME_MARKERS``) in a
    /proc/PID/mountinfo text: other containers' files, which come and go with them."""
    return [point for point in mount_points(mountinfo) if any(m in f"{point}/" for m in RUNTIME_MARKERS)]


def _detach_at_and_below(path: str) -> None:
    """Detaches every mount at or below `path` from the caller's mount namespace, deepest first:
    whatever is then mounted over `path` covers no mount, which CRIU could not restore."""
    with open("/proc/self/mountinfo") as f:
        points = mount_points(f.read())
    below = [p for p in points if p == path or p.startswith(path.rstrip("/") + "/")]
    for point in sorted(set(below), key=lambda p: (-p.count("/"), p)):
        while os.path.ismount(point):
            _umount_detach(point)


def hide_dirs(paths: Sequence[str]) -> None:
    """In the caller's own mount namespace: an empty, read-only tmpfs (mode 000) over each folder
    of `paths` that exists (after taking away what was mounted there), so that nothing in it can
    be read, listed or written there."""
    for path in paths:
        if os.path.isdir(path):
            _detach_at_and_below(os.path.realpath(path))
            _mount(HIDDEN_SOURCE, path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=000")


def private_dev(staging: str) -> None:
    """In the caller's own mount namespace: a /dev of its own, a small tmpfs holding ``DEVICES``,
    the GPUs' devices and ``SHARED_DEV_MOUNTS`` bound from the host's /dev, and the usual links.

    It is built at `staging` (an empty folder) while the host's /dev is still in view, then moved
    over /dev."""
    _mount("ferry-dev", staging, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=755")
    names = [*DEVICES, *sorted(n for n in os.listdir("/dev") if n.startswith("nvidia"))]
    for name in names:
        source = os.path.join("/dev", name)
        if os.path.exists(source) and not os.path.isdir(source):
            target = os.path.join(staging, name)
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o666))
            _mount(source, target, None, MS_BIND)
    for name in SHARED_DEV_MOUNTS:
        source = os.path.join("/dev", name)
        if os.path.ismount(source):
            os.mkdir(os.path.join(staging, name), 0o755)
            _mount(source, os.path.join(staging, name), None, MS_BIND | MS_REC)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2"), ("ptmx", "pts/ptmx")):
        os.symlink(target, os.path.join(staging, name))
    _detach_at_and_below("/dev")
    _mount(staging, "/dev", None, MS_MOVE)


IO_URING_SYSCALLS = (425, 426, 427)  # io_uring_setup, _enter, _register: the same number on every arch
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
PR_SET_PDEATHSIG = 1
_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_RET_K = 0x20, 0x15, 0x06
_SECCOMP_RET_ALLOW, _SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def io_uring_filter() -> list[tuple[int, int, int, int]]:
    """The seccomp program of ``refuse_io_uring``, as (code, jt, jf, k): the syscall number, then
    ENOSYS for each io_uring call, else allow."""
    n = len(IO_URING_SYSCALLS)
    prog = [(_BPF_LD_W_ABS, 0, 0, 0)]  # seccomp_data.nr
    prog += [(_BPF_JEQ_K, n - i, 0, nr) for i, nr in enumerate(IO_URING_SYSCALLS)]
    return [*prog, (_BPF_RET_K, 0, 0, _SECCOMP_RET_ALLOW), (_BPF_RET_K, 0, 0, _SECCOMP_RET_ERRNO | errno.ENOSYS)]


def refuse_io_uring() -> None:
    """A seccomp filter under which io_uring's system calls fail with ENOSYS, as on a kernel
    without io_uring: libraries that try it (libuv, in Node.js, torch's TCPStore, Ray) fall back
    to epoll. CRIU cannot dump an io_uring instance, so a job holding one could never be
    checkpointed; CRIU dumps and restores the filter itself with the job. Installed while the
    caller still has CAP_SYS_ADMIN (no no_new_privs needed), inherited by everything it execs."""
    prog = io_uring_filter()
    array = (_SockFilter * len(prog))(*(_SockFilter(*ins) for ins in prog))
    fprog = _SockFprog(len(prog), ctypes.cast(array, ctypes.POINTER(_SockFilter)))
    _check(_libc().prctl(ctypes.c_int(PR_SET_SECCOMP), ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(fprog),
                         ctypes.c_ulong(0), ctypes.c_ulong(0)), "prctl(PR_SET_SECCOMP)")


def drop_capabilities(numbers: Sequence[int] = tuple(DROPPED_CAPABILITIES.values())) -> None:
    """Removes each capability in `numbers` from the caller's bounding set: what the caller then
    execs (root or not, with file capabilities or not) can never hold them. Numbers this kernel
    does not know are skipped."""
    libc = _libc()
    for cap in numbers:
        if libc.prctl(ctypes.c_int(PR_CAPBSET_DROP), ctypes.c_ulong(cap), ctypes.c_ulong(0), ctypes.c_ulong(0),
                      ctypes.c_ulong(0)) != 0 and ctypes.get_errno() != errno.EINVAL:
            err = ctypes.get_errno()
            raise OSError(err, f"prctl(PR_CAPBSET_DROP, {cap}): {os.strerror(err)}")


def mount_own_proc() -> None:
    """For PID 1 of a new PID namespace: a mount namespace of its own, as the host's but private
    (nothing mounted in it reaches the host), with a /proc that shows this PID namespace.

    CRIU then dumps the tree's mounts too; each but that /proc is a copy of a host mount, which
    ``--external mnt[]`` records as external and a restore binds from the same path on its host."""
    unshare(CLONE_NEWNS)
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    # the host's pinned namespaces (its nodes' network namespaces under /run/netns, with `ferry up`)
    # and other containers' root filesystems, shm and volumes are none of the job's business, and
    # a copy of each would be an external mount its restore needs: one that is gone by then (a
    # node the autoscaler retired, a container that ended; on another node, any of them) fails
    # the restore
    with open("/proc/self/mountinfo") as f:
        mountinfo = f.read()
    for point in reversed([*nsfs_points(mountinfo), *runtime_points(mountinfo)]):
        with contextlib.suppress(OSError):
            _umount_detach(point)


def isolate_network() -> None:
    """A network namespace of the caller's own with its loopback up and nothing else: the
    caller's sockets reach only each other (CRIU dumps and restores the namespace with them)."""
    unshare(CLONE_NEWNET)
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        got = fcntl.ioctl(s, siocgifflags, struct.pack("16sH14s", b"lo", 0, b""))
        flags = struct.unpack("16sH14s", got)[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sH14s", b"lo", flags | iff_up, b""))


def set_parent_death_signal(signum: int) -> None:
    """prctl(PR_SET_PDEATHSIG): this process gets `signum` when the thread that forked it ends."""
    _check(_libc().prctl(ctypes.c_int(PR_SET_PDEATHSIG), ctypes.c_ulong(signum), ctypes.c_ulong(0),
                         ctypes.c_ulong(0), ctypes.c_ulong(0)), "prctl(PR_SET_PDEATHSIG)")


def set_child_subreaper() -> None:
    """prctl(PR_SET_CHILD_SUBREAPER, 1): orphaned descendants are reparented to this process."""
    _check(
        _libc().prctl(
            ctypes.c_int(PR_SET_CHILD_SUBREAPER),
            ctypes.c_ulong(1),
            ctypes.c_ulong(0),
            ctypes.c_ulong(0),
            ctypes.c_ulong(0),
        ),
        "prctl(PR_SET_CHILD_SUBREAPER)",
    )


def reset_signals() -> None:
    """Default dispositions and an empty mask, as a freshly exec'd program expects.

    Python ignores SIGPIPE (and a caller may ignore SIGHUP/SIGINT); ignored signals survive exec.
    """
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def _status_fields(pid: int) -> dict[str, str]:
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


def ns_pids(pid: int) -> list[int]:
    """``NSpid`` of a process: its PID in each namespace, outermost first."""
    return [int(p) for p in _status_fields(pid).get("NSpid", "").split()]


def catches_signal(pid: int, sig: int) -> bool:
    """Whether the process has a handler for ``sig`` (``SigCgt`` in /proc/<pid>/status)."""
    mask = int(_status_fields(pid).get("SigCgt", "0"), 16)
    return bool(mask & (1 << (sig - 1)))


def is_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs: absent, or a zombie waiting for its reaper."""
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def proc_state(pid: int) -> str | None:
    """The state letter of ``/proc/PID/stat`` (R, S, T: stopped, t: traced, Z...), None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants, parents first ([] when ``pid`` is gone). For a workload
    that is PID 1 of its own namespace, that is every process of the job."""
    try:
        root = psutil.Process(pid)
        return [pid, *(p.pid for p in root.children(recursive=True))]
    except psutil.NoSuchProcess:
        return []
