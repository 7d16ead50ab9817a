"""The command line: ``python -m lightning_rnn [hydra overrides]``.

Composes the Hydra configs (``config.yaml`` and its groups) and runs the selected
``task``. The configs are read from the package's own copy (``lightning_rnn/_conf``,
written when the package is built) or, in a source checkout, from the top-level ``conf/``.
"""
from __future__ import annotations

import os
from pathlib import Path

import hydra
from hydra.utils import instantiate
from omegaconf import DictConfig
from omegaconf.errors import MissingMandatoryValue

PACKAGE_DIR = Path(__file__).resolve().parent
# What the package raises for a bad setting (a checked argument, a missing file), and a
# mandatory config value left unset: reported in one line rather than with a traceback.
SETTING_ERRORS = (ValueError, TypeError, FileNotFoundError)


def config_dir() -> Path:
    """The directory holding ``config.yaml``: the packaged copy if present, else ``conf/``."""
    packaged = Path(__file__).resolve().parent / "_conf"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parents[1] / "conf"


def run(cfg: DictConfig):
    """Run ``cfg.task`` (a partial of a task function) on ``cfg``; return its result
    (the optimized metric for ``train``, which Hydra sweepers minimize)."""
    task = instantiate(cfg.task)
    try:
        return task(cfg)
    except Exception as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1" or not is_setting_error(err):
            raise
        raise SystemExit(f"Error: {err}\n(HYDRA_FULL_ERROR=1 shows the traceback)") from None


def is_setting_error(err: BaseException) -> bool:
    """A mandatory config value left unset, or a setting error raised by this package's own
    checks (the innermost frame is in ``lightning_rnn``), not by a library or a bug elsewhere."""
    if isinstance(err, MissingMandatoryValue):
        return True
    if not isinstance(err, SETTING_ERRORS) or err.__traceback__ is None:
        return False
    tb = err.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return Path(tb.tb_frame.f_code.co_filename).resolve().is_relative_to(PACKAGE_DIR)


def main() -> None:
    hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="config")(run)()
