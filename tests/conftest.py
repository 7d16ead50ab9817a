"""Project-wide test settings: offline logging, deterministic, few threads."""
import os

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("HYDRA_FULL_ERROR", "1")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
