"""Variable lengths: a packed batch vs the same batch fully padded, per implementation.

The batch has ``batch`` sequences, the longest ``seq_len`` steps, and real tokens making
up ``fill`` of the padded ``batch * seq_len``. Each implementation runs it twice — packed
(``<impl>.packed``) and padded to ``seq_len`` (``<impl>.padded``) — all interleaved in one
timing, so ``time_<impl>.packed/<impl>.padded`` is what packing buys (below 1) or costs.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable

import torch

from .config import BenchConfig, VarlenConfig
from .measure import Ratio, Table, measure, point_row, summarize
from .subjects import Workload, build_subjects, point_params, runnable


def lengths_with_fill(batch: int, seq_len: int, fill: float, seed: int = 0) -> tuple[int, ...]:
    """``batch`` lengths in [1, seq_len], the longest = seq_len, mean ~ fill * seq_len, shuffled.

    Lengths follow seq_len * u^p for u evenly spaced in (0, 1], with p = 1/fill - 1 so
    that the mean of u^p is about ``fill``.
    """
    if not 0 < fill <= 1:
        raise ValueError(f"fill: expected a number in (0, 1], got {fill!r}")
    p = 1 / fill - 1
    lengths = [max(1, round(seq_len * ((i + 1) / batch) ** p)) for i in range(batch)]
    order = torch.randperm(batch, generator=torch.Generator().manual_seed(seed)).tolist()
    return tuple(lengths[i] for i in order)  # unsorted, as real batches are


def run_varlen(section: VarlenConfig, cfg: BenchConfig, *, log: Callable[[str], None] = print) -> Table:
    """One row per (cell, layers, hidden): packed and padded times and memory, and their ratios."""
    implementations, notes = runnable(section.implementations, cfg.device)
    lengths = lengths_with_fill(section.batch, section.seq_len, section.fill, cfg.seed)
    fill = sum(lengths) / (section.batch * section.seq_len)
    table = Table("varlen", f"variable lengths: packed vs padded, real tokens = {fill:.0%} of padded", notes=notes)
    names = {impl: (f"{impl}.packed", f"{impl}.padded") for impl in implementations}
    ratios = [Ratio(metric, packed, padded) for metric in ("time", "mem") for packed, padded in names.values()]
    if "ours" in names and "torch" in names:
        ratios.append(Ratio("time", names["ours"][0], names["torch"][0]))
    for cell, layers, hidden in itertools.product(section.cells, section.layers, section.hidden):
        padded = Workload(cell, layers, hidden, hidden, section.batch, section.seq_len, device=cfg.device)
        packed = Workload(cell, layers, hidden, hidden, section.batch, section.seq_len, lengths, cfg.device)
        subjects = {}
        for workload, suffix in ((packed, "packed"), (padded, "padded")):
            torch.manual_seed(cfg.seed)  # the same weights and input values for both
            for impl, subject in build_subjects(workload, implementations).items():
                subjects[f"{impl}.{suffix}"] = subject
        measured = measure(subjects, cfg.rounds, cfg.warmup, cfg.device, cfg.min_seconds)
        params = point_params(packed, subjects) | {"fill": fill}
        table.rows.append(point_row(params, measured, ratios))
        log(f"[varlen] {cell} layers={layers} hidden={hidden}: " + summarize(table.rows[-1]))
    return table

