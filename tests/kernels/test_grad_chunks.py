"""The backward's dx / dW GEMMs over chunks of rows inside the loop (csrc/rnn_grad_gemms.h)
against the reference backend, and when the cpp kernels choose them."""
import pytest
import torch

from lightning_rnn.kernels import cpp, reference

from kernel_cases import check_float32_error, make_args, run_and_grad

SCHEDULES = {
    "full": [3] * 7,
    "packed": [5, 5, 4, 3, 3, 2, 1],
    "T1": [4],
}


@pytest.fixture
def chunk_rows(request):
    """The cpp kernels with chunks of the parameter's rows (0: after the loop), automatic after."""
    ext = cpp.load()
    ext.force_grad_chunk_rows(request.param)
    yield request.param
    ext.force_grad_chunk_rows(-1)


def _check_float64(cell, args):
    outs, grads = run_and_grad(getattr(cpp, cell), args)
    ref_outs, ref_grads = run_and_grad(getattr(reference, cell), args)
    assert len(grads) == len(ref_grads)
    for got, want in zip(outs + grads, ref_outs + ref_grads, strict=True):
        assert (got is None) == (want is None)
        if want is not None:
            assert got.dtype == want.dtype and got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


# 1 row: a chunk per step; 4: steps of 3 and 5 rows, so chunks overshoot to whole steps;
# 1000: one chunk, flushed after the loop; 0: no chunks
@pytest.mark.parametrize("chunk_rows", [1, 4, 1000, 0], indirect=True)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_chunked_gradients_match_reference_float64(cell, schedule, reverse, bias, chunk_rows):
    _check_float64(cell, make_args(cell, SCHEDULES[schedule], I=5, H=4, bias=bias, reverse=reverse))


@pytest.mark.parametrize("chunk_rows", [4], indirect=True)
@pytest.mark.parametrize("frozen", [(0,), (4,), (5,), (0, 4), (4, 5)], ids=["x", "w_ih", "w_hh", "x+w_ih", "weights"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_chunked_gradients_only_where_needed(cell, frozen, chunk_rows):
    """Inputs that do not require grad get none; the others still match (positions in
    make_args' order x, batch_sizes, h0, [c0,] w_ih, w_hh, ...)."""
    args = list(make_args(cell, SCHEDULES["packed"], I=5, H=4))
    shift = 0 if cell == "lstm" else -1  # the GRU has no c0
    for k in frozen:
        k = k if k < 3 else k + shift
        args[k] = args[k].detach()
    _check_float64(cell, args)


@pytest.mark.parametrize("chunk_rows", [1, 4], indirect=True)
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_chunks_add_into_the_given_weight_gradient_sums(cell, chunk_rows):
    """Gradient checkpointing's running sums (dw_ih_into / dw_hh_into) get each chunk added
    in place, and equal the sums with the GEMMs after the loop."""
    ext = cpp.load()
    x, bs, h0, c0, w_ih, w_hh, b_ih, b_hh, reverse = (
        a.detach() if isinstance(a, torch.Tensor) else a for a in make_args("lstm", SCHEDULES["packed"], I=5, H=4)
    )
    if cell == "gru":
        w_ih, w_hh, b_ih, b_hh, c0 = w_ih[:12], w_hh[:12], b_ih[:12], b_hh[:12], None
    f64 = torch.float64
    forward = getattr(ext, f"{cell}_forward")
    out, _, _, gates, x_c = forward(x, bs, h0, c0, w_ih, w_hh, b_ih, b_hh, None, reverse, f64, f64)
    d_out, d_hn = torch.randn_like(out), torch.randn_like(h0)
    d_cn = torch.randn_like(c0) if c0 is not None else None
    args = (x_c, gates, h0, c0, w_ih, w_hh, None, d_out, d_hn, d_cn, bs, reverse, [True] * 6 + [False], f64, f64)
    backward = getattr(ext, f"{cell}_backward")
    ext.force_grad_chunk_rows(0)
    plain = backward(*args, None, None)
    ext.force_grad_chunk_rows(chunk_rows)
    into_ih, into_hh = torch.randn_like(w_ih), torch.randn_like(w_hh)
    before_ih, before_hh = into_ih.clone(), into_hh.clone()
    summed = backward(*args, into_ih, into_hh)
    assert summed[3].data_ptr() == into_ih.data_ptr() and summed[4].data_ptr() == into_hh.data_ptr()
    torch.testing.assert_close(into_ih, before_ih + plain[3], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(into_hh, before_hh + plain[4], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(summed[0], plain[0], rtol=1e-12, atol=1e-12)  # dx


@pytest.mark.parametrize("chunk_rows", [-1, 64], indirect=True)
@pytest.mark.parametrize("panels", [True, False], ids=["panels", "no_panels"])
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("I, H", [(48, 64), (64, 320)], ids=["H64", "H320"])
def test_float32_chunks_close_to_reference(cell, reverse, I, H, panels, chunk_rows):
    """float32 with chunks chosen by one thread (-1: dG of 1120 rows is over 1 MiB at both
    sizes: 256 rows, whole steps of 50) or forced (64 rows: two steps, one of them 30 rows):
    a chunk's dx in at::mm (chunks run where MKL runs its own kernels), the weight
    gradients summed over the chunks; the step GEMMs on panels or not. Error of the order
    of the float32 reference's own."""
    ext = cpp.load()
    default = ext.panels_enabled()
    ext.set_panels(panels)
    try:
        args = make_args(cell, [50] * 20 + [30] * 4, I=I, H=H, reverse=reverse)
        check_float32_error(getattr(cpp, cell), getattr(reference, cell), args, (-5, -4))
    finally:
        ext.set_panels(default)


def test_chunks_on_one_thread_where_dG_outgrows_half_the_l2():
    """Automatic: chunks of 256 rows on one thread where dG (N rows) is over 1 MiB, in one
    precision and on the CPU; after the loop otherwise (and where MKL runs its generic
    kernels: test_mkl_path.py)."""
    ext = cpp.load()
    assert ext.forced_grad_chunk_rows() == -1
    row = 4 * 64 * 4  # LSTM, hidden 64, float32
    previous = torch.get_num_threads()
    ext.force_mkl_generic(0)
    try:
        torch.set_num_threads(1)
        assert ext.grad_chunk_rows(True, 2500, row) == 256  # batch 50, T 50: 2.5 MB
        assert ext.grad_chunk_rows(True, 1024, row) == 0  # exactly 1 MiB
        assert ext.grad_chunk_rows(False, 2500, row) == 0  # bf16 / fp16, a projection or CUDA
        torch.set_num_threads(2)
        assert ext.grad_chunk_rows(True, 2500, row) == 0
    finally:
        torch.set_num_threads(previous)
        ext.force_mkl_generic(-1)


def test_forced_chunk_rows_are_checked():
    ext = cpp.load()
    with pytest.raises(RuntimeError, match="expected -1 .automatic., 0 .off. or a positive count, got -2"):
        ext.force_grad_chunk_rows(-2)
    assert ext.forced_grad_chunk_rows() == -1


@pytest.mark.parametrize("chunk_rows", [0, 7], indirect=True)
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_gemm_bound_runs_the_same_chunks(cell, chunk_rows):
    """The GEMM-only bound (benchmarks) takes the chunked path too; it returns nothing."""
    ext = cpp.load()
    G = 4 if cell == "lstm" else 3
    x, bs = torch.randn(30, 6), torch.tensor([5, 5, 5, 5, 4, 4, 2])
    assert getattr(ext, f"{cell}_gemm_bound")(x, bs, torch.randn(G * 8, 6), torch.randn(G * 8, 8)) is None
