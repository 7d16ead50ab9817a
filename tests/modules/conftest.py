"""Fixtures of the module tests."""
import lightning.pytorch as pl
import pytest


@pytest.fixture(autouse=True)
def _seed_everything():
    pl.seed_everything(0, verbose=False)
