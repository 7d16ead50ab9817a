"""The one entry from a fused layer into the kernels: :func:`run` a stack over a batch.

The layer hands over a normalized batch (:class:`~lightning_rnn.kernels.batch.SequenceBatch`),
its initial states in the kernels' (length-sorted) order, its weights and the options of
the call; :func:`run` picks the path, from the fastest that serves the call down:

1. ``"torch"`` (asked for, or forced: meta device, torch.func, export, an empty batch):
   torch.nn's own implementation of the whole stack.
2. The backend's ``padded`` entry: a padded time-major batch, no autocast, no checkpointing,
   no inter-layer dropout: the whole stack in one step.
3. Checkpointing, unidirectional: all layers inside each chunk of steps (:mod:`.checkpointing`).
4. The backend's ``stack`` entry: every layer in one call (no inter-layer dropout).
5. Layer after layer: each direction through the backend's per-layer entry point, dropout
   between layers, each layer-direction checkpointed on its own if asked.

A backend declares which of these it has (:mod:`.backends`); an entry that declines a call
(returns None) hands it to the next path. Every path gives the same results.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import partial
from typing import Sequence

import torch

from . import checkpointing, dispatch, precision
from .backends import Backend
from .batch import SequenceBatch
from .cell import CellSpec
from .masks import dropout, dropout_keep
from .precision import compute_input

WEIGHTS_PER_LAYER = 5  # (w_ih, w_hh, b_ih, b_hh, w_hr) per layer-direction, None where absent


@dataclass(frozen=True)
class RunOptions:
    num_layers: int
    num_directions: int
    output_size: int  # P: h's columns (proj_size, else hidden_size)
    hidden_size: int  # H: c's columns
    dropout: float = 0.0  # between stacked layers, while training
    training: bool = False
    checkpoint_chunk_size: int | str | None = None  # None, an int or "sqrt" (see checkpointing)

    def dropout_after(self, layer: int) -> bool:
        """Inter-layer dropout on the output of ``layer``: all layers but the last, training only."""
        return bool(self.dropout) and self.training and layer < self.num_layers - 1

    @property
    def any_dropout(self) -> bool:
        return bool(self.dropout) and self.training and self.num_layers > 1


def run(cell: CellSpec, backend: str, batch: SequenceBatch, states: list[torch.Tensor] | None,
        weights: list[tuple], options: RunOptions) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The stack's output and final states.

    batch: normalized input; states: None (zeros) or ``[h0 (L*D, B, P), c0 (L*D, B, H)]``
    (the GRU: ``[h0]``) in the batch's sorted order, checked by the layer; weights: per
    layer-direction, ``WEIGHTS_PER_LAYER`` tensors or None; backend: a name of
    :data:`dispatch.BACKENDS`. Returns ``out`` as :meth:`SequenceBatch.restore` takes it
    and the final states in the sorted order.
    """
    kernels = None if batch.batch == 0 else dispatch.resolve_backend(backend, batch.device)
    if kernels is None:  # "torch", or an empty batch (B = 0): torch.nn's empty outputs
        if backend == "torch" and options.checkpoint_chunk_size is not None:
            warnings.warn("checkpoint_chunk_size is ignored with backend='torch' (torch.nn keeps its own "
                          "activations)", RuntimeWarning, stacklevel=3)
        return _run_torch(cell, batch, _states_or_zeros(cell, batch, states, options), weights, options)
    if kernels.padded is not None:
        result = _run_padded(cell, kernels, batch, states, weights, options)
        if result is not None:
            return result
    states = _states_or_zeros(cell, batch, states, options)
    chunk = _chunk_length(options.checkpoint_chunk_size, batch, states, weights)
    if chunk is not None and options.num_directions == 1:
        return _run_stack_in_chunks(cell, kernels, batch, states, weights, options, chunk)
    if chunk is None and kernels.stack is not None and not options.any_dropout:
        result = kernels.stack(cell.name, batch.data, batch.batch_sizes, states, weights, options.num_layers,
                               options.num_directions)
        if result is not None:
            return result
    return _run_layers(cell, kernels, batch, states, weights, options, chunk)


def _run_padded(cell: CellSpec, kernels: Backend, batch: SequenceBatch, states, weights, options: RunOptions):
    """The backend's padded entry where the call is its kind, else None."""
    x, w = batch.source, weights[0][0]
    if (batch.kind != "padded" or batch.batch_first or options.checkpoint_chunk_size is not None
            or options.any_dropout or x.dtype not in kernels.padded_dtypes or x.dtype != w.dtype
            or torch.is_autocast_enabled(x.device.type)):
        return None
    h0, c0 = (None, None) if states is None else (states[0], states[1] if cell.num_states == 2 else None)
    return kernels.padded(cell.name, x, h0, c0, weights, options.num_layers, options.num_directions)


def _states_or_zeros(cell: CellSpec, batch: SequenceBatch, states, options: RunOptions) -> list[torch.Tensor]:
    """The given states, or zeros: (L*D, B, P) h_0 and the LSTM's (L*D, B, H) c_0, one tensor
    for both where P == H."""
    if states is not None:
        return states
    LD, B = options.num_layers * options.num_directions, batch.batch
    widths = (options.output_size, options.hidden_size)[: cell.num_states]
    zeros = {w: batch.source.new_zeros(LD, B, w) for w in set(widths)}
    return [zeros[w] for w in widths]


