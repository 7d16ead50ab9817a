"""The subclassing example in recipes/custom_module.py trains and respects padding."""
import functools
import math
import importlib.util
from pathlib import Path

import pytest
import torch

from lightning_rnn import FusedLSTM
from lightning_rnn.data import pad_batch

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "custom_module.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("custom_module", RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module



def test_attention_pooling_ignores_padding(example):
    model = example.AttentionPoolingClassifier(
        input_size=2, num_classes=3, rnn=functools.partial(FusedLSTM, hidden_size=6, backend="reference"),
        optimizer=functools.partial(torch.optim.Adam, lr=1e-2)).eval()
    items = [{"inputs": torch.randn(n, 2), "targets": torch.tensor(0)} for n in (4, 9, 1)]
    batch = pad_batch(items)
    with torch.no_grad():
        batched, _ = model(batch["inputs"], lengths=batch["lengths"])
        alone = torch.cat([model(item["inputs"].unsqueeze(0))[0] for item in items])
    torch.testing.assert_close(batched, alone, rtol=1e-5, atol=1e-6)


def test_example_trains_and_validates(example):
    metrics = example.main(epochs=2, backend="reference", limit_train_batches=25, limit_val_batches=4, enable_progress_bar=False,
                           enable_model_summary=False)
    assert metrics["val/loss"] < 0.9 * math.log(4)  # better than chance over 4 classes
    assert metrics["val/acc"] > 0.3


def test_example_runs_from_the_cli_configs(monkeypatch, tmp_path):
    """`PYTHONPATH=recipes python -m lightning_rnn experiment=classification model._target_=...`"""
    from hydra import compose, initialize_config_dir

    from lightning_rnn.cli import config_dir
    from lightning_rnn.tasks import train

    monkeypatch.syspath_prepend(str(RECIPE.parent))
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose("config", overrides=[
            f"output_dir={tmp_path}", "experiment=classification", "model._target_=custom_module.AttentionPoolingClassifier",
            "trainer.fast_dev_run=true", "data.num_samples=40", "data.batch_size=8", "model.rnn.backend=reference",
            "logger=none", "callbacks=none"])
    assert train.run(cfg) > 0
