"""Which compiled kernel backends the tests run, and on which device.

``COMPILED`` lists (backend, device) pairs as pytest params. CUDA cases are skipped,
with the reason, where there is no GPU; the CPU backend is never skipped: if it
cannot be built, its tests fail with the compiler's message. The rest: the arguments
of one layer-direction call, and the parity checks the kernel tests share.
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
    return dispatch.backend(backend)


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


def recast(args, dtype, weight_scale, weights=(-5, -4)):
    """Fresh leaves of args in dtype, the weights at positions ``weights`` scaled by
    weight_scale (w_ih and w_hh in make_args' order ..., w_ih, w_hh, b_ih, b_hh, reverse;
    with a projection (-6, -5, -1): ..., reverse, w_hr)."""
    out = []
    for k, a in enumerate(args):
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            a = a.detach() * (weight_scale if k - len(args) in weights else 1)
            a = a.to(dtype).requires_grad_()
        out.append(a)
    return tuple(out)


def check_float32_error(ours_fn, reference_fn, base, weights):
    """ours_fn in float32 against reference_fn in float64 on the same values: the relative
    error of every output and gradient at most 4x the float32 reference's."""
    args32 = recast(base, torch.float32, 0.1, weights)  # weights ~ 0.05: gates not saturated
    args64 = tuple(a.detach().double().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point()
                   else a for a in args32)
    exact = run_and_grad(reference_fn, args64)
    ours = run_and_grad(ours_fn, recast(args32, torch.float32, 1))
    ref32 = run_and_grad(reference_fn, recast(args32, torch.float32, 1))
    for got, ref, want in zip(ours[0] + ours[1], ref32[0] + ref32[1], exact[0] + exact[1]):
        assert (got is None) == (want is None)
        if want is not None:
            scale = float(want.abs().max()) + 1e-12
            err = float((got.double() - want).abs().max()) / scale
            ref_err = float((ref.double() - want).abs().max()) / scale
            assert err <= 4 * ref_err + 1e-6, (err, ref_err)

