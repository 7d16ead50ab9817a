"""Fixtures of the module tests."""
import lightning.pytorch as pl
import pytest
import torch


@pytest.fixture(autouse=True)
def _seed_and_one_thread():
    """Seeded, single-threaded: tiny GEMMs on a shared 2-core machine run ~50x faster
    on one thread than on two contending ones."""
    pl.seed_everything(0, verbose=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
