"""Project-wide test settings: offline logging, seeded, one intra-op thread.

Tests use tiny shapes; on a shared 2-core machine one thread runs them many times
faster than two contending ones. The tests of the kernels' parallel paths ask for more
with the ``threads`` fixture. OMP_NUM_THREADS is set before torch is imported so
subprocesses (CLI, DDP tests) inherit it.
"""
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("HYDRA_FULL_ERROR", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _seed_and_one_thread():
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def threads(request):
    """``torch.set_num_threads(n)`` for one test, n its indirect parameter
    (``@pytest.mark.parametrize("threads", [2, 4], indirect=True)``): the tests of the
    kernels' parallel paths, which the one thread above never takes. One thread again
    after the test (and the caller's count after that, by the fixture above)."""
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(1)


@pytest.fixture(params=[1, 0], ids=["mkl_generic", "mkl_intel"])
def mkl_generic(request):
    """The cpp kernels choosing their GEMMs as if MKL ran its generic kernels (1: an
    AVX-512 CPU not made by Intel; kernels/csrc/rnn_blas.h) or its Intel ones (0), whatever
    this CPU is; detected again after the test."""
    from lightning_rnn.kernels import cpp

    ext = cpp.load()
    ext.force_mkl_generic(request.param)
    yield request.param
    ext.force_mkl_generic(-1)


@pytest.fixture(params=[1, 0], ids=["widened", "native"])
def widen(request):
    """The cpp kernels running their bf16 / fp16 GEMMs in float32 (1: as on a CPU without
    a fast low-precision GEMM; kernels/csrc/rnn_widen.h) or in ATen's low-precision GEMM
    (0), whatever this CPU is; detected again after the test."""
    from lightning_rnn.kernels import cpp

    ext = cpp.load()
    ext.force_widen(request.param)
    yield request.param
    ext.force_widen(-1)


@pytest.fixture
def patch_backend(monkeypatch):
    """``patch_backend("cpp", padded=..., ...)``: the kernel backend with some entry points
    replaced for one test (a Backend is frozen: its module's BACKEND is swapped for a copy,
    and the dispatch cache forgets what layers resolved to); returns the original Backend.
    Each call starts again from the original."""
    import dataclasses
    import importlib

    from lightning_rnn.kernels import dispatch

    originals = {}

    def patch(name: str, **entries):
        """Replaces ``entries`` of the original backend (not of an earlier patch's copy)."""
        module = importlib.import_module(f"lightning_rnn.kernels.{name}")
        original = originals.setdefault(name, module.BACKEND)
        monkeypatch.setattr(module, "BACKEND", dataclasses.replace(original, **entries))
        monkeypatch.setattr(dispatch, "_loaded", {})
        return original

    return patch


@pytest.fixture(autouse=True, scope="session")
def _cpu_self_check_first():
    """The cpp backend's self-check (kernels/selfcheck.py) runs once per process, when the
    backend is first resolved: here, before any test, rather than inside the first test that
    resolves it, where it would call the entry points that test spies on or replaces
    (``patch_backend``, a spy on Precision.for_call). A backend that fails it fails the tests
    that use it."""
    from lightning_rnn.kernels import dispatch

    try:
        dispatch.resolve("cpp", torch.device("cpu"))
    except dispatch.BackendUnavailable:
        pass
