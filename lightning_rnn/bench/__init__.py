"""Benchmark harness: ours vs torch.nn vs a naive cell loop vs GEMM-only.

``python -m lightning_rnn.bench [--preset NAME] [key=value ...]`` or, through the
application CLI, ``python -m lightning_rnn task=benchmark``; both call :func:`main`.
"""
from __future__ import annotations

from .config import BenchConfig


def main(cfg=None, log=None):
    """Run the benchmark (see :func:`lightning_rnn.bench.harness.main`); imported lazily,
    so importing ``lightning_rnn.bench.baselines`` does not pull in plotting."""
    from .harness import main as run

    return run(cfg, log)


__all__ = ["BenchConfig", "main"]
