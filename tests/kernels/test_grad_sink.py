"""Weight gradients summed in place across kernel calls: the sink, and the kernels' sums."""
import pytest
import torch

from lightning_rnn.kernels import cpp
from lightning_rnn.kernels.grad_sink import GradSink


def test_sink_sums_expected_weights_and_passes_others_through():
    w, other = torch.randn(4, 3, requires_grad=True), torch.randn(4, 3, requires_grad=True)
    sink = GradSink()
    sink.expect([w, None])
    assert GradSink.current() is None
    with sink:
        assert GradSink.current() is sink
        g_other = torch.ones(4, 3)
        assert sink.keep(other, g_other) is g_other  # not expected: back to autograd
        first = torch.full((4, 3), 2.0)
        assert sink.keep(w.detach(), first) is None  # a detached view is the same weight
        assert sink.into(w, torch.float32) is None  # not owned: never added into in place
        assert sink.keep(w, torch.full((4, 3), 3.0)) is None
        assert torch.equal(first, torch.full((4, 3), 2.0))  # the first gradient was not modified
        total = sink.into(w, torch.float32)  # now a sum of the sink's own
        assert total is not None and sink.into(w, torch.float64) is None
        total.add_(1.0)  # as a kernel adds into it ...
        assert sink.keep(w, total, owned=True) is None  # ... and hands it back
    assert GradSink.current() is None
    assert torch.equal(sink.take(w), torch.full((4, 3), 6.0))
    assert sink.take(w) is None


def test_owned_first_gradient_is_summed_in_place_and_clear_forgets():
    w = torch.randn(2, 2, requires_grad=True)
    sink = GradSink()
    sink.expect([w])
    fresh = torch.ones(2, 2)
    sink.keep(w, fresh, owned=True)
    sink.keep(w, torch.ones(2, 2))
    assert sink.into(w, torch.float32) is fresh and torch.equal(fresh, torch.full((2, 2), 2.0))
    sink.clear()
    assert sink.take(w) is None


def test_the_same_gradient_for_two_tied_weights_counts_twice():
    """Tied weights (one storage) share a sum; a gradient handed for both (the LSTM returns
    one bias gradient for b_ih and b_hh) is the sum of both, not taken for the kernel's
    in-place addition."""
    w = torch.randn(4, requires_grad=True)
    sink = GradSink()
    sink.expect([w, w])
    g = torch.ones(4)
    assert sink.keep(w.detach(), g) is None and sink.keep(w.detach(), g) is None
    assert torch.equal(sink.take(w), torch.full((4,), 2.0)) and torch.equal(g, torch.ones(4))


def test_frozen_weights_are_not_expected():
    w = torch.randn(2, 2)  # requires_grad False
    sink = GradSink()
    sink.expect([w])
    g = torch.ones(2, 2)
    assert sink.keep(w, g) is g


def _lstm_call(dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    T, B, I, H = 6, 3, 5, 4
    r = lambda *s: torch.randn(*s, generator=gen, dtype=dtype)  # noqa: E731
    x, bs = r(T * B, I), torch.full((T,), B)
    h0, c0, w_ih, w_hh, b = r(B, H), r(B, H), r(4 * H, I) * 0.3, r(4 * H, H) * 0.3, r(4 * H)
    return x, bs, h0, c0, w_ih, w_hh, b, r(T * B, H), r(B, H), r(B, H)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_kernel_adds_weight_gradients_into_the_given_sums(cell):
    ext = cpp.load()
    x, bs, h0, c0, w_ih, w_hh, b, d_out, d_hn, d_cn = _lstm_call()
    if cell == "gru":
        w_ih, w_hh, b, c0, d_cn = w_ih[: 3 * 4], w_hh[: 3 * 4], b[: 3 * 4], None, None
    f64 = torch.float64
    _, _, _, gates, x_c = getattr(ext, f"{cell}_forward")(x, bs, h0, c0, w_ih, w_hh, b, b, None, False, f64, f64)
    args = (x_c, gates, h0, c0, w_ih, w_hh, None, d_out, d_hn, d_cn, bs, False, [True] * 6 + [False], f64, f64)
    plain = getattr(ext, f"{cell}_backward")(*args, None, None)
    into_ih, into_hh = torch.randn_like(w_ih), torch.randn_like(w_hh)
    before_ih, before_hh = into_ih.clone(), into_hh.clone()
    summed = getattr(ext, f"{cell}_backward")(*args, into_ih, into_hh)
    assert summed[3].data_ptr() == into_ih.data_ptr() and summed[4].data_ptr() == into_hh.data_ptr()
    torch.testing.assert_close(into_ih, before_ih + plain[3], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(into_hh, before_hh + plain[4], rtol=1e-12, atol=1e-12)
    for i in (0, 1, 5, 6):  # dx, dh0, the bias gradients: as without sums
        torch.testing.assert_close(summed[i], plain[i], rtol=0, atol=0)


def test_kernel_rejects_a_sum_of_the_wrong_dtype_or_shape():
    ext = cpp.load()
    x, bs, h0, c0, w_ih, w_hh, b, d_out, d_hn, d_cn = _lstm_call()
    f64 = torch.float64
    _, _, _, gates, x_c = ext.lstm_forward(x, bs, h0, c0, w_ih, w_hh, b, b, None, False, f64, f64)
    args = (x_c, gates, h0, c0, w_ih, w_hh, None, d_out, d_hn, d_cn, bs, False, [True] * 6 + [False], f64, f64)
    with pytest.raises(RuntimeError, match="dw_ih_into: expected a contiguous Double tensor of shape"):
        ext.lstm_backward(*args, torch.zeros_like(w_ih, dtype=torch.float32), None)
    with pytest.raises(RuntimeError, match="dw_hh_into: expected"):
        ext.lstm_backward(*args, None, torch.zeros(3, 3, dtype=f64))
