"""The masks of the cell options: what is drawn (kinds, shapes, order, rates), and how each is
used over time (recurrent dropout: one mask for all steps; zoneout: a mask per step), and
evaluation mode (nothing drawn, deterministic, the expectation of the training-mode cell)."""
from __future__ import annotations

import math

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence

from cell_loops import LoopConfig, LoopLayer, record_masks, split_masks
from lightning_rnn import FusedGRU, FusedLSTM
from lightning_rnn.kernels import masks as masks_module
from lightning_rnn.kernels.dispatch import available_backends

BACKENDS = available_backends("cpu")
CELLS = {"lstm": FusedLSTM, "gru": FusedGRU}
SIGMAS = 5  # a rate more than 5 standard deviations off p fails (about 1 in 1.7 million by chance)


def test_draws_follow_the_specified_kinds_shapes_and_order(monkeypatch):
    """One training forward of a 2-layer bidirectional projected LSTM over a packed batch of 3
    sequences (10 tokens, H = 4, P = 2), then of a 2-layer GRU over a padded (5, 3) batch:
    every mask of the forward, in the specification's order, p the keep probability for the
    dropouts and the zoneout probability for zoneout, bool."""
    recording = record_masks(monkeypatch)
    lstm = FusedLSTM(3, 4, num_layers=2, bidirectional=True, proj_size=2, layer_norm=True, zoneout=(0.2, 0.5),
                     recurrent_dropout=0.3, weight_drop=0.4, dropout=0.4, dropout_mode="variational")
    x = torch.randn(5, 3, 3)
    lstm(pack_padded_sequence(x, torch.tensor([3, 5, 2]), enforce_sorted=False))
    per_direction = [("weight_drop", (16, 2), 0.6), ("recurrent_dropout", (3, 2), 0.7),
                     ("zoneout_c", (10, 4), 0.2), ("zoneout_h", (10, 2), 0.5)]
    expected = per_direction * 4 + [("dropout", (3, 4), 0.6)]  # (layer, direction) 0f 0r 1f 1r; 1 boundary
    _assert_draws(recording, expected)

    recording.clear()
    gru = FusedGRU(3, 4, num_layers=2, zoneout=0.3, recurrent_dropout=0.3, weight_drop=0.4, dropout=0.4,
                   dropout_mode="variational")
    gru(x)
    per_layer = [("weight_drop", (12, 4), 0.6), ("recurrent_dropout", (3, 4), 0.7), ("zoneout_h", (15, 4), 0.3)]
    _assert_draws(recording, per_layer * 2 + [("dropout", (3, 4), 0.6)])


def _assert_draws(recording, expected):
    got = [(kind, shape, p) for kind, shape, p, _ in recording.draws]
    assert [g[:2] for g in got] == [e[:2] for e in expected], got
    assert all(math.isclose(g[2], e[2]) for g, e in zip(got, expected)), got
    assert all(m.dtype == torch.bool and m.device.type == "cpu" for *_, m in recording.draws)


def _padded_case(cell, backend, monkeypatch, **options):
    """A 1-layer float64 layer in training mode over a padded (6, 4, 3) batch with given
    states: the layer's output and the masks it drew (by key), and the loop's inputs."""
    layer = CELLS[cell](3, 6, backend=backend, dtype=torch.float64, **options).train()
    x = torch.randn(6, 4, 3, dtype=torch.float64)
    hx = torch.randn(1, 4, 6, dtype=torch.float64)
    hx = (hx, torch.randn(1, 4, 6, dtype=torch.float64)) if cell == "lstm" else hx
    recording = record_masks(monkeypatch)
    out = layer(x, hx)[0]
    return layer, x, hx, out, split_masks(recording, LoopConfig.of(layer), 4, 24)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cell", list(CELLS))
def test_recurrent_dropout_mask_is_the_same_at_every_step(cell, backend, monkeypatch):
    """The layer is the loop fed its one (B, P) mask at every step, and not the loop fed a
    mask per step (the recorded one at step 0, fresh ones after): a layer that redrew the
    mask per step would match neither."""
    layer, x, hx, out, masks = _padded_case(cell, backend, monkeypatch, recurrent_dropout=0.5)
    one = masks[("recurrent_dropout", 0, 0)]
    torch.testing.assert_close(out, LoopLayer(layer, masks)(x, hx)[0], rtol=1e-9, atol=1e-10)
    per_step = torch.rand(6, *one.shape) < 0.5
    per_step[0] = one
    assert not all(torch.equal(per_step[t], one) for t in range(6))
    redrawn = LoopLayer(layer, masks | {("recurrent_dropout", 0, 0): per_step})(x, hx)[0]
    assert (out - redrawn).abs().max() > 1e-3


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cell", list(CELLS))
def test_zoneout_masks_change_from_step_to_step(cell, backend, monkeypatch):
    """Zoneout's masks are per token: the recorded rows of different steps differ, and the
    layer is the loop fed them, not the loop fed step 0's rows at every step."""
    layer, x, hx, out, masks = _padded_case(cell, backend, monkeypatch, zoneout=0.5)
    torch.testing.assert_close(out, LoopLayer(layer, masks)(x, hx)[0], rtol=1e-9, atol=1e-10)
    shared = {}
    for key, mask in masks.items():
        steps = mask.view(6, 4, -1)  # rows t*B + b of the padded batch
        assert any(not torch.equal(steps[t], steps[0]) for t in range(1, 6)), key
        shared[key] = steps[:1].expand_as(steps).reshape(mask.shape)
    assert (out - LoopLayer(layer, shared)(x, hx)[0]).abs().max() > 1e-3


