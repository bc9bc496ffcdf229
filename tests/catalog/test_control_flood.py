"""A local user flooding the control socket with bad request lines (issue 20 item 13): each
gets a clear error reply, and the daemon's log grows by a few short lines, not by a traceback
per line; a line longer than the limit is refused without being read to its end."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from cattest_util import People, Site, run_as, site

from airfs.control.protocol import MAX_DEPTH, MAX_LINE
from airfs.testing.mountfix import fuse_available

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (useradd, mounts)"),
    pytest.mark.mount,
]


@pytest.fixture
def msite() -> Iterator[Site]:
    if not fuse_available():
        pytest.skip("needs /dev/fuse and fusermount3")
    with site("posix") as s:
        s.mount()
        yield s


FLOOD = """
import socket
from airfs.control.protocol import socket_path
path = socket_path(MP, 0)
def send(data):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    try:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before it was all sent: the reply is waiting
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    finally:
        s.close()
    return json.loads(out.splitlines()[-1])
replies = {}
def note(kind, r):
    key = f"{kind} {r['errno']} {r['error']}"
    replies[key] = replies.get(key, 0) + 1
for i in range(ROUNDS):
    note("deep", send(b"[" * 200000 + b"\\n"))
    note("mixed", send(b'{"op": "warm", "paths": ' + b'[{"a":' * 40 + b"\\n"))
    note("json", send(b'{"op": "status",\\n'))
    note("args", send(b'{"op": "warm", "paths": 5}\\n'))
note("long", send(b" " * (LONG) + b"\\n"))
note("ok", {"errno": 0, "error": send(b'{"op": "status"}\\n')["ok"]})
print(json.dumps(replies))
"""


def test_a_flood_of_bad_lines_gets_error_replies_and_a_bounded_log(
    msite: Site, folks: People
) -> None:
    m = msite.nodes[0]
    before = m.log.stat().st_size
    rounds = 300
    out = run_as(
        folks.alice, m.mountpoint, f"ROUNDS = {rounds}\nLONG = {MAX_LINE + (1 << 20)}\n" + FLOOD
    )
    deep = f"bad request: request nested more than {MAX_DEPTH} levels deep (or unbalanced)"
    want = {
        f"deep 22 {deep}": rounds,
        f"mixed 22 {deep}": rounds,
        "args 22 bad request: paths must be a list": rounds,
        f"long 90 bad request: request line longer than {MAX_LINE} bytes": 1,
        "ok 0 True": 1,
    }
    json_errors = {k: v for k, v in out.items() if k.startswith("json 22 bad request: ")}
    assert sum(json_errors.values()) == rounds, out
    assert {k: v for k, v in out.items() if k not in json_errors} == want, out
    grown = m.log.read_bytes()[before:]
    lines = grown.decode(errors="replace").splitlines()
    bad = [ln for ln in lines if "control: bad request" in ln]
    # 1,201 bad requests: one line per uid per 10 s (this run takes a few seconds)
    assert 1 <= len(bad) <= 3, lines[:20]
    assert len(lines) <= 10 and len(grown) < 4096, lines[:20]
    assert all(len(ln) < 400 for ln in lines), lines
    assert "Traceback" not in grown.decode(errors="replace")
