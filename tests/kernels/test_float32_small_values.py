"""float32 accuracy of the cpp kernels where activations are small.

tanh(x) = (1 - e^{-2|x|}) / (1 + e^{-2|x|}) loses its relative accuracy as |x| -> 0
(1 - e cancels: an absolute error of about 6e-8, so 3e-4 relative at |x| = 1e-4, and 0
for |x| < 3e-8). Inputs, biases and initial states of size 1e-4 or 1e-7 drive every
pre-activation and state to that size: the outputs and gradients must keep float32's
relative accuracy there (torch.nn and the reference backend do: about 3e-7).
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
