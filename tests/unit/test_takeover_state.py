"""The state a daemon leaves for the one taking its FUSE connection over
(:mod:`airfs.fuse.kernel.takeover`), without a kernel: what is written is read back, a
record torn by the kill is ignored, compaction keeps the state, and a state that cannot be
used is refused with its reason."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from airfs.fuse.kernel.handover import servable
from airfs.fuse.kernel.negotiate import Negotiated
from airfs.fuse.kernel.takeover import StateLog, TakeoverRefused, load, state_dir
from airfs.origin.base import Kind

NEG = Negotiated(protocol="7.45", flags=["ASYNC_READ"], max_write=1 << 20, max_pages=256)


def _written(tmp_path: Path) -> StateLog:
    log = StateLog(str(tmp_path))
    log.start()
    log.save_init(NEG)
    log.bound(2, Kind.DIR, "d")
    log.bound(3, Kind.FILE, "d/a")
    log.bound(4, Kind.FILE, "d/b")
    for ino in (2, 3, 3, 4):
        log.looked_up(ino)
    log.forgot([(4, 1)])
    log.dropped(4)
    log.bound(2, Kind.DIR, "e")  # renamed
    log.bound(3, Kind.FILE, "e/a")
    log.opened(7, 3, os.O_RDONLY, None)
    log.opened(8, 3, os.O_RDONLY, 5)
    log.released(8)
    log.opened_dir(9, 2)
    log.flush()
    return log


def test_what_is_written_is_read_back(tmp_path: Path) -> None:
    _written(tmp_path).close()
    st = load(str(tmp_path), servable)
    assert st.negotiated == NEG and st.minor == 45
    assert {i: (n.path, n.kind, n.lookups) for i, n in st.nodes.items()} == {
        2: ("e", Kind.DIR, 1),
        3: ("e/a", Kind.FILE, 2),
    }
    assert {fh: (f.ino, f.flags) for fh, f in st.files.items()} == {7: (3, os.O_RDONLY)}
    assert st.dirs == {9: 2}


def test_unflushed_records_are_not_written_and_a_torn_one_is_ignored(tmp_path: Path) -> None:
    log = _written(tmp_path)
    log.looked_up(2)  # buffered, never flushed: its reply never went out
    path = Path(log.path)
    with open(path, "ab") as f:
        f.write(b"\x03\x02\x00")  # the start of a record the kill cut short
    st = load(str(tmp_path), servable)
    assert st.nodes[2].lookups == 1


def test_compaction_keeps_the_state(tmp_path: Path) -> None:
    log = _written(tmp_path)
    before = load(str(tmp_path), servable)
    log.compact([(1, "", Kind.DIR, 1), (2, "e", Kind.DIR, 1), (3, "e/a", Kind.FILE, 2)])
    log.bound(5, Kind.FILE, "e/c")
    log.looked_up(5)
    log.flush()
    after = load(str(tmp_path), servable)
    assert after.files == before.files and after.dirs == before.dirs
    assert {i: n.lookups for i, n in after.nodes.items()} == {1: 1, 2: 1, 3: 2, 5: 1}


def test_missing_damaged_or_foreign_state_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TakeoverRefused, match="no saved INIT"):
        load(str(tmp_path), servable)
    _written(tmp_path).close()
    init = Path(state_dir(str(tmp_path))) / "init.json"
    raw = json.loads(init.read_text())
    init.write_text(json.dumps({**raw, "version": 99}))
    with pytest.raises(TakeoverRefused, match="state version 99 written by another airfs"):
        load(str(tmp_path), servable)
    init.write_text(json.dumps({**raw, "negotiated": {**raw["negotiated"], "protocol": "7.12"}}))
    with pytest.raises(TakeoverRefused, match=r"negotiated FUSE 7\.12, this one speaks 7\.31"):
        load(str(tmp_path), servable)
    init.write_text(json.dumps(raw))
    log = Path(state_dir(str(tmp_path))) / "log"
    log.write_bytes(b"garbage")
    with pytest.raises(TakeoverRefused, match="state log damaged"):
        load(str(tmp_path), servable)
