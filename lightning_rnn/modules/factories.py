"""The factories among a module's hyperparameters, as plain data in checkpoints.

An :class:`~lightning_rnn.modules.RNNModule` is built from factories (``rnn``,
``optimizer``, ``scheduler``: ``functools.partial`` objects, from Python or from a Hydra
``_partial_: true`` config). Pickled as they are, they make a checkpoint that torch's
``weights_only`` loader refuses, and Lightning's ``Trainer.fit(ckpt_path=...)`` (like
``validate``/``test``/``predict``) loads with it. So a checkpoint holds each factory as its
Hydra description instead: strings, numbers, lists and dicts, e.g.
``{"_target_": "lightning_rnn.layers.recurrent.FusedLSTM", "_partial_": True,
"hidden_size": 128}``, which :func:`rebuild` turns back into the factory.
"""
from __future__ import annotations

import functools
import importlib
import numbers
from typing import Any

import torch
from omegaconf import DictConfig, ListConfig, OmegaConf

_PLAIN = (type(None), bool, int, float, str)


class NotDescribable(ValueError):
    """A value with no plain-data description (a tensor, a lambda, an arbitrary object)."""


def is_plain(value: Any) -> bool:
    """Whether ``value`` is already plain data (None, bool, numbers, str, and lists,
    tuples and str-keyed dicts of those)."""
    if isinstance(value, _PLAIN):
        return True
    if isinstance(value, (list, tuple)):
        return all(is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_plain(v) for k, v in value.items())
    return False


def describe(value: Any) -> Any:
    """The plain-data (Hydra) description of ``value``; raises :class:`NotDescribable`.

    A ``functools.partial`` becomes ``{"_target_": ..., "_partial_": True, "_args_": [...],
    **keywords}``; a class, function or other module attribute (``torch.float32``) becomes
    a reference to it; tuples are kept as tuples (``betas=(0.9, 0.999)`` comes back a tuple).
    """
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, numbers.Number) and not isinstance(value, complex):  # numpy scalars
        return value.item() if hasattr(value, "item") else float(value)
    if isinstance(value, functools.partial):
        description = {"_target_": _path_of(value.func), "_partial_": True}
        if value.args:
            description["_args_"] = [describe(v) for v in value.args]
        for key, item in value.keywords.items():
            if key.startswith("_") and key.endswith("_"):
                raise NotDescribable(f"a keyword named like a Hydra key: {key!r}")
            description[key] = describe(item)
        return description
    if isinstance(value, list):
        return [describe(v) for v in value]
    if isinstance(value, tuple):
        return {"_target_": "builtins.tuple", "_args_": [[describe(v) for v in value]]}
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise NotDescribable(f"a dict with keys that are not strings: {list(value)!r}")
        if "_target_" in value:
            raise NotDescribable("a dict with a '_target_' key")
        return {k: describe(v) for k, v in value.items()}
    if callable(value) or isinstance(value, torch.dtype):
        return {"_target_": "hydra.utils.get_object", "path": _path_of(value)}
    raise NotDescribable(f"{type(value).__name__} {value!r}")


def rebuild(description: Any) -> Any:
    """The value :func:`describe` described (targets of modules this package has since
    moved are read at their new place, see :data:`MOVED`)."""
    from hydra.utils import instantiate

    if not isinstance(description, (dict, list)):
        return description
    return instantiate(_moved_targets(description), _convert_="all")


#: Module paths of this package that checkpoints written by earlier versions may name.
MOVED = {"lightning_rnn.layers.cells.": "lightning_rnn.layers.fused.",
         "lightning_rnn.layers.recurrent.FusedLSTM": "lightning_rnn.layers.fused.FusedLSTM",
         "lightning_rnn.layers.recurrent.FusedGRU": "lightning_rnn.layers.fused.FusedGRU"}


def _moved_targets(description: Any) -> Any:
    """``description`` with every ``_target_`` (and ``get_object`` path) of :data:`MOVED` renamed."""
    if isinstance(description, list):
        return [_moved_targets(v) for v in description]
    if not isinstance(description, dict):
        return description
    renamed = {}
    for key, value in description.items():
        if key in ("_target_", "path") and isinstance(value, str):
            for old, new in MOVED.items():
                if value.startswith(old):
                    value = new + value[len(old):]
        renamed[key] = _moved_targets(value)
    return renamed


def _path_of(obj: Any) -> str:
    """``module.qualname`` of ``obj``, checked to import back to ``obj`` itself; for what this
    package exports at its top (``lightning_rnn.FusedLSTM``) that shorter path, which stays
    valid when the defining module moves."""
    if isinstance(obj, torch.dtype):
        path = str(obj)  # "torch.float32"
    else:
        module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
        if module is None or name is None or "<" in name:
            raise NotDescribable(f"{obj!r} has no importable name")
        path = f"{module}.{name}"
        package = module.split(".")[0]
        if package == "lightning_rnn" and _import(f"{package}.{name}") is obj:
            path = f"{package}.{name}"
    if _import(path) is not obj:
        raise NotDescribable(f"{path} does not import back to {obj!r}")
    return path


def _import(path: str) -> Any:
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        try:
            for attr in parts[split:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None
