"""Subclassing example: a sequence classifier that pools with learned attention.

Shows how a project extends the module family without touching lightning_rnn: override
one extension point (``pool``), keep everything else (packing, fused layers,
optimization, metrics, logging). Run it as a script:

    python recipes/custom_module.py --epochs 5

or train it from the CLI with the classification recipe, from the repository root with
this directory on the import path (run from recipes/, the CLI would write its outputs/
into recipes/, which the configs see as conf/experiment/):

    PYTHONPATH=recipes python -m lightning_rnn experiment=classification \
        model._target_=custom_module.AttentionPoolingClassifier
"""
from __future__ import annotations

import argparse
import functools

import lightning.pytorch as pl
import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pad_packed_sequence

from lightning_rnn import FusedLSTM, TemporalAdapter
from lightning_rnn.data import SequenceClassificationDataModule
from lightning_rnn.modules import SequenceClassifier


class AttentionPoolingClassifier(SequenceClassifier):
    """A :class:`SequenceClassifier` whose summary of a sequence is an attention-weighted
    mean of its outputs: score_t = w . o_t, weights = softmax over the real steps.
    It replaces the built-in ``pooling`` choice."""

    def __init__(self, input_size: int, num_classes: int, **kwargs):
        super().__init__(input_size=input_size, num_classes=num_classes, **kwargs)
        self.attention = TemporalAdapter(nn.Linear(self.rnn_output_size, 1))  # (B, T, D) -> (B, T, 1)

    def pool(self, outputs, state, lengths):
        """Attention over the real steps: (B, T, D) outputs -> (B, D)."""
        if isinstance(outputs, PackedSequence):
            outputs, lengths = pad_packed_sequence(outputs, batch_first=True)  # (B, T, D), (B,)
        scores = self.attention(outputs).squeeze(-1)  # (B, T)
        if lengths is not None:
            padding = torch.arange(outputs.shape[1], device=outputs.device) >= lengths.to(outputs.device).unsqueeze(1)
            scores = scores.masked_fill(padding, float("-inf"))
        weights = scores.softmax(dim=1).unsqueeze(-1)  # (B, T, 1)
        return (weights * outputs).sum(dim=1)


def main(epochs: int = 5, backend: str = "auto", **trainer_kwargs) -> dict[str, float]:
    """Train on the synthetic variable-length task; returns the final metrics."""
    pl.seed_everything(0)
    datamodule = SequenceClassificationDataModule(num_samples=1000, max_len=100)
    datamodule.setup()
    model = AttentionPoolingClassifier(
        **datamodule.model_kwargs(),
        rnn=functools.partial(FusedLSTM, hidden_size=64, backend=backend),
        optimizer=functools.partial(torch.optim.Adam, lr=3e-3),
    )
    trainer = pl.Trainer(max_epochs=epochs, accelerator="cpu", logger=False, enable_checkpointing=False,
                         **trainer_kwargs)
    trainer.fit(model, datamodule=datamodule)
    return {k: float(v) for k, v in trainer.callback_metrics.items()}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--backend", default="auto", help="FusedLSTM backend: auto, reference, cpp, torch")
    args = parser.parse_args()
    print(main(args.epochs, args.backend))
