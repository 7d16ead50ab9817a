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
    g_out = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    loss = (out * g_out).sum() + sum((s * (k + 2)).sum() for k, s in enumerate(states))
    leaves = [x_leaf] + ([*hx] if isinstance(hx, tuple) else [hx] if hx is not None else [])
    grads = torch.autograd.grad(loss, leaves + list(layer.parameters()), retain_graph=True)
    return out, states, grads
