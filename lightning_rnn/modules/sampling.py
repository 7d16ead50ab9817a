"""Drawing the next token from logits: temperature, top-k and top-p (nucleus)."""
from __future__ import annotations

import torch

from ..utils.checks import check_int, check_number


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                generator: torch.Generator | None = None, top_p: float | None = None) -> torch.Tensor:
    """One token id per row of ``logits`` (B, V) -> (B,) int64.

    ``temperature`` 0 picks the most likely token; otherwise the logits are divided by
    it, restricted to the ``top_k`` largest (all if None; ties with the k-th are kept),
    then to the nucleus of ``top_p`` (see :func:`nucleus`; all if None), and sampled with
    ``generator``. A tiny temperature tends to the most likely token (the logits are
    shifted so that their maximum is 0 before the division, which cannot overflow).
    """
    temperature, top_k, top_p = check_sampling_arguments(temperature, top_k, top_p)
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float()
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature  # <= 0; -inf where it underflows
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p is not None and top_p < 1:
        probs = nucleus(probs, top_p)  # multinomial takes weights that do not sum to 1
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """``probs`` (B, V) with every token outside the nucleus set to 0: a token stays when
    the tokens more likely than it hold less than ``top_p`` of the probability (Holtzman et
    al. 2020's smallest set of most likely tokens whose probability reaches top_p; tokens
    of equal probability stay or go together, and the most likely always stays)."""
    ordered = probs.sort(dim=-1, descending=True).values  # (B, V)
    above = ordered.cumsum(dim=-1) - ordered  # what the tokens before each one in that order hold
    kept = (above < top_p).sum(dim=-1, keepdim=True)  # (B, 1), >= 1
    smallest = ordered.gather(-1, kept - 1)
    return probs.masked_fill(probs < smallest, 0.0)


def check_sampling_arguments(temperature, top_k, top_p=None,
                             temperature_name: str = "temperature") -> tuple[float, int | None, float | None]:
    """``(temperature, top_k, top_p)`` as a float, an int and a float (from Python, numpy or
    0-d tensor numbers): a finite temperature >= 0 (named ``temperature_name``), ``top_k``
    None or >= 1 and ``top_p`` None or in (0, 1]."""
    temperature = check_number(temperature_name, plain_number(temperature), 0)
    top_k = check_int("top_k", plain_number(top_k), 1, optional=True)
    top_p = check_number("top_p", plain_number(top_p), 0, 1, low_open=True, optional=True)
    return temperature, top_k, top_p


def check_length(length, name: str = "length") -> int:
    """``length`` (characters to generate) as an int >= 0, from Python, numpy or 0-d tensor
    integers, named ``name`` in errors."""
    return check_int(name, plain_number(length), 0)


def check_stop(stop) -> str | None:
    """A stop string: None or a non-empty str."""
    if stop is not None and (not isinstance(stop, str) or not stop):
        error = ValueError if isinstance(stop, str) else TypeError
        raise error(f"stop: expected None or a non-empty str, got {stop!r}")
    return stop


def plain_number(value):
    """A one-element tensor's number; anything else as it is."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        return value.item()
    return value
