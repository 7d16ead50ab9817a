"""Summaries of a sequence encoding: the final hidden state or the mean over steps."""
from __future__ import annotations

import torch
from torch.nn.utils.rnn import PackedSequence, pad_packed_sequence

from .state import State, hidden_of


def final_hidden(state: State, num_directions: int) -> torch.Tensor:
    """The top layer's final hidden state, directions concatenated: (B, num_directions * H).

    For packed input ``h_n`` holds each sequence's state at its own last step, so this is
    correct for variable lengths (and the backward direction's "last" is step 0).
    """
    h_n = hidden_of(state)  # (layers * directions, B, H)
    top = h_n[-num_directions:]  # (directions, B, H)
    return top.transpose(0, 1).reshape(h_n.shape[1], -1)


def mean_over_steps(outputs: torch.Tensor | PackedSequence, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of the outputs over each sequence's real steps: (B, T, D) -> (B, D).

    ``outputs`` is padded batch-first with ``lengths`` (B,), or a PackedSequence.
    """
    if isinstance(outputs, PackedSequence):
        outputs, lengths = pad_packed_sequence(outputs, batch_first=True)
    if lengths is None:
        return outputs.mean(dim=1)
    lengths = lengths.to(outputs.device)
    mask = torch.arange(outputs.shape[1], device=outputs.device) < lengths.unsqueeze(1)  # (B, T)
    summed = (outputs * mask.unsqueeze(-1)).sum(dim=1)
    return summed / lengths.unsqueeze(1).to(outputs.dtype)
