"""Bad input gets a clear error naming the argument; one bad row does not spoil the others."""
import pytest
import torch
from torch.nn.utils.rnn import PackedSequence

from lightning_rnn import FusedGRU, FusedLSTM
from lightning_rnn.kernels.dispatch import available_backends
from lightning_rnn.layers import InputMismatchError


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(hidden_size=0), "hidden_size: expected an int >= 1"),
        (dict(num_layers=0), "num_layers: expected an int >= 1"),
        (dict(input_size=-2), "input_size: expected an int >= 1"),
        (dict(dropout=1.5), r"dropout: expected a finite number in \[0, 1\], got 1.5"),
        (dict(dropout=-0.1), r"dropout: expected a finite number in \[0, 1\], got -0.1"),
        (dict(backend="cudnn"), "backend: expected one of"),
        (dict(proj_size=-1), "proj_size: expected an int >= 0, got -1"),
    ],
)
@pytest.mark.parametrize("layer_class", [FusedLSTM, FusedGRU])
def test_bad_constructor_arguments(layer_class, kwargs, match):
    args = dict(input_size=3, hidden_size=4) | kwargs
    with pytest.raises(ValueError, match=match):
        layer_class(**args)


def test_bad_projection_sizes():
    """torch.nn's rules: proj_size < hidden_size, and only the LSTM has a projection."""
    for proj_size in (4, 5):
        with pytest.raises(ValueError, match=f"proj_size: expected an int < hidden_size=4, got {proj_size}"):
            FusedLSTM(3, 4, proj_size=proj_size)
    with pytest.raises(ValueError, match="proj_size: only FusedLSTM has a projection .as in torch.nn., got 2"):
        FusedGRU(3, 4, proj_size=2)
    with pytest.raises(TypeError, match="proj_size: expected an int >= 0, got 2.0"):
        FusedLSTM(3, 4, proj_size=2.0)


def test_bad_projected_lstm_states():
    """With a projection h_0 has proj_size columns and c_0 hidden_size; the message gives both."""
    layer = FusedLSTM(3, 4, proj_size=2)
    x = torch.randn(5, 2, 3)
    with pytest.raises(ValueError, match=r"hx: expected h_0 of shape \(1, 2, 2\), got \(1, 2, 4\)"):
        layer(x, (torch.zeros(1, 2, 4), torch.zeros(1, 2, 4)))
    with pytest.raises(ValueError, match=r"hx: expected c_0 of shape \(1, 2, 4\), got \(1, 2, 2\)"):
        layer(x, (torch.zeros(1, 2, 2), torch.zeros(1, 2, 2)))
    with pytest.raises(TypeError, match=r"tensors of shapes \(1, 2, 2\) and \(1, 2, 4\), got a tensor"):
        layer(x, torch.zeros(1, 2, 2))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(hidden_size=4.0), r"hidden_size: expected an int >= 1, got 4.0"),
        (dict(num_layers="2"), r"num_layers: expected an int >= 1, got '2'"),
        (dict(bias="yes"), r"bias: expected a bool, got 'yes'"),
        (dict(bidirectional=2), r"bidirectional: expected a bool, got 2"),
    ],
)
def test_constructor_arguments_of_the_wrong_type(kwargs, match):
    with pytest.raises(TypeError, match=match):
        FusedLSTM(**(dict(input_size=3, hidden_size=4) | kwargs))


def test_constructor_accepts_what_torch_nn_accepts():
    np = pytest.importorskip("numpy")
    layer = FusedLSTM(np.int64(3), 4, num_layers=2, dropout=np.float32(0.25), proj_size=0, bias=1,
                      bidirectional=np.True_, batch_first=np.bool_(False))
    assert (layer.input_size, layer.dropout, layer.bias, layer.bidirectional) == (3, 0.25, True, True)
    assert layer.batch_first is False
    assert type(layer.input_size) is int
    with pytest.warns(UserWarning, match="dropout=0.2 has no effect with num_layers=1"):
        FusedGRU(3, 4, dropout=0.2)


