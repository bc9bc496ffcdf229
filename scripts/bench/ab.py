#!/usr/bin/env python3
"""Before/after in one run: a benchmark run from two checkouts, interleaved round by round.

    .venv/bin/python scripts/bench/ab.py --before /path/old --after /path/new --rounds 3 \\
        --out /tmp/ab.md [--transport-only T1,T3,T4,T5,T6,T8,T9] [--skip-write-loop]

Each round runs ``scripts/bench/transport_t.py --reps 1`` and ``scripts/bench/write_loop.py``
once from each checkout (before, after; the order alternates every round so that neither side
always runs on a warmer machine). The bench scripts are the *after* checkout's (so both sides
are measured the same way), run with the working directory and ``PYTHONPATH`` of the checkout
under test: the daemons they start import ``airfs`` from there. The report gives, for every
row, the median over the rounds of each side and after/before; a row's ratio column is the
row's own ratio against its baseline measured in the same invocation (so a slower machine in
one round moves both the value and its baseline).

Never run in CI; run it on a quiet machine (anything else running moves the numbers more than
most changes do).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_one(tree: Path, script: str, args: list[str], out: Path) -> Any:
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, str(HERE / script), *args, "--json", str(out)]
    log(f"{tree.name}: {script} {' '.join(args)}")
    p = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if p.returncode != 0 or not out.exists():
        log(f"  failed (exit {p.returncode}): {p.stderr.strip().splitlines()[-3:]}")
        return None
    return json.loads(out.read_text())


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, type=Path)
    ap.add_argument("--after", required=True, type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--transport-only", default="T1,T3,T4,T5,T6,T8,T9")
    ap.add_argument("--transport-args", default="", help="more transport_t.py options")
    ap.add_argument("--skip-write-loop", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    sides = {"before": a.before.resolve(), "after": a.after.resolve()}
    # (row key) -> side -> list of (value, ratio)
    t_rows: dict[str, dict[str, list[tuple[float, float]]]] = {}
    t_info: dict[str, tuple[str, str, str]] = {}
    w_rows: dict[str, dict[str, list[tuple[float, float]]]] = {}
    w_unit: dict[str, str] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="airfs-ab-") as tmp:
        for rnd in range(a.rounds):
            order = ["before", "after"] if rnd % 2 == 0 else ["after", "before"]
            for side in order:
                tree = sides[side]
                targs = ["--only", a.transport_only, "--reps", "1", *a.transport_args.split()]
                rows = run_one(tree, "transport_t.py", targs, Path(tmp) / f"t{rnd}{side}.json")
                for r in rows or []:
                    for tr, v in r["vals"].items():
                        key = f"{r['num']} {tr}"
                        t_info[key] = (r["scen"], r["unit"], r["base"])
                        ratio = v / r["bv"] if r["bv"] else float("nan")
                        t_rows.setdefault(key, {}).setdefault(side, []).append((v, ratio))
                if a.skip_write_loop:
                    continue
                rows = run_one(tree, "write_loop.py", [], Path(tmp) / f"w{rnd}{side}.json")
                for r in rows or []:
                    w_unit[r["case"]] = r["unit"]
                    w_rows.setdefault(r["case"], {}).setdefault(side, []).append(
                        (r["rate"], r["stall_p99_ms"])
                    )
    out = [
        f"A/B run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {a.rounds} rounds "
        f"interleaved, {(time.monotonic() - started) / 60:.1f} min; before = `{sides['before']}`, "
        f"after = `{sides['after']}`. Medians over the rounds.",
        "",
        "| row | transport | scenario | before | after | after/before | before ratio | "
        "after ratio | baseline |",
        "|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for key, by in t_rows.items():
        num, tr = key.split(" ", 1)
        scen, unit, base = t_info[key]
        bv = med([v for v, _ in by.get("before", [])])
        av = med([v for v, _ in by.get("after", [])])
        br = med([r for _, r in by.get("before", [])])
        ar = med([r for _, r in by.get("after", [])])
        out.append(
            f"| {num} | {tr} | {scen} | {bv:,.1f} {unit} | {av:,.1f} {unit} | {av / bv:.2f}x | "
            f"{br:.2f}x | {ar:.2f}x | {base} |"
        )
    if w_rows:
        out += [
            "",
            "| write_loop case | before | after | after/before | loop stall p99 before | after |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for case, by in w_rows.items():
            bv = med([v for v, _ in by.get("before", [])])
            av = med([v for v, _ in by.get("after", [])])
            bs = med([s for _, s in by.get("before", [])])
            as_ = med([s for _, s in by.get("after", [])])
            u = w_unit[case]
            out.append(
                f"| {case} | {bv:,.0f} {u} | {av:,.0f} {u} | {av / bv:.2f}x | {bs:.2f} ms | "
                f"{as_:.2f} ms |"
            )
    text = "\n".join(out) + "\n"
    print(text)
    if a.out:
        Path(a.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
