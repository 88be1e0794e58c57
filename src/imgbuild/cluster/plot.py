"""Bus bandwidth against message size, for people who would rather look than read a table.

matplotlib is imported here only, when a plot is asked for (Agg: no display needed), so the rest of imgbuild does
not pay for it.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from imgbuild.core.errors import OutputError
from imgbuild.nccltests.log import Measurement
from imgbuild.nccltests.verdict import Report, human_size

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def png(rep: Report) -> bytes:
    """A PNG: out-of-place and in-place bus bandwidth of each result table against message size (log-2 axis), the
    published figures as a dashed line with their pass floor, the verdict in the title. A log without result rows
    gets a plot that says so (a CI job that keeps the plot keeps one for every run). OutputError without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError as exc:
        raise OutputError(f"--plot needs matplotlib, which is not installed ({exc}): pip install matplotlib") from None

    tables = [t for t in rep.log.tables if any(r.size > 0 for r in t.rows)]
    versions = ", ".join(rep.log.nccl_versions) or "not in the log"
    name = rep.source if rep.source.startswith("<") else Path(rep.source).name
    title = f"{name}\n{rep.verdict}: NCCL {versions}"
    if len(tables) > _MAX_TABLES:
        title += f" (the first {_MAX_TABLES} of {len(tables)} result tables)"
    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=110)
    try:
        if not tables:
            ax.text(0.5, 0.5, "no nccl-tests result rows in the log", ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
            ax.set_title(title, fontsize="medium")
            return _png(fig)
        for k, t in enumerate(tables[:_MAX_TABLES], 1):
            rows = [r for r in t.rows if r.size > 0]  # size 0 has no place on a log axis
            tag = "" if len(tables) == 1 else f" ({t.collective or f'table {k}'})"
            sizes = [r.size for r in rows]
            ax.plot(sizes, [_level(r.out_of_place) for r in rows], marker="o", ms=3, label=f"out-of-place{tag}")
            ax.plot(sizes, [_level(r.in_place) for r in rows], marker="s", ms=3, ls="--", label=f"in-place{tag}")
        where = f"{rep.nodes}x {rep.instance_type}"
        for n, check in enumerate(sorted(rep.bandwidth, key=lambda c: c.size)):
            # Each published figure as a short level one octave either side of its size, its pass floor beneath.
            span = (check.size / 2, check.size * 2)
            levels: tuple[tuple[float, str, Literal["--", ":"], str], ...] = (
                (check.published, "black", "--", f"published, {where}"),
                (check.floor, "grey", ":", f"pass floor (-{rep.tolerance:.0%})"),
            )
            for level, colour, style, label in levels:
                # Legend entries once: matplotlib leaves out labels that start with an underscore.
                ax.hlines(level, *span, colors=colour, linestyles=style, lw=1.2, label=label if n == 0 else "_")
            ax.plot([check.size], [check.published], "o", color="black", zorder=3)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: human_size(int(x)) if x >= 1 else ""))
        ax.tick_params(axis="x", labelrotation=45)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("message size")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(loc="upper left", fontsize="small")
        ax.set_title(title, fontsize="medium")
        return _png(fig)
    finally:
        plt.close(fig)


# More lines than this make a plot nobody can read (and a legend that takes longer to lay out than the log to read).
_MAX_TABLES = 8


def _level(m: Measurement) -> float:
    """The bus bandwidth to draw: a gap (nan) where the log printed nan, inf or a negative number."""
    return m.busbw if m.sound else math.nan


def _png(fig: Figure) -> bytes:
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
