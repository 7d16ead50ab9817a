"""The recurrent encoder a module is built around: made by a factory, sized by its attributes."""
from __future__ import annotations

from typing import Callable

from torch import nn


def build_rnn(rnn: Callable[..., nn.Module], input_size: int) -> nn.Module:
    """Call the factory ``rnn(input_size=input_size, batch_first=True)``."""
    if isinstance(rnn, nn.Module) or not callable(rnn):
        raise TypeError(
            "rnn: expected a factory called as rnn(input_size=..., batch_first=True), such as "
            f"functools.partial(FusedLSTM, hidden_size=128) or a Hydra `_partial_: true` config; got {rnn!r}"
        )
    module = rnn(input_size=input_size, batch_first=True)
    if not isinstance(module, nn.Module):
        raise TypeError(f"rnn: the factory returned {type(module).__name__}, expected a torch.nn.Module")
    return module


def rnn_output_size(rnn: nn.Module) -> int:
    """Features per step of ``rnn``'s output: ``hidden_size`` (or ``proj_size``) x directions."""
    hidden = getattr(rnn, "proj_size", 0) or getattr(rnn, "hidden_size", None)
    if not isinstance(hidden, int):
        raise TypeError(f"rnn: {type(rnn).__name__} has no int attribute `hidden_size`; the head needs it")
    return hidden * num_directions(rnn)


def num_directions(rnn: nn.Module) -> int:
    return 2 if getattr(rnn, "bidirectional", False) else 1
