"""The zygote's server side (``python -m ferry.criu.zygote_server --socket PATH``): the protocol
and the process are described in ``ferry.criu.zygote``. It imports the shim once; every request
forks a starter that runs it."""

from __future__ import annotations

import argparse
import array
import contextlib
import gc
import json
import os
import selectors
import signal
import socket
import struct
import sys
from collections.abc import Sequence
from pathlib import Path

import setproctitle

from ferry.criu import shim
from ferry.criu.linux import set_parent_death_signal
from ferry.criu.zygote import FDS

MAX_REQUEST = 1 << 20


def _send(conn: socket.socket, doc: dict[str, object]) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps(doc).encode() + b"\n")


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


class Server:
    """The zygote's loop: accept, fork a starter, report its end (``serve``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.waiting: dict[int, socket.socket] = {}  # starter pid -> its client

    def listen(self) -> socket.socket:
        self.path.unlink(missing_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(str(self.path))
        finally:
            os.umask(old)
        sock.listen(64)
        return sock

    def serve(self, sock: socket.socket, ready: int | None = None) -> None:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        # the shim's command line parser, built here once: built in each fork, it was half of a
        # starter's CPU (argparse looks up gettext catalogs and the terminal size for every option)
        shim.parser()
        gc.freeze()  # what is imported now stays shared with every fork: the collector leaves it alone
        sel = selectors.DefaultSelector()
        sel.register(sock, selectors.EVENT_READ, "accept")
        sel.register(wake_r, selectors.EVENT_READ, "child")
        if ready is not None:
            os.write(ready, b"ready\n")
            os.close(ready)
        while True:
            for key, _ in sel.select():
                if key.data == "accept":
                    with contextlib.suppress(OSError):
                        self.accept(sock, [wake_r, wake_w])
                else:
                    with contextlib.suppress(OSError):
                        os.read(wake_r, 512)
                    self.reap()

    def accept(self, sock: socket.socket, own: Sequence[int]) -> None:
        conn, _ = sock.accept()
        fds: list[int] = []
        try:
            if _peer_uid(conn) != os.getuid():
                _send(conn, {"error": "refused: another user"})
                conn.close()
                return
            msg, fds = _receive(conn)
            argv = json.loads(msg)["argv"]
            if len(fds) != FDS or not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
                raise ValueError("expected argv and three descriptors")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            _send(conn, {"error": f"bad request: {exc}"})
            conn.close()
            for fd in fds:
                os.close(fd)
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            others = [c.fileno() for c in self.waiting.values()]
            _starter(argv, fds, close=[sock.fileno(), conn.fileno(), *own, *others])
        for fd in fds:
            os.close(fd)
        self.waiting[pid] = conn
        _send(conn, {"pid": pid})

    def reap(self) -> None:
        while self.waiting:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.waiting.pop(pid, None)
            if conn is not None:
                code = os.waitstatus_to_exitcode(status)
                _send(conn, {"exit": code if code >= 0 else 128 - code})
                conn.close()


def _receive(conn: socket.socket) -> tuple[bytes, list[int]]:
    fds = array.array("i")
    msg, anc, _, _ = conn.recvmsg(MAX_REQUEST, socket.CMSG_LEN(FDS * fds.itemsize))
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - (len(data) % fds.itemsize)])
    while msg and not msg.endswith(b"\n") and len(msg) < MAX_REQUEST:
        more = conn.recv(MAX_REQUEST)
        if not more:
            break
        msg += more
    return msg, list(fds)


def shim_title(argv: Sequence[str]) -> str:
    """The command line of ``python -m ferry.criu.shim ARGV``, as one string."""
    return " ".join([sys.executable, "-m", "ferry.criu.shim", *argv])


def _starter(argv: list[str], fds: list[int], close: Sequence[int]) -> None:
    """In the forked child: the request's descriptors as 0, 1, 2, the zygote's own closed, the
    signals as a new process has them; then the shim, as ``python -m ferry.criu.shim`` would."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in {*fds, *close} - {0, 1, 2}:
            with contextlib.suppress(OSError):
                os.close(fd)
        sys.argv = ["ferry.criu.shim", *argv]
        # the command line a new interpreter would have: `ps` shows what the fork is, and a node
        # service that restarts finds a restore still under way by it (ferry.node.procs.restores_of)
        setproctitle.setproctitle(shim_title(argv))
        code = shim.main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:  # whatever it is, the client hears it and the child ends
        with contextlib.suppress(OSError):
            os.write(2, f"ferry-shim: {type(exc).__name__}: {exc}\n".encode())
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def main(args: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ferry.criu.zygote_server", description=__doc__.split("\n")[0])
    parser.add_argument("--socket", required=True, type=Path)
    parser.add_argument("--ready-fd", type=int, help="write a line here once it listens")
    ns = parser.parse_args(args)
    set_parent_death_signal(signal.SIGTERM)
    server = Server(ns.socket)
    try:
        server.serve(server.listen(), ns.ready_fd)
    finally:
        ns.socket.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
