"""What every benchmark's plots share: where they are written and how bars
are drawn so that people can read them — value labels on the bars, axes
from zero, and a reference (a single-process ceiling, a target) drawn as a
line, or named at the top when it would flatten the bars, never as a bar.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / (
    "gridstream-bench/out")
"""Where results go by default: outside the repository, so a run never
leaves files in the checkout."""

REFERENCE_FITS = 1.6
"""A reference line is drawn on the axis when it is at most this many times
the tallest bar; above, it would squash the bars, and is named at the top."""


def add_out_argument(parser: argparse.ArgumentParser) -> None:
    """``--out DIR``: where the tables and plots go."""
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"directory for tables and plots (default {DEFAULT_OUT})")


def out_dir(path: Path) -> Path:
    """The output directory, created."""
    path = path.expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def si(value: float) -> str:
    """``1.2M``, ``350k``, ``42``, ``0.35``: short labels for bars and axes."""
    for bound, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= bound:
            return f"{value / bound:.3g}{suffix}"
    return f"{value:.3g}"


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


Reference = tuple[str, float, str]
"""``(label, value, colour)``: a figure to compare the bars with (a
single-process ceiling, a target), never drawn as a bar."""


def bars(ax: Any, labels: Sequence[str], values: Sequence[float], colors: Sequence[str],
         fmt: Callable[[float], str] = si, references: Sequence[Reference] = ()
         ) -> None:
    """Vertical bars with their values on top, the y axis from zero, and
    each reference as a dashed line across the panel, or, when it would
    flatten the bars, as a note at the top giving its value and its ratio to
    the tallest bar."""
    from matplotlib.ticker import FuncFormatter

    drawn = ax.bar(labels, values, color=colors)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: si(v)))
    ax.bar_label(drawn, labels=[fmt(v) for v in values], padding=2, fontsize=8)
    _references(ax, values, fmt, references, vertical=True)


def hbars(ax: Any, labels: Sequence[str], values: Sequence[float], colors: Sequence[str],
          fmt: Callable[[float], str] = si, references: Sequence[Reference] = (),
          texts: Sequence[str] | None = None) -> Any:
    """Horizontal bars, first label at the top, each labelled at its end
    (``texts``, else ``fmt`` of its value), the x axis from zero, and each
    reference as a dashed vertical line, or a note at the top when it would
    flatten the bars. Returns the bars (to hatch some)."""
    from matplotlib.ticker import FuncFormatter

    drawn = ax.barh(labels, values, color=colors)
    ax.invert_yaxis()
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: si(v)))
    ax.bar_label(drawn, labels=list(texts) if texts is not None else [fmt(v) for v in values],
                 padding=3, fontsize=8)
    _references(ax, values, fmt, references, vertical=False)
    return drawn


def _references(ax: Any, values: Sequence[float], fmt: Callable[[float], str],
                references: Sequence[Reference], vertical: bool) -> None:
    """Draws the references along the value axis (y when ``vertical``) and
    sets that axis from zero, with room for the bar labels and the notes."""
    tallest = max(values, default=0.0) or 1.0
    top = tallest
    notes = []
    for label, value, color in references:
        if value <= tallest * REFERENCE_FITS:
            if vertical:
                ax.axhline(value, color=color, ls="--", lw=1.2)
                ax.annotate(f"{label}: {fmt(value)}", (1.0, value),
                            xycoords=("axes fraction", "data"), xytext=(-2, 2),
                            textcoords="offset points", ha="right", va="bottom", fontsize=8,
                            color=color)
            else:  # named at the top: along the line it would cross the bar labels
                ax.axvline(value, color=color, ls="--", lw=1.2)
                notes.append((f"- - {label}: {fmt(value)} (dashed line)", color))
            top = max(top, value)
        else:
            arrow, bar = ("↑", "tallest") if vertical else ("→", "longest")
            notes.append((f"{arrow} {label}: {fmt(value)} ({value / tallest:.1f}x the {bar} "
                          "bar, off scale)", color))
    # Horizontal bars carry long labels (value and ratio): more room at the end.
    room = 1.18 if vertical else 1.45
    for i, (text, color) in enumerate(notes):
        ax.text(0.02 if vertical else 0.98, 0.98 - 0.07 * i, text, transform=ax.transAxes,
                ha="left" if vertical else "right", va="top", fontsize=8, color=color)
    if vertical:
        ax.set_ylim(0, top * (room + 0.12 * len(notes)))
    else:
        ax.set_xlim(0, top * room)
        if notes:  # the notes sit above the first bar
            low, high = ax.get_ylim()
            ax.set_ylim(low, high - 0.9 * len(notes))


def lines(ax: Any, x: Sequence[float], series: Sequence[tuple[str, Sequence[float], str]],
          fmt: Callable[[float], str] = si, references: Sequence[Reference] = ()) -> None:
    """Series over ``x`` as lines with a marker at each point (``(label,
    values, colour)``, named in a legend), the y axis from zero, and each
    reference as a dashed line across the panel, or, when it would flatten
    the lines, as a note at the top with its ratio to the highest point. The
    legend sits above the panel's top right corner, clear of the lines and
    the references' labels (give the panel a title on the left)."""
    import math

    from matplotlib.ticker import FuncFormatter

    for label, values, color in series:
        ax.plot(x, values, marker="o", ms=3, lw=1.4, color=color, label=label)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: si(v)))
    points = [v for _, values, _ in series for v in values if math.isfinite(v)]
    _references(ax, points, fmt, references, vertical=True)
    ax.legend(fontsize=8, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=len(series),
              frameon=False, borderaxespad=0.2)
