"""The cpp backend's pool of big buffers (csrc/rnn_pool.h): kept mapped between calls,
never handed to the user, never shared by two live tensors."""
import os
import subprocess
import sys

import pytest
import torch

from lightning_rnn import FusedGRU, FusedLSTM
from lightning_rnn.kernels import cpp

MIB = 1 << 20


@pytest.fixture
def ext():
    ext = cpp.load()
    capacity = ext.pool_capacity()
    yield ext
    ext.set_pool_capacity(capacity)


def _step(layer, x):
    out, state = layer(x)
    (out.square().sum() + sum(s.sum() for s in (state if isinstance(state, tuple) else (state,)))).backward()
    return out, state


def _layer(cls, H=128, layers=2):
    torch.manual_seed(0)
    return cls(H, H, layers, backend="cpp")


@pytest.mark.parametrize("cls", [FusedLSTM, FusedGRU])
def test_blocks_are_kept_between_calls_and_reused(ext, cls):
    """After a step the gates and the backward's scratch (N x 4H floats = 800 KiB here)
    are idle in the pool; the next step takes them again rather than mapping more."""
    ext.set_pool_capacity(0)
    ext.set_pool_capacity(64 * MIB)
    layer, x = _layer(cls), torch.randn(40, 10, 128, requires_grad=True)
    _step(layer, x)
    idle = ext.pool_idle_bytes()
    assert idle >= 2 * 400 * 4 * 128 * 4  # two layers' gates at least
    _step(layer, x)
    assert ext.pool_idle_bytes() == idle


@pytest.mark.parametrize("cls", [FusedLSTM, FusedGRU])
def test_no_pooled_memory_reaches_the_user(ext, cls):
    """Outputs and gradients are ordinary tensors (resizable storage); the pool's blocks
    (from_blob, not resizable) stay inside the kernels and the autograd graph. At hidden
    256 the output and every gradient are big enough to be pooled (400 KiB and more)."""
    ext.set_pool_capacity(64 * MIB)
    layer, x = _layer(cls, H=256), torch.randn(40, 10, 256, requires_grad=True)
    out, state = _step(layer, x)
    seen = [out, *(state if isinstance(state, tuple) else (state,)), x.grad, *(p.grad for p in layer.parameters())]
    assert all(t.untyped_storage().resizable() for t in seen)


@pytest.mark.parametrize("cls", [FusedLSTM, FusedGRU])
def test_live_graphs_keep_their_blocks_and_match_the_unpooled_run(ext, cls):
    """Two forwards whose graphs are alive at once hold distinct blocks: their gradients
    equal those of runs without the pool, bit for bit."""
    xs = [torch.randn(40, 10, 128, generator=torch.Generator().manual_seed(s)) for s in (1, 2)]

    def grads(capacity):
        ext.set_pool_capacity(capacity)
        layer = _layer(cls)
        leaves = [x.clone().requires_grad_() for x in xs]
        outs = [layer(x)[0] for x in leaves]  # both graphs alive
        for out in reversed(outs):
            out.square().sum().backward()
        return [x.grad for x in leaves] + [p.grad for p in layer.parameters()]

    for a, b in zip(grads(0), grads(64 * MIB), strict=True):
        assert torch.equal(a, b)


def test_capacity_bounds_the_idle_bytes_and_zero_frees_them(ext):
    ext.set_pool_capacity(64 * MIB)
    _step(_layer(FusedLSTM), torch.randn(40, 10, 128, requires_grad=True))
    assert ext.pool_idle_bytes() > 0
    ext.set_pool_capacity(1 * MIB)
    assert 0 < ext.pool_idle_bytes() <= 1 * MIB
    ext.set_pool_capacity(0)
    assert ext.pool_idle_bytes() == 0
    _step(_layer(FusedLSTM), torch.randn(40, 10, 128, requires_grad=True))
    assert ext.pool_idle_bytes() == 0


@pytest.mark.parametrize("value", ["0.5", "1.5", "abc", "-1", " ", "64MB", "99999999999999"])
def test_a_capacity_that_is_not_whole_mib_is_an_error(monkeypatch, value):
    """The pool reads LIGHTNING_RNN_POOL_MB with atoll: "0.5", "abc" or " " turned it off
    and "1.5" gave 1 MiB, silently; now loading the kernels names the variable."""
    monkeypatch.setattr(cpp, "_pool_env_checked", False, raising=False)
    monkeypatch.setenv("LIGHTNING_RNN_POOL_MB", value)
    with pytest.raises(ValueError, match="LIGHTNING_RNN_POOL_MB: expected a whole number of MiB >= 0"):
        cpp.load()
    monkeypatch.setenv("LIGHTNING_RNN_POOL_MB", " 16 ")
    assert cpp.load().pool_capacity() > 0


def test_environment_sets_the_capacity():
    """LIGHTNING_RNN_POOL_MB (MiB; 0 turns the pool off), read when the kernels load."""
    code = "from lightning_rnn.kernels import cpp; print(cpp.load().pool_capacity())"
    for env, expected in (("0", 0), ("3", 3 * MIB), (None, 256 * MIB)):
        environ = {k: v for k, v in os.environ.items() if k != "LIGHTNING_RNN_POOL_MB"}
        if env is not None:
            environ["LIGHTNING_RNN_POOL_MB"] = env
        done = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, check=True)
        assert int(done.stdout.split()[-1]) == expected
