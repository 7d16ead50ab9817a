"""The naive baseline: a Python loop over torch.nn.LSTMCell/GRUCell, autograd throughout.

This is what char-rnn did (and what torch-rnn measured itself against): every step's
intermediates are saved by autograd. It shares weights with a fused or torch.nn layer
so all implementations compute the same function.
"""
from __future__ import annotations

import torch
from torch import nn


class CellLoop(nn.Module):
    """Multi-layer unidirectional LSTM/GRU as a loop over cells; input (T, B, I)."""

    def __init__(self, cell: str, input_size: int, hidden_size: int, num_layers: int = 1):
        super().__init__()
        cell_class = {"lstm": nn.LSTMCell, "gru": nn.GRUCell}[cell]
        self.is_lstm = cell == "lstm"
        self.cells = nn.ModuleList(
            cell_class(input_size if k == 0 else hidden_size, hidden_size) for k in range(num_layers)
        )

    @classmethod
    def like(cls, layer: nn.Module) -> "CellLoop":
        """A cell loop with a copy of the weights of an LSTM/GRU-like layer (unidirectional)."""
        cell = "lstm" if isinstance(layer, nn.LSTM) or getattr(getattr(layer, "cell", None), "name", "") == "lstm" else "gru"
        loop = cls(cell, layer.input_size, layer.hidden_size, layer.num_layers)
        ref = layer.weight_ih_l0
        loop.to(device=ref.device, dtype=ref.dtype)
        for k, c in enumerate(loop.cells):
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                getattr(c, name).data.copy_(getattr(layer, f"{name}_l{k}"))
        return loop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for cell in self.cells:
            state = None
            outs = []
            for x_t in x.unbind(0):  # (B, I)
                state = cell(x_t, state)
                outs.append(state[0] if self.is_lstm else state)
            x = torch.stack(outs)  # (T, B, H)
        return x
