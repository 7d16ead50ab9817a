"""FusedLSTM / FusedGRU with the cell options against the plain loops of ``cell_loops``.

float64, outputs, final states and every gradient (input, given initial states, every
parameter with the layer-norm gains and biases), in training mode (the masks the layer drew,
recorded and fed to the loop) and in evaluation mode, on every kernel backend that loads on
this machine. The loops themselves are checked against torch.nn first (every option off).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

from cell_loops import LoopConfig, LoopLayer, record_masks, split_masks
from layer_helpers import outputs_and_grads
from lightning_rnn import FusedGRU, FusedLSTM
from lightning_rnn.kernels.dispatch import available_backends

BACKENDS = available_backends("cpu")
CELLS = {"lstm": FusedLSTM, "gru": FusedGRU}
I, H, T, B = 3, 4, 5, 3
LENGTHS = [3, 5, 2]  # unsorted, the longest in the middle
# Shapes of the stack; each option runs on every one of them (a covering set of layers x
# directions x padded/packed x proj_size x given states rather than their full product).
STRUCTURES = {
    "one_layer_padded": dict(),
    "one_layer_bidirectional_packed": dict(bidirectional=True, packed=True),
    "two_layers_batch_first_no_bias_given": dict(num_layers=2, batch_first=True, bias=False, given_state=True),
    "two_layers_bidirectional_packed_given": dict(num_layers=2, bidirectional=True, packed=True, given_state=True),
}
PROJECTED = {  # LSTM only: h has P columns, c keeps H
    "projected_one_layer_padded_given": dict(proj_size=3, given_state=True),
    "projected_two_layers_bidirectional_packed_given": dict(
        num_layers=2, bidirectional=True, packed=True, given_state=True, proj_size=2
    ),
}
ALL = dict(layer_norm=True, recurrent_dropout=0.3, weight_drop=0.4, dropout=0.4, dropout_mode="variational")
OPTIONS = {  # name: (options, cells, needs two layers)
    "layer_norm": (dict(layer_norm=True), ("lstm", "gru"), False),
    "zoneout": (dict(zoneout=0.4), ("lstm", "gru"), False),
    "zoneout_pair": (dict(zoneout=(0.3, 0.6)), ("lstm",), False),
    "zoneout_hidden_only": (dict(zoneout=(0.0, 0.5)), ("lstm",), False),
    "recurrent_dropout": (dict(recurrent_dropout=0.3), ("lstm", "gru"), False),
    "weight_drop": (dict(weight_drop=0.4), ("lstm", "gru"), False),
    "variational_dropout": (dict(dropout=0.4, dropout_mode="variational"), ("lstm", "gru"), True),
    "standard_dropout_layer_norm_zoneout": (dict(dropout=0.4, layer_norm=True, zoneout=0.3), ("lstm", "gru"), True),
    "recurrent_dropout_weight_drop_zoneout": (
        dict(recurrent_dropout=0.3, weight_drop=0.4, zoneout=0.3), ("lstm", "gru"), False
    ),
    "all_lstm": (ALL | dict(zoneout=(0.2, 0.5)), ("lstm",), False),
    "all_gru": (ALL | dict(zoneout=0.3), ("gru",), False),
}
EVAL_OPTIONS = ("layer_norm", "zoneout", "zoneout_pair", "all_lstm", "all_gru")  # the rest are no-ops in eval


def _cases(option_names):
    cases = []
    for name in option_names:
        _, cells, two_layers = OPTIONS[name]
        for cell in cells:
            structures = STRUCTURES | (PROJECTED if cell == "lstm" else {})
            cases += [(cell, s, name) for s, case in structures.items()
                      if not two_layers or case.get("num_layers", 1) > 1]
    return cases


def make_layer(cell, structure, options, backend, training, dtype=torch.float64, sizes=(I, H)):
    """The layer of ``structure`` with ``options`` (between-layer dropout only where there are
    two layers), its layer-norm gains and biases moved off 1 / 0 so a missing one shows."""
    case = (STRUCTURES | PROJECTED)[structure]
    config = {k: case[k] for k in ("num_layers", "bidirectional", "batch_first", "bias", "proj_size") if k in case}
    options = dict(options)
    if case.get("num_layers", 1) == 1:
        options.pop("dropout", None)
    layer = CELLS[cell](*sizes, **config, **options, backend=backend, dtype=dtype).train(training)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name.startswith("layernorm_"):
                p.copy_((1.0 if "_weight_" in name else 0.0) + 0.3 * torch.randn_like(p))
    return layer


def make_input(layer, structure, dtype=torch.float64):
    """(x leaf, the layer's input, hx, tokens): padded or a PackedSequence of LENGTHS
    (unsorted); hx random leaves for a structure with given states, else None."""
    case = (STRUCTURES | PROJECTED)[structure]
    x = torch.randn(*((B, T) if layer.batch_first else (T, B)), layer.input_size, dtype=dtype, requires_grad=True)
    hx = initial_state(LoopConfig.of(layer), dtype) if case.get("given_state") else None
    if not case.get("packed"):
        return x, x, hx, T * B
    inp = pack_padded_sequence(x, torch.tensor(LENGTHS), batch_first=layer.batch_first, enforce_sorted=False)
    return x, inp, hx, sum(LENGTHS)


def initial_state(cfg: LoopConfig, dtype):
    """Leaves h_0 (L*D, B, P) and, for an LSTM, c_0 (L*D, B, H): a tuple, or a GRU's tensor."""
    L = cfg.num_layers * cfg.num_directions
    widths = (cfg.output_size, cfg.hidden_size) if cfg.cell == "lstm" else (cfg.output_size,)
    states = tuple(torch.randn(L, B, w, dtype=dtype, requires_grad=True) for w in widths)
    return states if len(states) > 1 else states[0]


def run_both(layer, structure, monkeypatch):
    """The layer's and the loop's (out, states, grads), the loop fed the masks the layer drew."""
    x, inp, hx, tokens = make_input(layer, structure)
    recording = record_masks(monkeypatch)
    got = outputs_and_grads(layer, x, inp, hx)
    masks = split_masks(recording, LoopConfig.of(layer), B, tokens)
    expected = outputs_and_grads(LoopLayer(layer, masks), x, inp, hx)
    return got, expected


def assert_same(layer, got, expected, given_state, rtol=1e-9, atol=1e-10):
    """Every tensor of ``got`` close to ``expected``, a failure naming the tensor."""
    num_states = 2 if layer.mode == "LSTM" else 1
    names = ["output", "h_n", "c_n"][: 1 + num_states]
    names += ["grad input"] + [f"grad {s}" for s in ("h_0", "c_0")[:num_states] if given_state]
    names += [f"grad {n}" for n, _ in layer.named_parameters()]
    tensors = zip([got[0], *got[1], *got[2]], [expected[0], *expected[1], *expected[2]], strict=True)
    for name, (a, b) in zip(names, tensors, strict=True):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


# ----- the loops against torch.nn -----------------------------------------------------------
@pytest.mark.parametrize("cell, structure", [(c, s) for c in CELLS for s in STRUCTURES] +
                         [("lstm", s) for s in PROJECTED])
def test_loop_without_options_is_torch_nn(cell, structure):
    case = (STRUCTURES | PROJECTED)[structure]
    config = {k: case[k] for k in ("num_layers", "bidirectional", "batch_first", "bias", "proj_size") if k in case}
    ref = (nn.LSTM if cell == "lstm" else nn.GRU)(I, H, **config, dtype=torch.float64)
    x, inp, hx, _ = make_input(ref, structure)
    got = outputs_and_grads(LoopLayer(ref), x, inp, hx)
    assert_same(ref, got, outputs_and_grads(ref, x, inp, hx), hx is not None, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_loop_zoneout_and_layer_norm_switch_as_stated(cell):
    """The loop's options do what they say: zoneout masks all False (no unit kept) give the
    plain cell, all True keep h_0 (and c_0) at every step; LN with gain 1 / bias 0 changes it."""
    ref = (nn.LSTM if cell == "lstm" else nn.GRU)(I, H, num_layers=2, bidirectional=True, dtype=torch.float64)
    x = torch.randn(T, B, I, dtype=torch.float64)
    hx = initial_state(LoopConfig.of(ref), torch.float64)
    plain, plain_states = ref(x, hx)
    on = dataclasses.replace(LoopConfig.of(ref), training=True, zoneout_c=0.5 if cell == "lstm" else 0.0, zoneout_h=0.5)
    for keep in (False, True):
        mask = torch.full((T * B, H), keep)
        masks = {(kind, k, d): mask for kind in ("zoneout_c", "zoneout_h") for k in range(2) for d in range(2)}
        out, states = LoopLayer(ref, masks, on)(x, hx)
        if keep:  # every layer-direction's state stays its initial one
            torch.testing.assert_close(states, hx)
            h_0 = hx[0] if cell == "lstm" else hx
            top = torch.cat([h_0[2], h_0[3]], dim=1)  # layer 1's two directions
            torch.testing.assert_close(out, top[None].expand(T, B, 2 * H))
        else:
            torch.testing.assert_close(out, plain, rtol=1e-12, atol=1e-14)
            torch.testing.assert_close(states, plain_states, rtol=1e-12, atol=1e-14)
    params = dict(ref.named_parameters())
    G = 4 if cell == "lstm" else 3
    for k in range(2):
        for sfx in ("", "_reverse"):
            for which, width in (("ih", G * H), ("hh", G * H), ("c", H)):
                params[f"layernorm_{which}_weight_l{k}{sfx}"] = torch.ones(width, dtype=torch.float64)
                params[f"layernorm_{which}_bias_l{k}{sfx}"] = torch.zeros(width, dtype=torch.float64)
    normed = LoopLayer(ref, cfg=dataclasses.replace(LoopConfig.of(ref), layer_norm=True), params=params)(x, hx)[0]
    assert (normed - plain).abs().max() > 1e-2


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_loop_weight_drop_and_recurrent_dropout_are_torch_nn_with_a_scaled_weight(cell):
    """Weight drop is torch.nn with W_hh * M / (1 - p_w); recurrent dropout with a mask that
    keeps every unit scales h_{t-1} into W_hh only, i.e. torch.nn with W_hh / (1 - p_r)."""
    ref = (nn.LSTM if cell == "lstm" else nn.GRU)(I, H, num_layers=2, bidirectional=True, dtype=torch.float64)
    x = torch.randn(T, B, I, dtype=torch.float64)
    cfg = dataclasses.replace(LoopConfig.of(ref), training=True, weight_drop=0.4, recurrent_dropout=0.25)
    G = 4 if cell == "lstm" else 3
    masks = {}
    for k in range(2):
        for d in range(2):
            masks[("weight_drop", k, d)] = torch.rand(G * H, H) < 0.6
            masks[("recurrent_dropout", k, d)] = torch.ones(B, H, dtype=torch.bool)
    out, states = LoopLayer(ref, masks, cfg)(x)
    with torch.no_grad():
        for k in range(2):
            for d, sfx in enumerate(("", "_reverse")):
                w = getattr(ref, f"weight_hh_l{k}{sfx}")
                w.copy_(w * masks[("weight_drop", k, d)] / 0.6 / 0.75)
        expected, expected_states = ref(x)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(states, expected_states, rtol=1e-10, atol=1e-12)


# ----- the layers against the loops -------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cell, structure, option", _cases(OPTIONS))
def test_training_matches_loop_float64(cell, structure, option, backend, monkeypatch):
    layer = make_layer(cell, structure, OPTIONS[option][0], backend, training=True)
    got, expected = run_both(layer, structure, monkeypatch)
    assert_same(layer, got, expected, "given" in structure)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cell, structure, option", _cases(EVAL_OPTIONS))
def test_evaluation_matches_loop_float64(cell, structure, option, backend, monkeypatch):
    layer = make_layer(cell, structure, OPTIONS[option][0], backend, training=False)
    got, expected = run_both(layer, structure, monkeypatch)  # split_masks: nothing drawn in eval
    assert_same(layer, got, expected, "given" in structure)


CHECKPOINT_CASES = [("lstm", "projected_two_layers_bidirectional_packed_given", "all_lstm"),
                    ("lstm", "two_layers_batch_first_no_bias_given", "standard_dropout_layer_norm_zoneout"),
                    ("gru", "two_layers_bidirectional_packed_given", "all_gru"),
                    ("gru", "two_layers_batch_first_no_bias_given", "standard_dropout_layer_norm_zoneout")]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cell, structure, option", CHECKPOINT_CASES)
def test_checkpointed_equals_plain_with_options(cell, structure, option, backend, monkeypatch):
    """checkpoint_chunk_size=2 changes nothing: the same masks are drawn (before chunking)
    under the same seed, and outputs, states and gradients are the same."""
    layer = make_layer(cell, structure, OPTIONS[option][0], backend, training=True)
    x, inp, hx, tokens = make_input(layer, structure)
    recording = record_masks(monkeypatch)
    runs = []
    for chunk in (None, 2):
        layer.checkpoint_chunk_size = chunk
        recording.clear()
        torch.manual_seed(1)
        runs.append((outputs_and_grads(layer, x, inp, hx), list(recording.draws), list(recording.standard)))
    (plain, draws, standard), (chunked, chunked_draws, chunked_standard) = runs
    assert [d[:3] for d in chunked_draws] == [d[:3] for d in draws]
    assert all(torch.equal(a[3], b[3]) for a, b in zip(draws, chunked_draws))
    assert len(standard) == len(chunked_standard) and all(map(torch.equal, standard, chunked_standard))
    split_masks(recording, LoopConfig.of(layer), B, tokens)  # the chunked forward drew what the spec says
    assert_same(layer, chunked, plain, "given" in structure, rtol=1e-10, atol=1e-12)


# bf16 keeps 8 bits of mantissa (a relative step of 2^-8 = 0.4%). Over 5 steps of 2 bidirectional
# layers of I = 8, H = 16 with every option on, the outputs and final states stay within 0.06
# of the float32 loop and all gradients together within 10% of their norm (the worst of 30
# seeds: 0.034 and 5.4%). Not with a projection to P = 2 under layer norm: LN of a W_hh h with
# 2 columns magnifies bf16 rounding, the loop itself under bf16 autocast drifts 0.15 / 67% there.
BF16_SIZES, BF16_ATOL, BF16_GRAD_RTOL = (8, 16), 0.06, 0.1
BF16_CASES = [("lstm", "two_layers_bidirectional_packed_given", "all_lstm"),
              ("lstm", "two_layers_batch_first_no_bias_given", "standard_dropout_layer_norm_zoneout"),
              ("gru", "two_layers_bidirectional_packed_given", "all_gru")]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cell, structure, option", BF16_CASES)
def test_bf16_autocast_close_to_float32_loop(cell, structure, option, backend, monkeypatch):
    layer = make_layer(cell, structure, OPTIONS[option][0], backend, True, torch.float32, BF16_SIZES)
    x, inp, hx, tokens = make_input(layer, structure, dtype=torch.float32)
    recording = record_masks(monkeypatch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, state = layer(inp, hx)
    masks = split_masks(recording, LoopConfig.of(layer), B, tokens)
    loop_out, loop_state = LoopLayer(layer, masks)(inp, hx)
    states = state if isinstance(state, tuple) else (state,)
    loop_states = loop_state if isinstance(loop_state, tuple) else (loop_state,)
    out, loop_out = (o.data if isinstance(o, PackedSequence) else o for o in (out, loop_out))
    for name, a, b in zip(("output", "h_n", "c_n"), [out, *states], [loop_out, *loop_states]):
        torch.testing.assert_close(a.float(), b, rtol=0, atol=BF16_ATOL, msg=lambda m: f"{name}: {m}")
    leaves = [x, *(hx if isinstance(hx, tuple) else [hx])] + list(layer.parameters())
    grads = torch.autograd.grad(out.float().sum() + sum(s.float().sum() for s in states), leaves,
                                retain_graph=True)  # the packing of x is shared with the loop's graph
    loop_grads = torch.autograd.grad(loop_out.sum() + sum(s.sum() for s in loop_states), leaves)
    names = ["input", "h_0", "c_0"][: 1 + len(states)] + [n for n, _ in layer.named_parameters()]
    for name, g in zip(names, grads, strict=True):
        assert g.dtype == torch.float32 and torch.isfinite(g).all(), name
    grads, loop_grads = (torch.cat([g.flatten() for g in gs]) for gs in (grads, loop_grads))
    assert (grads - loop_grads).norm() <= BF16_GRAD_RTOL * loop_grads.norm()
