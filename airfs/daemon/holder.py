"""The holder: a small process that keeps a mount's ``/dev/fuse`` connection open while the
daemons that serve it come and go (``airfs mount --restartable``, kernel transport).

The kernel ends a FUSE connection when the last descriptor of it closes; while the holder
keeps one, a daemon killed with SIGKILL leaves the mount waiting, not dead: the requests
sent meanwhile queue in the kernel, and the next daemon takes the connection over
(:mod:`airfs.fuse.kernel.handover`). The holder:

* starts the first daemon (``python -m airfs.daemon.process CONFIG --holder-fd N``), which
  mounts, reports readiness to ``airfs mount`` as without a holder, and sends the holder the
  ``/dev/fuse`` descriptor (and, for an overlay mount, the directory beneath it) over
  ``SCM_RIGHTS``;
* restarts a daemon that died without saying goodbye (crash take-over), with the descriptors
  passed to it (``--takeover``); more than :data:`MAX_RESTARTS` in :data:`RESTART_WINDOW`
  seconds: it gives up, unmounts, and exits 1 with one log line;
* on ``airfs restart`` (its socket, next to the control socket: ``<key>.holder``, the
  holder's own uid or root only) starts the new daemon at once and tells the old one to
  retire; the new one takes over as soon as the old one let go of the cache dir; the client
  is answered ``OK <seconds>`` once the new daemon serves, or ``ERR <reason>``;
* exits with the daemon's code when a daemon says goodbye (a real unmount).

While a daemon serves, the holder keeps a *standby* daemon started ahead (``--standby``): its
code loaded and its origin open, it waits for the cache dir's lock, which the serving daemon
holds until it dies; then it asks the holder (``ACTIVE``) and takes over (``GO``), unless the
daemon before it said goodbye (``STOP``). A crash take-over therefore starts no process. An
``airfs restart`` stops the standby first (it runs the old code).

Messages on the daemon link (``SOCK_SEQPACKET``, one per datagram): daemon → holder ``FDS``
(with descriptors), ``WAITING``, ``READY``, ``ACTIVE``, ``BYE``; holder → daemon ``RETIRE``,
``GO``, ``STOP``. :class:`Link` is the daemon's end.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field

import trio

from airfs.control.protocol import prepare_dir, runtime_dir, socket_path

log = logging.getLogger("airfs.holder")

#: exit code of a daemon that retired (its connection is handed to the next daemon)
RETIRED = 75
MAX_RESTARTS = 50
RESTART_WINDOW = 60.0


def holder_path(mountpoint: str, *, resolve: bool = True) -> str:
    """The socket ``airfs restart`` asks the holder of ``mountpoint`` through."""
    return socket_path(mountpoint, resolve=resolve).removesuffix(".sock") + ".holder"


# -- the daemon's end ------------------------------------------------------------------------


class Link:
    """The daemon's end of its holder link (the descriptor given as ``--holder-fd``)."""

    def __init__(self, fd: int) -> None:
        self.sock = socket.socket(fileno=fd)
        self.sock.setblocking(True)

    def send(self, msg: str, fds: list[int] | None = None) -> None:
        with contextlib.suppress(OSError):
            if fds:
                socket.send_fds(self.sock, [msg.encode()], fds)
            else:
                self.sock.send(msg.encode())

    def activate(self) -> bool:
        """A standby holding the lock: say so and wait for the holder's word (True: take
        over; False: the daemon before it unmounted, or the holder is gone)."""
        self.send("ACTIVE")
        while True:
            try:
                msg = self.sock.recv(64)
            except OSError:
                return False
            if msg in (b"GO", b"STOP", b""):
                return msg == b"GO"

    async def wait_retire(self) -> None:
        """Return when the holder says RETIRE (or goes away: then the daemon serves on)."""
        while True:
            await trio.lowlevel.wait_readable(self.sock)
            try:
                msg = self.sock.recv(64, socket.MSG_DONTWAIT)
            except BlockingIOError:
                continue
            except OSError:
                await trio.sleep_forever()
            if msg == b"RETIRE":
                return
            if not msg:
                await trio.sleep_forever()


# -- the holder process ------------------------------------------------------------------------


@dataclass(eq=False)
class Child:
    proc: subprocess.Popen[bytes]
    link: socket.socket
    pidfd: int
    started: float = field(default_factory=time.monotonic)
    ready: bool = False
    bye: bool = False
    retiring: bool = False
    eof: bool = False
    #: a standby took over from it (its exit is no longer the mount's business)
    replaced: bool = False


def _readable(sock: socket.socket) -> bool:
    return bool(select.select([sock.fileno()], [], [], 0)[0])


