"""Value types and usage errors for ``airfs`` commands: sizes, seconds, counts, modes and the
``--metrics`` address, each turning bad input into an :class:`argparse.ArgumentTypeError` that
names what is wrong; the parser class whose errors are one line and exit 2; the rewriting that
lets a negative value reach its option's type; and :func:`fail`, the one-line failure (exit 1)
every command reports through.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from typing import NoReturn

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"50G"``, ``"512MiB"``, ``"1073741824"`` → bytes (powers of 1024)."""
    m = _SIZE.match(str(text))
    if not m:
        if str(text).strip().startswith("-"):
            raise argparse.ArgumentTypeError(f"a size cannot be negative: {text!r}")
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 50G, 512M)")
    mult = 1024 ** "_kmgtp".index(m.group(2).lower() or "_")
    return int(float(m.group(1)) * mult)


def positive_size(text: str) -> int:
    """A size of at least one byte (a limit of 0 would make the mount useless)."""
    n = parse_size(text)
    if n <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text!r}")
    return n


def seconds(text: str) -> float:
    """A finite number of seconds, 0 or more."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text!r}")
    return v


def positive_seconds(text: str) -> float:
    """A finite number of seconds, more than 0 (a timeout)."""
    v = seconds(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text!r}")
    return v


def metrics_address(text: str) -> str:
    """``[ADDR:]PORT`` for ``--metrics``, normalised to ``ADDR:PORT``."""
    from airfs.obs.metrics import parse_address

    try:
        host, port = parse_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def positive_int(text: str) -> int:
    """A whole number of at least 1 (``warm -j``)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return v


class Parser(argparse.ArgumentParser):
    """Usage errors are one line (``airfs mount: error: ...``) and exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def join_negative_values(argv: list[str]) -> list[str]:
    """``--cache-size -5G`` → ``--cache-size=-5G``, so that argparse hands a negative value to
    the option's type (which says what is wrong) instead of taking it for an unknown option.
    No airfs option starts with a digit, so ``-<digit>...`` is always a value."""
    out: list[str] = []
    for arg in argv:
        prev = out[-1] if out else ""
        if _NEGATIVE.match(arg) and prev.startswith("-") and "=" not in prev and prev != "--":
            out[-1] = f"{prev}={arg}"
        else:
            out.append(arg)
    return out


_NEGATIVE = re.compile(r"^-\.?\d")


def fail(msg: str, code: int = 1) -> int:
    """Print ``airfs: MSG`` on stderr; return ``code`` (the command's exit code)."""
    print(f"airfs: {msg}", file=sys.stderr)
    return code


def octal_mode(text: str) -> int:
    """An octal permission mode, ``000`` to ``777`` (``--s3-default-mode``)."""
    try:
        mode = int(text, 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an octal mode (e.g. 640)") from None
    if not 0 <= mode <= 0o777:
        raise argparse.ArgumentTypeError(f"{text!r} is not a mode between 000 and 777")
    return mode
