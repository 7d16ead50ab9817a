"""The benchmark page (``docs/benchmarks.md``): the method, then the latest run of each
machine, rebuilt from the result folders.

One folder per machine (e.g. ``docs/bench/xeon``) holds one run's files, as
:func:`lightning_rnn.bench.harness.main` writes them; a new run into a folder replaces
its files, and :func:`write_page` (called by the benchmark with ``bench.page``, or by
``python -m lightning_rnn.bench --write-page ROOT PAGE``) rebuilds the page from every
folder, so the page always shows the latest run per machine.
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path

from .measure import Table
from .report import caption, read_csv

# The tables in the order a run makes them; others follow by name.
TABLE_ORDER = ("grid", "varlen", "scaling", "features", "projection", "alone", "checkpoint_vs_naive",
               "checkpoint_scaling", "packed_epoch", "generation")

RUN_FIELDS = {  # what the page shows of a run, from the lines harness.environment writes
    "date": r"date: ([^;]+)",
    "torch": r"(torch [^,;]+)",
    "device": r"device: \S+ \((.*?)\), torch threads",
    "threads": r"torch threads: (\d+)",
}
GRID_PLOTS = ("lstm_time", "gru_time", "lstm_memory", "gru_memory")
_GRID_COLUMNS = (  # (header, ratio column, invert): the grid's ratios against torch.nn, naive, GEMM-only
    ("time ours/torch.nn", "time_ours/torch", False),
    ("naive/ours (speed-up)", "time_ours/naive", True),
    ("time ours/GEMM-only", "time_ours/gemm", False),
    ("torch.nn/GEMM-only", "time_torch/gemm", False),
    ("memory ours/torch.nn", "mem_ours/torch", False),
    ("memory ours/naive", "mem_ours/naive", False),
)

PAGE_METHOD = """\
## Method

Four implementations run the same forward + backward on each point:

- **ours**: `FusedLSTM` / `FusedGRU` on the `cpp` backend (or `cuda` on a GPU);
- **torch.nn**: `torch.nn.LSTM` / `torch.nn.GRU` (on CPU the LSTM is oneDNN's fused RNN,
  the GRU ATen's step-by-step cell loop);
- **naive**: a Python loop over `LSTMCell` / `GRUCell` with autograd throughout, the
  approach of char-rnn that torch-rnn compared itself with;
- **GEMM-only**: exactly the GEMMs one forward + backward needs, through `torch.mm`, with
  nothing else: the time the GEMMs alone take. Ours runs some GEMMs in oneDNN or in its
  own panel kernel, so it can come in under this bound.

**Time is a ratio.** The machines these runs come from are shared and noisy, so absolute
times mean little; what repeats is the ratio of two implementations timed side by side.
They run interleaved in one process, in rounds: every round runs each implementation
once, in a fresh seeded random order, after untimed warm-up rounds. A point's time is the
median of its rounds; with `min_seconds` a fast point gets more rounds until they have
taken that long. Ratios near 1.0 move by a few percent from run to run: read them as
level.

**Memory is activation memory**: the bytes of the distinct storages saved for backward
by one forward, counted with `torch.autograd.graph.saved_tensors_hooks`
(`lightning_rnn.utils.memory.SavedTensorsMeter`). It is deterministic, and it is what
grows with batch and sequence length; parameters are not counted. On a GPU the tables
also show the peak allocated during one forward + backward.

**Sections.** `grid`: torch-rnn's grid (batch 50, sequence 50, 1-3 layers, hidden 64-512,
input size = hidden). `varlen`: a packed variable-length batch against the same batch
padded. `scaling`: cost against sequence length. `features`: gradient checkpointing and
bf16 autocast on the grid's largest point. `projection`: the LSTM with `proj_size`.
`alone`: a training step (forward, backward, Adam) of ours and of torch.nn, each in
processes of its own, so that each has the memory allocator to itself.
`checkpoint_vs_naive`, `checkpoint_scaling`, `packed_epoch`: the callbacks' studies.
The full preset runs one thread: on a shared CPU a multi-threaded GEMM waits for its
threads at every barrier, and that measures the scheduler rather than the kernels.

Run it (each run writes one folder; `bench.page` rebuilds this page from all of them):

