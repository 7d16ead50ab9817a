"""The one entry from a fused layer into the kernels: :func:`run` a stack over a batch.

The layer hands over a normalized batch (:class:`~lightning_rnn.kernels.batch.SequenceBatch`),
its initial states in the kernels' (length-sorted) order, its weights (and layer-norm
parameters) and the options of the call; :func:`run` draws the call's masks
(:mod:`.masks`) and picks the path, from the fastest that serves the call down:

1. ``"torch"`` (asked for, or forced: meta device, torch.func, export, an empty batch):
   torch.nn's own implementation of the whole stack (no cell options).
2. The backend's ``padded`` entry: a padded time-major batch, no autocast, no checkpointing,
   no between-layer dropout, no cell options: the whole stack in one step.
3. Checkpointing, unidirectional: all layers inside each chunk of steps (:mod:`.checkpointing`).
4. The backend's ``stack`` entry: every layer in one call (no between-layer dropout, no
   cell options).
5. Layer after layer: each direction through the backend's per-layer entry point (the
   reference backend's where the backend does not declare the cell options), dropout
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

from . import checkpointing, dispatch, masks, precision
from .backends import Backend
from .batch import SequenceBatch
from .cell import CellExtras, CellSpec
from .masks import draw_layer_masks, dropout, dropout_keep
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
    dropout_mode: str = "standard"  # "variational": one between-layer mask per sequence
    zoneout: tuple[float, float] = (0.0, 0.0)  # (cell, hidden)
    recurrent_dropout: float = 0.0
    weight_drop: float = 0.0

    def dropout_after(self, layer: int) -> bool:
        """Between-layer dropout on the output of ``layer``: all layers but the last, training only."""
        return bool(self.dropout) and self.training and layer < self.num_layers - 1

    @property
    def any_dropout(self) -> bool:
        return bool(self.dropout) and self.training and self.num_layers > 1

    def options_in_use(self, layer_norm: bool) -> list[str]:
        """The options torch.nn's implementation lacks that this call uses, by argument name."""
        names = [name for name, on in (("layer_norm", layer_norm), ("zoneout", any(self.zoneout)),
                                       ("recurrent_dropout", self.recurrent_dropout),
                                       ("weight_drop", self.weight_drop)) if on]
        return names + (["dropout_mode"] if self.dropout_mode == "variational" and self.dropout else [])


