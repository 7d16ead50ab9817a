"""The callbacks from their configs, on the project's own modules and recipes."""
import csv

import pytest
import torch
from hydra import compose, initialize_config_dir

from lightning_rnn.callbacks import GradientCheckpointing, MixedPrecision, PackedSequences
from lightning_rnn.cli import config_dir
from lightning_rnn.tasks import train

SMALL_CLASSIFICATION = ["data.num_samples=40", "data.batch_size=8", "trainer.max_steps=3", "trainer.max_epochs=1",
                        "model.rnn.backend=reference", "logger=csv", "trainer.log_every_n_steps=1"]


def _compose(tmp_path, overrides):
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return compose("config", overrides=[f"output_dir={tmp_path}", *overrides])


def _logged(tmp_path) -> dict[str, list[float]]:
    (path,) = tmp_path.rglob("metrics.csv")
    columns: dict[str, list[float]] = {}
    for row in csv.DictReader(path.open()):
        for k, v in row.items():
            if v:
                columns.setdefault(k, []).append(float(v))
    return columns


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_all_four_on_the_sequence_classifier(tmp_path, dtype):
    callbacks = "callbacks=[packed_sequences,gpu_memory,gradient_checkpointing,mixed_precision]"
    cfg = _compose(tmp_path, ["experiment=classification", callbacks, f"callbacks.mixed_precision.dtype={dtype}",
                              "callbacks.gpu_memory.every_n_steps=1", *SMALL_CLASSIFICATION])
    train.run(cfg)
    logged = _logged(tmp_path)
    assert len(logged["memory/activation_mb"]) == 3 and min(logged["memory/rss_mb"]) > 0
    assert len(logged["packed/padding_efficiency"]) == 3 and min(logged["packed/padding_efficiency"]) > 0.5
    assert all(torch.isfinite(torch.tensor(logged["train/loss"])))
    if dtype == "fp16":
        assert logged["precision/loss_scale"] == [65536.0] * 3 and logged["precision/skipped_steps"] == [0.0] * 3


@pytest.mark.parametrize("recipe, expected", [
    ("adding_problem", GradientCheckpointing),
    ("classification", PackedSequences),
    ("char_shakespeare_large", MixedPrecision),
])
def test_recipes_use_the_callbacks(tmp_path, recipe, expected):
    from hydra.utils import instantiate

    cfg = _compose(tmp_path, [f"experiment={recipe}"])
    assert any(isinstance(instantiate(c), expected) for c in cfg.callbacks.values())
