"""Drawing the next token from logits: temperature and top-k."""
from __future__ import annotations

import math
import numbers

import torch


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
    numbers); a ValueError naming the argument (the temperature as ``temperature_name``)
    unless the temperature is finite and >= 0 and ``top_k`` None or >= 1."""
    temperature = plain_number(temperature)
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) \
            or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"{temperature_name}: expected a finite number >= 0, got {temperature!r}")
    top_k = plain_number(top_k)
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 1):
        raise ValueError(f"top_k: expected None or an int >= 1, got {top_k!r}")
    return float(temperature), None if top_k is None else int(top_k)


def check_length(length, name: str = "length") -> int:
    """``length`` (characters to generate) as an int >= 0, from Python, numpy or 0-d tensor
    integers; a ValueError naming ``name`` otherwise."""
    length = plain_number(length)
    if isinstance(length, bool) or not isinstance(length, numbers.Integral) or length < 0:
        raise ValueError(f"{name}: expected an int >= 0, got {length!r}")
    return int(length)


def plain_number(value):
    """A one-element tensor's number; anything else as it is."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        return value.item()
    return value
