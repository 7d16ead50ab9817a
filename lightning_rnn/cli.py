"""The command line: ``python -m lightning_rnn [hydra overrides]``.

Composes the Hydra configs (``config.yaml`` and its groups) and runs the selected
``task``. The configs are read from the package's own copy (``lightning_rnn/_conf``,
written when the package is built) or, in a source checkout, from the top-level ``conf/``.
"""
from __future__ import annotations

import logging
import os
import shutil
import sys
import warnings
from pathlib import Path

import hydra
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig
from omegaconf.errors import MissingMandatoryValue

from .tasks.threads import apply_threads, choose_threads
from .tasks.unknown_keys import unexpected_argument_error, unknown_override_error

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
    task = instantiate(cfg.task)  # imports the task's module, and with it Lightning
    route_lightning_logs_through_hydra()
    quiet_upstream_deprecations()
    untouched = untouched_run_directory()
    restore_threads = None
    try:
        # one line per machine: the processes DDP starts on it (LOCAL_RANK 1, 2, ...) say nothing
        restore_threads = apply_threads(choose_threads(cfg, multirun_launcher()),
                                        announce=os.environ.get("LOCAL_RANK", "0") == "0")
        result = task(cfg)
    except Exception as err:
        finish_wandb_run(exit_code=1)
        cause = setting_error(err)
        message = unexpected_argument(err, cfg) or (None if cause is None else f"Error: {cause}")
        if os.environ.get("HYDRA_FULL_ERROR") == "1" or message is None:
            raise
        remove_run_directory(untouched)
        raise SystemExit(f"{message}\n(HYDRA_FULL_ERROR=1 shows the traceback)") from None
    finally:
        if restore_threads is not None:
            restore_threads()
    finish_wandb_run(exit_code=0)
    return result


