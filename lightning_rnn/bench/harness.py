"""``main(cfg)``: run the enabled sections, print and save their tables, draw the plots.

Sections (each a field of :class:`~lightning_rnn.bench.config.BenchConfig` with an
``enabled`` flag, each producing one :class:`~lightning_rnn.bench.measure.Table`):

- ``grid``: torch-rnn's grid, ours vs torch.nn vs the naive loop vs GEMM-only;
- ``varlen``: packed vs padded variable-length batches;
- ``scaling``: time and memory vs sequence length;
- ``features``: gradient checkpointing (``ours+ckpt``) and bf16 autocast (``ours+bf16``);
- ``projection``: the LSTM with torch.nn's ``proj_size``, ours vs torch.nn;
- ``alone``: a training step of each implementation in processes of its own;
- ``callbacks``: the callbacks' own studies (checkpointing vs T, PackedSequences epoch);
- ``generation``: characters per second of a character LM's sampling at batch 1.

Adding a section = a config dataclass, a ``run_*`` function returning Tables, and one
entry in :data:`SECTIONS`. Everything is written to the output directory as soon as
its section finishes: ``<table>.csv``, ``<table>.md``, PNGs, and ``results.md`` (every
``<table>.md`` in the directory, so re-running one section keeps the others). With
``page`` set, the benchmark page is rebuilt too, from every result folder next to the
output directory (:mod:`lightning_rnn.bench.page`).
"""
from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from ..kernels.dispatch import available_backends
from . import report
from .alone import run_alone
from .config import BenchConfig
from .callback_figures import run_callback_figures
from .generation import run_generation
from .grid import run_grid
from .measure import Table
from .page import TABLE_ORDER, write_page
from .scaling import run_scaling
from .varlen import run_varlen

Log = Callable[[str], None]

SECTIONS: dict[str, Callable[[BenchConfig, Log], list[Table]]] = {
    "grid": lambda cfg, log: [run_grid(cfg.grid, cfg, log=log)],
    "varlen": lambda cfg, log: [run_varlen(cfg.varlen, cfg, log=log)],
    "scaling": lambda cfg, log: [run_scaling(cfg.scaling, cfg, log=log)],
    "features": lambda cfg, log: [
        run_grid(cfg.features, cfg, name="features", title="training features: checkpointing and bf16", log=log)
    ],
    "projection": lambda cfg, log: [_projection(cfg, log)],
    "alone": lambda cfg, log: [run_alone(cfg.alone, cfg, torch.get_num_threads(), log=log)],
    "callbacks": lambda cfg, log: run_callback_figures(cfg.callbacks, log=log),
    "generation": lambda cfg, log: [run_generation(cfg.generation, cfg, log=log)],
}



@dataclass
class BenchResult:
    """What :func:`main` returns: the output directory, the tables, the files written."""

    out_dir: Path
    threads: int
    tables: dict[str, Table] = field(default_factory=dict)  # by table name
    files: list[Path] = field(default_factory=list)


