"""Fixtures of the CLI tests."""
import pytest


@pytest.fixture
def small_text(tmp_path):
    """A 20k-character text file (stands in for downloaded corpora)."""
    path = tmp_path / "small.txt"
    path.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(400)))
    return path
