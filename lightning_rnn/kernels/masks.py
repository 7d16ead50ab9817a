"""The random masks of a forward: dropout between layers, weight drop, recurrent dropout, zoneout.

Every mask is a bool tensor (1 byte per element where it is saved for backward) drawn
through :func:`draw`. :func:`draw_layer_masks` draws all of a forward's masks at its start,
before any kernel runs, in one fixed order (per layer, per direction: weight drop,
recurrent dropout, zoneout of c, zoneout of h; then the variational between-layer masks),
so that every path through the kernels (chunked or not) uses the same masks. torch.nn's
between-layer dropout ("standard") keeps its own draw, :func:`dropout_keep`, which follows
torch.nn's random stream.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def draw(kind: str, shape, p: float, device: torch.device) -> torch.Tensor:
    """A bool tensor of ``shape``, True with probability ``p``. ``kind`` names the mask
    ("weight_drop", "recurrent_dropout", "zoneout_c", "zoneout_h", "dropout"): for the
    dropouts p is the probability to keep, for zoneout to keep the previous value.

    On the CPU, where the compiled kernels are built, from a seed drawn from torch's
    generator (so ``torch.manual_seed`` reproduces it) by the kernels' vectorized
    generator (csrc/rnn_random.h); else ``torch.rand(shape) < p``."""
    device = torch.device(device)
    ext = _cpu_extension() if device.type == "cpu" else None
    if ext is None:
        return torch.rand(shape, device=device) < p
    seed = int(torch.randint(0, 2**62, (), dtype=torch.int64))
    return ext.random_mask(seed, math.prod(shape), float(p)).view(shape)


def _cpu_extension():
    """The built cpp extension, or None where it is not available (no compiler: masks then
    come from torch.rand)."""
    global _extension
    if _extension is False:
        from .backends import BackendUnavailable
        from .cpp import load

        try:
            _extension = load()
        except BackendUnavailable:
            _extension = None
    return _extension


_extension = False  # not looked up yet


@dataclass(frozen=True)
class LayerMasks:
    """One layer-direction's masks of a forward (None where the option is off or in evaluation)."""

    weight_keep: torch.Tensor | None = None  # (G*H, P): weight drop on W_hh
    recurrent_keep: torch.Tensor | None = None  # (B, P): recurrent dropout, sequences in sorted order
    keep_c: torch.Tensor | None = None  # (N, H): zoneout keeps c_{t-1} (LSTM)
    keep_h: torch.Tensor | None = None  # (N, P): zoneout keeps h_{t-1}


def draw_layer_masks(num_layer_directions: int, weight_shape, num_sequences: int, num_rows: int,
                     hidden_size: int, output_size: int, device: torch.device, weight_drop: float = 0.0,
                     recurrent_dropout: float = 0.0, zoneout: tuple[float, float] = (0.0, 0.0)) -> list[LayerMasks]:
    """The masks of every layer-direction, in :func:`draw`'s documented order (training only)."""
    p_c, p_h = zoneout
    masks = []
    for _ in range(num_layer_directions):
        masks.append(LayerMasks(
            weight_keep=draw("weight_drop", weight_shape, 1 - weight_drop, device) if weight_drop else None,
            recurrent_keep=draw("recurrent_dropout", (num_sequences, output_size), 1 - recurrent_dropout, device)
            if recurrent_dropout else None,
            keep_c=draw("zoneout_c", (num_rows, hidden_size), p_c, device) if p_c else None,
            keep_h=draw("zoneout_h", (num_rows, output_size), p_h, device) if p_h else None,
        ))
    return masks


def dropout_keep(shape, dtype: torch.dtype, device: torch.device, p: float) -> torch.Tensor:
    """Bool keep-mask, drawn as F.dropout draws its noise on CPU (the same RNG stream), so a
    layer with inter-layer dropout matches torch.nn's under the same seed."""
    return torch.empty(shape, dtype=dtype, device=device).bernoulli_(1 - p).bool()


def dropout(x: torch.Tensor, keep: torch.Tensor, p: float) -> torch.Tensor:
    """Inverted dropout with a given bool keep-mask: ``x * keep / (1 - p)`` (zeros at p = 1)."""
    return _MaskedDropout.apply(x, keep, 0.0 if p >= 1 else 1.0 / (1 - p))


class _MaskedDropout(torch.autograd.Function):
    """Dropout that saves its bool mask (F.dropout on CPU saves a float mask)."""

    @staticmethod
    def forward(ctx, x, keep, scale):
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return torch.where(keep, x * scale, 0.0)

    @staticmethod
    def backward(ctx, grad):
        (keep,) = ctx.saved_tensors
        return torch.where(keep, grad * ctx.scale, 0.0), None, None
