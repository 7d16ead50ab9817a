"""The reference Functions: gradcheck in float64 on full and packed schedules."""
import pytest
import torch

from lightning_rnn.kernels import reference

B, I, H = 3, 2, 3


def _args(cell, batch_sizes, reverse, bias):
    n_gates = 4 if cell == "lstm" else 3
    N = int(sum(batch_sizes))
    leaf = lambda *s: torch.randn(*s, dtype=torch.float64, requires_grad=True)  # noqa: E731
    states = (leaf(B, H), leaf(B, H)) if cell == "lstm" else (leaf(B, H),)
    biases = (leaf(n_gates * H), leaf(n_gates * H)) if bias else (None, None)
    return (leaf(N, I), torch.tensor(batch_sizes), *states, leaf(n_gates * H, I), leaf(n_gates * H, H), *biases, reverse)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("batch_sizes", [[3, 3, 3], [3, 2, 2, 1]])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_gradcheck(cell, batch_sizes, reverse, bias):
    fn = reference.LSTMFunction if cell == "lstm" else reference.GRUFunction
    assert torch.autograd.gradcheck(fn.apply, _args(cell, batch_sizes, reverse, bias))