def run(cell: CellSpec, backend: str, batch: SequenceBatch, states: list[torch.Tensor] | None,
        weights: list[tuple], options: RunOptions, norms: list[tuple] | None = None
        ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The stack's output and final states.

    batch: normalized input; states: None (zeros) or ``[h0 (L*D, B, P), c0 (L*D, B, H)]``
    (the GRU: ``[h0]``) in the batch's sorted order, checked by the layer; weights: per
    layer-direction, ``WEIGHTS_PER_LAYER`` tensors or None; norms: per layer-direction the
    layer-norm parameters (see :class:`~lightning_rnn.kernels.cell.CellExtras`), None without
    layer norm; backend: a name of :data:`dispatch.BACKENDS`. Returns ``out`` as
    :meth:`SequenceBatch.restore` takes it and the final states in the sorted order.
    """
    kernels = None if batch.batch == 0 else dispatch.resolve_backend(backend, batch.device)
    if kernels is None:  # "torch", or an empty batch (B = 0): torch.nn's empty outputs
        _check_torch_serves(backend, batch, options, norms is not None)
        return _run_torch(cell, batch, _states_or_zeros(cell, batch, states, options), weights, options)
    layer_masks = _draw_masks(cell, batch, weights, options)
    extras = _extras(cell, options, norms, layer_masks)
    if kernels.padded is not None and extras is None:
        result = _run_padded(cell, kernels, batch, states, weights, options)
        if result is not None:
            return result
    states = _states_or_zeros(cell, batch, states, options)
    between = _between_layer_masks(batch, options)
    chunk = _chunk_length(options.checkpoint_chunk_size, batch, states, weights, norms)
    if chunk is not None and options.num_directions == 1:
        return _run_stack_in_chunks(cell, kernels, batch, states, weights, extras, between, options, chunk)
    if chunk is None and kernels.stack is not None and not options.any_dropout and extras is None:
        result = kernels.stack(cell.name, batch.data, batch.batch_sizes, states, weights, options.num_layers,
                               options.num_directions)
        if result is not None:
            return result
    return _run_layers(cell, kernels, batch, states, weights, extras, between, options, chunk)


def _check_torch_serves(backend: str, batch: SequenceBatch, options: RunOptions, layer_norm: bool) -> None:
    """torch.nn's implementation has none of the cell options: refuse them, naming the first
    (the meta device only propagates shapes, which the options do not change)."""
    used = options.options_in_use(layer_norm)
    if used and batch.device.type != "meta":
        where = "backend='torch'" if backend == "torch" else "torch.nn's implementation (under torch.func or export)"
        raise ValueError(f"{used[0]}: {where} has no {used[0]}; use a kernel backend (auto, cpp, cuda, reference)")
    if backend == "torch" and options.checkpoint_chunk_size is not None:
        warnings.warn("checkpoint_chunk_size is ignored with backend='torch' (torch.nn keeps its own "
                      "activations)", RuntimeWarning, stacklevel=4)


def _draw_masks(cell: CellSpec, batch: SequenceBatch, weights, options: RunOptions):
    """Every layer-direction's masks of this call (training), or a list of Nones."""
    LD = options.num_layers * options.num_directions
    zoneout = options.zoneout if cell.num_states == 2 else (0.0, options.zoneout[1])
    if not options.training or not (options.weight_drop or options.recurrent_dropout or any(zoneout)):
        return [None] * LD
    w_hh = weights[0][1]
    return draw_layer_masks(LD, tuple(w_hh.shape), batch.batch, batch.data.shape[0], options.hidden_size,
                            options.output_size, batch.device, options.weight_drop, options.recurrent_dropout,
                            zoneout)


def _extras(cell: CellSpec, options: RunOptions, norms, masks) -> list[CellExtras] | None:
    """Per layer-direction what the kernels need beyond torch.nn's cell, or None if nothing."""
    zoneout = options.zoneout if cell.num_states == 2 else (0.0, options.zoneout[1])
    recurrent = options.recurrent_dropout if options.training else 0.0
    weight_p = options.weight_drop if options.training else 0.0
    if norms is None and not any(zoneout) and not recurrent and not weight_p:
        return None
    extras = []
    for k, m in enumerate(masks):
        extras.append(CellExtras(
            norm=() if norms is None else tuple(norms[k]),
            recurrent_keep=None if m is None else m.recurrent_keep, recurrent_p=recurrent,
            zoneout=zoneout, keep_c=None if m is None else m.keep_c, keep_h=None if m is None else m.keep_h,
            weight_keep=None if m is None else m.weight_keep, weight_p=weight_p,
        ))
    return extras


def _between_layer_masks(batch: SequenceBatch, options: RunOptions) -> list[torch.Tensor] | None:
    """The variational between-layer masks as (N, D*P) token rows (each sequence's one mask
    at all its steps), drawn after the layers' masks; None for torch.nn's dropout."""
    if options.dropout_mode != "variational" or not options.any_dropout:
        return None
    width, p = options.num_directions * options.output_size, options.dropout
    index = _sequence_index(batch)
    return [masks.draw("dropout", (batch.batch, width), 1 - p, batch.device).index_select(0, index)
            for k in range(options.num_layers - 1)]


def _sequence_index(batch: SequenceBatch) -> torch.Tensor:
    """(N,) the sequence (row of the sorted batch) of every packed row."""
    if batch.is_full:
        return torch.arange(batch.batch, device=batch.device).repeat(batch.num_steps)
    return torch.cat([torch.arange(n) for n in batch.batch_sizes.tolist()]).to(batch.device)


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


def _chunk_length(chunk_size, batch: SequenceBatch, states, weights, norms) -> int | None:
    """Steps per checkpointed chunk, or None when off or when no gradient is needed."""
    chunk = checkpointing.chunk_length(chunk_size, batch.num_steps)
    if chunk is None or not torch.is_grad_enabled():
        return None
    params = [w for layer in (weights + (norms or [])) for w in layer if w is not None]
    return chunk if any(t.requires_grad for t in [batch.data, *states, *params]) else None


def _cell_entry(cell: CellSpec, kernels: Backend, extras):
    """The per-layer entry point for calls with or without ``extras``: the reference backend's
    where ``kernels`` does not declare the cell options."""
    if extras is not None and not kernels.cell_options:
        kernels = dispatch.load("reference")
    return kernels.cell(cell.name)


def _drop_between(x: torch.Tensor, layer: int, between, options: RunOptions) -> torch.Tensor:
    """Between-layer dropout on the output of ``layer``, if it applies."""
    if not options.dropout_after(layer):
        return x
    keep = between[layer] if between is not None else dropout_keep(x.shape, x.dtype, x.device, options.dropout)
    return dropout(x, keep, options.dropout)


def _run_layers(cell, kernels: Backend, batch, states, weights, extras, between, options: RunOptions,
                chunk: int | None):
    """Layer after layer, both directions of a layer on the same input, dropout between layers."""
    D = options.num_directions
    run_cell = _cell_entry(cell, kernels, extras)
    x, batch_sizes = batch.data, batch.batch_sizes
    finals = []  # each layer-direction's final states
    for layer in range(options.num_layers):
        outs = []
        for d in range(D):
            k = layer * D + d
            init = [s[k] for s in states]
            extra = None if extras is None else extras[k]
            if d == 0:  # in the dtype the kernels compute in: under autocast one low-precision
                x = compute_input(x, weights[k][0])  # copy for both directions, and what chunks save
            if chunk is None:
                out, *final = call_cell(run_cell, x, batch_sizes, init, weights[k], d == 1, extra)
            else:  # bidirectional: each layer-direction is chunked on its own
                layers = [_LayerPlan(weights[k], extra)]
                span = partial(_run_span, run_cell, cell.num_states, 0.0, d == 1, layers, 0)
                out, final = checkpointing.run_chunked(
                    span, [x, *_plan_rows(layers)], batch_sizes, init, _plan_sequences(layers), _plan_whole(layers),
                    chunk, d == 1, kernels.weight_packs,
                )
            outs.append(out)
            finals.append(final)
        x = outs[0] if D == 1 else precision.cat(outs, dim=1)  # (N, D*P)
        x = _drop_between(x, layer, between, options)
    return x, [_stack(f) for f in zip(*finals)]


@dataclass(frozen=True)
class _LayerPlan:
    """One layer-direction inside a checkpointed span: its weights and extras, whose tensors
    the chunks take by rows, by sequences or whole (see checkpointing.run_chunked)."""

    weights: tuple
    extras: CellExtras | None


def _plan_rows(layers) -> list:
    return [t for plan in layers if plan.extras is not None for t in plan.extras.row_tensors()]


def _plan_sequences(layers) -> list:
    return [t for plan in layers if plan.extras is not None for t in plan.extras.sequence_tensors()]


def _plan_whole(layers) -> list:
    return [t for plan in layers for t in (*plan.weights, *(plan.extras.whole_tensors() if plan.extras is not None else ()))]


def _run_stack_in_chunks(cell, kernels: Backend, batch, states, weights, extras, between, options: RunOptions,
                         chunk: int):
    """A unidirectional stack with ALL layers inside each chunk of steps.

    Only the network input, the masks (bool) and every layer's states at chunk boundaries
    are saved; layer outputs are recomputed too. The between-layer masks are drawn up front,
    in the order the per-layer path draws them, so results match it exactly.
    """
    L, S = options.num_layers, cell.num_states
    init = [s[layer] for layer in range(L) for s in states]
    # saved by the chunks in the dtype the kernels compute in (low precision under autocast)
    x = compute_input(batch.data, weights[0][0])
    shape = (x.shape[0], options.output_size)  # (N, P)
    drops = [k for k in range(L - 1) if options.dropout_after(k)]
    if between is None:
        between_rows = [dropout_keep(shape, x.dtype, x.device, options.dropout) for _ in drops]
    else:
        between_rows = [between[k] for k in drops]
    layers = [_LayerPlan(weights[k], None if extras is None else extras[k]) for k in range(L)]
    span = partial(_run_span, _cell_entry(cell, kernels, extras), S, options.dropout, False, layers,
                   len(between_rows))
    out, final = checkpointing.run_chunked(
        span, [x, *between_rows, *_plan_rows(layers)], batch.batch_sizes, init, _plan_sequences(layers),
        _plan_whole(layers), chunk, False, kernels.weight_packs,
    )
    return out, [_stack(final[s::S]) for s in range(S)]


def _run_span(run_cell, num_states: int, p: float, reverse: bool, layers: Sequence[_LayerPlan], num_between: int,
              rows: list, batch_sizes, states: list, sequences: list, whole: list) -> tuple:
    """Consecutive layers of one direction over a range of steps: ``(out, *final_states)``.

    rows: the chunk's rows of x, of the ``num_between`` between-layer keep masks (applied
    with probability ``p``: none, or one per layer boundary) and of the layers' row tensors;
    states: ``num_states`` per layer ((b, P) h, (b, H) c); sequences: the chunk's rows of the
    layers' sequence tensors; whole: every layer's weights and norm parameters, in the plan's order.
    """
    x, between, rest = rows[0], rows[1 : 1 + num_between], iter(rows[1 + num_between :])
    sequences, whole = iter(sequences), iter(whole)
    finals = []
    for k, plan in enumerate(layers):
        if k and between:
            x = dropout(x, between[k - 1], p)
        layer_weights = tuple(next(whole) for _ in range(WEIGHTS_PER_LAYER))
        extra = plan.extras
        if extra is not None:
            extra = extra.with_tensors([next(rest) for _ in extra.row_tensors()],
                                       [next(sequences) for _ in extra.sequence_tensors()],
                                       [next(whole) for _ in extra.whole_tensors()])
        layer_states = states[k * num_states : (k + 1) * num_states]
        x, *final = call_cell(run_cell, x, batch_sizes, layer_states, layer_weights, reverse, extra)
        finals.extend(final)
    return (x, *finals)


def call_cell(run_cell, x, batch_sizes, states, weights, reverse: bool, extras: CellExtras | None = None):
    """One layer-direction through a backend's per-layer entry point; the projection is
    passed only when there is one (the GRU's entry takes none), the extras only when given."""
    w_ih, w_hh, b_ih, b_hh, w_hr = weights
    projection = () if w_hr is None else (w_hr,)
    if extras is None:
        return run_cell(x, batch_sizes, *states, w_ih, w_hh, b_ih, b_hh, reverse, *projection)
    return run_cell(x, batch_sizes, *states, w_ih, w_hh, b_ih, b_hh, reverse, *projection, extras=extras)


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
