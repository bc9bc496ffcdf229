"""Helpers for the mounted catalog tests: real users and a group (``useradd``/``groupadd``,
removed afterwards), code run as one of them, and governed nodes (root mounts of one origin
whose catalog was set up with ``airfs catalog --origin``).

A user's code runs in a Python process started as root that imports what it needs and then
drops to the user's uid, gid and groups for good: the interpreter lives under ``/root``, which
the users could not exec. Mounts live under a fresh ``/tmp/airfs-cat-*`` directory (0755).
"""

from __future__ import annotations

import contextlib
import grp
import io
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airfs.cli import app as cli
from airfs.origin.base import Origin
from airfs.origin.posix import PosixOrigin
from airfs.testing.mountfix import Mounted, is_mounted, mount, teardown_all


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...] = ()


@dataclass
class People:
    """``alice`` (her own group only), ``bob`` (also in ``group``)."""

    alice: User
    bob: User
    group: str


@contextlib.contextmanager
def people() -> Iterator[People]:
    tag = uuid.uuid4().hex[:8]
    group = f"afcg{tag}"
    made: list[str] = []
    try:
        subprocess.run(["groupadd", group], check=True, capture_output=True)
        for who, extra in (("a", []), ("b", ["-G", group])):
            name = f"afc{who}{tag}"
            subprocess.run(
                ["useradd", "--no-create-home", "--user-group", "--shell", "/bin/false",
                 *extra, name],
                check=True,
                capture_output=True,
            )  # fmt: skip
            made.append(name)
        gid = grp.getgrnam(group).gr_gid
        a, b = (pwd.getpwnam(n) for n in made)
        yield People(
            User(a.pw_name, a.pw_uid, a.pw_gid),
            User(b.pw_name, b.pw_uid, b.pw_gid, (gid,)),
            group,
        )
    finally:
        for n in made:
            subprocess.run(["userdel", n], capture_output=True)
        subprocess.run(["groupdel", group], capture_output=True)


PRELUDE = """
import errno, json, os, sys, time, contextlib, io
import encodings.unicode_escape, socket, struct, argparse, gettext, shutil, grp, pwd, textwrap
import mmap, subprocess
from airfs.cli import app as cli
from airfs.control import client
import airfs.catalog.cli, airfs.catalog.explain
cli.build_parser().format_help()  # everything argparse loads, while /root is readable
{imports}
os.setgroups({groups})
os.setgid({gid})
os.setuid({uid})
os.umask(0o022)

def call(op, **kw):
    try:
        return {{"ok": True, "result": client.request(MP, op, **kw)}}
    except client.ControlError as exc:
        return {{"ok": False, "errno": exc.errno, "error": str(exc)}}

def airfs(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(list(argv))
        except SystemExit as exc:
            code = exc.code
    return [code, out.getvalue(), err.getvalue()]

def attempt(fn, *a, **kw):
    try:
        r = fn(*a, **kw)
        return ["ok", r if isinstance(r, (str, int, float, list, type(None))) else None]
    except OSError as exc:
        return [errno.errorcode.get(exc.errno, str(exc.errno)), str(exc)]
    except Exception as exc:
        return [type(exc).__name__, str(exc)]
"""


