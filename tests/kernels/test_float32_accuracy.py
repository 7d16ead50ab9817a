"""float32 accuracy of the cpp kernels against the float64 reference where a float32
computation can lose it: small activations and long sequences.

Small activations: tanh(x) = (1 - e^{-2|x|}) / (1 + e^{-2|x|}) loses its relative accuracy as |x| -> 0
(1 - e cancels: an absolute error of about 6e-8, so 3e-4 relative at |x| = 1e-4, and 0
for |x| < 3e-8). Inputs, biases and initial states of size 1e-4 or 1e-7 drive every
pre-activation and state to that size: the outputs and gradients must keep float32's
relative accuracy there (torch.nn and the reference backend do: about 3e-7).

Long sequences: the bias gradient sums the gate gradients of all T steps; one float32
running sum over T 2000 steps was off by 6e-7 (GRU) to 1.3e-6 (LSTM) relative, against
3e-8 to 4e-7 for the reference backend's torch.sum.

Saturated gates: weights of unit scale put many gates where the sigmoid and tanh round to
within an ulp of their limits, over 1000 steps; the kernel's error stays of the order of
torch.nn's own float32 error.
"""
import pytest
import torch
from torch import nn

from lightning_rnn import FusedGRU, FusedLSTM
from lightning_rnn.kernels import reference

from kernel_cases import kernels_for, make_args, run_and_grad

SCHEDULE = [5, 5, 4, 2, 2]


def _scaled(cell, scale, dtype):
    """make_args' leaves in dtype with x, the initial states and the biases times scale."""
    args = make_args(cell, SCHEDULE, I=8, H=16)
    weights = {4, 5} if cell == "lstm" else {3, 4}  # w_ih, w_hh
    out = []
    for k, a in enumerate(args):
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            a = (a.detach() * (1 if k in weights else scale)).to(dtype).requires_grad_()
        out.append(a)
    return tuple(out)


@pytest.mark.parametrize("scale", [1e-4, 1e-7])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_small_activations_keep_float32_relative_accuracy(cell, scale):
    fn = lambda module: module.lstm if cell == "lstm" else module.gru  # noqa: E731
    exact = run_and_grad(fn(reference), _scaled(cell, scale, torch.float64))
    ours = run_and_grad(fn(kernels_for("cpp")), _scaled(cell, scale, torch.float32))
    for got, want in zip(ours[0] + ours[1], exact[0] + exact[1], strict=True):
        if want is None:
            assert got is None
            continue
        err = float((got.double() - want).abs().max()) / float(want.abs().max())
        assert err < 1e-5, err


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_bias_gradient_of_a_long_sequence_as_accurate_as_the_reference_s(cell):
    """Errors summed over four seeds, as a multiple of the float32 reference's: 1.3x (LSTM)
    and 1.0x (GRU) on an AMD EPYC, where one float32 running sum over the T steps gave 2.7x
    and 4.5x. One seed's ratio swings with the rounding of both (0.2-3.3x for the LSTM's
    outputs and gradients there; its bias gradient at seed 0: 2.7x)."""
    fn = lambda module: module.lstm if cell == "lstm" else module.gru  # noqa: E731
    err = {"ours": [0.0, 0.0], "ref32": [0.0, 0.0]}
    for seed in range(4):
        args = make_args(cell, [2] * 2000, I=4, H=8, seed=seed)
        args32 = tuple(a.detach().float().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point()
                       else a for a in args)
        exact = run_and_grad(fn(reference), args)[1]
        runs = {"ours": run_and_grad(fn(kernels_for("cpp")), args32)[1],
                "ref32": run_and_grad(fn(reference), args32)[1]}
        for i, k in enumerate((-2, -1)):  # b_ih, b_hh: the last leaves
            scale = float(exact[k].abs().max())
            for name, grads in runs.items():
                err[name][i] += float((grads[k].double() - exact[k]).abs().max()) / scale
    for ours, ref in zip(err["ours"], err["ref32"], strict=True):
        assert ours <= 2 * ref, (ours, ref)


