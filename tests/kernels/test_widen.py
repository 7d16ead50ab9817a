"""bf16 / fp16 GEMMs run in float32 on CPUs without a fast low-precision GEMM
(kernels/csrc/rnn_widen.h): detected as ATen reports it, forced both ways here, and
computing what the low-precision GEMMs compute (same products, float32 sums)."""
import pytest
import torch

from lightning_rnn.kernels import reference

from kernel_cases import kernels_for, make_args, recast, run_and_grad


def _ext():
    return kernels_for("cpp").load()


@pytest.mark.parametrize("dtype, op", [(torch.bfloat16, "_is_mkldnn_bf16_supported"),
                                       (torch.float16, "_is_mkldnn_fp16_supported")], ids=["bf16", "fp16"])
def test_widens_where_aten_has_no_fast_low_precision_gemm(dtype, op):
    ext = _ext()
    supported = getattr(torch.ops.mkldnn, op, None)
    native = bool(supported()) if supported is not None else False
    assert ext.widens(torch.zeros(1, dtype=dtype)) == (not native)
    for other in (torch.float32, torch.float64):
        assert not ext.widens(torch.zeros(1, dtype=other))


def test_force_widen_both_ways_and_back():
    ext = _ext()
    bf16 = torch.zeros(1, dtype=torch.bfloat16)
    detected = ext.widens(bf16)
    try:
        ext.force_widen(1)
        assert ext.widens(bf16) and not ext.widens(torch.zeros(1))
        ext.force_widen(0)
        assert not ext.widens(bf16)
    finally:
        ext.force_widen(-1)
    assert ext.widens(bf16) == detected
    with pytest.raises(RuntimeError, match="expected -1 \\(detect\\), 0 or 1, got 2"):
        ext.force_widen(2)


def _rel_err(got, want) -> float:
    return max(((g.float() - w.float()).abs().max() / w.float().abs().max().clamp_min(1e-6)).item()
               for g, w in zip(got, want) if w is not None)


# 12 steps (>= 8: the step GEMM's weight is prepared, not a plain at::mm): H 40 runs the
# float32 copy on panels, H 192 in oneDNN packed (where present); the packed schedule's
# steps shrink. Projected: the r W_hr^T step GEMM and its backward too.
@pytest.mark.parametrize("schedule", [[8] * 12, [8] * 6 + [5] * 4 + [2] * 2], ids=["full", "packed"])
@pytest.mark.parametrize("cell, H, P", [("lstm", 40, None), ("gru", 40, None), ("lstm", 192, None),
                                        ("gru", 192, None), ("lstm", 40, 24)],
                         ids=["lstm40", "gru40", "lstm192", "gru192", "lstm40_projected"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_widened_gemms_match_the_low_precision_ones(cell, H, P, schedule, dtype):
    """Outputs and every gradient under CPU autocast, widened and not: within 2% of the
    reference backend's (the bound of test_backend_precision.py), and of each other."""
    ext = _ext()
    cpp = kernels_for("cpp")
    # weights ~ 1/sqrt(fan-in), as layers initialize them: make_args' 0.5 saturates the
    # gates at H 192, where the rounding of any two bf16 runs then grows step by step
    # (bf16 against float32: 13-100% apart)
    args = recast(make_args(cell, schedule, I=24, H=H, P=P), torch.float32, 2 / H**0.5,
                  (-6, -5, -1) if P else (-5, -4))
    results = {}
    for module, widen in ((cpp, 1), (cpp, 0), (reference, -1)):
        ext.force_widen(widen)
        try:
            fn = getattr(module, cell)
            with torch.autocast("cpu", dtype=dtype):
                outs = fn(*args)
            assert outs[0].dtype == dtype
            outs, grads = run_and_grad(lambda *a: outs, args)
            results[widen] = list(outs) + list(grads)
        finally:
            ext.force_widen(-1)
    assert _rel_err(results[1], results[-1]) <= 0.02
    assert _rel_err(results[0], results[-1]) <= 0.02
    assert _rel_err(results[1], results[0]) <= 0.02