def run_as(user: User, mp: Path, code: str, *, imports: str = "", timeout: float = 300) -> Any:
    """Run ``code`` as ``user`` (``MP`` is the mountpoint); return the JSON it printed last."""
    script = PRELUDE.format(imports=imports, uid=user.uid, gid=user.gid, groups=list(user.groups))
    script += f"MP = {str(mp)!r}\n" + textwrap.dedent(code)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=timeout)  # fmt: skip
    assert p.returncode == 0, f"exit {p.returncode}: " + p.stderr[-3000:] + p.stdout[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def airfs_main(*argv: str) -> tuple[int, str, str]:
    """``airfs ARGV`` in this process (root): exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(list(argv))
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


@dataclass
class Origin_:
    kind: str
    spec: str
    view: Origin
    env: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)

    def catalog(self, *argv: str) -> tuple[int, str, str]:
        """``airfs catalog --origin SPEC ARGV`` as root."""
        extra = self.args if self.kind == "s3" else []
        with _env(self.env):
            return airfs_main("catalog", "--origin", self.spec, *extra, *argv)


@contextlib.contextmanager
def _env(env: dict[str, str]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@dataclass
class Site:
    """An origin and its nodes (root mounts with separate caches), under ``base``."""

    base: Path
    origin: Origin_
    nodes: list[Mounted] = field(default_factory=list)

    def mount(self, *args: str) -> Mounted:
        i = len(self.nodes)
        mp = self.base / f"mnt{i}"
        mp.mkdir()
        m = mount(self.origin.spec, mp, self.base / f"cache{i}", "--ttl", "0.5",
                  *self.origin.args, *args, env=self.origin.env)  # fmt: skip
        self.nodes.append(m)
        return m


@contextlib.contextmanager
def site(kind: str, seaweed: Any = None) -> Iterator[Site]:
    base = Path(tempfile.mkdtemp(prefix="airfs-cat-", dir="/tmp"))
    base.chmod(0o755)
    if kind == "posix":
        (base / "origin").mkdir()
        (base / "origin").chmod(0o755)
        spec = str(base / "origin")
        o = Origin_(kind, spec, PosixOrigin(spec))
    else:
        from airfs.origin.s3 import S3Origin

        spec = seaweed.url(f"cat-{uuid.uuid4().hex[:12]}")
        view = S3Origin.from_url(spec, env=seaweed.env)
        o = Origin_(kind, spec, view, dict(seaweed.env), ["--s3-endpoint", seaweed.endpoint])
    s = Site(base, o)
    try:
        yield s
    finally:
        try:
            teardown_all(s.nodes)
        finally:
            o.view.close()
            for m in s.nodes:
                assert not is_mounted(m.mountpoint)
            shutil.rmtree(base, ignore_errors=True)


def put(view: Origin, base: Path, rel: str, data: bytes, mode: int = 0o644) -> None:
    src = base / "src.tmp"
    src.write_bytes(data)
    view.put(rel, str(src), None, mode=mode)
    src.unlink()


def governed(s: Site, p: People) -> None:
    """main.raw.images readable by alice, readable and writable by bob's group; main.raw.secret
    nobody's (but root's); a file in each."""
    o = s.origin
    steps = [
        ["init"],
        ["create-catalog", "main"],
        ["create-schema", "main.raw"],
        ["create-volume", "main.raw.images"],
        ["create-volume", "main.raw.secret"],
        ["grant", "USE CATALOG", "ON", "CATALOG", "main", "TO", p.alice.name],
        ["grant", "USE_CATALOG", "ON", "CATALOG", "main", "TO", f"group:{p.group}"],
        ["grant", "use schema", "ON", "SCHEMA", "main.raw", "TO", p.alice.name],
        ["grant", "USE SCHEMA", "ON", "SCHEMA", "main.raw", "TO", f"group:{p.group}"],
        ["grant", "READ VOLUME", "ON", "VOLUME", "main.raw.images", "TO", p.alice.name],
        ["grant", "READ VOLUME", "ON", "VOLUME", "main.raw.images", "TO", f"group:{p.group}"],
        ["grant", "WRITE VOLUME", "ON", "VOLUME", "main.raw.images", "TO", f"group:{p.group}"],
    ]
    for argv in steps:
        code, out, err = o.catalog(*argv)
        assert code == 0, (argv, out, err)
    put(o.view, s.base, "main/raw/images/a.bin", b"a" * 5000)
    put(o.view, s.base, "main/raw/secret/s.bin", b"s" * 3000)


def dumps(x: Any) -> str:
    return json.dumps(x, sort_keys=True)
