"""Shared by the layer tests: run a recurrent layer and take every gradient."""
from __future__ import annotations

import torch


def outputs_and_grads(layer, x_leaf, inp, hx):
    """``(out, states, grads)`` of ``layer(inp, hx)`` under a loss that weights every output.

    out: the output tensor (``.data`` of a PackedSequence); states: the final states as a
    tuple; grads: d loss / d (x_leaf, the given initial states, every parameter), in order.
    """
    out, state = layer(inp, hx)
    out = out.data if hasattr(out, "batch_sizes") else out
    states = state if isinstance(state, tuple) else (state,)
    g_out = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view_as(out)
    loss = (out * g_out).sum() + sum((s * (k + 2)).sum() for k, s in enumerate(states))
    leaves = [x_leaf] + ([*hx] if isinstance(hx, tuple) else [hx] if hx is not None else [])
    grads = torch.autograd.grad(loss, leaves + list(layer.parameters()), retain_graph=True)
    return out, states, grads


def random_initial_state(layer, batch: int | None):
    """float64 leaves for ``layer``'s hx: h_0 with ``output_size`` columns (proj_size, if set),
    c_0 with hidden_size; (L*D, batch, width), or (L*D, width) for ``batch=None`` (unbatched).
    A tuple for the LSTM, a tensor for the GRU."""
    L = layer.num_layers * layer.num_directions
    widths = (layer.output_size, layer.hidden_size)[: layer.cell.num_states]
    states = tuple(
        torch.randn(*((L, w) if batch is None else (L, batch, w)), dtype=torch.float64, requires_grad=True)
        for w in widths
    )
    return states if len(states) > 1 else states[0]
