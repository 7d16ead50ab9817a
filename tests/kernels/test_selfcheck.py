"""The compiled backends' self-check (kernels/selfcheck.py): a wrong kernel result injected into
the cpp backend's entry points is caught, named, and either falls back (auto) or raises (cpp);
the check runs once per process and device, whatever the caller's autograd state."""
import warnings

import pytest
import torch

from lightning_rnn import FusedGRU, FusedLSTM
from lightning_rnn.kernels import cpp, dispatch, reference, selfcheck

CPU = torch.device("cpu")


@pytest.fixture
def fresh(monkeypatch):
    """No check run, no warning given and no backend resolved yet in this process, as far as
    this test sees (the real reports are back after it); the check enabled."""
    monkeypatch.setattr(selfcheck, "_reports", {})
    monkeypatch.setattr(dispatch, "_warned", set())
    monkeypatch.setattr(dispatch, "_loaded", {})
    monkeypatch.delenv(selfcheck.ENV, raising=False)


class _NudgeGrad(torch.autograd.Function):
    """Identity forward; the gradient flowing back scaled by 1.001."""

    @staticmethod
    def forward(ctx, w):
        return w.view_as(w)

    @staticmethod
    def backward(ctx, grad):
        return grad * 1.001


REAL = cpp.BACKEND  # the entries the wrong ones below call (tests swap cpp.BACKEND for a copy)


def _wrong_gru_grad(x, batch_sizes, h0, w_ih, w_hh, *rest, **kwargs):
    """The cpp GRU, its gradient of w_hh 0.1% off (outputs exact)."""
    return REAL.gru(x, batch_sizes, h0, w_ih, _NudgeGrad.apply(w_hh), *rest, **kwargs)


def _wrong_lstm_c_n(*args, **kwargs):
    """The cpp LSTM, its final cell state 1e-6 off."""
    out, h_n, c_n = REAL.lstm(*args, **kwargs)
    return out, h_n, c_n + 1e-6


def test_the_cpu_backend_passes_and_every_entry_point_is_run(fresh, patch_backend):
    """float64 (what the CPU is checked in) and float32 against the float64 reference: no
    mismatch; each entry point the backend declares ran, with autograd and without, with the
    cell options and without."""
    calls = []

    def spy(name, entry):
        def call(*args, **kwargs):
            calls.append((name, "extras" in kwargs, torch.is_grad_enabled()))
            return entry(*args, **kwargs)
        return call

    patch_backend("cpp", **{name: spy(name, getattr(REAL, name)) for name in ("lstm", "gru", "stack", "padded")})
    report = selfcheck.run(cpp.BACKEND, CPU)
    assert report.dtype == torch.float64 and report.mismatches == ()
    assert {name for name, _, _ in calls} == {"lstm", "gru", "stack", "padded"}
    for cell in ("lstm", "gru"):
        assert (cell, True, True) in calls and (cell, False, True) in calls and (cell, False, False) in calls
    report32 = selfcheck.run(cpp.BACKEND, CPU, torch.float32)
    assert report32.dtype == torch.float32 and report32.mismatches == ()


def test_auto_warns_once_naming_what_differed_and_falls_back(fresh, patch_backend):
    patch_backend("cpp", gru=_wrong_gru_grad)
    layer, x = FusedGRU(3, 4), torch.randn(5, 2, 3)
    with pytest.warns(RuntimeWarning) as caught:
        out = layer(x)[0]
    message = str(caught[0].message)
    assert "the 'cpp' backend failed its self-check on cpu (float64 against the 'reference' backend)" in message
    assert "gru layer (bidirectional, packed): grad of w_hh (layer 1) differs by " in message
    assert "(tolerance 1e-09)" in message and message.endswith("falling back to the 'reference' backend on cpu.")
    assert "lstm" not in message and "stack" not in message  # what is right is not named
    assert caught[0].filename == __file__  # the warning points at the user's call
    error = float(message.split("grad of w_hh (layer 1) differs by ")[1].split()[0])
    assert 1e-5 < error < 1e-2  # 0.1% of a gradient of order 1
    assert dispatch.resolve_backend("auto", CPU) is reference.BACKEND
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(layer(x)[0], out)  # the same backend, no second warning
        assert dispatch.resolve("auto", CPU) == "reference"
    layer.backend = "reference"
    assert torch.equal(layer(x)[0], out)
    assert len(selfcheck.reports()) == 1


def test_a_named_backend_raises(fresh, patch_backend):
    patch_backend("cpp", lstm=_wrong_lstm_c_n)
    # 1e-6 over max(1, max |c_n|): c_n's entries reach beyond 1 here
    with pytest.raises(selfcheck.SelfCheckFailed, match=r"lstm layer \(bidirectional, packed, projected\): c_n "
                                                        r"differs by \d\.\de-07 \(tolerance 1e-09\)") as raised:
        FusedLSTM(3, 4, backend="cpp")(torch.randn(5, 2, 3))
    assert isinstance(raised.value, dispatch.BackendUnavailable)  # what the CLI reports as a clean error
    assert "c_n (no grad) differs by " in str(raised.value)  # the inference path too
    with pytest.raises(selfcheck.SelfCheckFailed, match="c_n differs"):
        dispatch.resolve("cpp", CPU)  # every time, from the one report
    assert len(selfcheck.reports()) == 1


