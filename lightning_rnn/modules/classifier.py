"""SequenceClassifier: one label per variable-length sequence."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from ..utils.checks import check_choice, check_int
from .pooling import final_hidden, mean_over_steps
from .rnn_module import RNNModule
from .tbptt import reject_tbptt

POOLINGS = ("last", "mean")


class SequenceClassifier(RNNModule):
    """Encode a (padded or packed) sequence, pool it, classify it.

    Batches: ``inputs`` (B, T, input_size) float, ``lengths`` (B,) and ``targets`` (B,)
    class ids; the padded inputs are packed, so padding costs nothing in the fused
    layers. Predictions are logits (B, num_classes). Logs loss and accuracy.

    Args:
        input_size: features per step.
        num_classes: number of classes.
        pooling: ``"last"`` (final hidden state of the top layer, both directions) or
            ``"mean"`` (mean of the outputs over the real steps).
        **kwargs: the :class:`RNNModule` arguments (``rnn``, ``optimizer``, ...).
    """

    def __init__(self, input_size: int, num_classes: int, pooling: str = "last", **kwargs):
        check_choice("pooling", pooling, POOLINGS)
        check_int("num_classes", num_classes, 2)
        reject_tbptt(kwargs.get("tbptt_steps"), "SequenceClassifier predicts one label per sequence from its final state")
        super().__init__(input_size=input_size, **kwargs)
        self.output_layer = nn.Linear(self.rnn_output_size, num_classes)

    def encode(self, inputs, state=None, lengths=None):
        """-> (pooled features (B, D*H), state)."""
        self.check_float_steps(inputs)
        outputs, state = super().encode(inputs, state, lengths)
        return self.pool(outputs, state, lengths), state

    def pool(self, outputs, state, lengths: torch.Tensor | None) -> torch.Tensor:
        """One vector per sequence (B, D*H) from the rnn's outputs (padded (B, T, D*H) or
        packed) and final state; override for other poolings."""
        if self.hparams.pooling == "last":
            return final_hidden(state, self.num_directions)
        return mean_over_steps(outputs, lengths)

    def head(self, features: torch.Tensor) -> torch.Tensor:
        return self.output_layer(features)

    def compute_loss(self, logits: torch.Tensor, batch: dict) -> torch.Tensor:
        targets = batch["targets"]
        if not isinstance(targets, torch.Tensor) or targets.shape != logits.shape[:1] \
                or targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool:
            described = f"{targets.dtype} of shape {tuple(targets.shape)}" if isinstance(targets, torch.Tensor) \
                else type(targets).__name__
            raise ValueError(f"targets: expected integer class ids of shape ({len(logits)},), got {described}")
        return F.cross_entropy(logits, targets.long())

    def build_metrics(self) -> MetricCollection:
        return MetricCollection({"acc": MulticlassAccuracy(num_classes=self.hparams.num_classes, average="micro")})
