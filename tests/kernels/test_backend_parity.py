"""Every compiled backend against the reference backend (float64, exact math),
plus gradcheck of the compiled Functions."""
import contextlib
import os
from pathlib import Path

import pytest
import torch

from lightning_rnn.kernels import cpp, reference

from kernel_cases import COMPILED, check_float32_error, kernels_for, make_args, run_and_grad

SCHEDULES = {
    "full": [3, 3, 3, 3],
    "packed": [4, 3, 3, 1],
    "T1": [3],
    "B1": [1, 1, 1],
}


def _call(module, cell):
    return module.lstm if cell == "lstm" else module.gru


@pytest.mark.parametrize("backend,device", COMPILED)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_matches_reference_float64(cell, schedule, reverse, bias, backend, device):
    kernels = kernels_for(backend)
    args = make_args(cell, SCHEDULES[schedule], bias=bias, reverse=reverse, device=device)
    outs, grads = run_and_grad(_call(kernels, cell), args)
    ref_args = make_args(cell, SCHEDULES[schedule], bias=bias, reverse=reverse, device=device)
    ref_outs, ref_grads = run_and_grad(_call(reference, cell), ref_args)
    for got, want in zip(outs + grads, ref_outs + ref_grads):
        assert (got is None) == (want is None)
        if want is not None:
            assert got.dtype == want.dtype and got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("backend,device", COMPILED)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("P", [2, 1])
def test_projected_lstm_matches_reference_float64(P, schedule, reverse, bias, backend, device):
    """LSTM with a projection w_hr (P, H), H = 5: outputs, states and every gradient, w_hr's too."""
    kernels = kernels_for(backend)
    make = dict(H=5, P=P, bias=bias, reverse=reverse, device=device)
    outs, grads = run_and_grad(kernels.lstm, make_args("lstm", SCHEDULES[schedule], **make))
    ref_outs, ref_grads = run_and_grad(reference.lstm, make_args("lstm", SCHEDULES[schedule], **make))
    assert outs[0].shape[1] == outs[1].shape[1] == P and outs[2].shape[1] == 5 and grads[-1].shape == (P, 5)
    for got, want in zip(outs + grads, ref_outs + ref_grads, strict=True):
        assert (got is None) == (want is None)
        if want is not None:
            assert got.dtype == want.dtype and got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("backend,device", COMPILED)
