"""Which compiled kernel backends the tests run, and on which device.

``COMPILED`` lists (backend, device) pairs as pytest params. CUDA cases are skipped,
with the reason, where there is no GPU; the CPU backend is never skipped: if it
cannot be built, its tests fail with the compiler's message.
"""
import pytest
import torch

from lightning_rnn.kernels import dispatch


def _cuda_skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device on this machine (the cuda backend needs a GPU and nvcc)"
    return None


COMPILED = [
    pytest.param("cpp", "cpu", id="cpp"),
    pytest.param(
        "cuda", "cuda", id="cuda",
        marks=pytest.mark.skipif(_cuda_skip_reason() is not None, reason=_cuda_skip_reason() or ""),
    ),
]


def kernels_for(backend: str):
    """The backend's kernel module (building it if needed; failures propagate)."""
    return dispatch.kernels(backend)


def make_args(cell, batch_sizes, *, I=3, H=4, bias=True, reverse=False, dtype=torch.float64, device="cpu",
              seed=0, P=None):
    """Leaf inputs of one layer-direction call, in the kernels' argument order; with P (LSTM
    only) a projection: h0 (B, P), w_hh (4H, P) and w_hr (P, H) last, after ``reverse``."""
    g = torch.Generator().manual_seed(seed)
    G = 4 if cell == "lstm" else 3
    N, B, Ph = int(sum(batch_sizes)), batch_sizes[0], P or H

    def leaf(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=dtype) * scale).to(device).requires_grad_()

    states = (leaf(B, Ph), leaf(B, H)) if cell == "lstm" else (leaf(B, H),)
    biases = (leaf(G * H), leaf(G * H)) if bias else (None, None)
    projection = (leaf(P, H, scale=0.5),) if P else ()
    return (leaf(N, I), torch.tensor(batch_sizes), *states, leaf(G * H, I, scale=0.5), leaf(G * H, Ph, scale=0.5),
            *biases, reverse, *projection)


def run_and_grad(fn, args, seed=1):
    """Outputs of ``fn(*args)`` and the gradients of a random projection of them
    w.r.t. every tensor argument that requires grad (None where a grad is None)."""
    outs = fn(*args)
    g = torch.Generator().manual_seed(seed)
    loss = sum((o.float() * torch.randn(o.shape, generator=g).to(o.device)).sum() for o in outs)
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return [o.detach() for o in outs], list(grads)
