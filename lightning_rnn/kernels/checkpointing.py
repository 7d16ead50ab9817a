"""Gradient checkpointing over time for the fused recurrent layers.

With ``checkpoint_chunk_size = k`` a recurrence is cut into chunks of ``k`` consecutive
steps. Each chunk runs inside :class:`RecomputedChunk`, an autograd Function whose
forward builds no graph and saves only its inputs — views of the chunk's packed input
rows, the states at the chunk's first step (and dropout masks) — and whose backward runs
the chunk again with grad enabled and backpropagates through it, one chunk at a time.

Saved for backward: the input plus ``ceil(T / k)`` boundary states per layer; during
backward one chunk's activations live at a time. ``k = ceil(sqrt(T))`` ("sqrt") makes
both O(sqrt(T)) (besides the input itself).

Why not ``torch.utils.checkpoint``: its non-reentrant mode keeps the chunk inputs alive
outside ``ctx.save_for_backward``, invisible to ``saved_tensors_hooks`` (so to
:class:`~lightning_rnn.utils.memory.SavedTensorsMeter`), and it would have to replay the
RNG for dropout. Here everything kept goes through ``save_for_backward`` and dropout
masks are drawn before the chunks run and passed in, so results are identical to the
un-checkpointed layer (gradients up to float summation order).

Packed weights: a compiled CPU backend packs W_ih and W_hh for oneDNN once per kernel
call, which at chunks of a few steps costs about what the packed GEMMs save. The
backend's ``weight_packs`` store (where it declares one, :mod:`.backends`) is active while the chunks run
forward and while each is recomputed and backpropagated in backward, so each weight is
packed once per pass into each layout the pass uses; the store is emptied at the end of
each pass. It holds packed copies of the chunked layers' weights (in backward up to two
per weight: the forward's and the backward's layouts), not activations.

Weight gradients: left to autograd, every chunk's backward would return a fresh gradient
per weight for autograd to add to the others' (an allocation and an extra pass over the
weight per chunk). The chunks of a call share a :class:`~lightning_rnn.kernels.grad_sink.GradSink`
instead: a compiled backend's GEMM adds each chunk's weight gradient into the pass's
running sum (beta = 1), and the sums go to autograd once, from the chunk a pass reaches
last.

Packed layout (see :mod:`lightning_rnn.kernels.steps`): a chunk is a range of steps
``[t0, t1)``, i.e. the rows ``offsets[t0] : offsets[t1]`` with ``batch_sizes[t0:t1]``.
Its initial state is the carried ``(B, H)`` state sliced to ``batch_sizes[t0]`` rows;
a reverse direction visits the chunks last to first.
"""
from __future__ import annotations

import math
import numbers
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Callable, Sequence

import torch

from . import precision
from .grad_sink import GradSink
from .steps import Steps

# span(rows, batch_sizes, start_states, sequences, whole) -> (out_rows, *final_states)
Span = Callable[..., tuple]


def check_chunk_size(value, name: str = "checkpoint_chunk_size", optional: bool = True):
    """None (off, where ``optional``), "sqrt" or an int >= 1; anything else is a ValueError
    naming ``name``."""
    if (value is None and optional) or value == "sqrt":
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name}: expected {'None, ' if optional else ''}'sqrt' or an int >= 1, got {value!r}")
    return int(value)  # a numpy int as torch.nn-style sizes are taken


def chunk_length(chunk_size, num_steps: int) -> int | None:
    """Steps per chunk for a sequence of ``num_steps`` steps (None: checkpointing off)."""
    check_chunk_size(chunk_size)
    if chunk_size is None:
        return None
    return math.ceil(math.sqrt(num_steps)) if chunk_size == "sqrt" else chunk_size


@dataclass(frozen=True)
class Chunk:
    steps: slice  # time steps [t0, t1)
    rows: slice  # their packed rows
    batch: int  # rows active at the chunk's first step (the widest)


