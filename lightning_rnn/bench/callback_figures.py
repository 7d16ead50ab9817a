"""The callbacks' figures (:mod:`lightning_rnn.bench.callbacks_bench`) as benchmark tables.

``callbacks_bench`` (written with the callbacks) returns plain dicts; this section calls
whichever of its studies exist and turns each into a :class:`Table`:

- ``checkpoint_vs_naive``: memory (saved for backward, and the peak with one recomputed
  chunk) against the naive loop, and time against no checkpointing, at 3x512, one row
  per chunk size;
- ``checkpoint_scaling``: saved bytes vs T up to 10,000 with ``chunk_size="sqrt"``;
- ``packed_epoch``: one epoch with vs without the PackedSequences callback.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

from . import callbacks_bench
from .config import CallbacksConfig
from .measure import Table

STUDIES = {  # table name -> (callbacks_bench function, title)
    "checkpoint_vs_naive": (
        "checkpointing_vs_naive",
        "gradient checkpointing at 3x512, batch 50, T 50, by chunk size: memory vs the naive loop, time vs "
        "no checkpointing (median of 15 rounds, each running every setting once in a rotating order, thread "
        "CPU time)",
    ),
    "checkpoint_scaling": ("checkpointing_scaling", "gradient checkpointing: saved bytes vs T (chunk = sqrt(T))"),
    "packed_epoch": (
        "packed_epoch_time",
        "PackedSequences: epoch time with vs without the callback (best of 2 interleaved epochs each, wall time "
        "including the Trainer's setup); training losses",
    ),
}


def run_callback_figures(section: CallbacksConfig, *, log: Callable[[str], None] = print) -> list[Table]:
    """One Table per enabled study that ``callbacks_bench`` provides; a note for the others."""
    tables = []
    for name, (function, title) in STUDIES.items():
        if not getattr(section, name):
            continue
        study = getattr(callbacks_bench, function, None)
        if study is None:
            log(f"[callbacks] skipped {name}: callbacks_bench.{function} does not exist yet")
            continue
        tables.append(as_table(name, title, study()))
        log(f"[callbacks] {name}: {len(tables[-1].rows)} row(s)")
    return tables


def as_table(name: str, title: str, result: Mapping) -> Table:
    """``{"rows": [...], scalar: ...}`` -> rows; the scalars become notes (or the single row)."""
    scalars = {k: v for k, v in result.items() if k != "rows"}
    if "rows" in result:
        return Table(name, title, [dict(r) for r in result["rows"]], [f"{k} = {_fmt(v)}" for k, v in scalars.items()])
    return Table(name, title, [scalars])


def _fmt(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)
