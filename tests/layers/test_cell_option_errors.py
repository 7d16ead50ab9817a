"""The cell options' arguments, parameters and conversions: bad values name the argument,
the layer-norm parameters are in the state dict, the init options do what they say,
to_torch() refuses what torch.nn lacks, and options at their defaults change nothing."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lightning_rnn import FusedGRU, FusedLSTM
from lightning_rnn.kernels.dispatch import available_backends

BACKENDS = available_backends("cpu")
CELLS = {"lstm": FusedLSTM, "gru": FusedGRU}
TORCH_CELLS = {"lstm": nn.LSTM, "gru": nn.GRU}
# Options torch.nn's layers lack, each on by itself.
NON_TORCH_OPTIONS = {
    "layer_norm": dict(layer_norm=True),
    "zoneout": dict(zoneout=0.2),
    "recurrent_dropout": dict(recurrent_dropout=0.2),
    "weight_drop": dict(weight_drop=0.2),
    "dropout_mode": dict(dropout=0.2, dropout_mode="variational"),
}
BAD_PROBABILITIES = [
    ("lstm", "zoneout", -0.1), ("lstm", "zoneout", 1.0), ("lstm", "zoneout", (0.1, 1.0)),
    ("lstm", "zoneout", (-0.2, 0.1)), ("lstm", "zoneout", float("nan")), ("gru", "zoneout", 1.5),
    ("lstm", "recurrent_dropout", 1.0), ("gru", "recurrent_dropout", -0.01),
    ("lstm", "weight_drop", 2.0), ("gru", "weight_drop", 1.0), ("gru", "weight_drop", float("nan")),
]


@pytest.mark.parametrize("cell, name, value", BAD_PROBABILITIES)
def test_probability_outside_zero_one_is_named(cell, name, value):
    with pytest.raises(ValueError, match=name):
        CELLS[cell](3, 4, **{name: value})


@pytest.mark.parametrize("cell, kwargs, name", [
    ("gru", dict(zoneout=(0.1, 0.2)), "zoneout"),
    ("lstm", dict(zoneout=(0.1, 0.2, 0.3)), "zoneout"),
    ("gru", dict(forget_bias=1.0), "forget_bias"),
    ("lstm", dict(forget_bias=1.0, bias=False), "forget_bias"),
    ("lstm", dict(dropout_mode="gaussian"), "dropout_mode"),
    ("gru", dict(dropout_mode="Variational"), "dropout_mode"),
    ("lstm", dict(recurrent_init="xavier"), "recurrent_init"),
    ("gru", dict(recurrent_init="orthogonal_"), "recurrent_init"),
])
def test_bad_option_is_a_value_error_naming_it(cell, kwargs, name):
    with pytest.raises(ValueError, match=name):
        CELLS[cell](3, 4, **kwargs)


@pytest.mark.parametrize("option", list(NON_TORCH_OPTIONS))
@pytest.mark.parametrize("cell", list(CELLS))
def test_torch_backend_refuses_each_option_by_name(cell, option):
    """torch.nn has none of these: backend="torch" refuses them, at construction or at the
    first forward."""
    with pytest.raises(ValueError, match=option):
        layer = CELLS[cell](3, 4, num_layers=2, backend="torch", **NON_TORCH_OPTIONS[option])
        layer(torch.randn(5, 2, 3))


def _layer_norm_shapes(cell, num_layers, bidirectional, H):
    G = 4 if cell == "lstm" else 3
    shapes = {}
    for k in range(num_layers):
        for sfx in ("", "_reverse")[: 2 if bidirectional else 1]:
            for which in ("ih", "hh") + (("c",) if cell == "lstm" else ()):
                width = H if which == "c" else G * H
                shapes[f"layernorm_{which}_weight_l{k}{sfx}"] = (width,)
                shapes[f"layernorm_{which}_bias_l{k}{sfx}"] = (width,)
    return shapes


@pytest.mark.parametrize("cell, proj_size", [("lstm", 0), ("lstm", 2), ("gru", 0)])
def test_layer_norm_parameters_in_the_state_dict(cell, proj_size):
    """torch.nn's keys and shapes, plus the layer-norm gains (1) and biases (0): (G*H,) for
    the input and recurrent norms, (H,) for the LSTM's cell norm; a state dict loads back."""
    extra = dict(proj_size=proj_size) if proj_size else {}
    layer = CELLS[cell](3, 5, num_layers=2, bidirectional=True, layer_norm=True, **extra)
    state = layer.state_dict()
    torch_state = TORCH_CELLS[cell](3, 5, num_layers=2, bidirectional=True, **extra).state_dict()
    expected = {k: tuple(v.shape) for k, v in torch_state.items()} | _layer_norm_shapes(cell, 2, True, 5)
    assert {k: tuple(v.shape) for k, v in state.items()} == expected
    for name in _layer_norm_shapes(cell, 2, True, 5):
        assert torch.equal(state[name], torch.full_like(state[name], 1.0 if "_weight_" in name else 0.0)), name
    assert not any(k.startswith("layernorm") for k in CELLS[cell](3, 5, num_layers=2, **extra).state_dict())

    state = {k: v + 0.1 * torch.randn_like(v) for k, v in state.items()}
    other = CELLS[cell](3, 5, num_layers=2, bidirectional=True, layer_norm=True, **extra)
    other.load_state_dict(state)
    assert all(torch.equal(v, state[k]) for k, v in other.state_dict().items())


