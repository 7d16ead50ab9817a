"""GradientCheckpointing: trade recomputation for activation memory.

When fit starts (``on_fit_start``: after the module's ``configure_model`` and ``setup``,
so layers built there count too) every fused layer gets ``checkpoint_chunk_size =
chunk_size``: its recurrence then saves only its input and the states at chunk
boundaries and recomputes each chunk during backward (see
:mod:`lightning_rnn.kernels.checkpointing`). Outputs and gradients are the same as without
it. ``teardown``, or ``on_exception`` when fit raises, restores the layers' own settings.

Optionally, other submodules named in ``modules`` (e.g. ``["head"]``) are wrapped with
``torch.utils.checkpoint`` (non-reentrant): in training their forward keeps only its
inputs and is rerun during backward.
"""
from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import torch
import torch.utils.checkpoint
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import nn

from ..kernels.checkpointing import check_chunk_size
from .fused_layers import fused_layers


def _checkpointed_forward(module: nn.Module, forward, *args, **kwargs):
    if module.training and torch.is_grad_enabled():
        return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)
    return forward(*args, **kwargs)


class GradientCheckpointing(Callback):
    """Turn on gradient checkpointing over time in every fused layer of the model.

    Args:
        chunk_size: steps per recomputed chunk: ``"sqrt"`` (ceil(sqrt(T)) for each call,
            memory O(sqrt(T))) or an int >= 1. Longer chunks (fewer of them) keep fewer
            boundary states and run a little faster, but the chunk that backward
            recomputes at a time grows.
        modules: names of other submodules (as in ``named_modules()``) to wrap with
            ``torch.utils.checkpoint``; empty by default.
    """

    def __init__(self, chunk_size: int | str = "sqrt", modules: list[str] | tuple[str, ...] = ()):
        self.chunk_size = check_chunk_size(chunk_size, "chunk_size", optional=False)
        if isinstance(modules, str) or not isinstance(modules, Sequence) or not all(isinstance(m, str) for m in modules):
            raise TypeError(f"modules: expected a list of submodule names, got {modules!r}")
        if len(set(modules)) != len(modules):
            raise ValueError(f"modules: expected distinct submodule names, got {list(modules)!r}")
        self.modules = tuple(modules)
        self._previous: list[tuple[nn.Module, object]] = []
        self._wrapped: list[nn.Module] = []

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._previous or self._wrapped:  # already set up
            return
        layers = fused_layers(pl_module)
        for layer in layers:
            self._previous.append((layer, layer.checkpoint_chunk_size))
            layer.checkpoint_chunk_size = self.chunk_size
        named = dict(pl_module.named_modules())
        for name in self.modules:
            if name not in named or name == "":
                raise ValueError(f"modules: {type(pl_module).__name__} has no submodule {name!r}")
            module = named[name]
            if any(_contains(module, layer) for layer in layers):
                rank_zero_warn(
                    f"GradientCheckpointing: modules: {name!r} is or holds a FusedLSTM/FusedGRU, which the "
                    "callback already checkpoints over time; torch.utils.checkpoint around it recomputes it "
                    "once more and hides what it keeps from the saved-tensor counts (memory/activation_mb): "
                    "name its other submodules instead"
                )
            module.forward = partial(_checkpointed_forward, module, module.forward)
            self._wrapped.append(module)
        if not layers and not self._wrapped:
            rank_zero_warn(
                "GradientCheckpointing: the model has no FusedLSTM/FusedGRU layers and no `modules`; nothing to do"
            )
        else:
            on_torch = [layer for layer in layers if layer.backend == "torch"]
            if on_torch:
                rank_zero_warn(
                    f"GradientCheckpointing: {len(on_torch)} of the {len(layers)} fused layer(s) run "
                    "backend='torch' (torch.nn's kernels), which cannot be checkpointed over time; they "
                    "run without it"
                )
            rank_zero_info(
                f"GradientCheckpointing: chunk_size={self.chunk_size!r} on {len(layers)} fused layer(s)"
                + (f"; torch.utils.checkpoint on {', '.join(self.modules)}" if self.modules else "")
            )

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._restore()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._restore()  # Lightning skips teardown when a run raises

    def _restore(self) -> None:
        for layer, previous in self._previous:
            layer.checkpoint_chunk_size = previous
        for module in self._wrapped:
            del module.forward  # the instance attribute; the class's forward shows again
        self._previous, self._wrapped = [], []


def _contains(module: nn.Module, layer: nn.Module) -> bool:
    """Whether ``layer`` is ``module`` or one of its submodules."""
    return any(child is layer for child in module.modules())