class Holder:
    """The holder's state and loop (one mount)."""

    def __init__(self, cfg_json: str, mountpoint: str, ready_fd: int | None) -> None:
        self.cfg_json = cfg_json
        self.mountpoint = mountpoint
        self.ready_fd = ready_fd
        self.fds: list[int] = []  # the /dev/fuse fd, then the overlay dir fd if any
        self.children: list[Child] = []
        self.current: Child | None = None
        self.crashes: deque[float] = deque()
        self.waiting: list[tuple[socket.socket, float]] = []  # restart clients
        self.listener: socket.socket | None = None
        #: the daemon an ``airfs restart`` replaces, until its successor is ready to take over
        self.retiring: Child | None = None
        #: a daemon started ahead, waiting for the cache dir's lock: it takes over the moment
        #: the serving one dies (no process start in the gap)
        self.standby: Child | None = None
        self.code = 0
        #: never resolved later: the mount's path may be one nobody serves for a while
        self.path = holder_path(mountpoint, resolve=False)

    def spawn(self, takeover: bool, standby: bool = False) -> Child:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        args = [sys.executable, "-m", "airfs.daemon.process", self.cfg_json]
        args += ["--holder-fd", str(theirs.fileno())]
        keep = [theirs.fileno()]
        if takeover:
            args += ["--takeover", ",".join(str(fd) for fd in self.fds)]
            args += ["--standby"] if standby else []
            keep += self.fds
        elif self.ready_fd is not None:
            args += ["--ready-fd", str(self.ready_fd)]
            keep.append(self.ready_fd)
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, pass_fds=keep, close_fds=True)
        theirs.close()
        if not takeover and self.ready_fd is not None:
            os.close(self.ready_fd)
            self.ready_fd = None
        child = Child(proc, ours, os.pidfd_open(proc.pid))
        self.children.append(child)
        what = " as the standby" if standby else " to take over" if takeover else ""
        log.info("daemon pid %d started%s", proc.pid, what)
        return child

    def _drop_standby(self) -> None:
        """Stop the standby (it only waits for the cache dir's lock: nothing to lose)."""
        sb, self.standby = self.standby, None
        if sb is not None and sb in self.children and sb.proc.poll() is None:
            sb.proc.kill()
            sb.proc.wait()

    def _activate(self, sb: Child) -> None:
        """The standby got the cache dir's lock: the daemon before it is gone. It takes over
        unless that daemon said goodbye (a real unmount)."""
        prev = self.current
        if prev is not None and prev is not sb:
            # the lock is let go while the process exits: it may not be a zombie yet
            with contextlib.suppress(subprocess.TimeoutExpired):
                prev.proc.wait(timeout=5)
            while _readable(prev.link) and self._message(prev):
                pass
            if prev.bye or prev.proc.poll() is None:
                with contextlib.suppress(OSError):
                    sb.link.send(b"STOP")
                if self.standby is sb:
                    self.standby = None
                return
            prev.replaced = True
            self._crashed(prev)
        if self.standby is sb:
            self.standby = None
        self.current = sb
        with contextlib.suppress(OSError):
            sb.link.send(b"GO")

    def listen(self) -> None:
        path = self.path
        prepare_dir(runtime_dir(), os.geteuid())
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path)
        os.chmod(path, 0o666)  # callers are checked by their credentials
        sock.listen(4)
        self.listener = sock

    def run(self) -> int:
        self.current = self.spawn(takeover=False)
        try:
            self.listen()
        except OSError as exc:
            log.warning("airfs restart unavailable: holder socket: %s", exc)
        while self.children:
            rl = [c.link.fileno() for c in self.children if not c.eof]
            rl += [c.pidfd for c in self.children]
            if self.listener is not None:
                rl.append(self.listener.fileno())
            ready, _, _ = select.select(rl, [], [], 1.0)
            # messages before exits: a daemon's last words come before its death
            for c in list(self.children):
                if not c.eof and c.link.fileno() in ready and not self._message(c):
                    c.eof = True
            for c in list(self.children):
                if c.pidfd in ready:
                    while _readable(c.link) and self._message(c):
                        pass
                    self._exited(c)
            if self.listener is not None and self.listener.fileno() in ready:
                self._accept()
        self._close()
        return self.code

    def _message(self, c: Child) -> bool:
        """Take one message from ``c``; False at the end of its link (it is gone)."""
        try:
            msg, fds, _, _ = socket.recv_fds(c.link, 64, 4, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not msg and not fds:
            return False
        if msg == b"FDS":
            for fd in self.fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self.fds = list(fds)
        else:
            for fd in fds:
                os.close(fd)
        if msg == b"FDS":
            self._drop_standby()  # it holds the previous connection's descriptors
        if msg == b"WAITING" and c is self.current:
            self._retire()
        elif msg == b"ACTIVE":
            self._activate(c)
        elif msg == b"READY":
            if c is self.current and self.standby is None and self.fds:
                self.standby = self.spawn(takeover=True, standby=True)
            c.ready = True
            for client, t0 in self.waiting:
                self._answer(client, f"OK {time.monotonic() - t0:.3f}")
            self.waiting.clear()
        elif msg == b"BYE":
            c.bye = True
            if c is self.current:
                self._drop_standby()
        return True

    def _exited(self, c: Child) -> None:
        code = c.proc.wait()
        os.close(c.pidfd)
        c.link.close()
        self.children.remove(c)
        if c is self.standby:
            self.standby = None
        if c is not self.current:
            if code not in (RETIRED, 0) and not c.replaced and c.proc.returncode != -9:
                log.warning("daemon pid %d exited with code %d", c.proc.pid, code)
            return
        self.current = None
        if self.retiring is not None and self.retiring in self.children:
            log.warning(
                "the new daemon pid %d exited (code %d) before taking over; the old one serves on",
                c.proc.pid,
                code,
            )
            self.current, self.retiring = self.retiring, None
            self._fail_waiting(f"the new daemon exited with code {code} before taking over")
            return
        if c.bye or not self.fds:
            self.code = code
            self._drop_standby()
            self._fail_waiting("the daemon exited")
            return
        if not self._crashed(c):
            return
        if self.standby is not None and self.standby in self.children:
            self.current = self.standby  # it is taking the lock now; ACTIVE follows
            return
        log.warning("starting a daemon to take over")
        self.current = self.spawn(takeover=True)

    def _crashed(self, c: Child) -> bool:
        """Count the death of ``c``; False when there were too many (the holder gave up)."""
        log.warning("daemon pid %d died (code %s): taking over", c.proc.pid, c.proc.returncode)
        now = time.monotonic()
        self.crashes.append(now)
        while self.crashes and now - self.crashes[0] > RESTART_WINDOW:
            self.crashes.popleft()
        if len(self.crashes) > MAX_RESTARTS:
            log.error(
                "daemon died %d times in %.0fs: giving up, unmounting %s",
                len(self.crashes), RESTART_WINDOW, self.mountpoint,
            )  # fmt: skip
            self._drop_standby()
            self._unmount()
            self.code = 1
            self._fail_waiting("the daemon keeps dying")
            return False
        return True

    def _accept(self) -> None:
        assert self.listener is not None
        try:
            client, _ = self.listener.accept()
        except OSError:
            return
        client.settimeout(5)
        creds = client.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        uid = int.from_bytes(creds[4:8], "little")
        if uid not in (0, os.geteuid()):
            self._answer(client, "ERR only the mount's owner may restart its daemon")
            return
        try:
            cmd = client.recv(64).strip()
        except OSError:
            client.close()
            return
        if cmd != b"restart":
            self._answer(client, f"ERR unknown request {cmd!r}")
            return
        old = self.current
        if old is None or not old.ready or not self.fds:
            self._answer(client, "ERR the daemon is not serving yet; try again")
            return
        self.waiting.append((client, time.monotonic()))
        self._drop_standby()  # it runs the old code, and must not take the lock first
        self.current = self.spawn(takeover=True)
        self.retiring = old  # told to retire once the new one is ready to take over

    def _retire(self) -> None:
        old, self.retiring = self.retiring, None
        if old is not None and old in self.children:
            old.retiring = True
            with contextlib.suppress(OSError):
                old.link.send(b"RETIRE")

    def _answer(self, client: socket.socket, msg: str) -> None:
        with contextlib.suppress(OSError):
            client.sendall(msg.encode() + b"\n")
        client.close()

    def _fail_waiting(self, why: str) -> None:
        for client, _ in self.waiting:
            self._answer(client, f"ERR {why}")
        self.waiting.clear()

    def _unmount(self) -> None:
        from airfs.fuse.kernel.mount import MountFailed, unmount

        try:
            unmount(self.mountpoint)
        except MountFailed as exc:
            log.error("%s", exc)

    def _close(self) -> None:
        if self.listener is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            self.listener.close()
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []


def request_restart(mountpoint: str, timeout: float = 300.0) -> str:
    """Ask the holder of ``mountpoint`` to restart its daemon; its one-line answer
    (``OK <seconds>`` / ``ERR <reason>``). Raises ``OSError`` when no holder answers."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(holder_path(mountpoint))
        s.sendall(b"restart\n")
        out = b""
        while not out.endswith(b"\n"):
            chunk = s.recv(256)
            if not chunk:
                break
            out += chunk
    return out.decode(errors="replace").strip() or "ERR the holder closed the connection"


def main(argv: list[str] | None = None) -> int:
    from .config import MountConfig, pop_option

    args = sys.argv[1:] if argv is None else argv
    ready = pop_option(args, "--ready-fd")
    ready_fd = None if ready is None else int(ready)
    cfg = MountConfig.from_json(args[0])
    return run_holder(args[0], cfg.mountpoint, ready_fd)


def run_holder(cfg_json: str, mountpoint: str, ready_fd: int | None) -> int:
    """Be the holder of the mount ``cfg_json`` describes until it is unmounted (logging to
    stderr: ``airfs mount`` points it at the log file, systemd at the journal)."""
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    return Holder(cfg_json, mountpoint, ready_fd).run()


if __name__ == "__main__":
    sys.exit(main())