def test_a_kernel_that_raises_fails_the_check(fresh, patch_backend):
    def no_image(*args):
        raise RuntimeError("no kernel image is available for execution on the device\nsecond line")

    patch_backend("cpp", stack=no_image)
    with pytest.warns(RuntimeWarning, match=r"lstm stack \(2 layers, bidirectional, packed, projected\): raised "
                                            r"RuntimeError: no kernel image is available for execution on the "
                                            r"device; gru stack"):
        assert dispatch.resolve("auto", CPU) == "reference"


def test_the_check_runs_once_per_process_and_device(fresh, monkeypatch):
    runs = []
    run_isolated = selfcheck.run_isolated

    def counted(backend, device, dtype=None):
        runs.append((backend.name, device))
        return run_isolated(backend, device, dtype)

    monkeypatch.setattr(selfcheck, "run_isolated", counted)
    for name in ("auto", "cpp", "auto", "cpp"):
        dispatch.resolve(name, CPU)
    FusedLSTM(3, 4)(torch.randn(5, 2, 3))
    FusedGRU(3, 4, backend="cpp")(torch.randn(5, 2, 3))
    assert runs == [("cpp", CPU)]
    dispatch.resolve("reference", CPU)
    assert len(runs) == 1  # the reference is what the others are checked against

    def passed(backend, device, dtype=None):  # GPUs by index, without running anything
        runs.append((backend.name, device))
        return selfcheck.Report(backend.name, device, torch.float64, (), 0.0)

    monkeypatch.setattr(selfcheck, "run_isolated", passed)
    for index in (0, 1, 0, 1):
        selfcheck.verify(cpp.BACKEND, torch.device("cuda", index))
    assert runs[1:] == [("cpp", torch.device("cuda", 0)), ("cpp", torch.device("cuda", 1))]


def test_the_check_neither_uses_nor_changes_the_caller_s_state(fresh):
    """First resolved inside inference_mode, bf16 autocast and saved-tensor hooks: the check
    still runs float64 with gradients, the hooks see none of its tensors, the caller's random
    state is untouched."""
    packed = []
    rng = torch.get_rng_state()
    with (torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16),
          torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t)):
        assert dispatch.resolve("auto", CPU) == "cpp"
    (report,) = selfcheck.reports()
    assert report.mismatches == () and report.dtype == torch.float64
    assert packed == [] and torch.equal(torch.get_rng_state(), rng)


def test_the_environment_variable_skips_the_check(fresh, patch_backend, monkeypatch):
    patch_backend("cpp", lstm=_wrong_lstm_c_n)
    monkeypatch.setenv(selfcheck.ENV, "0")
    assert dispatch.resolve("cpp", CPU) == "cpp"
    assert selfcheck.reports() == []
    monkeypatch.setattr(dispatch, "_loaded", {})
    monkeypatch.setenv(selfcheck.ENV, "yes")
    with pytest.raises(ValueError, match=r"LIGHTNING_RNN_SELFCHECK: expected 1 \(check .*\) or 0 \(skip the "
                                         r"check\), got 'yes'"):
        dispatch.resolve("cpp", CPU)


def test_gpus_without_fast_float64_are_checked_in_float32(monkeypatch):
    """No GPU needed: the choice reads the device's compute capability and torch's TF32 flag."""
    assert selfcheck.check_dtype(CPU) == torch.float64
    for capability, dtype in (((9, 0), torch.float64), ((8, 0), torch.float64), ((8, 6), torch.float32),
                              ((8, 9), torch.float32), ((12, 0), torch.float32)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        assert selfcheck.check_dtype(torch.device("cuda", 0)) == dtype
    allowed = torch.backends.cuda.matmul.allow_tf32  # a property: monkeypatch cannot restore it
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        assert selfcheck.tolerance(torch.float32, torch.device("cuda", 0)) == selfcheck.TOLERANCE[torch.float32]
        torch.backends.cuda.matmul.allow_tf32 = True
        assert selfcheck.tolerance(torch.float32, torch.device("cuda", 0)) == selfcheck.TF32_TOLERANCE
        assert selfcheck.tolerance(torch.float32, CPU) == selfcheck.TOLERANCE[torch.float32]
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allowed


def test_a_float32_check_catches_an_error_float32_rounding_does_not_make(fresh, patch_backend):
    """float32's tolerance passes the real kernel (test above) and fails one 1e-3 off."""
    def off(*args, **kwargs):
        out, h_n = REAL.gru(*args, **kwargs)
        return out * 1.001, h_n

    patch_backend("cpp", gru=off)
    report = selfcheck.run(cpp.BACKEND, CPU, torch.float32)
    assert {m.tensor for m in report.mismatches if m.case.entry == "layer"} >= {"out", "out (no grad)"}
    assert all(m.case.cell == "gru" and m.error > selfcheck.TOLERANCE[torch.float32] for m in report.mismatches)



def test_a_nan_is_a_mismatch(fresh, patch_backend):
    def nan_out(*args):
        out, finals = REAL.padded(*args)
        return out.clone().index_fill_(0, torch.tensor([1]), float("nan")), finals

    patch_backend("cpp", padded=nan_out)
    mismatches = selfcheck.run(cpp.BACKEND, CPU).mismatches
    assert {m.case.entry for m in mismatches} == {"padded"}
    nan = [m for m in mismatches if m.tensor == "out"]
    assert [m.case.cell for m in nan] == ["lstm", "gru"] and "out differs by nan" in str(nan[0])