def untouched_run_directory() -> tuple[Path, set[str]] | None:
    """The run directory and its entries, where Hydra has just made it for this run under the
    current directory (a single run, not a sweep's job) and it holds nothing but Hydra's record
    (``.hydra/``) and an empty log file; else None."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.RUN:
        return None
    directory, cwd = Path(HydraConfig.get().runtime.output_dir).resolve(), Path.cwd().resolve()
    if directory == cwd or not directory.is_relative_to(cwd) or not directory.is_dir():
        return None
    entries = {p.name: p for p in directory.iterdir()}
    if not all(name == ".hydra" or (p.suffix == ".log" and p.is_file() and p.stat().st_size == 0)
               for name, p in entries.items()):
        return None
    return directory, set(entries)


def remove_run_directory(untouched: tuple[Path, set[str]] | None) -> None:
    """Remove the run directory of :func:`untouched_run_directory` when the run, which ended
    on a setting error, wrote nothing there but its log (a checkpoint, a logger's files keep
    it), and the folders above it that this leaves empty, up to the current directory."""
    if untouched is None:
        return
    directory, entries = untouched
    if not directory.is_dir() or {p.name for p in directory.iterdir()} != entries:
        return
    shutil.rmtree(directory, ignore_errors=True)
    cwd = Path.cwd().resolve()
    for parent in directory.parents:
        if parent == cwd or not parent.is_relative_to(cwd) or any(parent.iterdir()):
            break
        parent.rmdir()


def multirun_launcher() -> DictConfig | None:
    """The launcher config of the multirun this job belongs to, or None (a single run, or
    a config composed outside Hydra's command line)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return HydraConfig.get().launcher


def finish_wandb_run(exit_code: int) -> None:
    """End the wandb run a task's WandbLogger started (Lightning leaves it open), so the
    next job of a multirun starts a run of its own: WandbLogger reuses a run in progress,
    which logged every job of a sweep into the first job's run."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish(exit_code=exit_code)


def setting_error(err: BaseException) -> BaseException | None:
    """The setting error behind ``err`` (itself, or what Hydra's ``instantiate`` wrapped
    when a constructor rejected its arguments), or None if it is not one."""
    while isinstance(err, InstantiationException) and err.__cause__ is not None:
        err = err.__cause__
    return err if is_setting_error(err) else None


def unexpected_argument(err: BaseException, cfg: DictConfig) -> str | None:
    """``Error: KEY: CLASS takes no argument ...`` for a key of the config (one added with
    ``+``) that its class does not take, which Hydra's ``instantiate`` wrapped; else None."""
    while isinstance(err, InstantiationException) and err.__cause__ is not None:
        err = err.__cause__
    message = unexpected_argument_error(err, cfg)
    return None if message is None else f"Error: {message}"


def is_setting_error(err: BaseException) -> bool:
    """A mandatory config value left unset, a built-in corpus that cannot be fetched
    offline, a kernel backend asked for that cannot run here (``model.rnn.backend=cuda``
    without a GPU), or a setting error raised by this package's own checks (the innermost
    frame is in ``lightning_rnn``), not by a library or a bug elsewhere."""
    from .data.corpora import CorpusUnavailableError  # here: importing data imports Lightning
    from .kernels.dispatch import BackendUnavailable

    if isinstance(err, (MissingMandatoryValue, CorpusUnavailableError, BackendUnavailable)):
        return True
    if not isinstance(err, SETTING_ERRORS) or err.__traceback__ is None:
        return False
    tb = err.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return Path(tb.tb_frame.f_code.co_filename).resolve().is_relative_to(PACKAGE_DIR)


# Loggers to which Lightning attaches a console handler of its own.
LIGHTNING_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric", "lightning_fabric", "pytorch_lightning")


def route_lightning_logs_through_hydra() -> None:
    """Send Lightning's log lines only through the handlers Hydra configured (the console
    and ``cli.log``). ``import lightning`` gives its package logger a console handler of
    its own that also propagates to the root logger: inside a Hydra run every Lightning
    message would print twice. LIGHTNING_CHATTER is left out. Outside the CLI (no root
    handlers) nothing changes."""
    if not logging.getLogger().handlers or "lightning" not in sys.modules:
        return
    for name in LIGHTNING_LOGGERS:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            if type(handler) is logging.StreamHandler:  # Lightning's console handler, not a file handler
                logger.removeHandler(handler)
        logger.propagate = True
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if _not_chatter not in rank_zero.filters:
        rank_zero.addFilter(_not_chatter)


#: Lightning's info lines that say nothing about the run: its tips (other services to
#: install) and that the configs' RichModelSummary replaces its default summary.
LIGHTNING_CHATTER = ("💡 Tip:", "Trainer already configured with model summary callbacks")


def _not_chatter(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(LIGHTNING_CHATTER)


#: Deprecation warnings that Lightning's own code raises from torch, which a user of the
#: CLI can do nothing about (Lightning 2.6 with torch 2.13: its pytree check, per batch).
UPSTREAM_DEPRECATIONS = (r"`isinstance\(treespec, LeafSpec\)` is deprecated",)


#: Lightning's warning for any IterableDataset with a length, that workers might repeat
#: items: the character streams (lightning_rnn.data.streams) give each worker its own batches.
STREAM_LENGTH_WARNING = r"Your `IterableDataset` has `__len__` defined"


def quiet_upstream_deprecations() -> None:
    """Hide UPSTREAM_DEPRECATIONS and STREAM_LENGTH_WARNING in the CLI's runs (not when the
    package is imported)."""
    for message in UPSTREAM_DEPRECATIONS:
        warnings.filterwarnings("ignore", message=message, category=FutureWarning)
    warnings.filterwarnings("ignore", message=STREAM_LENGTH_WARNING)


#: Overrides that compose Hydra's Optuna sweeper, a plugin of its own package.
OPTUNA_OVERRIDES = ("hparams_search=optuna", "experiment=optuna_sweep")


def missing_sweeper(args: list[str]) -> str | None:
    """The error for an Optuna sweep asked for without its plugin installed (Hydra's own says
    only "Could not find 'hydra/sweeper/optuna'"), else None."""
    if not any(arg in OPTUNA_OVERRIDES for arg in args):
        return None
    try:
        import hydra_plugins.hydra_optuna_sweeper  # noqa: F401
    except ImportError:
        return ("Error: hparams_search=optuna needs Hydra's Optuna sweeper: "
                'pip install "lightning_rnn[optuna]" (or hydra-optuna-sweeper)')
    return None


def main() -> None:
    error = missing_sweeper(sys.argv[1:]) or unknown_override_error(config_dir(), sys.argv[1:])
    if error:
        print(error, file=sys.stderr)
        raise SystemExit(1)
    hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="config")(run)()
