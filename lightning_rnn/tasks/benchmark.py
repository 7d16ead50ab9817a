"""The benchmark task: hands the config to the benchmark harness."""
from __future__ import annotations

from omegaconf import DictConfig


def run(cfg: DictConfig):
    """Run :func:`lightning_rnn.bench.main` (imported here: it pulls in plotting)."""
    from ..bench import main

    return main(cfg)
