"""The result records of ``perfile.py`` and what is made of them: the markdown table, the JSON
document and one PNG bar chart per table (matplotlib, bars as ratios to the local disk)."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from perfile_sys import COLUMNS


@dataclass(frozen=True)
class Row:
    """One measured row. ``samples`` maps a column of :data:`COLUMNS` to its samples (one per
    repetition, A/B interleaved); ``local`` is the baseline of every ratio. ``target`` is the
    issue's bound on the kernel transport: a ratio to local disk (``higher``: at least, else:
    at most, for times), an absolute value with ``absolute`` (accelerator utilisation), or
    None (report only). Where JuiceFS was measured, the kernel column must also be ahead."""

    key: str
    table: str
    #: short label (chart axis)
    label: str
    scenario: str
    unit: str
    samples: dict[str, list[float]]
    target: float | None
    higher: bool = True
    absolute: bool = False
    notes: tuple[str, ...] = field(default=())
    #: columns whose figure is an upper bound (the pass was killed at its deadline)
    upper: tuple[str, ...] = ()

    def value(self, col: str) -> float | None:
        s = self.samples.get(col)
        return statistics.median(s) if s else None

    def ratio(self, col: str) -> float | None:
        v, base = self.value(col), self.value("local")
        return None if v is None or not base else v / base

    def met(self) -> bool | None:
        if self.target is None:
            return None
        x = self.value("airfs-kernel") if self.absolute else self.ratio("airfs-kernel")
        if x is None:
            return False
        return x >= self.target if self.higher else x <= self.target

    def ahead_of_juicefs(self) -> bool | None:
        k, j = self.value("airfs-kernel"), self.value("JuiceFS")
        if j is None:
            return None
        if k is None:
            return False
        return k > j if self.higher else k < j

    def target_text(self) -> str:
        if self.target is None:
            return "report"
        if self.absolute:
            return f"AU >= {self.target:.2f}"
        return f">= {self.target:g}x" if self.higher else f"<= {self.target:g}x (time)"


def _num(v: float | None, unit: str) -> str:
    if v is None:
        return "—"
    if unit == "AU":
        return f"{v:.2f}"
    if unit == "s":
        return f"{v:.2f} s"
    return f"{v:,.0f}" if v >= 100 else f"{v:,.1f}"


def _yn(b: bool | None) -> str:
    return "—" if b is None else ("yes" if b else "**no**")


RATIO_COLS = ("airfs-kernel", "airfs-pyfuse3", "JuiceFS")


def table(rows: list[Row]) -> str:
    head = (
        "| row | unit | airfs kernel | airfs pyfuse3 | local disk | JuiceFS | kernel / local "
        "| pyfuse3 / local | JuiceFS / local | target (kernel) | met | ahead of JuiceFS |"
    )
    out = [head, "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]
    for r in rows:
        ratios = [r.ratio(c) for c in RATIO_COLS]

        def lt(c: str, r: Row = r) -> str:
            return "< " if c in r.upper else ""

        out.append(
            f"| {r.scenario} | {r.unit} | "
            + " | ".join(lt(c) + _num(r.value(c), r.unit) for c in COLUMNS)
            + " | " + " | ".join("—" if x is None else f"{lt(c)}{x:.2f}x"
                                  for c, x in zip(RATIO_COLS, ratios, strict=True))
            + f" | {r.target_text()} | {_yn(r.met())} | {_yn(r.ahead_of_juicefs())} |"
        )  # fmt: skip
    return "\n".join(out)


def samples_text(rows: list[Row]) -> str:
    return "\n".join(f"- {r.key} {c}: " + ", ".join(f"{x:,.3g}" for x in s)
                     for r in rows for c, s in r.samples.items())  # fmt: skip


def as_json(rows: list[Row], meta: dict[str, Any]) -> dict[str, Any]:
    return {**meta, "rows": [{**asdict(r), "median": {c: r.value(c) for c in r.samples},
                              "ratio_to_local": {c: r.ratio(c) for c in r.samples},
                              "met": r.met(), "ahead_of_juicefs": r.ahead_of_juicefs()}
                             for r in rows]}  # fmt: skip


COLOURS = {"airfs-kernel": "#1f77b4", "airfs-pyfuse3": "#9ecae1", "JuiceFS": "#ff7f0e",
           "local": "#2ca02c"}  # fmt: skip


def chart(rows: list[Row], path: Path, title: str) -> None:
    """Horizontal grouped bars, one group per row: each system's ratio to the local disk (log
    scale; local disk is 1.0), with the kernel target as a mark."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = ["airfs-kernel", "airfs-pyfuse3", "JuiceFS", "local"]
    h = 0.8 / len(cols)
    fig, ax = plt.subplots(figsize=(9, 0.9 + 0.75 * len(rows)))
    for i, c in enumerate(cols):
        ys, xs = [], []
        for j, r in enumerate(rows):
            x = r.ratio(c)
            if x is not None and x > 0 and not r.higher:
                x = 1 / x
            if x is not None and x > 0:
                ys.append(j + (i - 1.5) * h)
                xs.append(x)
        if ys:
            ax.barh(ys, xs, height=h, color=COLOURS[c], label=c.replace("local", "local disk"))
    for j, r in enumerate(rows):
        if r.target is not None and not r.absolute:
            t = r.target if r.higher else 1 / r.target
            ax.plot([t, t], [j - 0.45, j + 0.45], color="black", lw=1.5, ls="--")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r.label for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.axvline(1.0, color="#2ca02c", lw=0.8)
    ax.set_xlabel("ratio to local disk (time rows: local time / time, so longer is better);"
                  " dashed: kernel target", fontsize=8)  # fmt: skip
    ax.set_title(title, fontsize=10, pad=24)
    ax.legend(fontsize=8, ncol=4, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