@pytest.mark.parametrize("value", [1.0, -0.5])
def test_forget_bias_sets_the_sum_of_the_forget_biases(value):
    H = 6
    layer = FusedLSTM(3, H, num_layers=2, bidirectional=True, forget_bias=value)
    bound = 1 / math.sqrt(H)
    for k in range(2):
        for sfx in ("", "_reverse"):
            b_ih, b_hh = getattr(layer, f"bias_ih_l{k}{sfx}"), getattr(layer, f"bias_hh_l{k}{sfx}")
            assert torch.equal(b_ih[H:2 * H], torch.full((H,), value))
            assert torch.equal(b_hh[H:2 * H], torch.zeros(H))
            for b in (b_ih, b_hh):  # the other gates keep torch.nn's U(-1/sqrt(H), 1/sqrt(H))
                rest = torch.cat([b[:H], b[2 * H:]])
                assert rest.abs().max() <= bound and rest.std() > 0


@pytest.mark.parametrize("cell, proj_size", [("lstm", 0), ("lstm", 3), ("gru", 0)])
def test_orthogonal_recurrent_init_gives_orthogonal_gate_blocks(cell, proj_size):
    """Every (H, P) gate block of every weight_hh has orthonormal columns (and rows too when
    P = H); the input weights keep torch.nn's uniform init; "uniform" blocks are not orthogonal."""
    H = 6
    extra = dict(proj_size=proj_size) if proj_size else {}
    P, G = proj_size or H, 4 if cell == "lstm" else 3
    for init in ("orthogonal", "uniform"):
        layer = CELLS[cell](3, H, num_layers=2, bidirectional=True, recurrent_init=init, dtype=torch.float64, **extra)
        for name, w in layer.named_parameters():
            if name.startswith("weight_hh"):
                for g in range(G):
                    block = w[g * H:(g + 1) * H]  # (H, P)
                    orthonormal = torch.allclose(block.T @ block, torch.eye(P, dtype=w.dtype), atol=1e-10)
                    assert orthonormal == (init == "orthogonal"), (init, name, g)
                    if init == "orthogonal" and P == H:
                        torch.testing.assert_close(block @ block.T, torch.eye(H, dtype=w.dtype))
            elif name.startswith("weight_ih"):
                assert w.abs().max() <= 1 / math.sqrt(H)


@pytest.mark.parametrize("option", list(NON_TORCH_OPTIONS))
@pytest.mark.parametrize("cell", list(CELLS))
def test_to_torch_refuses_each_option_by_name(cell, option):
    layer = CELLS[cell](3, 4, num_layers=2, **NON_TORCH_OPTIONS[option])
    with pytest.raises(ValueError, match=option):
        layer.to_torch()


@pytest.mark.parametrize("cell", list(CELLS))
def test_to_torch_after_turning_off_what_changes_nothing_in_evaluation(cell):
    """Weight drop, recurrent dropout and variational dropout leave evaluation mode as
    torch.nn's: set to 0 / "standard", the layer converts and computes the same in eval."""
    layer = CELLS[cell](3, 4, num_layers=2, recurrent_dropout=0.3, weight_drop=0.3, dropout=0.3,
                        dropout_mode="variational", dtype=torch.float64).eval()
    x = torch.randn(5, 2, 3, dtype=torch.float64)
    out = layer(x)[0]
    layer.recurrent_dropout, layer.weight_drop, layer.dropout_mode = 0.0, 0.0, "standard"
    torch.testing.assert_close(layer.to_torch()(x)[0], out, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cell, init", [("lstm", dict(forget_bias=1.0, recurrent_init="orthogonal")),
                                        ("gru", dict(recurrent_init="orthogonal"))])
def test_init_options_convert_both_ways(cell, init, backend):
    layer = CELLS[cell](3, 4, num_layers=2, bidirectional=True, backend=backend, dtype=torch.float64, **init)
    ref = layer.to_torch()
    assert isinstance(ref, TORCH_CELLS[cell])
    back = CELLS[cell].from_torch(ref, backend=backend)
    assert not back.layer_norm and back.zoneout == 0 and back.dropout_mode == "standard"
    x = torch.randn(5, 2, 3, dtype=torch.float64)
    for module in (ref, back):
        torch.testing.assert_close(module(x)[0], layer(x)[0], rtol=1e-10, atol=1e-12)
    assert all(torch.equal(v, ref.state_dict()[k]) for k, v in layer.state_dict().items())


DEFAULTS = dict(layer_norm=False, zoneout=0.0, recurrent_dropout=0.0, dropout_mode="standard", weight_drop=0.0,
                recurrent_init="uniform")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cell", list(CELLS))
def test_options_at_their_defaults_are_bit_identical(cell, backend):
    """The same seed, the same parameters, and in training mode (with between-layer dropout)
    the same outputs, states and gradients, bit for bit."""
    defaults = DEFAULTS | (dict(forget_bias=None) if cell == "lstm" else {})
    results = []
    for options in ({}, defaults):
        torch.manual_seed(0)
        layer = CELLS[cell](3, 4, num_layers=2, bidirectional=True, dropout=0.3, backend=backend,
                            dtype=torch.float64, **options).train()
        x = torch.randn(5, 2, 3, dtype=torch.float64, requires_grad=True)
        out, state = layer(x)
        states = state if isinstance(state, tuple) else (state,)
        loss = (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum() + sum(
            s.sum() for s in states)
        grads = torch.autograd.grad(loss, [x, *layer.parameters()])
        results.append([*layer.state_dict().values(), out, *states, *grads])
    assert len(results[0]) == len(results[1])
    assert all(torch.equal(a, b) for a, b in zip(*results))