def main(cfg: BenchConfig | Mapping | None = None, log: Log | None = None) -> BenchResult:
    """Run the benchmark described by ``cfg``.

    cfg: a BenchConfig, the ``bench`` DictConfig, or the whole Hydra config of
    ``python -m lightning_rnn task=benchmark`` (its ``bench`` node is used; defaults if it
    has none). See ``conf/bench/default.yaml`` for every key.
    """
    cfg = BenchConfig.from_any(bench_node(cfg))
    check_device(cfg.device)
    log = log or (lambda line: print(line, flush=True))
    out_dir = output_dir(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    threads = cfg.threads or len(os.sched_getaffinity(0))
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    result = BenchResult(out_dir, threads)
    header = environment(cfg, threads)
    for line in header:
        log(line)
    try:
        for name, run in SECTIONS.items():
            if not getattr(cfg, name).enabled:
                continue
            for table in run(cfg, log):
                result.tables[table.name] = table
                report.print_table(table, cfg.table)
                result.files.append(report.write_csv(table, out_dir))
                result.files.append(report.write_markdown(table, out_dir, header))
                if cfg.plots:
                    result.files += _plots(table, out_dir)
                report.write_results(out_dir, TABLE_ORDER)
                if cfg.page:
                    write_page(Path(cfg.page), out_dir.parent)
        result.files.append(out_dir / "results.md")
        if cfg.page:
            result.files.append(Path(cfg.page))
    finally:
        torch.set_num_threads(previous_threads)
    log(f"results in {out_dir}")
    return result


def check_device(device: str) -> None:
    """A ValueError naming ``bench.device`` if this machine has no such device (before any
    section starts, rather than a CUDA error from inside one of them or from a worker)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return
    if not torch.cuda.is_available():
        raise ValueError(f"bench.device: {device!r}, but CUDA is not available here "
                         f"(torch {torch.__version__}); set it to 'cpu'")
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"bench.device: {device!r}, but this machine has {torch.cuda.device_count()} CUDA device(s)")


def _projection(cfg: BenchConfig, log: Log) -> Table:
    table = run_grid(cfg.projection, cfg, name="projection", title="LSTM with a projection (proj_size)", log=log)
    if "torch" in cfg.projection.implementations and torch.device(cfg.device).type == "cpu":
        table.notes.append(
            "torch.nn.LSTM with a projection runs its default CPU implementation, not oneDNN's fused RNN "
            "(its warning: 'LSTM with projections is not supported with oneDNN')"
        )
    return table


def bench_node(cfg):
    """The benchmark's own node of whatever ``cfg`` is (see :func:`main`)."""
    if isinstance(cfg, Mapping) and "bench" in cfg:
        return cfg["bench"]
    if isinstance(cfg, Mapping) and "task" in cfg:  # the app config without a bench group: defaults
        return None
    return cfg


def output_dir(configured: str | os.PathLike | None) -> Path:
    """``configured``, else ``<Hydra run dir>/bench`` inside a Hydra run, else ``./bench_results``."""
    if configured is not None:
        return Path(configured)
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            return Path(HydraConfig.get().runtime.output_dir) / "bench"
    except ImportError:
        pass
    return Path("bench_results")


def environment(cfg: BenchConfig, threads: int) -> list[str]:
    """Lines describing the run: when, where, with what."""
    lines = [f"note: {cfg.note}"] if cfg.note else []
    lines += [
        f"date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"torch {torch.__version__}, python {sys.version.split()[0]}, {platform.machine()}",
        f"device: {cfg.device} ({_device_name(cfg.device)}), torch threads: {threads}",
        f"kernel backends available: {', '.join(available_backends(cfg.device))}",
        f"oneDNN (mkldnn) enabled: {torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled} "
        "(if so, torch.nn's CPU LSTM runs oneDNN's fused RNN, one call per layer with pre-packed weights, "
        "which can beat 'gemm', the same GEMMs through torch.mm; torch.nn's CPU GRU runs ATen's step-by-step "
        "cell loop)",
        f"timing: median of {cfg.rounds} interleaved rounds{_more_rounds(cfg)} after {cfg.warmup} warm-up rounds "
        "(scaling: its own rounds; the callback studies: as their titles say); memory: bytes saved for "
        "backward by one forward",
    ]
    return lines


def _more_rounds(cfg: BenchConfig) -> str:
    if not cfg.min_seconds:
        return ""
    return f" or more, until a point's timed rounds took {cfg.min_seconds:g} s (column 'rounds'),"


def _device_name(device: str) -> str:
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(torch.device(device))
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def replot(out_dir: str | os.PathLike) -> list[Path]:
    """Redraw the PNGs of an earlier run from its CSVs (no measuring)."""
    out_dir = Path(out_dir)
    paths = []
    for name in ("grid", "scaling"):
        if (out_dir / f"{name}.csv").is_file():
            paths += _plots(report.read_csv(out_dir / f"{name}.csv"), out_dir)
    if not paths:
        raise ValueError(f"replot: no grid.csv or scaling.csv in {out_dir}")
    return paths


def _plots(table: Table, out_dir: Path) -> list[Path]:
    from . import plots  # matplotlib only when plotting

    if table.name == "grid":
        return plots.plot_grid(table, out_dir)
    if table.name == "scaling":
        return [plots.plot_scaling(table, out_dir)]
    return []