```bash
python -m lightning_rnn task=benchmark bench=smoke      # a tiny grid in seconds: checks the harness only
python -m lightning_rnn task=benchmark bench=full bench.out_dir=docs/bench/MACHINE bench.page=docs/benchmarks.md
python -m lightning_rnn.bench --write-page docs/bench docs/benchmarks.md   # only this page, from the folders
```
"""


def run_info(folder: Path) -> dict[str, str]:
    """When and where the run in ``folder`` ran, read from the ``*Run:*`` line of its tables."""
    for path in [folder / "grid.md", *sorted(folder.glob("*.md"))]:
        if not path.is_file():
            continue
        run = next((line for line in path.read_text().splitlines() if line.startswith("*Run:*")), None)
        if run is not None:
            found = {k: re.search(p, run) for k, p in RUN_FIELDS.items()}
            return {k: m.group(1).strip() for k, m in found.items() if m}
    return {}


def grid_summary(grid: Table) -> str:
    """The grid's ratios as a Markdown table, one row per (cell, layers x hidden)."""
    present = [c for c in _GRID_COLUMNS if any(c[1] in row for row in grid.rows)]
    lines = ["| cell | L x H | " + " | ".join(c[0] for c in present) + " |", "|---|---|" + "---|" * len(present)]
    for row in grid.rows:
        cells = [_ratio(row.get(key), invert) for _, key, invert in present]
        lines.append(f"| {str(row['cell']).upper()} | {row['layers']}x{row['hidden']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def headline(grid: Table) -> str:
    """Time and activation memory of ours over torch.nn's, one row per layers x hidden and
    two columns per cell: the front page's table."""
    cells = list(dict.fromkeys(str(r["cell"]) for r in grid.rows))
    by_point = {(str(r["cell"]), r["layers"], r["hidden"]): r for r in grid.rows}
    points = list(dict.fromkeys((r["layers"], r["hidden"]) for r in grid.rows))
    heads = [f"{c.upper()} {what}" for c in cells for what in ("time", "memory")]
    lines = ["| layers x hidden | " + " | ".join(heads) + " |", "|---|" + "---|" * len(heads)]
    for layers, hidden in points:
        values = []
        for c in cells:
            row = by_point.get((c, layers, hidden), {})
            values += [_ratio(row.get("time_ours/torch")), _ratio(row.get("mem_ours/torch"))]
        lines.append(f"| {layers}x{hidden} | " + " | ".join(values) + " |")
    return "\n".join(lines) + "\n"


def ranges(grid: Table) -> str:
    """One line: per cell, the range of time and memory ours/torch.nn over the grid."""
    parts = []
    for cell in dict.fromkeys(str(r["cell"]) for r in grid.rows):
        rows = [r for r in grid.rows if r["cell"] == cell]
        for what, key in (("time", "time_ours/torch"), ("memory", "mem_ours/torch")):
            values = [r[key] for r in rows if key in r]
            if values:
                parts.append(f"{cell.upper()} {what} {_span(values)} of torch.nn's")
    return "; ".join(parts) + "." if parts else ""


def machine_section(folder: Path, page_dir: Path) -> str:
    """The page's section for one result folder: its run, the grid's ratios and plots, then
    every other table of the run as it wrote it."""
    link = Path(os.path.relpath(folder, page_dir)).as_posix()
    info = run_info(folder)
    lines = [f"## {folder.name}", ""]
    lines += [f"{_described(folder)}; all its tables: [{link}/results.md]({link}/results.md).", ""]
    if (folder / "grid.csv").is_file():
        grid = read_csv(folder / "grid.csv")
        lines += [f"### The grid: {caption(grid)}", "", ranges(grid), "", grid_summary(grid)]
        lines += [f"![{name}]({link}/{name}.png)" for name in GRID_PLOTS if (folder / f"{name}.png").is_file()]
        lines.append("")
    others = [p for p in sorted(folder.glob("*.md"), key=_table_rank) if p.stem not in ("grid", "results")]
    for path in others:
        text = "\n".join(line for line in path.read_text().splitlines() if not line.startswith("*Run:*"))
        lines += [text.replace("### ", "### " + path.stem + ": ", 1).rstrip(), ""]
        if (folder / f"{path.stem}.png").is_file():
            lines += [f"![{path.stem}]({link}/{path.stem}.png)", ""]
    return "\n".join(lines)


def write_page(page: Path, root: Path) -> Path:
    """``page``: the method, then one section per result folder in ``root`` (each folder
    with a ``results.md``), newest run first. Returns the page's path."""
    page, root = Path(page), Path(root)
    folders = [p.parent for p in root.glob("*/results.md")]
    folders.sort(key=lambda f: (run_info(f).get("date", ""), f.name), reverse=True)
    if not folders:
        raise ValueError(f"bench.page: no result folders (with a results.md) in {root}")
    page.parent.mkdir(parents=True, exist_ok=True)
    head = [
        "# Benchmarks",
        "",
        "<!-- Written by the benchmark (lightning_rnn/bench/page.py: write_page) from the result",
        "folders next to its out_dir; rerun it rather than editing this page. -->",
        "",
        "The fused layers against `torch.nn` on CPU: time and activation memory of a forward +",
        "backward on torch-rnn's grid and beyond, the latest run on each machine:",
        "",
        *[f"- [{f.name}](#{f.name}): {_described(f)}" for f in folders],
        "",
    ]
    body = [PAGE_METHOD] + [machine_section(f, page.parent) for f in folders]
    page.write_text("\n".join(head) + "\n" + "\n".join(body).rstrip() + "\n")
    return page


def _described(folder: Path) -> str:
    """``Intel(R) Xeon(R) Processor, 2026-12-03 08:29 UTC, torch 2.13.0+cpu, 1 thread(s)``."""
    info = run_info(folder)
    if "threads" in info:
        info["threads"] += " thread(s)"
    return ", ".join(info[k] for k in ("device", "date", "torch", "threads") if k in info) or "no run information"


def _table_rank(path: Path):
    return (TABLE_ORDER.index(path.stem) if path.stem in TABLE_ORDER else len(TABLE_ORDER), path.stem)


def _ratio(value, invert: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value == 0:
        return ""
    return f"{1 / value:.2f}x" if invert else f"{value:.2f}"


def _span(values) -> str:
    low, high = f"{min(values):.2f}", f"{max(values):.2f}"
    return f"{low}x" if low == high else f"{low}-{high}x"
