"""The one results writer of the benchmarks, and their correctness checks.

A benchmark's results are a list of flat rows (dicts), one per case. :func:`write_report` writes them as
``<name>.csv`` (one column per field), ``<name>.md`` (the lines given: header, tables, notes) and, given a
:class:`Plot`, ``<name>.png`` (needs matplotlib; skipped with a note otherwise). :func:`markdown_table`
and :func:`fmt` make the tables.

Correctness checks: every benchmarked case records each check it made as a boolean field (e.g.
``"byte_exact": torch.equal(...)`` through :func:`outputs_equal`). :func:`check_failures` lists the cases
where a required check is False *or missing* (a check that was never made fails), and
:func:`exit_status` turns failures into a message on stderr and exit status 1. The benchmarks print
measurements; they do not grade them against goals (those are stated in docs/performance.md's text).
"""

from __future__ import annotations

import csv
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import torch

Row = Dict[str, object]


def outputs_equal(a: Union[torch.Tensor, Sequence[torch.Tensor]], b: Union[torch.Tensor, Sequence[torch.Tensor]]
                  ) -> bool:
    """Whether two outputs (a tensor or a tuple of tensors) are byte for byte the same: same number of
    tensors, each of the same shape and dtype with equal bytes (so NaNs with equal bits compare equal)."""
    a = (a,) if isinstance(a, torch.Tensor) else tuple(a)
    b = (b,) if isinstance(b, torch.Tensor) else tuple(b)
    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype
        and torch.equal(x.contiguous().reshape(-1).view(torch.uint8), y.contiguous().reshape(-1).view(torch.uint8))
        for x, y in zip(a, b))


def check_failures(rows: Iterable[Row], required: Union[Sequence[str], Callable[[Row], Sequence[str]]],
                   case: Callable[[Row], str]) -> List[str]:
    """``"<case>: <check> failed"`` or ``"<case>: <check> not checked"`` for every row and required check
    that is not True. ``required``: the check fields of every row, or a function of the row naming them
    (for checks that apply to some rows only); ``case`` names a row."""
    failures = []
    for r in rows:
        for key in (required(r) if callable(required) else required):
            if key not in r:
                failures.append(f"{case(r)}: {key} not checked")
            elif r[key] is not True:
                failures.append(f"{case(r)}: {key} failed")
    return failures


def exit_status(failures: Sequence[str], what: str) -> int:
    """0 when there are no failures, else 1 after printing them to stderr under ``check failed: <what>``
    (one line per failure, then what the exit status means)."""
    if not failures:
        return 0
    print(f"check failed: {what}:\n  " + "\n  ".join(failures)
          + "\nexit status 1: a correctness check failed (the measurements were written all the same)",
          file=sys.stderr)
    return 1


def fmt(v: object, spec: str) -> str:
    """``format(v, spec)``, "n/a" for a non-finite float or None."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    return format(v, spec)


def yes_no(v: object) -> str:
    """"yes" for True, "NO" for anything else (a failed or missing check shows)."""
    return "yes" if v is True else "NO"


def markdown_table(columns: Sequence[str], cells: Iterable[Sequence[object]]) -> List[str]:
    """A markdown table: the header of ``columns``, its separator, then one line per row of ``cells``."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in cells]


def write_csv(path: Path, rows: Sequence[Row], fields: Optional[Sequence[str]] = None) -> None:
    """``rows`` as CSV, one column per field (default: every key of the rows, in first-seen order), empty
    where a row lacks one."""
    if fields is None:
        fields = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(fields), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in fields})


@dataclass
class Plot:
    """A line plot of the rows: ``y`` of each series against ``x`` (log scale), one panel per value of
    ``panel``, with an optional horizontal line (``hline``: value, label)."""

    x: str
    panel: str
    series: Mapping[str, str]  # label -> field
    xlabel: str
    ylabel: str
    title: str
    hline: Optional[Tuple[float, str]] = None
    panel_label: str = ""  # the panel field's name in titles (default: the field)


def write_png(path: Path, rows: Sequence[Row], plot: Plot) -> Optional[str]:
    """Draw ``plot`` of ``rows`` into ``path``; None, or why it was skipped (no matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return f"matplotlib is not installed: {path.name} skipped (pip install matplotlib)"
    panels = sorted({r[plot.panel] for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.8), squeeze=False)
    styles = ("o-", "s-", "^-", "d-", "v-", "x-")
    for ax, p in zip(axes[0], panels):
        sub = sorted((r for r in rows if r[plot.panel] == p), key=lambda r: r[plot.x])
        xs = [r[plot.x] for r in sub]
        for (label, key), style in zip(plot.series.items(), styles):
            ys = [r.get(key, float("nan")) for r in sub]
            if any(isinstance(y, float) and math.isfinite(y) for y in ys):
                ax.plot(xs, ys, style, label=label)
        if plot.hline is not None:
            ax.axhline(plot.hline[0], color="k", linestyle="--", label=plot.hline[1])
        ax.set_xscale("log")
        ax.set_xlabel(plot.xlabel)
        ax.set_ylabel(plot.ylabel)
        ax.set_title(f"{plot.panel_label or plot.panel} = {p}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(plot.title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def write_report(out_dir: Path, name: str, rows: Sequence[Row], md_lines: Sequence[str],
                 fields: Optional[Sequence[str]] = None, plot: Optional[Plot] = None) -> List[Path]:
    """Write ``<out_dir>/<name>.csv`` (``rows``, :func:`write_csv`), ``<name>.md`` (``md_lines``) and, with
    ``plot``, ``<name>.png``; print what was written (or why the plot was skipped) and return the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / f"{name}.csv", out_dir / f"{name}.md"]
    write_csv(written[0], rows, fields)
    written[1].write_text("\n".join(md_lines) + "\n")
    if plot is not None:
        skipped = write_png(out_dir / f"{name}.png", rows, plot)
        if skipped:
            print(skipped)
        else:
            written.append(out_dir / f"{name}.png")
    print("wrote " + ", ".join(str(p) for p in written))
    return written
