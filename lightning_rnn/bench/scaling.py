"""Cost in sequence length: fwd+bwd time and activation memory for T up to thousands.

A fused layer saves a fixed number of floats per token and does a fixed amount of work
per step, so both columns should grow linearly in T: ``<impl>_us_per_token`` (median
microseconds per real token) stays flat along a series, and so does bytes per token.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable

import torch

from .config import BenchConfig, ScalingConfig
from .measure import Table, measure, point_row, standard_ratios, summarize
from .subjects import Workload, build_subjects, point_params, runnable


def run_scaling(section: ScalingConfig, cfg: BenchConfig, *, log: Callable[[str], None] = print) -> Table:
    """One row per (cell, hidden, T), with ``section``'s own (fewer) rounds."""
    implementations, notes = runnable(section.implementations, cfg.device)
    table = Table("scaling", f"cost vs sequence length (batch {section.batch}, {section.layers} layer(s))", notes=notes)
    ratios = standard_ratios(implementations)
    for cell, hidden, seq_len in itertools.product(section.cells, section.hidden, section.seq_lens):
        torch.manual_seed(cfg.seed)
        workload = Workload(cell, section.layers, hidden, hidden, section.batch, seq_len, device=cfg.device)
        subjects = build_subjects(workload, implementations, checkpoint_chunk_size=cfg.checkpoint_chunk_size)
        measured = measure(subjects, section.rounds, section.warmup, cfg.device, cfg.min_seconds)
        row = point_row(point_params(workload, subjects), measured, ratios)
        for name, m in measured.items():
            row[f"{name}_us_per_token"] = m.time_s * 1e6 / workload.tokens
        table.rows.append(row)
        log(f"[scaling] {cell} hidden={hidden} T={seq_len}: " + summarize(row))
    return table
