"""Settings of the kernel tests."""
import pytest
import torch

from lightning_rnn.kernels import dispatch


@pytest.fixture(autouse=True, scope="session")
def _cpu_self_check_first():
    """The cpp backend's self-check (kernels/selfcheck.py) runs once per process, when the
    backend is first resolved: here, before any test, rather than inside the first test that
    resolves it, where it would call the entry points that test spies on or replaces
    (``patch_backend``). A backend that fails it fails the tests that use it."""
    try:
        dispatch.resolve("cpp", torch.device("cpu"))
    except dispatch.BackendUnavailable:
        pass
