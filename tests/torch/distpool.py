"""Real ``torch.distributed`` process groups for tests: gloo, CPU, 127.0.0.1.

A :class:`DistPool` forks ``world_size`` processes that join one gloo group and then run the
functions sent to them, so that many tests share one group instead of paying its start-up each
time. Functions must be module-level (they are pickled by reference; the forked children
already have every collected test module imported). :func:`run_group` starts a throwaway group
for tests that break it on purpose (killing a rank).
"""

from __future__ import annotations

import contextlib
import faulthandler
import multiprocessing as mp
import os
import signal
import socket
import time
import traceback
from collections.abc import Callable, Iterator
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

GROUP_TIMEOUT_S = 60.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_group(rank: int, world_size: int, port: int, timeout_s: float = GROUP_TIMEOUT_S) -> None:
    """Join a gloo group on 127.0.0.1:``port`` (sets the torchrun-style environment too)."""
    import torch.distributed as dist

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )


def _after_fork() -> None:
    """What torch's DataLoader does in its forked workers: the parent may have used OpenMP,
    which is not fork-safe, so keep intra-op work on this thread."""
    import torch

    torch.set_num_threads(1)


def _serve(rank: int, world_size: int, port: int, conn: Connection) -> None:
    import torch.distributed as dist

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # stacks on demand (hangs)
    _after_fork()

    try:
        init_group(rank, world_size, port)
    except BaseException:
        conn.send(("err", traceback.format_exc()))
        return
    conn.send(("ok", None))
    while True:
        msg = conn.recv()
        if msg is None:
            break
        fn, args, kwargs = msg
        try:
            conn.send(("ok", fn(*args, **kwargs)))
        except BaseException:
            conn.send(("err", traceback.format_exc()))
    if dist.is_initialized():
        dist.destroy_process_group()


class DistPool:
    """``world_size`` forked processes in one gloo group, running functions on every rank."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.broken = False
        ctx = mp.get_context("fork")
        port = free_port()
        self._conns: list[Connection] = []
        self._procs: list[mp.process.BaseProcess] = []
        for rank in range(world_size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(rank, world_size, port, child))
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
        self._collect(GROUP_TIMEOUT_S)

    def run(
        self, fn: Callable[..., Any], *args: Any, timeout: float = 120.0, **kwargs: Any
    ) -> list[Any]:
        """``fn(*args, **kwargs)`` on every rank; the results by rank. Raises AssertionError
        with every failing rank's traceback (the pool is then marked broken)."""
        if self.broken:
            raise RuntimeError("this DistPool is broken")
        for conn in self._conns:
            conn.send((fn, args, kwargs))
        return self._collect(timeout)

    def _collect(self, timeout: float) -> list[Any]:
        results: list[Any] = []
        errors: list[str] = []
        for rank, (conn, proc) in enumerate(zip(self._conns, self._procs, strict=True)):
            if not conn.poll(timeout):
                self.broken = True
                for p in self._procs:  # dump every rank's stacks to stderr
                    if p.pid is not None and p.is_alive():
                        os.kill(p.pid, signal.SIGUSR1)
                time.sleep(1)
                self.close()
                raise AssertionError(
                    f"rank {rank} gave no answer in {timeout} s (alive: {proc.is_alive()}, "
                    f"exit code: {proc.exitcode})"
                )
            try:
                status, value = conn.recv()
            except EOFError:
                self.broken = True
                errors.append(f"rank {rank} died (exit code {proc.exitcode})")
                continue
            if status == "ok":
                results.append(value)
            else:
                errors.append(f"rank {rank}:\n{value}")
        if errors:
            self.broken = True
            raise AssertionError("\n".join(errors))
        return results

    def close(self) -> None:
        for conn, proc in zip(self._conns, self._procs, strict=True):
            if proc.is_alive():
                with contextlib.suppress(OSError):  # it died meanwhile
                    conn.send(None)
        for proc in self._procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)


def _one_shot(
    rank: int,
    world_size: int,
    port: int,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    conn: Connection,
) -> None:
    _after_fork()
    try:
        init_group(rank, world_size, port, timeout_s=30.0)
        conn.send(("ok", fn(*args)))
    except BaseException:
        conn.send(("err", traceback.format_exc()))


def run_group(
    world_size: int, fn: Callable[..., Any], *args: Any, timeout: float = 120.0
) -> list[tuple[str, Any, int | None]]:
    """Run ``fn(*args)`` on every rank of a fresh group of forked processes, then end them.

    Returns per rank ``(status, value, exitcode)``: status ``"ok"`` (value: the result),
    ``"err"`` (value: the traceback) or ``"died"`` (the process exited without answering)."""
    ctx = mp.get_context("fork")
    port = free_port()
    conns: list[Connection] = []
    procs: list[mp.process.BaseProcess] = []
    for rank in range(world_size):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_one_shot, args=(rank, world_size, port, fn, args, child))
        proc.start()
        child.close()
        conns.append(parent)
        procs.append(proc)
    out: list[tuple[str, Any, int | None]] = []
    try:
        for conn, proc in zip(conns, procs, strict=True):
            if not conn.poll(timeout):
                out.append(("died", "no answer", proc.exitcode))
                continue
            try:
                status, value = conn.recv()
            except EOFError:
                proc.join(5)
                out.append(("died", None, proc.exitcode))
                continue
            out.append((status, value, None))
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
    return out


def shared_pools() -> Iterator[Callable[[int], DistPool]]:
    """The body of the ``dist_pool`` fixtures (torch and tables tests): ``get(n)`` is a
    shared gloo group of ``n`` forked processes, made on first use, remade if a test broke
    it; every group is closed when the generator ends."""
    pools: dict[int, DistPool] = {}

    def get(world_size: int) -> DistPool:
        pool = pools.get(world_size)
        if pool is None or pool.broken:
            if pool is not None:
                pool.close()
            pool = pools[world_size] = DistPool(world_size)
        return pool

    yield get
    for pool in pools.values():
        pool.close()
