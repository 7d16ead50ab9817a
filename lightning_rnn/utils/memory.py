"""Counting activation memory on any device: the bytes saved for backward.

A tensor saved for backward keeps its whole storage alive, so we count distinct
storages (by data pointer), each once, no matter how many views of it are saved.
Parameters are usually excluded: they live anyway, whatever the layer saves.
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import nn


class SavedTensorsMeter:
    """Context manager: ``meter.bytes`` = bytes of distinct storages saved for backward.

    >>> with SavedTensorsMeter(exclude=model.parameters()) as meter:
    ...     loss = model(x).sum()
    >>> meter.bytes
    """

    def __init__(self, exclude: Iterable[torch.Tensor] | nn.Module = ()):
        if isinstance(exclude, nn.Module):
            exclude = list(exclude.parameters()) + list(exclude.buffers())
        self._excluded = {_storage_key(t) for t in exclude}
        self.storages: dict[int, int] = {}
        self._hooks = None

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key is not None and key not in self._excluded:
            self.storages[key] = t.untyped_storage().nbytes()
        return t

    def __enter__(self) -> "SavedTensorsMeter":
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())


def _storage_key(t: torch.Tensor) -> int | None:
    try:
        ptr = t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # tensors without a storage (e.g. functional wrappers)
        return None
    return ptr or None


def saved_tensor_bytes(fn: Callable, *args, exclude: Iterable[torch.Tensor] | nn.Module = (), **kwargs) -> int:
    """Bytes of distinct storages that ``fn(*args, **kwargs)`` saves for backward."""
    with SavedTensorsMeter(exclude) as meter:
        result = fn(*args, **kwargs)
    del result
    return meter.bytes
