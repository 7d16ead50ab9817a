"""The cpp backend's packed-weight store: each weight packed once while active, never stale."""
import pytest
import torch

from lightning_rnn.kernels import cpp

from kernel_cases import make_args

H = 256  # oneDNN's packed GEMMs are used from H = 192 on (rnn_gemm.h)
# Inside a store the steps run oneDNN's packed GEMM instead of MKL's: float32 results
# differ in rounding (up to ~2e-5 here); a stale weight would be off by O(1).
TOL = dict(rtol=1e-4, atol=1e-4)
# Every test runs with the GEMMs chosen both ways (the mkl_generic fixture, tests/conftest.py):
# the generic choices run x W_ih^T on panels of W_ih^T (66 rows), one more packed weight per call.
pytestmark = pytest.mark.skipif(
    not hasattr(torch.ops.mkldnn, "_reorder_linear_weight") or not torch.backends.mkldnn.is_available(),
    reason="this torch build has no oneDNN weight packing",
)


def _args(cell, seed=0):
    # 4 steps (66 rows): below the step count at which a call packs W_hh on its own
    return make_args(cell, [20, 20, 16, 10], I=H, H=H, dtype=torch.float32, seed=seed)


def _run(cell, args):
    with torch.no_grad():
        return getattr(cpp, cell)(*args)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_each_weight_packed_once_while_active_and_results_unchanged(cell, mkl_generic):
    args = _args(cell)
    expected = _run(cell, args)
    store = cpp.weight_packs()
    with store:
        first = _run(cell, args)
        # W_hh, and W_ih^T's panels where x W_ih^T runs on them (generic choices; else at::mm)
        packed = 1 + mkl_generic
        assert len(store) == packed
        w_ih, w_hh = args[-5], args[-4]  # make_args: ..., w_ih, w_hh, b_ih, b_hh, reverse
        detached = (*args[:-5], w_ih.detach(), w_hh.detach(), *args[-3:])  # new views, same weights
        second = _run(cell, detached)
        assert len(store) == packed
    assert len(store) == packed  # kept after the block, until cleared
    for got in (first, second):
        for a, b in zip(got, expected, strict=True):
            torch.testing.assert_close(a, b, **TOL)
    _run(cell, args)  # inactive: nothing added
    assert len(store) == packed
    store.clear()
    assert len(store) == 0


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_a_weight_changed_in_place_is_packed_again(cell, mkl_generic):
    args = _args(cell)
    w_hh = args[-4]
    store = cpp.weight_packs()
    with store:
        before = _run(cell, args)
        with torch.no_grad():
            w_hh.mul_(-1.5)  # bumps the version: the packed copy is stale
        after = _run(cell, args)
    assert len(store) == 2 + mkl_generic  # W_hh before and after; W_ih^T (unchanged) once
    with cpp.weight_packs():  # a fresh store packs the changed weight: the same GEMMs, bit for bit
        expected = _run(cell, args)
    for a, b in zip(after, expected, strict=True):
        assert torch.equal(a, b)
    assert not torch.allclose(before[0], after[0])


def test_stores_nest_and_exit_in_order(mkl_generic):
    args = _args("lstm")
    outer, inner = cpp.weight_packs(), cpp.weight_packs()
    with outer:
        with inner:
            _run("lstm", args)
        _run("lstm", make_args("lstm", [20, 20, 16, 10], I=H, H=H, dtype=torch.float32, seed=1))
    assert (len(outer), len(inner)) == (1 + mkl_generic, 1 + mkl_generic)
    with pytest.raises(RuntimeError, match="exit without a matching enter"):
        inner.__exit__(None, None, None)