@pytest.mark.parametrize(
    "make_input, error, match",
    [
        (lambda: torch.randn(5, 2, 7), ValueError, "input: expected last dimension input_size=3, got 7"),
        (lambda: torch.randn(5, 2, 3, 1), ValueError, "input: expected a 3-D batched tensor"),
        (lambda: torch.randn(3), ValueError, "input: expected a 3-D batched tensor"),
        (lambda: torch.ones(5, 2, 3, dtype=torch.long), TypeError, "input: expected a floating-point tensor"),
        (lambda: torch.randn(5, 2, 3, dtype=torch.float64), ValueError, "input: dtype torch.float64 does not match"),
        (lambda: [1.0, 2.0], TypeError, "input: expected a Tensor or PackedSequence"),
        (lambda: torch.randn(0, 2, 3), ValueError, "input: expected at least one time step, got shape \\(0, 2, 3\\)"),
    ],
)
@pytest.mark.parametrize("layer_class", [FusedLSTM, FusedGRU])
def test_bad_input(layer_class, make_input, error, match):
    layer = layer_class(3, 4)
    with pytest.raises(error, match=match):
        layer(make_input())


def test_bad_lstm_states():
    layer = FusedLSTM(3, 4, num_layers=2)
    x = torch.randn(5, 2, 3)
    with pytest.raises(TypeError, match=r"hx: FusedLSTM expects a tuple \(h_0, c_0\)"):
        layer(x, torch.zeros(2, 2, 4))
    with pytest.raises(ValueError, match=r"hx: expected h_0 of shape \(2, 2, 4\), got \(1, 2, 4\)"):
        layer(x, (torch.zeros(1, 2, 4), torch.zeros(2, 2, 4)))
    with pytest.raises(ValueError, match=r"hx: expected c_0 of shape \(2, 2, 4\), got \(2, 3, 4\)"):
        layer(x, (torch.zeros(2, 2, 4), torch.zeros(2, 3, 4)))
    with pytest.raises(TypeError, match="hx: expected h_0 of dtype torch.float32"):
        layer(x, (torch.zeros(2, 2, 4, dtype=torch.float64), torch.zeros(2, 2, 4)))
    with pytest.raises(ValueError, match=r"hx: expected h_0 of shape \(2, 4\)"):
        layer(torch.randn(5, 3), (torch.zeros(2, 2, 4), torch.zeros(2, 2, 4)))


@pytest.mark.parametrize(
    "call",
    [
        lambda layer, nn_layer: layer(torch.randn(5, 2, 7)),  # input_size
        lambda layer, nn_layer: layer(torch.randn(5, 2, 3), _states(nn_layer, 2, 2)),  # h_0 layers
        lambda layer, nn_layer: layer(torch.randn(5, 2, 3), _states(nn_layer, 1, 3)),  # h_0 batch
        lambda layer, nn_layer: layer(torch.randn(5, 3), _states(nn_layer, 1, 2)),  # unbatched, batched hx
        lambda layer, nn_layer: layer(torch.randn(5, 2, 3), _states(nn_layer, 1, 2, device="meta")),
    ],
)
@pytest.mark.parametrize("pair", [(FusedLSTM, torch.nn.LSTM), (FusedGRU, torch.nn.GRU)])
def test_shape_and_device_mismatches_are_also_torch_nn_runtime_errors(pair, call):
    """Where torch.nn raises RuntimeError (input size, hx shape or device), ours raises an
    InputMismatchError: a ValueError naming the argument that `except RuntimeError` catches too."""
    layer, nn_layer = pair[0](3, 4), pair[1](3, 4)
    for module in (layer, nn_layer):
        with pytest.raises(RuntimeError):
            call(module, nn_layer)
    with pytest.raises(InputMismatchError, match=r"^(input|hx): expected") as caught:
        call(layer, nn_layer)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    "call",
    [
        lambda module: module(torch.ones(5, 2, 3, dtype=torch.long)),  # integer input
        lambda module: module(torch.randn(0, 2, 3)),  # no time steps
        lambda module: module(torch.randn(5, 2, 3, 1)),  # 4-D
        lambda module: module(torch.randn(5, 2, 3, dtype=torch.float64)),  # input dtype != weights
        lambda module: module(torch.randn(5, 2, 3), _states(module, 1, 2, dtype=torch.float64)),  # h_0 dtype
    ],
)
@pytest.mark.parametrize("pair", [(FusedLSTM, torch.nn.LSTM), (FusedGRU, torch.nn.GRU)])
def test_dtype_and_rank_errors_are_caught_as_torch_nn_errors(pair, call):
    """Whatever exception torch.nn raises for a bad input (a ValueError for some, a
    RuntimeError for others), ours is one too: an InputMismatchError naming the argument."""
    layer, nn_layer = pair[0](3, 4), pair[1](3, 4)
    with pytest.raises(Exception) as theirs:
        call(nn_layer)
    with pytest.raises(InputMismatchError, match=r"^(input|hx): ") as ours:
        call(layer)
    assert isinstance(ours.value, type(theirs.value)), (type(theirs.value), ours.value)


