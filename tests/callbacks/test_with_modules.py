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


def test_stateful_classifier_with_length_bucketing_warns():
    """Bucketing regroups the rows by length, so a carried state would come from other sequences."""
    import functools

    from lightning.pytorch import Trainer
    from torch.utils.data import DataLoader

    from lightning_rnn import FusedLSTM
    from lightning_rnn.data import pad_batch
    from lightning_rnn.modules import SequenceClassifier

    items = [{"inputs": torch.randn(n, 3), "targets": torch.tensor(n % 2)} for n in (5, 9, 3, 7, 4, 8, 6, 2)]
    model = SequenceClassifier(input_size=3, num_classes=2, stateful=True, rnn=functools.partial(FusedLSTM, hidden_size=4),
                               optimizer=functools.partial(torch.optim.SGD, lr=0.1))
    trainer = Trainer(max_epochs=1, callbacks=[PackedSequences()], logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    with pytest.warns(UserWarning, match=r"stateful=True .* shuffles \(or buckets by length\)"):
        trainer.fit(model, DataLoader(items, batch_size=4, collate_fn=pad_batch))
