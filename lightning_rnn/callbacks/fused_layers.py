"""Finding the fused recurrent layers inside any module."""
from __future__ import annotations

from torch import nn

from ..layers import FusedRNNBase


def fused_layers(module: nn.Module) -> list[FusedRNNBase]:
    """Every FusedLSTM/FusedGRU in ``module`` (itself included), in ``modules()`` order."""
    return [m for m in module.modules() if isinstance(m, FusedRNNBase)]
