"""The daemon's log file rotates with a size cap (a flood of log lines cannot fill the disk)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from airfs.daemon import process
from airfs.daemon.config import MountConfig


def test_the_log_file_rotates_and_keeps_a_bounded_number_of_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(process, "LOG_MAX_BYTES", 4096)
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    log_file = tmp_path / "airfs.log"
    try:
        process.setup_logging(
            MountConfig("/mnt", None, str(tmp_path), log_file=str(log_file)), False
        )
        for i in range(2000):
            logging.getLogger("airfs.test").warning("line %d %s", i, "x" * 60)
    finally:
        for h in root.handlers:
            h.close()
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["airfs.log", "airfs.log.1", "airfs.log.2", "airfs.log.3"]
    total = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert total <= 4 * 4096
    assert "line 1999 " in log_file.read_text()
