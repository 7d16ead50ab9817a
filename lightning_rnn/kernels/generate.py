"""Token-by-token generation on the compiled CPU kernels (``csrc/rnn_generate.h``, ``csrc/rnn_draw.h``).

The loop of a language model's sampling, draw a token, embed it, run every layer's cell
and project to the next logits, runs in C++ for a whole chunk of steps per call: no
Python and no op dispatch between steps. A model is an embedding, a stack of
unidirectional LSTM or GRU layers (torch.nn's weights, an LSTM's projection included)
and a linear output layer, all float32 on the CPU; :meth:`GenerationWeights.pack` puts
their weights in the layout the loop reads (each layer's ``[W_ih | W_hh]`` as one matrix,
every matrix in column panels, the biases folded), optionally in bfloat16, which halves
the bytes read per step.

Tokens are drawn as :func:`lightning_rnn.modules.sampling.sample_next` draws them (the
same temperature, top-k and top-p filters, then one categorical draw per token), with
random numbers from the ``torch.Generator`` given, so a seed reproduces a text; the draws
are not torch.multinomial's, so the text differs from the per-step Python loop's under
the same seed, while the distribution is the same.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from . import cpp

CELLS = ("lstm", "gru")
WEIGHT_DTYPES = (torch.float32, torch.bfloat16)


@dataclass(frozen=True)
class GenerationWeights:
    """A model's weights as the compiled loop reads them (see :meth:`pack`)."""

    cell: str  # "lstm" or "gru"
    embedding: torch.Tensor  # (V_in, E) float32
    layers: tuple[torch.Tensor, ...]  # per layer [W_ih | W_hh] (G*H, I_l + P) in panels
    biases: tuple[torch.Tensor, ...]  # per layer (G*H,) float32, folded
    b_hn: tuple[torch.Tensor, ...]  # GRU: per layer b_hn (H,) float32; LSTM: none
    projections: tuple[torch.Tensor, ...]  # LSTM with proj_size: per layer W_hr (P, H) in panels; else none
    w_out: torch.Tensor  # (V, P) in panels
    b_out: torch.Tensor  # (V,) float32
    bytes_per_step: int  # of weights one step of one sequence reads (every matrix and bias, one embedding row)

    @classmethod
    def pack(cls, cell: str, embedding: torch.Tensor, layers: Sequence[tuple], w_out: torch.Tensor,
             b_out: torch.Tensor | None = None, dtype: torch.dtype = torch.float32) -> "GenerationWeights":
        """Copies of the weights in the loop's layout.

        Args:
            cell: ``"lstm"`` or ``"gru"``.
            embedding: (V_in, E) the input embedding, one row per token id.
            layers: per layer ``(w_ih, w_hh, b_ih, b_hh, w_hr)`` in torch.nn's shapes (biases
                None without bias, ``w_hr`` None without a projection).
            w_out, b_out: the output layer, (V, P) and (V,) or None.
            dtype: of the matrices, float32 or bfloat16 (rounded once here; every sum is float32).

        Raises:
            ValueError: naming an argument that is not a float32 CPU tensor (the kernel checks
                the shapes, naming the one that does not fit).
        """
        if cell not in CELLS:
            raise ValueError(f"cell: expected one of {', '.join(CELLS)}, got {cell!r}")
        if dtype not in WEIGHT_DTYPES:
            raise ValueError(f"dtype: expected torch.float32 or torch.bfloat16, got {dtype!r}")
        tensors = {"embedding": embedding, "w_out": w_out, "b_out": b_out}
        tensors.update({f"layers[{k}][{i}]": w for k, layer in enumerate(layers) for i, w in enumerate(layer)})
        for name, t in tensors.items():
            plain = isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.dtype == torch.float32
            if t is not None and not plain:
                described = f"{t.dtype} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{name}: the compiled generation loop takes float32 CPU tensors, got {described}")
        if not layers:
            raise ValueError("layers: expected at least one layer")
        with torch.no_grad():
            packed = [_pack_layer(cell, *layer, dtype) for layer in layers]
            b_out = torch.zeros(w_out.shape[0]) if b_out is None else b_out.detach().contiguous()
            matrices = [p[0] for p in packed] + [p[3] for p in packed if p[3] is not None] + [w_out.to(dtype)]
            vectors = [t for p in packed for t in (p[1], p[2]) if t is not None] + [b_out, embedding[0]]
            size = sum(m.numel() * m.element_size() for m in matrices) + sum(v.nbytes for v in vectors)
            panels = cpp.load().generation_panels  # BackendUnavailable without a build
            return cls(cell, embedding.detach().contiguous(), tuple(panels(p[0]) for p in packed),
                       tuple(p[1] for p in packed), tuple(p[2] for p in packed if p[2] is not None),
                       tuple(panels(p[3]) for p in packed if p[3] is not None), panels(w_out.detach().to(dtype)),
                       b_out, size)


