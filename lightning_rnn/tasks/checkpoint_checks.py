"""The checks a task runs on the checkpoint it is given (``ckpt_path``) before it builds anything
from it, and the checkpoint a train run resumes from by itself (``resume: auto``).

Every error is a ValueError of one line that names ``ckpt_path``, the file and what is wrong with
it (the command line prints it as ``Error: ...``): a file that is missing, truncated or damaged,
one of another model class, of other data (a vocabulary of other characters) or of other model
settings, and one without the state a run resumes from.
"""
from __future__ import annotations

import logging
import pickle
import reprlib
import zipfile
from pathlib import Path

import torch
from hydra.utils import get_class
from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import DictConfig, OmegaConf

from ..utils.checks import check_choice

log = logging.getLogger(__name__)

RESUME_CHOICES = ("auto", "never")


def one_line(err: BaseException, limit: int = 200) -> str:
    """``err``'s message on one line, at most ``limit`` characters."""
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def damaged_record(path) -> str | None:
    """The first record of the zip-format checkpoint at ``path`` whose bytes do not match the
    CRC-32 that torch.save stored for it (a bit flipped on a disk, a partial copy), or None.
    Reads the whole file once; torch.load checks no checksum, so such a file loads with
    wrong weights. Records stored without a checksum (CRC 0) are not read."""
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if info.CRC == 0:
                continue
            try:
                with archive.open(info) as record:
                    while record.read(1 << 24):  # zipfile compares the CRC-32 at the record's end
                        pass
            except zipfile.BadZipFile:
                return info.filename
    return None


def check_checkpoint_file(path, required: bool, needed_by: str = "this task") -> dict | None:
    """The checkpoint at ``path`` (memory-mapped: tensors are not read into memory), or None when
    ``path`` is unset and not ``required``. A ValueError naming ``ckpt_path`` and the file when
    it is not an existing file, damaged (a record fails its checksum), not one torch's
    ``weights_only`` loader reads (truncated, not a checkpoint), or not a Lightning checkpoint."""
    if not required and not path:
        return None
    if not path:
        raise ValueError(f"ckpt_path: {needed_by} needs a checkpoint file, pass ckpt_path=PATH/TO/FILE.ckpt "
                         f"(got {path!r})")
    check_is_a_file(Path(path))
    try:
        record = damaged_record(path)
    except (zipfile.BadZipFile, OSError, EOFError):  # not a zip at all: torch.load says what it is
        record = None
    if record is not None:
        raise ValueError(f"ckpt_path: {path} is damaged: its record {record} does not match its checksum (a partial "
                         "copy, or a bad disk); use an earlier checkpoint")
    try:
        # weights_only said: torch < 2.6 defaults to False, which unpickles anything
        checkpoint = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except pickle.UnpicklingError as err:
        raise ValueError(
            f"ckpt_path: {path} holds pickled Python objects, which torch's weights_only loader refuses (a "
            "checkpoint of an earlier lightning_rnn, or a factory with no plain description). If you trust it, load "
            "it in Python: Model.load_from_checkpoint(path, weights_only=False)"
        ) from err
    except (RuntimeError, OSError, EOFError, ValueError) as err:
        reason = "it is empty" if Path(path).stat().st_size == 0 else one_line(err)
        raise ValueError(f"ckpt_path: {path} is not a readable torch checkpoint, truncated or not one at all "
                         f"({reason})") from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise ValueError(f"ckpt_path: {path} is not a Lightning checkpoint (no 'state_dict'); save one with "
                         "Trainer.save_checkpoint or a ModelCheckpoint callback")
    return checkpoint


def check_is_a_file(path: Path) -> None:
    """A ValueError naming ``ckpt_path`` when ``path`` does not exist (saying where a relative
    path was looked for) or is a directory (naming the checkpoints in it)."""
    if path.is_dir():
        inside = sorted(p.name for p in path.glob("*.ckpt"))
        held = f"; it holds {', '.join(inside[:4])}{', ...' if len(inside) > 4 else ''}" if inside else ""
        raise ValueError(f"ckpt_path: {path} is a directory, not a checkpoint file{held}")
    if not path.exists():
        where = "" if path.is_absolute() else f" (relative to {Path.cwd()}, where the command started)"
        raise ValueError(f"ckpt_path: {path} does not exist{where}; pass the path of a checkpoint file, "
                         "ckpt_path=PATH/TO/FILE.ckpt")


def check_resumable(checkpoint: dict, path) -> None:
    """A ValueError unless the checkpoint holds what a training run resumes from (the optimizer's
    and the loops' state), which a ``save_weights_only`` checkpoint lacks."""
    missing = [key for key in ("optimizer_states", "loops") if key not in checkpoint]
    if missing:
        raise ValueError(
            f"ckpt_path: {path} holds no {' or '.join(missing)} (saved with save_weights_only=True?), which a run "
            "resumes from; evaluate it with task=test, or load its weights in Python to start a new run from them"
        )


