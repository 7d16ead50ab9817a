"""torch.nn interop: state dict names/shapes, from_torch / to_torch both ways."""
import pytest
import torch
from torch import nn

from lightning_rnn import FusedGRU, FusedLSTM

PAIRS = [(FusedLSTM, nn.LSTM), (FusedGRU, nn.GRU)]
CONFIG = dict(input_size=3, hidden_size=4, num_layers=2, bidirectional=True, batch_first=True)
KINDS = [  # (ours, torch.nn's, configuration): the LSTM also with a projection (proj_size)
    pytest.param(FusedLSTM, nn.LSTM, CONFIG, id="lstm"),
    pytest.param(FusedGRU, nn.GRU, CONFIG, id="gru"),
    pytest.param(FusedLSTM, nn.LSTM, CONFIG | dict(proj_size=2), id="lstm_projected"),
]


@pytest.mark.parametrize("fused_class, torch_class, config", KINDS)
def test_state_dict_has_torch_names_and_shapes(fused_class, torch_class, config):
    ours, theirs = fused_class(**config).state_dict(), torch_class(**config).state_dict()
    assert list(ours) == list(theirs)
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in theirs.items()}


@pytest.mark.parametrize("fused_class, torch_class, config", KINDS)
def test_load_torch_state_dict_gives_same_function(fused_class, torch_class, config):
    ref = torch_class(**config)
    fused = fused_class(**config)
    fused.load_state_dict(ref.state_dict())
    x = torch.randn(2, 5, 3)
    torch.testing.assert_close(fused(x)[0], ref(x)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fused_class, torch_class, config", KINDS)
def test_round_trip_keeps_weights_dtype_device(fused_class, torch_class, config):
    ref = torch_class(**config).double()
    fused = fused_class.from_torch(ref)
    assert fused.weight_hh_l1_reverse.dtype == torch.float64
    assert fused.batch_first and fused.bidirectional and fused.num_layers == 2
    back = fused.to_torch()
    assert type(back) is torch_class and back.weight_ih_l0.dtype == torch.float64
    for (k, a), (k2, b) in zip(ref.state_dict().items(), back.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(a, b) and a.data_ptr() != b.data_ptr()


def test_repr_and_init_range():
    layer = FusedLSTM(3, 16, num_layers=2, dropout=0.25)
    assert repr(layer) == "FusedLSTM(3, 16, num_layers=2, dropout=0.25)"
    bound = 1 / 16**0.5
    assert all(p.abs().max() <= bound for p in layer.parameters())
    projected = FusedLSTM(3, 16, proj_size=4)
    assert repr(projected) == "FusedLSTM(3, 16, proj_size=4)"
    assert repr(projected.to_torch()) == "LSTM(3, 16, proj_size=4)"
    assert projected.weight_hr_l0.shape == (4, 16) and projected.weight_hr_l0.abs().max() <= bound  # as torch.nn
    theirs = torch.nn.LSTM(3, 8, proj_size=2, num_layers=2, dropout=0.1, bidirectional=True, batch_first=True)
    assert repr(FusedLSTM.from_torch(theirs)) == "Fused" + repr(theirs)  # torch.nn's order, proj_size first
    gru = torch.nn.GRU(3, 8, num_layers=2, bidirectional=True)
    assert repr(FusedGRU.from_torch(gru)) == "Fused" + repr(gru)


@pytest.mark.parametrize("fused_class, torch_class", PAIRS)
def test_conversion_keeps_eval_mode_and_frozen_parameters(fused_class, torch_class):
    ref = torch_class(3, 4, num_layers=2, dropout=0.5).eval()
    ref.weight_hh_l1.requires_grad_(False)
    fused = fused_class.from_torch(ref)
    assert not fused.training
    assert [n for n, p in fused.named_parameters() if not p.requires_grad] == ["weight_hh_l1"]
    x = torch.randn(6, 2, 3)
    torch.testing.assert_close(fused(x)[0], ref(x)[0], rtol=1e-5, atol=1e-6)  # no dropout in eval
    back = fused.train().to_torch()
    assert back.training
    assert [n for n, p in back.named_parameters() if not p.requires_grad] == ["weight_hh_l1"]


@pytest.mark.parametrize("fused_class, torch_class, config", KINDS)
@pytest.mark.parametrize("bias", [True, False])
def test_torch_nn_attributes(fused_class, torch_class, bias, config):
    ours, theirs = fused_class(**config, bias=bias), torch_class(**config, bias=bias)
    assert (ours.mode, ours.proj_size) == (theirs.mode, theirs.proj_size)
    assert ours._all_weights == theirs._all_weights
    assert ours._flat_weights_names == theirs._flat_weights_names
    assert [w is getattr(ours, n) for w, n in zip(ours._flat_weights, ours._flat_weights_names)] == [True] * (
        len(ours._flat_weights_names)
    )
    assert [[p.shape for p in ws] for ws in ours.all_weights] == [[p.shape for p in ws] for ws in theirs.all_weights]


@pytest.mark.parametrize("fused_class, torch_class, config", KINDS)
def test_weight_drop_through_flat_weights_as_on_torch_nn(fused_class, torch_class, config):
    """Weight drop as code written for torch.nn does it: the parameter moves aside, a
    dropped copy takes its name, and ``_flat_weights`` is assigned anew. Same numbers."""
    torch.manual_seed(0)
    theirs = torch_class(**config, dtype=torch.float64)
    ours = fused_class.from_torch(theirs)
    x = torch.randn(5, 2, config["input_size"], dtype=torch.float64)
    mask = (torch.rand_like(theirs.weight_hh_l0) > 0.5).double()
    outputs = []
    for module in (theirs, ours):
        raw = module._parameters.pop("weight_hh_l0")
        module.weight_hh_l0 = raw * mask
        module._flat_weights = [getattr(module, n) for n in module._flat_weights_names]
        out = module(x)[0]
        out.sum().backward()
        outputs.append((out, raw.grad))
    torch.testing.assert_close(outputs[1], outputs[0])
    assert (outputs[1][1] * (1 - mask)).abs().max() == 0  # dropped weights get no gradient
    with pytest.raises(ValueError, match=f"_flat_weights: expected {len(ours._flat_weights_names)} tensors"):
        ours._flat_weights = ours._flat_weights[:-1]


@pytest.mark.parametrize("fused_class, torch_class, config", KINDS)
def test_meta_device_gives_shapes(fused_class, torch_class, config):
    ours = fused_class(**config, device="meta")
    theirs = torch_class(**config, device="meta")
    x = torch.empty(2, 5, 3, device="meta")
    out, state = ours(x)
    ref_out, ref_state = theirs(x)
    assert out.device.type == "meta" and out.shape == ref_out.shape
    states, ref_states = (state, ref_state) if isinstance(state, tuple) else ((state,), (ref_state,))
    assert [s.shape for s in states] == [s.shape for s in ref_states]


@pytest.mark.parametrize("fused_class, torch_class, config", KINDS)
@pytest.mark.parametrize("checkpoint", [None, "sqrt"])
def test_empty_batch_gives_torch_nn_empty_outputs(fused_class, torch_class, checkpoint, config):
    theirs = torch_class(**config)
    ours = fused_class.from_torch(theirs)
    ours.checkpoint_chunk_size = checkpoint
    x = torch.randn(0, 5, 3, requires_grad=True)  # batch_first: no sequences, 5 steps
    out, state = ours(x)
    ref_out, ref_state = theirs(x)
    P = config.get("proj_size") or 4  # h's columns
    assert out.shape == ref_out.shape == (0, 5, 2 * P)
    states, ref_states = (state, ref_state) if isinstance(state, tuple) else ((state,), (ref_state,))
    assert [s.shape for s in states] == [s.shape for s in ref_states] == [(4, 0, P), (4, 0, 4)][: len(states)]
    out.sum().backward()  # an empty loss still backpropagates, as with torch.nn
    assert x.grad.shape == x.shape and ours.weight_hh_l0.grad is not None
    assert ours.weight_hh_l0.grad.abs().sum() == 0
