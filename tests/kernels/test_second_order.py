"""Second-order gradients of one layer-direction: gradgradcheck in float64 per backend."""
import pytest
import torch

from kernel_cases import make_args
from lightning_rnn.kernels import dispatch

BACKENDS = dispatch.available_backends("cpu")
SCHEDULES = {"full": [2, 2, 2], "packed": [2, 2, 1]}


@pytest.mark.parametrize(
    "cell, options",
    [
        ("lstm", {}),
        ("lstm", {"P": 2}),
        ("lstm", {"bias": False, "reverse": True}),
        ("gru", {}),
        ("gru", {"bias": False, "reverse": True}),
    ],
    ids=["lstm", "lstm_projected", "lstm_reverse_no_bias", "gru", "gru_reverse_no_bias"],
)
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_gradgradcheck(backend, cell, options, schedule):
    fn = getattr(dispatch.backend(backend), cell)
    args = make_args(cell, SCHEDULES[schedule], I=2, H=2, **options)
    assert torch.autograd.gradgradcheck(fn, args)


@pytest.mark.parametrize("backend", BACKENDS)
def test_create_graph_through_an_input_the_function_cast_is_refused(backend):
    """Called directly under autocast, a Function casts x itself and saves the cast copy, which
    the graph does not connect to x: a create_graph backward says so instead of dropping x's
    terms (the backends' gru()/lstm() cast first, outside the Function)."""
    kernels = dispatch.backend(backend)
    x, *rest = make_args("gru", [2, 2], I=2, H=2, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = kernels.function("gru").apply(x, *rest)
        with pytest.raises(RuntimeError, match="x: a backward with create_graph=True needs"):
            torch.autograd.grad(out.float().sum(), x, create_graph=True)
        out, _ = kernels.gru(x, *rest)
        (dx,) = torch.autograd.grad(out.float().sum(), x, create_graph=True)
    assert dx.requires_grad and dx.dtype == torch.float32
