"""PNG plots in the style of torch-rnn's benchmark: a metric vs hidden size, one line per
implementation, one panel per layer count (log scale), and under each panel the ratios.

- ``<cell>_time.png``: fwd+bwd ms vs hidden size; below, ``time_<a>/<b>`` ratios;
- ``<cell>_memory.png``: activation MiB vs hidden size; below, ``mem_<a>/<b>`` ratios;
- ``scaling.png``: time and memory vs sequence length (log-log: linear cost is slope 1).
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, NullFormatter  # noqa: E402

from .measure import Table  # noqa: E402
from .report import MIB, columns  # noqa: E402

_PLAIN = FuncFormatter(lambda v, _: f"{v:g}")  # 0.5, 2, 300 instead of 5x10^-1
METRICS = {  # metric -> (column suffix, ratio prefix, axis label, scale)
    "time": ("_ms", "time_", "fwd+bwd time (ms)", 1.0),
    "memory": ("_bytes", "mem_", "activation memory (MiB)", 1 / MIB),
}


def _series(table: Table, suffix: str) -> list[str]:
    return [c.removesuffix(suffix) for c in columns(table) if c.endswith(suffix) and not c.endswith("_peak_bytes")]


def plot_grid(table: Table, out_dir: Path) -> list[Path]:
    """``<cell>_time.png`` and ``<cell>_memory.png`` for every cell in the grid table."""
    paths = []
    for cell in dict.fromkeys(r["cell"] for r in table.rows):
        one_cell = Table(table.name, table.title, [r for r in table.rows if r["cell"] == cell])
        paths += [_plot_metric(one_cell, cell, metric, Path(out_dir)) for metric in METRICS]
    return paths


def _plot_metric(table: Table, cell: str, metric: str, out_dir: Path) -> Path:
    suffix, prefix, label, scale = METRICS[metric]
    rows = table.rows
    layer_counts = sorted({r["layers"] for r in rows})
    impls = _series(table, suffix)
    ratios = [c for c in columns(table) if c.startswith(prefix)]
    fig, axes = plt.subplots(2, len(layer_counts), figsize=(4.2 * len(layer_counts), 7), squeeze=False, sharex=True, sharey="row")
    for j, layers in enumerate(layer_counts):
        sub = sorted((r for r in rows if r["layers"] == layers), key=lambda r: r["hidden"])
        hidden = [r["hidden"] for r in sub]
        top, bottom = axes[0][j], axes[1][j]
        for name in impls:
            _line(top, hidden, [_get(r, name + suffix, scale) for r in sub], name)
        for name in ratios:
            _line(bottom, hidden, [_get(r, name, 1.0) for r in sub], name[len(prefix) :])
        bottom.axhline(1.0, color="gray", linestyle="--", linewidth=0.8)
        top.set_title(f"{cell.upper()}, {layers} layer{'s' if layers > 1 else ''}")
        top.set_ylabel(label if j == 0 else "")
        bottom.set_ylabel("ratio" if j == 0 else "")
        bottom.set_xlabel("hidden size")
        top.set_yscale("log")  # times and bytes span 30x over the grid
        top.yaxis.set_major_formatter(_PLAIN)
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.set_xticks(hidden, [str(h) for h in hidden])
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.grid(True, alpha=0.3)
    axes[0][-1].legend(fontsize=8)
    axes[1][-1].legend(fontsize=8)
    batch, seq = rows[0]["batch"], rows[0]["seq_len"]
    fig.suptitle(f"{cell.upper()} {metric}, batch {batch}, sequence length {seq}")
    fig.tight_layout()
    path = out_dir / f"{cell}_{metric}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_scaling(table: Table, out_dir: Path) -> Path:
    """``scaling.png``: per cell, time and memory vs T for each (implementation, hidden)."""
    cells = list(dict.fromkeys(r["cell"] for r in table.rows))
    fig, axes = plt.subplots(len(cells), 2, figsize=(10, 4 * len(cells)), squeeze=False)
    for i, cell in enumerate(cells):
        rows = [r for r in table.rows if r["cell"] == cell]
        for j, metric in enumerate(METRICS):
            suffix, _, label, scale = METRICS[metric]
            ax = axes[i][j]
            for name in _series(table, suffix):
                for hidden in sorted({r["hidden"] for r in rows}):
                    sub = sorted((r for r in rows if r["hidden"] == hidden), key=lambda r: r["seq_len"])
                    _line(ax, [r["seq_len"] for r in sub], [_get(r, name + suffix, scale) for r in sub], f"{name} H={hidden}")
            ax.set_xscale("log")
            ax.set_yscale("log")
            seq_lens = sorted({r["seq_len"] for r in rows})
            ax.set_xticks(seq_lens, [str(t) for t in seq_lens])
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.yaxis.set_major_formatter(_PLAIN)
            ax.set_xlabel("sequence length T")
            ax.set_ylabel(label)
            ax.set_title(f"{cell.upper()}: {metric} vs T")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(out_dir) / "scaling.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _get(row: dict, column: str, scale: float) -> float:
    value = row.get(column)
    return float("nan") if value is None else value * scale


def _line(ax, xs: Sequence[float], ys: Sequence[float], label: str) -> None:
    ax.plot(xs, ys, marker="o", markersize=3, label=label)