def test_projected_lstm_only_needed_grads(backend, device):
    """A frozen projection gets no gradient; a frozen W_hh still lets w_hr's through."""
    kernels = kernels_for(backend)
    for frozen in (-1, 5):  # w_hr, w_hh
        args = list(make_args("lstm", [3, 3, 2], H=5, P=3, device=device))
        args[frozen] = args[frozen].detach()
        outs, grads = run_and_grad(kernels.lstm, args)
        ref_outs, ref_grads = run_and_grad(reference.lstm, args)
        assert len(grads) == len(ref_grads) == 7  # x, h0, c0, w_ih, b_ih, b_hh and one of w_hh / w_hr
        for got, want in zip(outs + grads, ref_outs + ref_grads, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("backend,device", COMPILED)
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_float32_close_to_reference(cell, backend, device):
    kernels = kernels_for(backend)
    kw = dict(I=8, H=16, dtype=torch.float32, device=device)
    outs, grads = run_and_grad(_call(kernels, cell), make_args(cell, [5, 5, 4, 2, 2], **kw))
    ref_outs, ref_grads = run_and_grad(_call(reference, cell), make_args(cell, [5, 5, 4, 2, 2], **kw))
    for got, want in zip(outs + grads, ref_outs + ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend,device", COMPILED)
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
@pytest.mark.parametrize("schedule", ["full", "packed"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_gradcheck(cell, schedule, reverse, backend, device):
    kernels = kernels_for(backend)
    fn = kernels.function(cell)
    args = make_args(cell, [3, 2, 2, 1] if schedule == "packed" else [3, 3, 3], I=2, H=3, reverse=reverse,
                     device=device)
    assert torch.autograd.gradcheck(fn.apply, args)


@pytest.mark.parametrize("backend,device", COMPILED)
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
@pytest.mark.parametrize("schedule", ["full", "packed"])
def test_projected_lstm_gradcheck(schedule, reverse, backend, device):
    kernels = kernels_for(backend)
    args = make_args("lstm", [3, 2, 2, 1] if schedule == "packed" else [3, 3, 3], I=2, H=3, P=2, reverse=reverse,
                     device=device)
    assert torch.autograd.gradcheck(kernels.function("lstm").apply, args)


@pytest.mark.parametrize("backend,device", COMPILED)
def test_only_needed_grads(backend, device):
    """Inputs that do not require grad get None, and the rest still match."""
    kernels = kernels_for(backend)
    args = list(make_args("lstm", [3, 2], device=device))
    args[0] = args[0].detach()  # x
    args[4] = args[4].detach()  # w_ih
    outs, grads = run_and_grad(kernels.lstm, args)
    ref_outs, ref_grads = run_and_grad(reference.lstm, args)
    for got, want in zip(outs + grads, ref_outs + ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("backend,device", COMPILED)
def test_non_contiguous_inputs(backend, device):
    kernels = kernels_for(backend)
    x, bs, h0, c0, w_ih, w_hh, b_ih, b_hh, rev = make_args("lstm", [3, 3], device=device)
    w_hh_t = w_hh.detach().t().contiguous().t()  # same values, transposed strides
    x_wide = torch.cat([x.detach(), x.detach()], 1)[:, ::2]  # strided columns (different values)
    want = reference.lstm(x_wide, bs, h0, c0, w_ih, w_hh_t, b_ih, b_hh, rev)
    got = kernels.lstm(x_wide, bs, h0, c0, w_ih, w_hh_t, b_ih, b_hh, rev)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)


_NO_GRAPH = {
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
    "frozen": contextlib.nullcontext,  # grad mode on, but no tensor requires grad
}


@pytest.mark.parametrize("backend,device", COMPILED)
@pytest.mark.parametrize("mode", list(_NO_GRAPH))
@pytest.mark.parametrize("cell, P", [("lstm", None), ("lstm", 2), ("gru", None)], ids=["lstm", "lstm_proj", "gru"])
def test_forward_without_graph_skips_the_function(cell, P, mode, backend, device, monkeypatch):
    """Where nothing needs a gradient (generation token by token under no_grad), the kernel
    runs without an autograd node (its Python overhead exceeded a one-step kernel), with
    exactly the outputs of the Function."""
    kernels = kernels_for(backend)
    args = make_args(cell, [3, 2, 2], H=5, P=P, reverse=True, dtype=torch.float32, device=device)
    want = _call(kernels, cell)(*args)
    detached = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]

    def refused(*_):
        raise AssertionError("the autograd.Function ran without a gradient to record")

    monkeypatch.setattr(kernels.function(cell), "apply", refused)
    with _NO_GRAPH[mode]():
        got = _call(kernels, cell)(*detached)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.grad_fn is None and torch.equal(g, w.detach())


@pytest.mark.parametrize("backend,device", COMPILED)
def test_forward_without_graph_under_autocast(backend, device):
    """The graph-free path casts as the Function does under autocast (bf16 GEMMs, fp32 states)."""
    kernels = kernels_for(backend)
    args = make_args("lstm", [3, 3], H=5, dtype=torch.float32, device=device)
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
        want = kernels.lstm(*args)
        with torch.no_grad():
            got = kernels.lstm(*args)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and torch.equal(g, w.detach())


@pytest.mark.parametrize("backend,device", COMPILED)
def test_forward_mode_ad_is_refused_under_no_grad(backend, device):
    """Dual tensors (forward-mode AD, which the Functions do not implement) still get
    torch's error under no_grad, rather than outputs silently missing their tangents."""
    import torch.autograd.forward_ad as fwAD

    kernels = kernels_for(backend)
    x, *rest = [a.detach() if isinstance(a, torch.Tensor) else a for a in make_args("gru", [2, 2], device=device)]
    with torch.no_grad(), fwAD.dual_level():
        with pytest.raises(NotImplementedError, match="jvp"):
            kernels.gru(fwAD.make_dual(x, torch.ones_like(x)), *rest)


@pytest.mark.parametrize(
    "schedule",
    [[6] * 9, [6, 6, 5, 5, 4, 3, 3, 2, 1], [13] * 4 + [7] * 4 + [1], [48] * 6 + [40] * 4 + [30] * 4, [72] * 5 + [66] * 4],
    ids=["full", "packed", "packed_b13", "packed_n568", "wide"],
)
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize(
    "I, H", [(24, 20), (128, 128), (200, 192), (256, 256), (64, 1024)], ids=["H20", "H128", "H192", "H256", "H1024"]
)
def test_float32_fast_paths_close_to_reference(cell, reverse, schedule, I, H, panels, grad_chunks):
    """float32, T >= 8: the CPU backend's per-step GEMMs run on W_hh copied into panels
    (csrc/rnn_panels.h) for steps of up to 64 rows (every schedule but "wide": register
    tiles of each height 1-6 among them; H 20 also a partial panel; the backward's 4H-deep
    GEMM in 2-4 blocks of 256 at H 128-256), and for wider steps in oneDNN (forward from
    H 192, backward from H 1024) or at::mm. The projection runs in oneDNN with W_ih packed
    from H 128 (at H 20 in at::mm), the backward's dx in at::mm or oneDNN (on panels of
    W_ih where MKL runs its generic kernels: test_mkl_path.py), the weight-gradient GEMMs
    in oneDNN only at powers of two with >= 512 rows. Against the float64 reference on the
    same values, the error must be of the order of the float32 reference's own. With
    panels on and off (off, the steps run in oneDNN or at::mm), and with the backward's dx / dW GEMMs as one
    thread chooses them (in chunks of rows inside the loop where dG is over 1 MiB: the two
    schedules with the most rows from H 128, all but the smallest two at H 1024) or all
    after the loop (csrc/rnn_grad_gemms.h)."""
    check_float32_error(_call(kernels_for("cpp"), cell), _call(reference, cell),
                         make_args(cell, schedule, I=I, H=H, reverse=reverse), (-5, -4))


@pytest.mark.parametrize("schedule", [[6] * 9, [13] * 4 + [7] * 4 + [1], [72] * 5 + [66] * 4],
                         ids=["full", "packed_b13", "wide"])
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
@pytest.mark.parametrize("I, H, P", [(24, 20, 12), (128, 256, 128), (64, 1024, 256)], ids=["H20", "H256", "H1024"])
def test_float32_projected_lstm_fast_paths_close_to_reference(reverse, schedule, I, H, P, panels):
    """The projection's GEMMs take the same paths as the others (per step h W_hr^T and
    dh W_hr on panels up to 64 rows, else oneDNN / at::mm; one GEMM over all rows to
    rebuild h_t, and dW_hr): error of the order of the float32 reference's own."""
    args = make_args("lstm", schedule, I=I, H=H, P=P, reverse=reverse)
    check_float32_error(kernels_for("cpp").lstm, reference.lstm, args, (-6, -5, -1))


@pytest.fixture(params=[-1, 0], ids=["grad_chunks_auto", "grad_gemms_after_loop"])
def grad_chunks(request):
    """The cpp kernels' backward GEMMs in chunks as chosen (-1) or all after the loop (0)."""
    ext = cpp.load()
    ext.force_grad_chunk_rows(request.param)
    yield request.param
    ext.force_grad_chunk_rows(-1)


@pytest.fixture(params=[True, False], ids=["panels", "no_panels"])
def panels(request):
    """The cpp kernels with their step GEMMs on panels or not, whatever this CPU's default."""
    ext = cpp.load()
    default = ext.panels_enabled()
    ext.set_panels(request.param)
    yield request.param
    ext.set_panels(default)


def test_panels_are_on_by_default_with_the_cpus_widest_vectors():
    """Panels serve the step GEMMs unless LIGHTNING_RNN_NO_PANELS=1, in tiles of the CPU's
    widest vectors (-march=native): two 16-float vectors with AVX-512, two 8-float ones
    with AVX2. 8-float tiles on an AVX-512 CPU had lost to MKL by up to 1.4x."""
    if os.environ.get("LIGHTNING_RNN_NO_PANELS"):
        pytest.skip("LIGHTNING_RNN_NO_PANELS is set")
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        pytest.skip("no /proc/cpuinfo to read the CPU's flags from")
    if "avx2" not in flags:
        pytest.skip("the panel width is pinned for x86 CPUs with AVX2 or AVX-512")
    ext = cpp.load()
    assert ext.panels_enabled()
    assert ext.panel_width() == (32 if "avx512f" in flags else 16)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_cuda_runs_on_the_input_s_gpu_not_the_current_one(cell):
    """Tensors on cuda:1 while the current device is cuda:0: the kernels run on cuda:1 (on
    its current stream, ordered with the GEMMs), with the results of a run on cuda:0."""
    kernels = kernels_for("cuda")
    with torch.cuda.device(0):
        want = run_and_grad(_call(kernels, cell), make_args(cell, SCHEDULES["packed"], reverse=True, device="cuda:0"))
        got = run_and_grad(_call(kernels, cell), make_args(cell, SCHEDULES["packed"], reverse=True, device="cuda:1"))
    for g, w in zip(got[0] + got[1], want[0] + want[1], strict=True):
        assert g.device == torch.device("cuda:1")
        torch.testing.assert_close(g.cpu(), w.cpu(), rtol=1e-12, atol=1e-12)


def test_cpu_kernels_flush_denormals_and_restore_the_caller_s_mode():
    """The cpp kernels flush denormal floats (gradients decaying over long sequences are
    many times slower there on some CPUs): a denormal c_0 carried by a forget gate of 1 comes
    out as 0, where the reference keeps it. The caller's floating-point mode is restored."""
    torch.set_flush_denormal(False)
    tiny = torch.finfo(torch.float32).tiny / 4  # a float32 denormal
    args = list(make_args("lstm", [1], I=2, H=3, dtype=torch.float32))
    x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, reverse = args
    with torch.no_grad():
        for w in (w_ih, w_hh, b_ih, b_hh):
            w.zero_()
        b_ih[3:6] = 100.0  # forget gate 1, input gate 1/2, g = tanh(0) = 0: c_1 = c_0
        c0.fill_(tiny)
    (_, _, c_ref) = reference.lstm(*args)
    (_, _, c_ours) = kernels_for("cpp").lstm(*args)
    assert float(c_ref.min()) == pytest.approx(tiny) and float(c_ref.min()) > 0
    assert torch.equal(c_ours, torch.zeros_like(c_ours))
    assert float(torch.tensor([tiny]) * 1.0) > 0  # this thread's mode is the caller's again


@pytest.mark.parametrize("H, panels_expected", [(32, True), (1024, False)])
def test_step_gemms_on_panels_only_where_they_suit_the_build(H, panels_expected):
    """Steps of up to 64 rows run on panels, except with AVX-512's 16-float tiles for a
    W_hh^T beyond the core's L2 (16 MiB at hidden 1024): then in oneDNN or at::mm."""
    ext = cpp.load()
    if not ext.panels_enabled():
        pytest.skip("panels are off (LIGHTNING_RNN_NO_PANELS)")
    avx512 = ext.panel_width() == 32
    args = [a.detach() if isinstance(a, torch.Tensor) else a
            for a in make_args("lstm", [4] * 8, I=8, H=H, dtype=torch.float32)]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        kernels_for("cpp").lstm(*args)
    steps = [e for e in prof.events()  # the GEMMs of h's rows (H columns; x has 8)
             if e.name in ("aten::mm", "mkldnn::_linear_pointwise") and e.input_shapes[0] == [4, H]]
    on_panels = panels_expected or not avx512
    assert len(steps) == (0 if on_panels else 8)
