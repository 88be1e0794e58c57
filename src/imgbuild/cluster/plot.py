"""Bus bandwidth against message size, for people who would rather look than read a table.

matplotlib is imported here only, when a plot is asked for (Agg: no display needed), so the rest of imgbuild does
not pay for it.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Literal

from imgbuild.cluster.report import Report, human_size
from imgbuild.errors import VerifyError


def png(rep: Report) -> bytes:
    """A PNG: out-of-place and in-place bus bandwidth of each result table against message size (log-2 axis), the
    published figures as a dashed line with their pass floor, the verdict in the title."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError as exc:
        raise VerifyError(
            f"--plot needs matplotlib, which is not installed ({exc})", hint="pip install matplotlib"
        ) from None

    tables = [t for t in rep.log.tables if any(r.size > 0 for r in t.rows)]
    if not tables:
        raise VerifyError(f"{rep.source}: nothing to plot: the log has no nccl-tests result rows")

    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=110)
    try:
        for k, t in enumerate(tables, 1):
            rows = [r for r in t.rows if r.size > 0]  # size 0 has no place on a log axis
            tag = "" if len(tables) == 1 else f" ({t.collective or f'table {k}'})"
            sizes = [r.size for r in rows]
            ax.plot(sizes, [r.out_of_place.busbw for r in rows], marker="o", ms=3, label=f"out-of-place{tag}")
            ax.plot(sizes, [r.in_place.busbw for r in rows], marker="s", ms=3, ls="--", label=f"in-place{tag}")
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
        versions = ", ".join(rep.log.nccl_versions) or "not in the log"
        name = rep.source if rep.source.startswith("<") else Path(rep.source).name
        ax.set_title(f"{name}\n{rep.verdict}: NCCL {versions}", fontsize="medium")
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return buf.getvalue()
    finally:
        plt.close(fig)
