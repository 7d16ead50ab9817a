"""What a module's checkpoint holds besides Lightning's own state, and how it is read back.

- ``lightning_rnn_class``: the module's class, so that a task restores a checkpoint
  without being told its model;
- ``hyper_parameters``: the arguments the module's own class received, its factories
  (``rnn``, ``optimizer``, ``scheduler``) as plain data (:mod:`.factories`), named under
  ``lightning_rnn_factories``, so that torch's ``weights_only`` loader reads the checkpoint;
- ``lightning_rnn_training_state``: what a run resumed mid-epoch needs that Lightning does
  not save (the state a stateful module carries, an unfinished accumulation's gradients).
"""
from __future__ import annotations

import inspect
import io

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn

from ..utils.compat import load_checkpoint_file
from . import factories

CLASS_KEY = "lightning_rnn_class"
FACTORIES_KEY = "lightning_rnn_factories"
TRAINING_STATE_KEY = "lightning_rnn_training_state"

#: Arguments of earlier versions that are Trainer settings now (module argument -> Trainer's).
TRAINER_SETTINGS = {"grad_clip": "gradient_clip_val", "grad_clip_algorithm": "gradient_clip_algorithm",
                    "accumulate_grad_batches": "accumulate_grad_batches"}

#: torch.load's weights_only defaults to False before torch 2.6 (True from 2.6 on).
TORCH_LOAD_UNPICKLES_BY_DEFAULT = tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 6)


def outermost_init_arguments(module: nn.Module, frame) -> set[str] | None:
    """Names of the arguments ``type(module).__init__`` received (its **kwargs expanded),
    found by walking up the chain of ``super().__init__`` calls from ``frame`` (the base's
    ``__init__``, as Lightning's ``save_hyperparameters`` does); None when the chain does not
    reach the class itself (a base ``__init__`` called without super()) or when it received
    values through ``*args`` (forwarded under names only the base's signature gives)."""
    found = None
    while frame is not None and frame.f_code.co_name == "__init__":
        local_vars = frame.f_locals
        cls = local_vars.get("__class__")
        params = inspect.signature(cls.__init__).parameters if cls is not None else None
        if params is None or local_vars.get(next(iter(params))) is not module:
            break
        names = set()
        for name, param in params.items():
            if param.kind is inspect.Parameter.VAR_KEYWORD:
                names.update(local_vars.get(name) or {})
            elif param.kind is not inspect.Parameter.VAR_POSITIONAL:
                names.add(name)
            elif local_vars.get(name):
                names = None
                break
        found = (cls, None if names is None else names - {next(iter(params))})
        frame = frame.f_back
    return found[1] if found is not None and found[0] is type(module) else None


def save_hyperparameters(checkpoint: dict, module, constructor_arguments: set[str] | None) -> None:
    """Write ``module``'s class and hyperparameters into ``checkpoint``.

    Only the arguments the class itself takes (``constructor_arguments``; else all but its
    ``derived_arguments``): a value a subclass computes and passes to its base (an
    ``input_size`` from its own sizes) is computed again on loading, and passing it too would
    give "multiple values for argument". Keys starting with "_" are Lightning's own
    (LightningCLI's "_instantiator" and "_class_path"). A factory with no plain description
    stays an object: that checkpoint then needs ``weights_only=False``."""
    checkpoint[CLASS_KEY] = f"{type(module).__module__}.{type(module).__qualname__}"
    hparams = checkpoint.get("hyper_parameters")
    if hparams is None:
        return
    if constructor_arguments is not None:
        hparams = {k: v for k, v in hparams.items() if k in constructor_arguments or k.startswith("_")}
    else:
        hparams = {k: v for k, v in hparams.items() if k not in module.derived_arguments}
    described = []
    for name, value in list(hparams.items()):
        if not factories.is_plain(value):
            try:
                hparams[name] = factories.describe(value)
            except factories.NotDescribable:
                continue
            described.append(name)
    checkpoint["hyper_parameters"] = hparams
    checkpoint[FACTORIES_KEY] = described


def loggable_hyperparameters(hparams: dict, derived_arguments) -> dict:
    """``hparams`` less ``derived_arguments``, factories as their plain description
    (``rnn: {_target_: ...FusedLSTM, hidden_size: 128, ...}``), which a logger can write."""
    logged = {k: v for k, v in hparams.items() if k not in derived_arguments}
    for name, value in logged.items():
        if not factories.is_plain(value):
            try:
                logged[name] = factories.describe(value)
            except factories.NotDescribable:
                pass
    return logged


def load_arguments(load, checkpoint_path, weights_only: bool | None, given: dict) -> tuple[object, dict]:
    """``(checkpoint, kwargs)`` for Lightning's ``load_from_checkpoint`` (``load``) called
    with ``given``: the checkpoint's factories rebuilt from their descriptions (but those in
    ``given``), and ``weights_only`` where ``load`` takes it (Lightning >= 2.6; the read here
    applies it on older ones).

    A factory with no plain description is pickled in the checkpoint, which then needs
    ``weights_only=False`` (load only checkpoints you trust); one that does not pickle (a
    lambda) is left out: pass it again (``optimizer=...``). ``weights_only=None`` is torch's
    default, True since torch 2.6, and True here on older torch too. The checkpoint is the
    path, or, where the hyperparameters of an earlier version hold :data:`TRAINER_SETTINGS`,
    a copy without them (with a warning naming the Trainer's)."""
    if weights_only is None and TORCH_LOAD_UNPICKLES_BY_DEFAULT:
        weights_only = True
    saved = read_checkpoint(checkpoint_path, weights_only)
    hparams = saved.get("hyper_parameters") or {}
    kwargs = {**{k: factories.rebuild(hparams[k]) for k in saved.get(FACTORIES_KEY, ()) if k not in given}, **given}
    if "weights_only" in inspect.signature(load).parameters:
        kwargs["weights_only"] = weights_only
    legacy = {k: hparams[k] for k in TRAINER_SETTINGS if k in hparams and k not in given}
    if not legacy:
        return checkpoint_path, kwargs
    rank_zero_warn(
        f"The checkpoint's {', '.join(f'{k}={v!r}' for k, v in legacy.items())} are Trainer settings now and are "
        f"not read: pass Trainer({', '.join(f'{TRAINER_SETTINGS[k]}=...' for k in legacy)}) to train on"
    )
    saved["hyper_parameters"] = {k: v for k, v in hparams.items() if k not in legacy}
    buffer = io.BytesIO()
    torch.save(saved, buffer)
    buffer.seek(0)
    return buffer, kwargs


def read_checkpoint(path, weights_only: bool | None) -> dict:
    """The checkpoint at ``path`` (a path, URL or file object), memory-mapped where it can be."""
    if hasattr(path, "seek"):
        start = path.tell()
        try:
            return load_checkpoint_file(path, weights_only)
        finally:
            path.seek(start)
    try:
        return torch.load(path, map_location="cpu", weights_only=weights_only, mmap=True)
    except (RuntimeError, OSError, ValueError):  # not a local zip-format file: a URL, an old format
        return load_checkpoint_file(path, weights_only)
