"""Drawing the next token from logits: temperature and top-k."""
from __future__ import annotations

import torch

from ..utils.checks import check_int, check_number


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """One token id per row of ``logits`` (B, V) -> (B,) int64.

    ``temperature`` 0 picks the most likely token; otherwise the logits are divided by
    it, restricted to the ``top_k`` largest (all if None) and sampled with ``generator``.
    A tiny temperature tends to the most likely token (the logits are shifted so that
    their maximum is 0 before the division, which cannot overflow).
    """
    temperature, top_k = check_sampling_arguments(temperature, top_k)
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float()
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature  # <= 0; -inf where it underflows
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def check_sampling_arguments(temperature, top_k, temperature_name: str = "temperature") -> tuple[float, int | None]:
    """``(temperature, top_k)`` as a float and an int (from Python, numpy or 0-d tensor
    numbers): a finite temperature >= 0 (named ``temperature_name``) and ``top_k`` None or >= 1."""
    temperature = check_number(temperature_name, plain_number(temperature), 0)
    return temperature, check_int("top_k", plain_number(top_k), 1, optional=True)


def check_length(length, name: str = "length") -> int:
    """``length`` (characters to generate) as an int >= 0, from Python, numpy or 0-d tensor
    integers, named ``name`` in errors."""
    return check_int(name, plain_number(length), 0)


def plain_number(value):
    """A one-element tensor's number; anything else as it is."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        return value.item()
    return value
