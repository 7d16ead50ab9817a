"""Helpers for recurrent state: a Tensor (GRU), a tuple of Tensors (LSTM) or None."""
from __future__ import annotations

import torch

State = torch.Tensor | tuple[torch.Tensor, ...] | None


def detach_state(state: State) -> State:
    """``state`` cut from the autograd graph (values kept), so BPTT stops here."""
    if state is None:
        return None
    if isinstance(state, torch.Tensor):
        return state.detach()
    return tuple(detach_state(s) for s in state)


def hidden_of(state: State) -> torch.Tensor:
    """The hidden state ``h_n`` (layers * directions, B, H): ``state`` itself or its first item."""
    if isinstance(state, torch.Tensor):
        return state
    if isinstance(state, tuple) and state and isinstance(state[0], torch.Tensor):
        return state[0]
    raise TypeError(f"state: expected a Tensor or a tuple (h_n, ...) of Tensors, got {type(state).__name__}")


def state_batch_size(state: State) -> int | None:
    """Rows of the batch ``state`` belongs to (dim 1 of ``h_n``), None for no state."""
    return None if state is None else hidden_of(state).shape[1]