EVAL_OPTIONS = {
    "lstm": dict(layer_norm=True, zoneout=(0.3, 0.6), recurrent_dropout=0.3, weight_drop=0.4, dropout=0.4,
                 dropout_mode="variational", proj_size=2),
    "gru": dict(layer_norm=True, zoneout=0.4, recurrent_dropout=0.3, weight_drop=0.4, dropout=0.4,
                dropout_mode="variational"),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cell", list(CELLS))
def test_evaluation_draws_nothing_and_is_deterministic(cell, backend, monkeypatch):
    layer = CELLS[cell](3, 4, num_layers=2, bidirectional=True, backend=backend, **EVAL_OPTIONS[cell]).eval()
    x = torch.randn(5, 3, 3)
    recording = record_masks(monkeypatch)
    first, second = layer(x), layer(x)
    assert recording.draws == [] and recording.standard == []
    for a, b in zip(_flat(first), _flat(second), strict=True):
        assert torch.equal(a, b)


def _flat(result):
    """[output, h_n(, c_n)] of a layer's ``(output, h_n)`` or ``(output, (h_n, c_n))``."""
    out, state = result
    return [out, *(state if isinstance(state, tuple) else (state,))]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cell", list(CELLS))
def test_evaluation_zoneout_is_its_expectation(cell, backend):
    """One step in evaluation mode: with zoneout, each state is p * its initial value +
    (1 - p) * the state the same layer computes with zoneout set to 0 (the attribute is read
    at every forward): c_1 = p_c c_0 + (1 - p_c) ctilde, h_1 = p_h h_0 + (1 - p_h) htilde."""
    p_c, p_h = (0.3, 0.6) if cell == "lstm" else (None, 0.4)
    zoneout = (p_c, p_h) if cell == "lstm" else p_h
    extra = dict(proj_size=2) if cell == "lstm" else {}
    layer = CELLS[cell](3, 4, bidirectional=True, layer_norm=True, zoneout=zoneout, backend=backend,
                        dtype=torch.float64, **extra).eval()
    P = layer.proj_size or 4
    x = torch.randn(1, 3, 3, dtype=torch.float64)
    h_0 = torch.randn(2, 3, P, dtype=torch.float64)
    hx = (h_0, torch.randn(2, 3, 4, dtype=torch.float64)) if cell == "lstm" else h_0
    out, state = layer(x, hx)
    assert layer.zoneout == zoneout or tuple(layer.zoneout) == zoneout
    layer.zoneout = 0.0
    plain_out, plain_state = layer(x, hx)
    states, plain_states = (state, plain_state) if cell == "lstm" else ((state,), (plain_state,))
    initial = hx if cell == "lstm" else (hx,)
    for name, p, s, s_0, s_plain in zip(("h", "c"), (p_h, p_c), states, initial, plain_states):
        torch.testing.assert_close(s, p * s_0 + (1 - p) * s_plain, rtol=1e-10, atol=1e-12, msg=name)
    h_1 = p_h * h_0 + (1 - p_h) * plain_states[0]  # (D, B, P); the output is (1, B, D*P)
    torch.testing.assert_close(out, h_1.transpose(0, 1).reshape(1, 3, 2 * P), rtol=1e-10, atol=1e-12)
    assert (out - plain_out).abs().max() > 1e-3


@pytest.mark.parametrize("kind, p", [("weight_drop", 0.6), ("recurrent_dropout", 0.9), ("zoneout_c", 0.15),
                                     ("zoneout_h", 0.5), ("dropout", 0.75)])
def test_draw_rate_is_p(kind, p):
    mask = masks_module.draw(kind, (300, 400), p, torch.device("cpu"))
    assert mask.dtype == torch.bool and mask.shape == (300, 400)
    n = mask.numel()
    assert abs(mask.double().mean().item() - p) <= SIGMAS * math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize("cell", list(CELLS))
def test_layer_mask_rates_match_their_options(cell, monkeypatch):
    """The masks one training forward draws keep (dropouts) or zone out (zoneout) at the
    rate the options say: weight drop 0.45 keeps 55%, recurrent dropout 0.25 keeps 75%,
    zoneout keeps the previous value with p_c = 0.3, p_h = 0.6."""
    zoneout = (0.3, 0.6) if cell == "lstm" else 0.6
    layer = CELLS[cell](8, 48, num_layers=2, bidirectional=True, zoneout=zoneout, recurrent_dropout=0.25,
                        weight_drop=0.45, dropout=0.35, dropout_mode="variational", backend="reference").train()
    recording = record_masks(monkeypatch)
    layer(torch.randn(20, 16, 8))
    rates = {"weight_drop": 0.55, "recurrent_dropout": 0.75, "zoneout_c": 0.3, "zoneout_h": 0.6, "dropout": 0.65}
    drawn = {}
    for kind, _, _, mask in recording.draws:
        drawn.setdefault(kind, []).append(mask.flatten())
    assert set(drawn) == set(rates) - ({"zoneout_c"} if cell == "gru" else set())
    for kind, parts in drawn.items():
        mask, p = torch.cat(parts), rates[kind]
        assert abs(mask.double().mean().item() - p) <= SIGMAS * math.sqrt(p * (1 - p) / mask.numel()), kind
