"""The command line: ``python -m lightning_rnn [hydra overrides]``.

Composes the Hydra configs (``config.yaml`` and its groups) and runs the selected
``task``. The configs are read from the package's own copy (``lightning_rnn/_conf``,
written when the package is built) or, in a source checkout, from the top-level ``conf/``.
"""
from __future__ import annotations

from pathlib import Path

import hydra
from hydra.utils import instantiate
from omegaconf import DictConfig


def config_dir() -> Path:
    """The directory holding ``config.yaml``: the packaged copy if present, else ``conf/``."""
    packaged = Path(__file__).resolve().parent / "_conf"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parents[1] / "conf"


def run(cfg: DictConfig):
    """Run ``cfg.task`` (a partial of a task function) on ``cfg``; return its result
    (the optimized metric for ``train``, which Hydra sweepers minimize)."""
    task = instantiate(cfg.task)
    return task(cfg)


def main() -> None:
    hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="config")(run)()