def checkpoint_class_name(checkpoint: dict) -> str | None:
    """The module class the checkpoint names (an RNNModule stores it), or None."""
    name = checkpoint.get("lightning_rnn_class")
    return name.rsplit(".", 1)[-1] if isinstance(name, str) else None


def check_checkpoint_class(checkpoint: dict, path, model_target: str) -> None:
    """A ValueError when the checkpoint is of another module class than ``model_target`` (the
    config's ``model._target_``) builds; compared by class (a module path or its package's
    export name the same), by name where the checkpoint's class no longer imports."""
    saved = checkpoint.get("lightning_rnn_class")
    if not isinstance(saved, str):
        return
    wanted = get_class(model_target)
    try:
        same = get_class(saved) is wanted
    except Exception:  # a class that moved or is gone: its name says enough
        same = saved.rsplit(".", 1)[-1] == wanted.__name__
    if not same:
        raise ValueError(
            f"ckpt_path: {path} holds a {checkpoint_class_name(checkpoint)}, and the config's model builds a "
            f"{wanted.__name__}; pass the model and data it was trained with (an experiment=... recipe picks both)"
        )


def _difference(name: str, saved, now) -> str:
    """How the checkpoint's ``name`` differs from the data's, briefly."""
    if isinstance(saved, str) and isinstance(now, str):
        extra, missing = sorted(set(saved) - set(now)), sorted(set(now) - set(saved))
        parts = [f"{len(saved)} characters against the data's {len(now)}"]
        if extra:
            parts.append(f"{len(extra)} not in the data's ({reprlib.repr(''.join(extra))})")
        if missing:
            parts.append(f"{len(missing)} of the data's missing ({reprlib.repr(''.join(missing))})")
        if not extra and not missing:
            parts.append("the same characters in another order: other ids")
        return f"another {name}: {', '.join(parts)}"
    return f"{name}={reprlib.repr(saved)}, the data's is {reprlib.repr(now)}"


def check_checkpoint_data(path, hparams, class_name: str, given: dict) -> None:
    """A ValueError when the checkpoint was trained on other data: ``hparams`` (its
    hyperparameters) differ from ``given`` (what the data module gives the model, e.g. the
    vocabulary), or the checkpoint's class takes none of it (a model of another kind)."""
    for name, value in given.items():
        if name not in hparams:
            raise ValueError(f"ckpt_path: {path} holds a {class_name}, which takes no {name} from the data; pass the "
                             "model and data it was trained with (an experiment=... recipe picks both)")
        if hparams[name] != value:
            difference = _difference(name, hparams[name], value)
            raise ValueError(f"ckpt_path: {path} was trained on other data ({difference}); pass the data settings it "
                             "was trained with")


def check_checkpoint_fits(checkpoint: dict, path, model) -> None:
    """A ValueError when the checkpoint's weights have other shapes than ``model``'s (it was
    trained with other model settings), before Lightning's size-mismatch traceback."""
    saved, current = checkpoint["state_dict"], model.state_dict()
    differ = [f"{k} (checkpoint {tuple(v.shape)}, now {tuple(current[k].shape)})"
              for k, v in saved.items() if k in current and tuple(v.shape) != tuple(current[k].shape)]
    missing = sorted(set(current) - set(saved))
    if differ or missing:
        found = "; ".join(differ[:3] + [f"missing {', '.join(missing[:3])}"] * bool(missing))
        raise ValueError(f"ckpt_path: {path} does not fit this model: {found}; pass the model and data settings it "
                         "was trained with")


def resume_path(cfg: DictConfig) -> str | None:
    """The checkpoint a train run resumes from: ``cfg.ckpt_path`` if set; else, with ``resume:
    auto``, the ``last.ckpt`` a ModelCheckpoint of ``cfg.callbacks`` (with ``save_last``) has
    already written into its directory, as when a preempted job runs again in its run
    directory; else None (a new run)."""
    if cfg.ckpt_path:
        return cfg.ckpt_path
    if check_choice("resume", cfg.get("resume", "auto"), RESUME_CHOICES) == "never":
        return None
    for name, callback in (cfg.get("callbacks") or {}).items():
        if not OmegaConf.is_dict(callback) or "_target_" not in callback:
            continue
        try:
            cls = get_class(callback._target_)
        except Exception:  # the callback's own construction reports it
            continue
        if not (isinstance(cls, type) and issubclass(cls, ModelCheckpoint)):
            continue
        if not callback.get("save_last") or not callback.get("dirpath"):
            continue
        last = Path(callback.dirpath) / f"{cls.CHECKPOINT_NAME_LAST}{cls.FILE_EXTENSION}"
        if last.is_file():
            log.info("resuming from %s (resume=auto: the run directory's last checkpoint of callbacks.%s)", last, name)
            return str(last)
    return None
