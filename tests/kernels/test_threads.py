"""The cpp kernels with 2 and 4 intra-op threads (the rest of the suite runs on one, so
it never takes their parallel paths; users train with every core by default).

What runs in parallel (kernels/csrc): the pointwise passes over a step's rows in chunks
of ~4K elements (rows x 4H: 128 rows at hidden 8, 16 at 64, 7 at 130), the backward's
scan over batch rows (one row a chunk), the panel GEMM of steps of up to 64 rows over its
panels of W (and the copy into panels), the blocked transpose of the weight gradients,
and MKL's / oneDNN's GEMMs. The schedules below split each of them (8+ steps: below 8 the
steps run in at::mm, not on panels), with steps of more and fewer rows than a chunk, of
1-3 rows, and partial panels (hidden 130).

Forward outputs (out, h_n, c_n) of steps on panels (float32, all steps of up to 64 rows)
are bitwise those of one thread: each row's pointwise math is the same in whichever chunk
it lands, and the panel GEMM splits over output columns. Elsewhere they are not always:
MKL splits the depth of a one-row product over its threads (h W_hh^T of a step of 1 row,
hidden 130, in a call whose widest step of 130 rows sends every step to at::mm: the last
bit of that row's outputs changes, in this step and the ones after), as it does for the
backward's per-step GEMMs with few rows and columns and the weight gradients (sums over
all tokens). Those are held to the reference's tolerances instead.
"""
import pytest
import torch

from lightning_rnn.kernels import cpp, reference

from kernel_cases import check_float32_error, kernels_for, make_args, recast, run_and_grad

CASES = {  # hidden size, batch_sizes
    "H8_B520": (8, [520, 520, 517, 300, 64, 64, 3, 1]),
    "H64_B67": (64, [67, 67, 66, 65, 64, 40, 3, 1]),
    "H130_B130": (130, [130, 130, 97, 64, 33, 31, 2, 1]),
    "H130_B64": (130, [64, 64, 63, 40, 33, 31, 2, 1]),
    "H64_B3": (64, [3, 3, 3, 2, 2, 1, 1, 1]),
    "H130_B1": (130, [1] * 8),
}
ON_PANELS = [name for name, (_, schedule) in CASES.items() if schedule[0] <= 64]  # float32: every step
# float32 also through oneDNN: steps of 96 rows at hidden 256, weight gradients over 704 rows
CASES32 = CASES | {"H256_B96": (256, [96] * 4 + [80] * 4)}
CELLS = [("lstm", None), ("lstm", 5), ("gru", None)]  # (cell, proj_size)
CELL_IDS = ["lstm", "lstm_proj", "gru"]
THREADS = pytest.mark.parametrize("threads", [2, 4], indirect=True)


def _fn(module, cell):
    return module.lstm if cell == "lstm" else module.gru


def _weights(P):
    """Positions of the weights in make_args' order (for recast)."""
    return (-6, -5, -1) if P else (-5, -4)


def _on_one_thread(fn, args):
    """run_and_grad(fn, args) with one intra-op thread, the caller's count restored."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run_and_grad(fn, args)
    finally:
        torch.set_num_threads(threads)


@THREADS
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("cell, P", CELLS, ids=CELL_IDS)
def test_float64_matches_reference(cell, P, case, reverse, threads):
    H, schedule = CASES[case]
    make = dict(I=7, H=H, P=P, reverse=reverse)
    outs, grads = run_and_grad(_fn(kernels_for("cpp"), cell), make_args(cell, schedule, **make))
    ref_outs, ref_grads = _on_one_thread(_fn(reference, cell), make_args(cell, schedule, **make))
    for got, want in zip(outs + grads, ref_outs + ref_grads, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@THREADS
@pytest.mark.parametrize("case", list(CASES32))
@pytest.mark.parametrize("cell, P", CELLS, ids=CELL_IDS)
def test_float32_close_to_reference(cell, P, case, threads):
    """float32: every output and gradient within the float32 tests' error bound of the
    float64 reference."""
    H, schedule = CASES32[case]
    base = make_args(cell, schedule, I=16, H=H, P=P, reverse=True)
    check_float32_error(_fn(kernels_for("cpp"), cell), _fn(reference, cell), base, _weights(P))


@THREADS
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
@pytest.mark.parametrize("case", ON_PANELS)
@pytest.mark.parametrize("cell, P", CELLS, ids=CELL_IDS)
def test_float32_forward_on_panels_as_on_one_thread(cell, P, case, reverse, threads):
    """Steps on panels: outputs and final states bitwise those of one thread."""
    if not cpp.load().panels_enabled():
        pytest.skip("panels are off (LIGHTNING_RNN_NO_PANELS)")
    H, schedule = CASES[case]
    fn = _fn(kernels_for("cpp"), cell)
    args32 = recast(make_args(cell, schedule, I=16, H=H, P=P, reverse=reverse), torch.float32, 0.1, _weights(P))
    many, _ = run_and_grad(fn, recast(args32, torch.float32, 1))
    one, _ = _on_one_thread(fn, recast(args32, torch.float32, 1))
    for got, want in zip(many, one, strict=True):
        assert torch.equal(got, want), float((got - want).abs().max())


@pytest.mark.parametrize("threads", [2], indirect=True)
@pytest.mark.parametrize("case", ["H64_B67", "H130_B130"])
@pytest.mark.parametrize("cell, P", CELLS, ids=CELL_IDS)
def test_bf16_autocast_as_on_one_thread(cell, P, case, threads):
    """Under bf16 autocast (bf16 GEMMs in oneDNN / MKL and saved gates, fp32 states):
    outputs and gradients within 0.1% of the largest of one thread's (bf16 keeps 8 bits:
    0.4%; the bf16 tests bound the error itself)."""
    H, schedule = CASES[case]
    fn = _fn(kernels_for("cpp"), cell)
    args32 = recast(make_args(cell, schedule, I=16, H=H, P=P), torch.float32, 0.1, _weights(P))

    def autocast_fn(*args):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return fn(*args)

    outs, grads = run_and_grad(autocast_fn, recast(args32, torch.float32, 1))
    one_outs, one_grads = _on_one_thread(autocast_fn, recast(args32, torch.float32, 1))
    assert outs[0].dtype == torch.bfloat16
    for got, want in zip(outs + grads, one_outs + one_grads, strict=True):
        assert got.dtype == want.dtype
        assert float((got.float() - want.float()).abs().max()) <= 1e-3 * float(want.float().abs().max())