def split_steps(steps: Steps, length: int) -> list[Chunk]:
    """Chunks of at most ``length`` steps in the order the recurrence visits them.

    As few chunks as ``length`` allows, their lengths differing by at most one (T = 50,
    length 8: 8 + 6 x 7 rather than 6 x 8 + 2; a short tail chunk costs a whole call).
    """
    T, ends = len(steps.batch_sizes), steps.offsets + (steps.num_rows,)
    count = math.ceil(T / length)
    starts = [k * (T // count) + min(k, T % count) for k in range(count + 1)]
    chunks = [
        Chunk(slice(t0, t1), slice(ends[t0], ends[t1]), steps.batch_sizes[t0]) for t0, t1 in zip(starts, starts[1:])
    ]
    return chunks[::-1] if steps.reverse else chunks


class PassPacks:
    """A backend's weight-pack store (or None) shared by the ``count`` chunks of one call.

    ``with packs:`` makes it active; ``chunk_done()`` after each chunk empties it once
    all ``count`` chunks of a pass (the forward, or one backward) have run.
    """

    def __init__(self, store, count: int):
        self.store, self.count, self.done = store, count, 0

    def __enter__(self):
        if self.store is not None:
            self.store.__enter__()
        return self

    def __exit__(self, *exc):
        if self.store is not None:
            self.store.__exit__(*exc)

    def chunk_done(self) -> None:
        self.done += 1
        if self.done == self.count:
            self.done = 0
            if self.store is not None:
                self.store.clear()


@dataclass
class ChunkedCall:
    """What the chunks of one call share: the weight-pack store (which also counts the
    chunks), the sink their weight gradients are summed in, and how many trailing inputs
    of each chunk are weights."""

    packs: PassPacks
    sink: GradSink
    num_weights: int


class RecomputedChunk(torch.autograd.Function):
    """``run(*inputs)`` without a graph; saves ``inputs``, reruns ``run`` in backward.

    ``call`` (a :class:`ChunkedCall`) is shared by the chunks of one call; ``index`` is this
    chunk's place in the order they run forward. The pack store is active around both
    runs. The weight gradients of a backward pass are summed over the chunks in the sink
    (the compiled kernels add into the sums in place) and handed to autograd once, by the
    chunk the pass reaches last (index 0); the chunk it reaches first (the last index)
    starts the sums afresh.
    """

    @staticmethod
    def forward(ctx, run, call, index, *inputs):
        device = next(t.device for t in inputs if t is not None)
        ctx.run, ctx.call, ctx.index = run, call, index
        ctx.autocast = (device.type, torch.is_autocast_enabled(device.type), torch.get_autocast_dtype(device.type))
        ctx.save_for_backward(*inputs)
        with call.packs:
            return run(*inputs)

    @staticmethod
    def backward(ctx, *grad_outputs):
        needs = ctx.needs_input_grad[3:]  # (run, call, index, *inputs)
        call = ctx.call
        # create_graph=True (a gradient of a gradient): rerun on views of the saved inputs,
        # connected to the graph, and keep the graph of the gradients (autograd sums them).
        # Views, not the inputs themselves: the gradients asked for are this chunk's own
        # (autograd.grad stops at a view), where the total derivative with respect to a
        # weight would also run back through the carried states into the earlier chunks,
        # which their own backward counts. Else on detached copies, with the weight
        # gradients summed in the sink.
        create_graph = torch.is_grad_enabled()
        inputs = [
            t if t is None else t.view_as(t) if create_graph else t.detach().requires_grad_(need)
            for t, need in zip(ctx.saved_tensors, needs)
        ]
        sink = None if create_graph else call.sink
        if sink is not None and ctx.index == call.packs.count - 1:
            sink.clear()
        device_type, enabled, dtype = ctx.autocast
        with call.packs, (sink if sink is not None else nullcontext()):  # packed weights reused here too
            with torch.enable_grad(), torch.autocast(device_type, dtype=dtype, enabled=enabled):
                outputs = ctx.run(*inputs)
            pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if o.requires_grad and g is not None]
            wrt = [t for t, need in zip(inputs, needs) if t is not None and need]
            found = iter(torch.autograd.grad(
                [o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True, create_graph=create_graph
            ))
        call.packs.chunk_done()
        grads = [next(found) if t is not None and need else None for t, need in zip(inputs, needs)]
        if sink is not None:
            for i in range(len(inputs) - call.num_weights, len(inputs)):
                if inputs[i] is not None and needs[i]:
                    grads[i] = sink.keep(inputs[i], grads[i])
                    if grads[i] is None and ctx.index == 0:
                        grads[i] = sink.take(inputs[i])
        return (None, None, None, *grads)


def _call_span(span: Span, batch_sizes: torch.Tensor, counts: tuple[int, int, int], *tensors):
    """``span(rows, batch_sizes, states, sequences, whole)`` from a chunk's flat inputs."""
    num_rows, num_states, num_sequences = counts
    rows, rest = list(tensors[:num_rows]), tensors[num_rows:]
    states, rest = list(rest[:num_states]), rest[num_states:]
    sequences, whole = list(rest[:num_sequences]), list(rest[num_sequences:])
    return tuple(span(rows, batch_sizes, states, sequences, whole))


def run_chunked(
    span: Span,
    rows: Sequence[torch.Tensor],
    batch_sizes: torch.Tensor,
    init: Sequence[torch.Tensor],
    sequences: Sequence[torch.Tensor],
    whole: Sequence[torch.Tensor | None],
    length: int,
    reverse: bool,
    weight_packs: Callable[[], object] | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Run ``span`` over chunks of ``length`` steps, recomputing each in backward.

    rows: (N, ·) row-aligned tensors, each chunk gets its rows (x first, then masks); init:
    (B, ·) states carried from chunk to chunk (h has proj_size columns with a projection, c
    hidden_size); sequences: (B, ·) tensors each chunk gets the rows of its sequences of
    (recurrent dropout's masks); whole: passed whole to every chunk (weights and norm
    parameters, None entries included), their gradients summed over the chunks;
    weight_packs: the kernel backend's store factory, if it declares one (see the module
    docstring). Returns ``out (N, F)`` and the final states, shaped as ``init`` and in its order.
    """
    carried = list(init)
    outs: list[torch.Tensor] = []
    chunks = split_steps(Steps.from_batch_sizes(batch_sizes, reverse), length)
    packs = PassPacks(weight_packs() if weight_packs is not None else None, len(chunks))
    call = ChunkedCall(packs, GradSink(), len(whole))
    call.sink.expect(whole)
    # The chunks' rows as the pieces of one split (not one slice each): in backward their
    # gradients are joined once, where slices would each fill an (N, I) tensor of zeros.
    pieces = _row_pieces(chunks, rows)
    counts = (len(rows), len(carried), len(sequences))
    for index, chunk in enumerate(chunks):
        b = chunk.batch
        run = partial(_call_span, span, batch_sizes[chunk.steps], counts)
        out, *final = RecomputedChunk.apply(
            run, call, index, *pieces[chunk.rows.start], *(s[:b] for s in carried), *(s[:b] for s in sequences),
            *whole,
        )
        carried = [f if b == s.shape[0] else precision.cat([f, s[b:]]) for f, s in zip(final, carried)]
        outs.append(out)
        packs.chunk_done()
    return precision.cat(outs[::-1] if reverse else outs), carried


def _row_pieces(chunks: Sequence[Chunk], tensors: Sequence[torch.Tensor]) -> dict[int, list[torch.Tensor]]:
    """{first row of a chunk: [its rows of each tensor]}, each tensor split once along rows."""
    ordered = sorted(chunks, key=lambda c: c.rows.start)
    sizes = [c.rows.stop - c.rows.start for c in ordered]
    splits = [t.split(sizes) for t in tensors]
    return {c.rows.start: [parts[i] for parts in splits] for i, c in enumerate(ordered)}