def _chunk_length(chunk_size, batch: SequenceBatch, states, weights) -> int | None:
    """Steps per checkpointed chunk, or None when off or when no gradient is needed."""
    chunk = checkpointing.chunk_length(chunk_size, batch.num_steps)
    if chunk is None or not torch.is_grad_enabled():
        return None
    tensors = [batch.data, *states, *(w for layer in weights for w in layer if w is not None)]
    return chunk if any(t.requires_grad for t in tensors) else None


def _run_layers(cell, kernels: Backend, batch, states, weights, options: RunOptions, chunk: int | None):
    """Layer after layer, both directions of a layer on the same input, dropout between layers."""
    run_cell, D = kernels.cell(cell.name), options.num_directions
    x, batch_sizes = batch.data, batch.batch_sizes
    finals = []  # each layer-direction's final states
    for layer in range(options.num_layers):
        outs = []
        for d in range(D):
            k = layer * D + d
            init = [s[k] for s in states]
            if d == 0:  # in the dtype the kernels compute in: under autocast one low-precision
                x = compute_input(x, weights[k][0])  # copy for both directions, and what chunks save
            if chunk is None:
                out, *final = call_cell(run_cell, x, batch_sizes, init, weights[k], d == 1)
            else:  # bidirectional: each layer-direction is chunked on its own
                span = partial(_run_span, run_cell, cell.num_states, 0.0, d == 1)
                out, final = checkpointing.run_chunked(
                    span, x, batch_sizes, init, weights[k], [], chunk, d == 1, kernels.weight_packs
                )
            outs.append(out)
            finals.append(final)
        x = outs[0] if D == 1 else precision.cat(outs, dim=1)  # (N, D*P)
        if options.dropout_after(layer):
            x = dropout(x, dropout_keep(x.shape, x.dtype, x.device, options.dropout), options.dropout)
    return x, [_stack(f) for f in zip(*finals)]


def _run_stack_in_chunks(cell, kernels: Backend, batch, states, weights, options: RunOptions, chunk: int):
    """A unidirectional stack with ALL layers inside each chunk of steps.

    Only the network input, the dropout masks (bool) and every layer's states at chunk
    boundaries are saved; layer outputs are recomputed too. The masks are drawn up front,
    in the order the per-layer path draws them, so results match it exactly.
    """
    L, S = options.num_layers, cell.num_states
    init = [s[layer] for layer in range(L) for s in states]
    flat = [w for layer_weights in weights for w in layer_weights]
    # saved by the chunks in the dtype the kernels compute in (low precision under autocast)
    x = compute_input(batch.data, flat[0])
    shape = (x.shape[0], options.output_size)  # (N, P)
    masks = [dropout_keep(shape, x.dtype, x.device, options.dropout) for k in range(L - 1) if options.dropout_after(k)]
    span = partial(_run_span, kernels.cell(cell.name), S, options.dropout, False)
    out, final = checkpointing.run_chunked(
        span, x, batch.batch_sizes, init, flat, masks, chunk, False, kernels.weight_packs
    )
    return out, [_stack(final[s::S]) for s in range(S)]


def _run_span(run_cell, num_states: int, p: float, reverse: bool, x, batch_sizes, masks, states, weights) -> tuple:
    """Consecutive layers of one direction over a range of steps: ``(out, *final_states)``.

    states: ``num_states`` tensors per layer ((b, P) h, (b, H) c); weights:
    ``WEIGHTS_PER_LAYER`` per layer; masks: the dropout keep-masks between the layers
    (empty when dropout is off), applied with probability ``p``.
    """
    S, W, finals = num_states, WEIGHTS_PER_LAYER, []
    for k in range(len(weights) // W):
        if k and masks:
            x = dropout(x, masks[k - 1], p)
        x, *final = call_cell(run_cell, x, batch_sizes, states[k * S: (k + 1) * S], weights[W * k: W * (k + 1)], reverse)
        finals.extend(final)
    return (x, *finals)


def call_cell(run_cell, x, batch_sizes, states, weights, reverse: bool):
    """One layer-direction through a backend's per-layer entry point; the projection is
    passed only when there is one (the GRU's entry takes none)."""
    w_ih, w_hh, b_ih, b_hh, w_hr = weights
    projection = () if w_hr is None else (w_hr,)
    return run_cell(x, batch_sizes, *states, w_ih, w_hh, b_ih, b_hh, reverse, *projection)


def _run_torch(cell: CellSpec, batch: SequenceBatch, states, weights, options: RunOptions):
    """The whole stack on torch.nn's implementation (``torch._VF.lstm`` / ``gru``)."""
    fn = getattr(torch._VF, cell.name)
    hx = tuple(states) if cell.num_states > 1 else states[0]
    flat = [w for layer_weights in weights for w in layer_weights if w is not None]  # torch.nn's _flat_weights
    has_bias = weights[0][2] is not None
    args = (flat, has_bias, options.num_layers, options.dropout, options.training, options.num_directions == 2)
    if batch.is_full:  # (T, B, F) out, as restore() takes it
        out, *final = fn(batch.source, hx, *args, False)
    else:
        out, *final = fn(batch.data, batch.batch_sizes, hx, *args)
    return out, final


def _stack(states: Sequence[torch.Tensor]) -> torch.Tensor:
    """(L*D, B, H) final states from the layer-directions' (B, H) ones; one is unsqueezed
    (a view of the kernel's own result, not a copy)."""
    return states[0].unsqueeze(0) if len(states) == 1 else precision.stack(states)
