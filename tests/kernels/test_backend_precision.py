"""bf16 autocast on the compiled CPU backend: activation memory and accuracy.

Tolerances (stated): under bf16 autocast, outputs and gradients are compared with
fp32 as max|bf16 - fp32| <= 5% of max|fp32| (bf16 keeps 8 mantissa bits; the cell
state and accumulations stay fp32), and with the reference backend under the same
autocast as max|cpp - ref| <= 2% of max|ref| (same roundings, different summation order).
"""
import pytest
import torch

from lightning_rnn.kernels import reference
from lightning_rnn.utils.memory import SavedTensorsMeter

from kernel_cases import kernels_for, make_args, run_and_grad

SCHEDULE = [6, 6, 5, 4, 4, 2, 1]
CELLS, CELL_IDS = [("lstm", None), ("gru", None), ("lstm", 12)], ["lstm", "gru", "lstm_projected"]  # P: proj size


def _run(module, cell, autocast: bool, P=None, device="cpu", dtype=torch.bfloat16):
    args = make_args(cell, SCHEDULE, I=16, H=32, dtype=torch.float32, P=P, device=device)
    weights = [a for a in args[3:7] + args[9:] if isinstance(a, torch.Tensor) and a.dim() == 2]
    fn = module.lstm if cell == "lstm" else module.gru
    with torch.autocast(device, dtype=dtype, enabled=autocast), SavedTensorsMeter(exclude=weights) as meter:
        outs = fn(*args)
    dtypes = [o.dtype for o in outs]
    outs, grads = run_and_grad(lambda *a: outs, args)
    return outs + grads, dtypes, meter.bytes


def _rel_err(got, want) -> float:
    return max(((g.float() - w.float()).abs().max() / w.float().abs().max().clamp_min(1e-6)).item()
               for g, w in zip(got, want))


@pytest.mark.parametrize("cell, P", CELLS, ids=CELL_IDS)
def test_bf16_autocast_memory_dtypes_accuracy(cell, P, widen):
    cpp = kernels_for("cpp")
    fp32, fp32_dtypes, fp32_bytes = _run(cpp, cell, autocast=False, P=P)
    bf16, bf16_dtypes, bf16_bytes = _run(cpp, cell, autocast=True, P=P)
    ref, ref_dtypes, ref_bytes = _run(reference, cell, autocast=True, P=P)
    assert bf16_bytes <= 0.65 * fp32_bytes
    assert bf16_bytes <= ref_bytes
    assert bf16_dtypes == ref_dtypes
    # out in bf16; h_n as the next step reads it: the LSTM's in bf16 (c_n fp32), the GRU's in fp32
    assert bf16_dtypes[1:] == ([torch.bfloat16, torch.float32] if cell == "lstm" else [torch.float32])
    assert bf16_dtypes[0] == torch.bfloat16 and all(d == torch.float32 for d in fp32_dtypes)
    assert _rel_err(bf16, fp32) <= 0.05
    assert _rel_err(bf16, ref) <= 0.02


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("cell, P", CELLS, ids=CELL_IDS)
def test_cuda_autocast_memory_dtypes_accuracy(cell, P, dtype):
    """The cuda kernel under CUDA autocast (bf16, fp16): the CPU kernel's contract above,
    saved bytes, output/state dtypes as the reference's, same error bounds."""
    cuda = kernels_for("cuda")
    fp32, _, fp32_bytes = _run(cuda, cell, autocast=False, P=P, device="cuda", dtype=dtype)
    low, low_dtypes, low_bytes = _run(cuda, cell, autocast=True, P=P, device="cuda", dtype=dtype)
    ref, ref_dtypes, ref_bytes = _run(reference, cell, autocast=True, P=P, device="cuda", dtype=dtype)
    assert low_bytes <= 0.65 * fp32_bytes and low_bytes <= ref_bytes
    assert low_dtypes == ref_dtypes and low_dtypes[0] == dtype
    assert _rel_err(low, fp32) <= 0.05
    assert _rel_err(low, ref) <= 0.02


@pytest.mark.parametrize("cell, P", CELLS, ids=CELL_IDS)
def test_fp32_saves_no_more_than_reference(cell, P):
    cpp = kernels_for("cpp")
    assert _run(cpp, cell, autocast=False, P=P)[2] <= _run(reference, cell, autocast=False, P=P)[2]
