"""The GEMM choices made where at::mm runs MKL's generic kernels (csrc/rnn_blas.h): the
forward's input projection on panels, the weight gradients in oneDNN at every size, the
backward's GEMMs after the loop. Both sets of choices run on any CPU when forced."""
import platform
from pathlib import Path

import pytest
import torch

from lightning_rnn.kernels import cpp, reference

from kernel_cases import check_float32_error, make_args


def _cpuinfo() -> tuple[str | None, list[str]]:
    """The CPU's vendor_id and flags from /proc/cpuinfo (None, [] without it)."""
    vendor, flags = None, []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "vendor_id" and vendor is None:
                vendor = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = value.split()
    except OSError:
        pass
    return vendor, flags


def test_detects_mkl_s_generic_kernels_on_avx512_cpus_not_made_by_intel():
    vendor, flags = _cpuinfo()
    if vendor is None or platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("needs an x86 CPU with /proc/cpuinfo")
    ext = cpp.load()
    want = torch.backends.mkl.is_available() and vendor != "GenuineIntel" and "avx512f" in flags
    assert ext.mkl_generic_detected() == want
    assert ext.mkl_generic() == want


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
def test_no_gradient_chunks_where_mkl_runs_generic_kernels(mkl_generic, threads):
    """dG of 2.5 MB: chunks of 256 rows on one thread for MKL's Intel kernels; after the
    loop (one oneDNN GEMM per weight gradient) for its generic ones, or on two threads."""
    want = 256 if threads == 1 and not mkl_generic else 0
    assert cpp.load().grad_chunk_rows(True, 2500, 4 * 64 * 4) == want


# 600 rows: the projection (>= 64 rows) on panels and the weight gradients (>= 512 rows) in
# oneDNN for the generic choices; H 40 and I 24 are not powers of two, H 64 is.
@pytest.mark.parametrize("schedule", [[50] * 12, [60] * 6 + [45] * 4 + [12] * 3], ids=["full", "packed"])
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
@pytest.mark.parametrize("I, H", [(24, 40), (64, 64)], ids=["H40", "H64"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_float32_close_to_reference_with_either_choices(cell, I, H, reverse, schedule, mkl_generic):
    args = make_args(cell, schedule, I=I, H=H, reverse=reverse)
    check_float32_error(getattr(cpp, cell), getattr(reference, cell), args, (-5, -4))


def test_projected_lstm_close_to_reference_with_the_generic_choices(mkl_generic):
    args = make_args("lstm", [50] * 12, I=24, H=40, P=16)
    check_float32_error(cpp.lstm, reference.lstm, args, (-6, -5, -1))


def test_forced_value_is_checked():
    ext = cpp.load()
    with pytest.raises(RuntimeError, match=r"expected -1 \(detect\), 0 or 1, got 2"):
        ext.force_mkl_generic(2)
