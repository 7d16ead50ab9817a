"""The torch-rnn grid: every (cell, layers, hidden) point, every implementation, fwd+bwd.

Also runs the features section, which is the same kind of run on fewer points with
``+ckpt`` / ``+bf16`` implementations, and the projection section (a section with
``proj_sizes``: each point also at every proj_size below its hidden size).
"""
from __future__ import annotations

import itertools
from collections.abc import Callable

import torch

from .config import BenchConfig, GridConfig
from .measure import Table, measure, point_row, standard_ratios, summarize
from .subjects import Workload, build_subjects, point_params, runnable


def run_grid(
    section: GridConfig,
    cfg: BenchConfig,
    *,
    name: str = "grid",
    title: str = "fwd+bwd time and activation memory on the torch-rnn grid",
    log: Callable[[str], None] = print,
) -> Table:
    """Measure every point of ``section``; one row per (cell, layers, hidden[, proj_size])."""
    implementations, notes = runnable(section.implementations, cfg.device)
    table = Table(name, title, notes=notes)
    ratios = standard_ratios(implementations)
    projections = getattr(section, "proj_sizes", [0])
    for cell, layers, hidden, proj in itertools.product(section.cells, section.layers, section.hidden, projections):
        if proj >= hidden:
            continue  # torch.nn's rule: proj_size < hidden_size
        torch.manual_seed(cfg.seed)
        workload = Workload(
            cell, layers, hidden, section.input_size or hidden, section.batch, section.seq_len, device=cfg.device,
            proj_size=proj,
        )  # fmt: skip
        subjects = build_subjects(workload, implementations, checkpoint_chunk_size=cfg.checkpoint_chunk_size)
        measured = measure(subjects, cfg.rounds, cfg.warmup, cfg.device, cfg.min_seconds)
        table.rows.append(point_row(point_params(workload, subjects), measured, ratios))
        point = f"{cell} layers={layers} hidden={hidden}" + (f" proj_size={proj}" if proj else "")
        log(f"[{name}] {point}: " + summarize(table.rows[-1]))
    return table

