"""Fixtures of the CLI tests."""
import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny GEMMs on a shared 2-core machine run far faster on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def small_text(tmp_path):
    """A 20k-character text file (stands in for downloaded corpora)."""
    path = tmp_path / "small.txt"
    path.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(400)))
    return path
