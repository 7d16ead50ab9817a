"""Callback tests: one intra-op thread (see callback_helpers for the tiny model and data)."""
import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """Small ops: one intra-op thread is several times faster on a loaded 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
