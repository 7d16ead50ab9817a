"""SequenceRegressor: multi-step forecasts (or any vector) from a sequence."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import MeanAbsoluteError, MeanSquaredError, MetricCollection

from ..utils.checks import check_choice, check_int
from .pooling import final_hidden
from .rnn_module import RNNModule
from .tbptt import reject_tbptt

LOSSES = {"mse": F.mse_loss, "mae": F.l1_loss}


class SequenceRegressor(RNNModule):
    """Encode a sequence and predict the next ``horizon`` steps of ``output_size`` values.

    Batches: ``inputs`` (B, T, input_size) float and ``targets`` (B, horizon,
    output_size); predictions have the targets' shape. The head reads the top layer's
    final hidden state. Logs the loss and both MSE and MAE.

    Args:
        input_size: features per input step.
        output_size: values per predicted step.
        horizon: predicted steps.
        loss: ``"mse"`` or ``"mae"``.
        **kwargs: the :class:`RNNModule` arguments (``rnn``, ``optimizer``, ...).
    """

    def __init__(self, input_size: int, output_size: int, horizon: int = 1, loss: str = "mse", **kwargs):
        check_choice("loss", loss, tuple(LOSSES))
        check_int("output_size", output_size, 1)
        check_int("horizon", horizon, 1)
        reject_tbptt(kwargs.get("tbptt_steps"), "SequenceRegressor predicts one forecast per sequence from its final state")
        super().__init__(input_size=input_size, **kwargs)
        self.output_layer = nn.Linear(self.rnn_output_size, horizon * output_size)

    def encode(self, inputs, state=None, lengths=None):
        """-> (final hidden state (B, D*H), state)."""
        self.check_float_steps(inputs)
        _, state = super().encode(inputs, state, lengths)
        return final_hidden(state, self.num_directions), state

    def head(self, features: torch.Tensor) -> torch.Tensor:
        """(B, D*H) -> (B, horizon, output_size)."""
        return self.output_layer(features).view(len(features), self.hparams.horizon, self.hparams.output_size)

    def compute_loss(self, predictions: torch.Tensor, batch: dict) -> torch.Tensor:
        targets = batch["targets"]
        if not isinstance(targets, torch.Tensor) or targets.shape != predictions.shape \
                or not targets.is_floating_point():
            described = f"{targets.dtype} of shape {tuple(targets.shape)}" if isinstance(targets, torch.Tensor) \
                else type(targets).__name__
            raise ValueError(f"targets: expected floats of shape {tuple(predictions.shape)} (batch, horizon, "
                             f"output_size), got {described}")  # a loss would broadcast other shapes
        return LOSSES[self.hparams.loss](predictions, targets)

    def build_metrics(self) -> MetricCollection:
        return MetricCollection({"mse": MeanSquaredError(), "mae": MeanAbsoluteError()})