def _states(nn_layer, layers: int, batch: int, device: str = "cpu", dtype=torch.float32):
    h = torch.zeros(layers, batch, 4, device=device, dtype=dtype)
    if isinstance(nn_layer, (torch.nn.LSTM, FusedLSTM)):
        return h, torch.zeros(layers, batch, 4, dtype=dtype)
    return h


def test_gru_given_lstm_state():
    layer = FusedGRU(3, 4)
    with pytest.raises(TypeError, match=r"hx: FusedGRU expects a tensor h_0 of shape \(1, 2, 4\), got a tuple"):
        layer(torch.randn(5, 2, 3), (torch.zeros(1, 2, 4), torch.zeros(1, 2, 4)))


def _packed(rows: int, batch_sizes, dtype=torch.int64, sorted_indices=None):
    return PackedSequence(torch.randn(rows, 3), torch.tensor(batch_sizes, dtype=dtype), sorted_indices)


@pytest.mark.parametrize(
    "make_input, match",
    [
        (lambda: _packed(6, [1, 2, 3]), r"input.batch_sizes: expected positive, non-increasing sizes, got \[1, 2, 3\]"),
        (lambda: _packed(4, [2, 0, 2]), r"input.batch_sizes: expected positive, non-increasing sizes, got \[2, 0, 2\]"),
        (lambda: _packed(6, [3, 2, 1], torch.int32), "input.batch_sizes: expected a non-empty 1-D int64 CPU tensor, "
                                                     "got torch.int32"),
        (lambda: _packed(5, [2, 2]), r"input.data: expected 4 rows \(the sum of input.batch_sizes\), got 5"),
        (lambda: _packed(3, [2, 2]), r"input.data: expected 4 rows \(the sum of input.batch_sizes\), got 3"),
        (lambda: _packed(4, [2, 2], sorted_indices=torch.tensor([2, 0, 1])),
         r"input.sorted_indices: expected one index per sequence, shape \(2,\), got shape \(3,\)"),
        (lambda: PackedSequence(torch.randn(4, 1, 3), torch.tensor([2, 2])),
         r"input.data: expected a 2-D \(N, input_size\) tensor of packed rows, got shape \(4, 1, 3\)"),
    ],
    ids=["increasing", "empty_step", "int32", "extra_rows", "missing_rows", "sorted_indices", "3d_data"],
)
@pytest.mark.parametrize("backend", available_backends("cpu") + ["torch"])
@pytest.mark.parametrize("layer_class", [FusedLSTM, FusedGRU])
def test_a_malformed_packed_sequence_is_named(layer_class, backend, make_input, match):
    """A hand-built PackedSequence that pack_padded_sequence could not have made is refused
    for every backend before any kernel runs (the reference backend ran one with an empty
    step as another batch, and failed deep inside for the others; torch.nn runs one with
    extra rows, and one with (N, 1, I) data)."""
    layer = layer_class(3, 4, num_layers=2, backend=backend)
    with pytest.raises(InputMismatchError, match=match):
        layer(make_input())


def test_from_torch_rejects_other_modules():
    with pytest.raises(TypeError, match="module: expected a torch.nn.LSTM, got GRU"):
        FusedLSTM.from_torch(torch.nn.GRU(3, 4))


