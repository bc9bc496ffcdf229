"""CLI pieces that need no mount: size parsing, the fstab option translation, the parser."""

from __future__ import annotations

import argparse

import pytest

from airfs.cli import build_parser, parse_size
from airfs.fstab import to_cli_args


@pytest.mark.parametrize(
    ("text", "value"),
    [("1024", 1024), ("4k", 4096), ("50G", 50 << 30), ("512MiB", 512 << 20), ("1.5g", 3 << 29)],
)
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "ten", "5X", "-1G"])
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
