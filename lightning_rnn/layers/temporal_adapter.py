"""Apply a per-item module to every timestep at once."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence


class TemporalAdapter(nn.Module):
    """Run ``module`` on all timesteps with a single call (one GEMM for a Linear).

    ``module`` maps ``(N, *item)`` to ``(N, *out)``, where ``item`` is the trailing
    ``item_dims`` dimensions of one timestep (1 for features, 0 for token ids). The
    adapter views ``(..., *item)`` as ``(prod(...), *item)``, applies the module once
    and restores the leading dimensions: ``(N, T, A) -> (N, T, B)``. A
    :class:`~torch.nn.utils.rnn.PackedSequence` is mapped through its ``.data``
    (``(tokens, A) -> (tokens, B)``) and keeps its batch sizes and orderings.
    """

    def __init__(self, module: nn.Module, item_dims: int = 1):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
        if not isinstance(item_dims, int) or isinstance(item_dims, bool) or item_dims < 0:
            raise ValueError(f"item_dims: expected an int >= 0, got {item_dims!r}")
        self.module = module
        self.item_dims = item_dims

    def forward(self, x):
        if isinstance(x, PackedSequence):
            return x._replace(data=self._apply_flat(x.data, 1))
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x: expected a Tensor or PackedSequence, got {type(x).__name__}")
        return self._apply_flat(x, x.dim() - self.item_dims)

    def _apply_flat(self, x: torch.Tensor, num_leading: int) -> torch.Tensor:
        if num_leading < 1:
            raise ValueError(
                f"x: expected at least {self.item_dims + 1} dimensions (leading dims + "
                f"{self.item_dims} item dims), got shape {tuple(x.shape)}"
            )
        leading, item = x.shape[:num_leading], x.shape[num_leading:]
        y = self.module(x.reshape(-1, *item))
        return y.reshape(*leading, *y.shape[1:])

    def extra_repr(self) -> str:
        return f"item_dims={self.item_dims}" if self.item_dims != 1 else ""