def _pack_layer(cell: str, w_ih, w_hh, b_ih, b_hh, w_hr, dtype):
    """([W_ih | W_hh] in ``dtype``, the folded bias, the GRU's b_hn, W_hr in ``dtype``)."""
    GH = w_ih.shape[0]
    weights = torch.cat([w_ih.detach(), w_hh.detach()], dim=1).to(dtype)
    b_ih = torch.zeros(GH) if b_ih is None else b_ih.detach()
    b_hh = torch.zeros(GH) if b_hh is None else b_hh.detach()
    if cell == "lstm":
        b_hn = None
        bias = (b_ih + b_hh).contiguous()
    else:  # r multiplies W_hn h + b_hn: b_hn stays apart from the folded bias
        H = GH // 3
        bias = torch.cat([b_ih[: 2 * H] + b_hh[: 2 * H], b_ih[2 * H:]]).contiguous()
        b_hn = b_hh[2 * H:].contiguous()
    projection = None if w_hr is None else w_hr.detach().to(dtype)
    return weights, bias, b_hn, projection


def sampling_options(temperature: float, top_k: int | None, top_p: float | None) -> tuple[float, int, float]:
    """The kernel's form of the filters: top_k 0 and top_p 1 for none."""
    return float(temperature), int(top_k or 0), 1.0 if top_p is None else float(top_p)


class CompiledDecoder:
    """Draws tokens with the compiled loop, carrying the logits and the state between calls.

    Args:
        weights: the model, packed.
        logits: (B, V) the logits the first token of each of the B sequences is drawn from.
        state: the layers' state after those logits, ``h`` (L, B, P) for a GRU, ``(h, c)``
            with c (L, B, H) for an LSTM (copied: the decoder advances its own).
        temperature, top_k, top_p: the filters (see
            :func:`lightning_rnn.modules.sampling.sample_next`).
        generator: a CPU ``torch.Generator``, the source of every draw.
    """

    def __init__(self, weights: GenerationWeights, logits: torch.Tensor, state, temperature: float,
                 top_k: int | None, top_p: float | None, generator: torch.Generator):
        self.weights = weights
        self.logits = logits.detach().float().contiguous().clone()  # (B, V)
        states = (state,) if isinstance(state, torch.Tensor) else tuple(state)
        if len(states) != (2 if weights.cell == "lstm" else 1):
            raise ValueError(f"state: expected {'(h, c)' if weights.cell == 'lstm' else 'h'} for a {weights.cell}, "
                             f"got {len(states)} tensors")
        self.h = states[0].detach().float().contiguous().clone()
        self.c = states[1].detach().float().contiguous().clone() if len(states) == 2 else None
        self.options = sampling_options(temperature, top_k, top_p)
        self.generator = generator
        self._run = getattr(cpp.load(), f"{weights.cell}_generate")  # BackendUnavailable without a build

    @property
    def state(self):
        """The layers' state after the tokens drawn so far were fed."""
        return self.h if self.c is None else (self.h, self.c)

    def run(self, steps: int) -> torch.Tensor:
        """The next ``steps`` tokens of every sequence, (B, steps) int64; each is fed to the
        network after it is drawn, so ``logits`` and ``state`` follow the last one."""
        w = self.weights
        return self._run(w.embedding, list(w.layers), list(w.biases), list(w.b_hn), list(w.projections), w.w_out,
                         w.b_out, self.h, self.c, self.logits, steps, *self.options, self.generator)


def draw(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
         generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of ``logits`` (B, V) float32 on the CPU -> (B,) int64: the compiled
    loop's draw alone (for tests and comparisons with ``sample_next``)."""
    return cpp.load().draw_tokens(logits.contiguous(), *sampling_options(temperature, top_k, top_p), generator)


__all__ = ["CompiledDecoder", "GenerationWeights", "draw"]
