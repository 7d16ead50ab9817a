"""Gradients of gradients through the fused layers, against torch.nn in float64.

A backward with create_graph=True (a gradient penalty, a Hessian-vector product) makes
the kernels differentiate their layer-direction as a graph of torch ops
(kernels/differentiable.py); the second-order gradients must be torch.nn's.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_sequence

from lightning_rnn import FusedGRU, FusedLSTM
from lightning_rnn.kernels.dispatch import available_backends

BACKENDS = available_backends("cpu")
CASES = [
    pytest.param(FusedLSTM, nn.LSTM, {}, None, id="lstm"),
    pytest.param(FusedLSTM, nn.LSTM, dict(num_layers=2, bidirectional=True), None, id="lstm_2x_bidirectional"),
    pytest.param(FusedLSTM, nn.LSTM, dict(proj_size=2, bias=False), None, id="lstm_projected_no_bias"),
    pytest.param(FusedLSTM, nn.LSTM, dict(num_layers=2), 2, id="lstm_2x_checkpointed"),
    pytest.param(FusedGRU, nn.GRU, dict(num_layers=2), None, id="gru_2x"),
    pytest.param(FusedGRU, nn.GRU, dict(bidirectional=True), 2, id="gru_bidirectional_checkpointed"),
]


LENGTHS = (5, 3, 4)


def _penalized_loss(model, x, hx, packed: bool):
    """A loss with a gradient penalty: sum(out) + |d sum(out^2) / d(x, h0)|^2.

    x: (B, T, I); packed: sequences of LENGTHS, unsorted; else time-major (T, B, I).
    """
    inp = pack_sequence([s[:n] for s, n in zip(x, LENGTHS)], enforce_sorted=False) if packed else x.transpose(0, 1)
    out = model(inp, hx)[0]
    out = out.data if packed else out
    grads = torch.autograd.grad(out.square().sum(), [x, hx[0] if isinstance(hx, tuple) else hx], create_graph=True)
    return out.sum() + sum(g.square().sum() for g in grads)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("fused_class, torch_class, kwargs, chunk", CASES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_penalty_matches_torch_nn(backend, fused_class, torch_class, kwargs, chunk, packed):
    torch.manual_seed(0)
    theirs = torch_class(3, 4, dtype=torch.float64, **kwargs)
    ours = fused_class.from_torch(theirs, backend=backend)
    ours.checkpoint_chunk_size = chunk
    D, L = 2 if theirs.bidirectional else 1, theirs.num_layers
    x = torch.randn(3, 5, 3, dtype=torch.float64)  # (B, T, I)
    h0 = torch.randn(L * D, 3, kwargs.get("proj_size") or 4, dtype=torch.float64)
    hx = (h0, torch.randn(L * D, 3, 4, dtype=torch.float64)) if fused_class is FusedLSTM else h0
    results = []
    for model in (ours, theirs):
        leaves = [x.clone().requires_grad_()] + [s.clone().requires_grad_() for s in (hx if isinstance(hx, tuple) else (hx,))]
        state = tuple(leaves[1:]) if isinstance(hx, tuple) else leaves[1]
        loss = _penalized_loss(model, leaves[0], state, packed)
        grads = torch.autograd.grad(loss, leaves + list(model.parameters()))
        results.append((loss, grads))
    (loss, grads), (expected_loss, expected) = results
    torch.testing.assert_close(loss, expected_loss)
    assert len(grads) == len(expected)
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_first_order_gradients_with_create_graph_equal_the_plain_ones(backend):
    """The differentiable path gives the hand-written backward's gradients (float64)."""
    torch.manual_seed(0)
    layer = FusedLSTM(3, 4, num_layers=2, proj_size=2, dtype=torch.float64, backend=backend)
    x = torch.randn(6, 2, 3, dtype=torch.float64, requires_grad=True)
    params = [x, *layer.parameters()]
    plain = torch.autograd.grad(layer(x)[0].square().sum(), params)
    graphed = torch.autograd.grad(layer(x)[0].square().sum(), params, create_graph=True)
    assert all(g.requires_grad for g in graphed)
    for got, want in zip(graphed, plain):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("fused_class, torch_class, kwargs", [
    pytest.param(FusedLSTM, nn.LSTM, dict(num_layers=2), id="lstm_2x"),
    pytest.param(FusedLSTM, nn.LSTM, dict(proj_size=2), id="lstm_projected"),
    pytest.param(FusedGRU, nn.GRU, dict(bidirectional=True), id="gru_bidirectional"),
])
@pytest.mark.parametrize("chunk", [None, 1, 2, "sqrt"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_weight_gradient_penalty_matches_torch_nn(backend, fused_class, torch_class, kwargs, chunk):
    """A penalty on the WEIGHT gradients (MAML's inner step, a Hessian-vector product):
    the weights are used by every chunk of a checkpointed layer, so each chunk's rerun must
    give its own share of their gradient only (the total derivative would run back through
    the carried states into the earlier chunks and count them again)."""
    torch.manual_seed(0)
    theirs = torch_class(3, 4, dtype=torch.float64, **kwargs)
    ours = fused_class.from_torch(theirs, backend=backend)
    ours.checkpoint_chunk_size = chunk
    x = torch.randn(5, 2, 3, dtype=torch.float64)  # (T, B, I)
    results = []
    for model in (ours, theirs):
        params = list(model.parameters())
        first = torch.autograd.grad(model(x)[0].square().sum(), params, create_graph=True)
        penalty = sum(g.square().sum() for g in first)
        results.append((first, torch.autograd.grad(penalty, params)))
    (first, second), (expected_first, expected_second) = results
    for got, want in zip(first + second, expected_first + expected_second):
        torch.testing.assert_close(got, want)