@pytest.mark.parametrize("layer_class", [FusedLSTM, FusedGRU])
def test_nan_in_one_sequence_leaves_other_rows_alone(layer_class):
    layer = layer_class(3, 4, num_layers=2, bidirectional=True)
    x = torch.randn(6, 4, 3)
    clean, _ = layer(x)
    x_bad = x.clone()
    x_bad[2, 1, 0] = float("nan")
    x_bad.requires_grad_(True)
    dirty, _ = layer(x_bad)
    keep = [0, 2, 3]
    assert torch.isnan(dirty[:, 1]).any()
    torch.testing.assert_close(dirty[:, keep], clean[:, keep], rtol=0, atol=0)
    (dirty[:, keep].sum()).backward()
    assert torch.isfinite(x_bad.grad[:, keep]).all()


@pytest.mark.parametrize("backend", available_backends("cpu"))
def test_a_replaced_weight_of_the_wrong_shape_or_dtype_is_named(backend):
    """Caught before the kernels, under torch.nn's names (a kernel would name its own
    arguments, and the wrong one: w_hr for a bad weight_hh with a projection)."""
    layer = FusedLSTM(2, 8, num_layers=2, proj_size=2, dtype=torch.float64, backend=backend)
    x = torch.randn(3, 1, 2, dtype=torch.float64)
    layer.weight_hh_l0 = torch.nn.Parameter(torch.zeros(32, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"weight_hh_l0: expected shape \(32, 2\), got \(32, 3\)"):
        layer(x)
    layer = FusedGRU(2, 4, num_layers=2, dtype=torch.float64, backend=backend)
    layer.bias_hh_l1 = torch.nn.Parameter(torch.zeros(12))
    with pytest.raises(ValueError, match="bias_hh_l1: expected torch.float64 on cpu like weight_ih_l0, got "
                                         "torch.float32 on cpu"):
        layer(x)


@pytest.mark.parametrize("backend", available_backends("cpu"))
def test_a_weight_that_is_no_longer_a_parameter_is_checked_too(backend):
    """A plain tensor (what weight drop puts in a parameter's place) of the wrong shape is
    named under its own name, not as the kernel argument it lands in; a missing one too."""
    layer = FusedLSTM(3, 5, proj_size=2, backend=backend)
    del layer._parameters["weight_hr_l0"]
    layer.weight_hr_l0 = torch.randn(2, 4)
    with pytest.raises(ValueError, match=r"weight_hr_l0: expected shape \(2, 5\), got \(2, 4\)"):
        layer(torch.randn(4, 2, 3))
    layer = FusedGRU(3, 5, backend=backend)
    del layer._parameters["weight_hh_l0"]
    layer.weight_hh_l0 = torch.randn(100)
    with pytest.raises(ValueError, match=r"weight_hh_l0: expected shape \(15, 5\), got \(100,\)"):
        layer(torch.randn(4, 2, 3))
    layer.weight_hh_l0 = None
    with pytest.raises(TypeError, match=r"weight_hh_l0: expected a tensor of shape \(15, 5\), got NoneType"):
        layer(torch.randn(4, 2, 3))


@pytest.mark.parametrize("backend, chunk", [
    *((b, None) for b in ["torch", *available_backends("cpu")]),
    *((b, 2) for b in available_backends("cpu")),  # gradient checkpointing: all chunks share one evaluation
])
def test_parametrized_weights_are_evaluated_once_per_forward(backend, chunk):
    """The weight checks skip parametrized weights: reading one evaluates its parametrization.
    Each forward reads them anew: a change to the parametrization is seen at the next call."""
    calls = []

    class Scaled(torch.nn.Module):
        scale = 1.0

        def forward(self, w):
            calls.append(1)
            return w * self.scale

    layer = FusedLSTM(2, 4, num_layers=2, backend=backend, checkpoint_chunk_size=chunk)
    torch.nn.utils.parametrize.register_parametrization(layer, "weight_hh_l0", Scaled())
    torch.nn.utils.parametrize.register_parametrization(layer, "weight_ih_l0", Scaled())
    x = torch.randn(5, 1, 2, requires_grad=True)
    calls.clear()
    out = layer(x)[0]
    assert len(calls) == 2  # once each
    layer.parametrizations.weight_ih_l0[0].scale = 0.0
    calls.clear()
    changed = layer(x)[0]
    assert len(calls) == 2
    assert not torch.allclose(out, changed)
    for name in ("weight_hh_l0", "weight_ih_l0"):
        torch.nn.utils.parametrize.remove_parametrizations(layer, name)  # leaves the weights parametrized
    torch.testing.assert_close(changed, layer(x)[0])