#: Saturated gates: (input size, hidden size) per cell, two layers, weights and biases drawn
#: from N(0, 1) (torch.nn's init is U(+-1/sqrt(H))). A gate's pre-activation then has a standard
#: deviation of about 3, and a large share of them lies beyond +-4.6, where the sigmoid's slope
#: is below 0.01: the activations round to within an ulp of 0 or 1 and the backward multiplies
#: by slopes that are differences of nearly equal numbers. Larger sizes make the recurrence
#: chaotic (float32 and float64 runs part ways for torch.nn too: no accuracy left to compare).
SATURATED_SIZES = {"lstm": (8, 16), "gru": (4, 8)}
SATURATED_STEPS, SATURATED_BATCH = 1000, 4


def _saturated_pair(cell, seed):
    """torch.nn's layer in float64 with unit-scale weights, and an input (T, B, I) float64."""
    (I, H), module = SATURATED_SIZES[cell], (nn.LSTM if cell == "lstm" else nn.GRU)
    torch.manual_seed(seed)
    exact = module(I, H, num_layers=2).double()
    with torch.no_grad():
        for p in exact.parameters():
            p.normal_()
    return exact, torch.randn(SATURATED_STEPS, SATURATED_BATCH, I, dtype=torch.float64)


def _saturated_share(exact, x) -> float:
    """The share of the first layer's gate pre-activations beyond +-4.6 over the first 200
    steps, computed in float64 with torch.nn's own cell."""
    cell_class = nn.LSTMCell if isinstance(exact, nn.LSTM) else nn.GRUCell
    cell = cell_class(exact.input_size, exact.hidden_size).double()
    cell.load_state_dict({k[:-3]: v for k, v in exact.state_dict().items() if k.endswith("_l0")})
    state, beyond, total = None, 0, 0
    with torch.no_grad():
        for x_t in x[:200]:
            h = torch.zeros(x.shape[1], exact.hidden_size, dtype=x.dtype) if state is None \
                else (state[0] if isinstance(state, tuple) else state)
            z = x_t @ cell.weight_ih.T + cell.bias_ih + h @ cell.weight_hh.T + cell.bias_hh
            beyond, total = beyond + int((z.abs() > 4.6).sum()), total + z.numel()
            state = cell(x_t, state)
    return beyond / total


def _layer_outputs_and_grads(layer, x, dtype, seed=1):
    """Output, final states and the gradients of the input and every parameter under a
    random projection of the output plus the states' sum."""
    x = x.to(dtype).requires_grad_()
    out, state = layer(x)
    states = state if isinstance(state, tuple) else (state,)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)
    loss = (out * g).sum() + sum(s.sum() for s in states)
    return [out.detach(), *(s.detach() for s in states), *torch.autograd.grad(loss, [x, *layer.parameters()])]


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_saturated_gates_over_long_sequences_as_accurate_as_torch_nn(cell):
    """Unit-scale weights, 1000 steps, two layers: the cpp kernel's float32 error against torch.nn
    in float64, for the output, the final states and every gradient, at most 3x torch.nn's own
    float32 error on the same values (errors relative to each tensor's largest entry, summed over
    four seeds: one seed's ratio swings with the rounding of both). Measured on an AMD EPYC: 1.0x
    to 1.9x (LSTM) and 0.7x to 1.8x (GRU) across the tensors."""
    errors = {name: None for name in ("ours", "torch")}
    for seed in range(4):
        exact, x = _saturated_pair(cell, seed)
        assert _saturated_share(exact, x) > 0.1  # the gates saturate (14-20% here): the case is what it says
        float32 = (nn.LSTM if cell == "lstm" else nn.GRU)(exact.input_size, exact.hidden_size, num_layers=2)
        float32.load_state_dict({k: v.float() for k, v in exact.state_dict().items()})
        layers = {"ours": (FusedLSTM if cell == "lstm" else FusedGRU).from_torch(float32, backend="cpp"),
                  "torch": float32}
        want = _layer_outputs_and_grads(exact, x, torch.float64)
        for name, layer in layers.items():
            got = _layer_outputs_and_grads(layer, x, torch.float32)
            err = torch.tensor([float((a.double() - b).abs().max() / b.abs().max()) for a, b in zip(got, want)])
            errors[name] = err if errors[name] is None else errors[name] + err
    assert errors["torch"].max() < 1e-3  # not chaotic: float32 still follows the float64 run
    ratios = errors["ours"] / errors["torch"]
    assert (ratios <= 3).all(), ratios
