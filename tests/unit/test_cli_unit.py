"""CLI pieces that need no mount: size parsing, the fstab option translation, the parser."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from airfs.cli.app import build_parser, join_negative_values, main, parse_size, positive_size
from airfs.cli.fstab import to_cli_args
from airfs.daemon.process import MountError, check_cache_dir, first_leaf


@pytest.mark.parametrize(
    ("text", "value"),
    [("1024", 1024), ("4k", 4096), ("50G", 50 << 30), ("512MiB", 512 << 20), ("1.5g", 3 << 29)],
)
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "ten", "5X", "-1G", "-0"])
def test_parse_size_rejects_garbage(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size(text)


def test_fstab_options_translate_to_cli_args() -> None:
    args = to_cli_args(
        "s3://b/p", "/Volumes", "rw,cache_dir=/c,ttl=2,s3_path_style,_netdev,nofail,x-systemd.y=z"
    )
    assert args == [
        "mount",
        "--origin",
        "s3://b/p",
        "--cache-dir",
        "/c",
        "--ttl",
        "2",
        "--s3-path-style",
        "--quiet",
        "/Volumes",
    ]
    assert to_cli_args("/Volumes", "/Volumes", "defaults")[:2] == ["mount", "--quiet"]


@pytest.mark.parametrize("opts", ["bogus=1", "cache_dir", "ttl"])
def test_fstab_rejects_unknown_or_malformed_options(opts: str) -> None:
    with pytest.raises(ValueError, match="option"):
        to_cli_args("/o", "/m", opts)


def test_parser_defaults() -> None:
    a = build_parser().parse_args(["mount", "/m"])
    assert a.origin is None and a.ttl == 1.0 and a.cache_size == 50 << 30
    assert a.allow_other is None
    assert build_parser().parse_args(["warm", "/m/x", "-j", "256"]).jobs == 256


# -- meaningless values are refused before anything starts --------------------------------


def _usage_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run the CLI; it must exit 2 with exactly one line on stderr, which is returned."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [
        ("--staging-size", "0", "--staging-size: must be more than 0"),
        ("--staging-min-free", "-1M", "--staging-min-free: a size cannot be negative: '-1M'"),
        ("--cache-size", "0", "--cache-size: must be more than 0"),
        ("--cache-size", "-5G", "--cache-size: a size cannot be negative: '-5G'"),
        ("--cache-size", "lots", "--cache-size: not a size"),
        ("--write-wait", "-5", "--write-wait: must be a finite number of seconds >= 0"),
        ("--drain-timeout", "-1", "--drain-timeout: must be a finite number of seconds >= 0"),
        ("--ttl", "-1", "--ttl: must be a finite number of seconds >= 0, got '-1'"),
        ("--ttl", "nan", "--ttl: must be a finite number of seconds >= 0, got 'nan'"),
        ("--ttl", "inf", "--ttl: must be a finite number of seconds >= 0, got 'inf'"),
        ("--ttl", "soon", "--ttl: not a number of seconds"),
        ("--timeout", "0", "--timeout: must be more than 0 seconds"),
    ],
)
def test_mount_refuses_meaningless_values(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, option: str, value: str, words: str
) -> None:
    line = _usage_error(capsys, ["mount", option, value, str(tmp_path)])
    assert line.startswith("airfs mount: error: argument ") and words in line, line
    # the same with option=value
    assert words in _usage_error(capsys, ["mount", f"{option}={value}", str(tmp_path)])


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["warm", "-j", "0", "/x"], "-j/--jobs: must be at least 1, got '0'"),
        (["warm", "-j", "-5", "/x"], "-j/--jobs: must be at least 1, got '-5'"),
        (["warm", "--jobs=many", "/x"], "-j/--jobs: not a whole number"),
        (["flush", "--timeout", "-1", "/x"], "--timeout: must be a finite number of seconds"),
        (["umount", "--timeout", "0", "/x"], "--timeout: must be more than 0 seconds"),
        (["mount", "--bogus", "/x"], "unrecognized arguments: --bogus"),
    ],
)
def test_other_commands_refuse_meaningless_values(
    capsys: pytest.CaptureFixture[str], argv: list[str], words: str
) -> None:
    assert words in _usage_error(capsys, argv)


def test_meaningful_edge_values_are_accepted() -> None:
    a = build_parser().parse_args(
        ["mount", "--ttl", "0", "--write-wait=0", "--drain-timeout", "0", "--cache-size", "1", "/m"]
    )
    assert (a.ttl, a.write_wait, a.drain_timeout, a.cache_size) == (0.0, 0.0, 0.0, 1)


def test_negative_values_reach_their_option() -> None:
    assert join_negative_values(["mount", "--ttl", "-1", "-q", "/m"]) == [
        "mount", "--ttl=-1", "-q", "/m",
    ]  # fmt: skip
    assert join_negative_values(["warm", "-j", "-5", "/m"]) == ["warm", "-j=-5", "/m"]
    # not after a value, nor after "--", nor a non-number
    assert join_negative_values(["--ttl=1", "-5"]) == ["--ttl=1", "-5"]
    assert join_negative_values(["--", "-5"]) == ["--", "-5"]
    assert join_negative_values(["--ttl", "-x"]) == ["--ttl", "-x"]


def test_negative_size_says_what_is_wrong() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="cannot be negative"):
        parse_size("-5G")
    with pytest.raises(argparse.ArgumentTypeError, match="must be more than 0"):
        positive_size("0k")


# -- mount start-up checks (no daemon is started) -----------------------------------------


def _mount_fails(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(["mount", *argv]) == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if line]
    assert len(lines) == 1, lines
    return lines[0]


def test_cache_dir_must_be_a_directory_off_the_mount(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    origin, mnt = tmp_path / "origin", tmp_path / "mnt"
    origin.mkdir()
    mnt.mkdir()
    (tmp_path / "afile").write_text("x")
    o = ["--origin", str(origin)]
    line = _mount_fails(capsys, [*o, "--cache-dir", str(tmp_path / "afile"), str(mnt)])
    assert line == f"airfs: cache dir {tmp_path / 'afile'} is not a directory"
    for inside in (mnt, mnt / "cache", mnt / "a" / "b"):
        line = _mount_fails(capsys, [*o, "--cache-dir", str(inside), str(mnt)])
        assert f"cache dir {inside} is on the mount at {mnt}" in line, line
    line = _mount_fails(capsys, [*o, "--cache-dir", str(origin / "c"), str(mnt)])
    assert f"cache dir {origin / 'c'} is inside the origin {origin}" in line
    # an overlaid mountpoint (no --origin): its cache may not live inside it either
    line = _mount_fails(capsys, ["--cache-dir", str(origin / "c"), str(origin)])
    assert f"is on the mount at {origin}" in line
    # a symlink that leads into the mount is the same thing
    (tmp_path / "link").symlink_to(mnt)
    line = _mount_fails(capsys, [*o, "--cache-dir", str(tmp_path / "link" / "c"), str(mnt)])
    assert "is on the mount at" in line
    assert not (mnt / "cache").exists() and not (origin / "c").exists()


def test_log_file_in_a_missing_directory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    origin, mnt = tmp_path / "origin", tmp_path / "mnt"
    origin.mkdir()
    mnt.mkdir()
    line = _mount_fails(
        capsys,
        ["--origin", str(origin), "--cache-dir", str(tmp_path / "c"),
         "--log-file", str(tmp_path / "nodir" / "x.log"), str(mnt)],
    )  # fmt: skip
    assert line == f"airfs: log file directory {tmp_path / 'nodir'} does not exist"


def test_check_cache_dir_accepts_a_sibling(tmp_path: Path) -> None:
    # a name that only starts like the mountpoint is not inside it
    assert check_cache_dir(str(tmp_path / "mnt-cache"), str(tmp_path / "mnt"), None) is None
    assert check_cache_dir(str(tmp_path / "c"), str(tmp_path / "mnt"), "s3://b/p") is None


def test_daemon_errors_are_reported_without_their_exception_groups() -> None:
    err = MountError("cache dir in use")
    nested = ExceptionGroup("outer", [ValueError("x"), ExceptionGroup("inner", [err])])
    assert first_leaf(nested) is err
    plain = ExceptionGroup("outer", [ExceptionGroup("inner", [KeyError("k")])])
    assert isinstance(first_leaf(plain), KeyError)
    assert first_leaf(err) is err
