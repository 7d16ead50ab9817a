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
"""
import pytest
import torch

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
