"""RNNModule: the LightningModule every recurrent model here derives from."""
from __future__ import annotations

import inspect
from typing import Callable

import torch
from lightning.pytorch import LightningModule
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence
from torchmetrics import MetricCollection

from ..utils.checks import check_callable, check_choice, check_flag, check_int
from ..utils.compat import switch_to_manual_optimization
from . import checkpoints, epoch_metrics
from .batches import check_float_steps, check_lengths, real_steps, sequences_in, split_along_time
from .carried_state import CarriedState
from .nonfinite import NonFiniteGuard, check_weights_finite
from .optimization import (
    configure_optimization, factory_learning_rate, is_plateau, step_plateaus, warn_unstepped_plateaus,
)
from .rnn_factory import build_rnn, num_directions, rnn_output_size
from .state import State
from .tbptt import TruncatedBPTT, validate_trainer


class RNNModule(LightningModule):
    """Base LightningModule for recurrent models: input layer -> ``rnn`` -> head.

    Batches are dicts: ``inputs`` (B, T, ...), ``targets`` and optionally ``lengths`` (B,)
    for padded variable-length inputs (packed before the ``rnn``). ``inputs`` may also
    arrive already packed (a ``PackedSequence``, e.g. from a callback). Packed inputs give
    packed features: a per-step head then predicts a ``PackedSequence``, which
    :meth:`compute_loss` receives as it is (:func:`~lightning_rnn.modules.pack_like` aligns
    the padded targets) and the metrics receive as its real steps' rows.

    Extension points (override any of them): :meth:`encode` ``(inputs, state, lengths) ->
    (features, state)``; :meth:`head` ``(features) -> predictions``; :meth:`compute_loss`
    ``(predictions, batch) -> loss`` (a mean); :meth:`loss_weight` ``(batch) -> int`` (what
    that mean is over); :meth:`build_metrics` and :meth:`derived_metrics`; :meth:`shared_step`;
    :meth:`split_batch` (how truncated BPTT cuts a batch).

    Args:
        rnn: factory of the recurrent encoder, called as ``rnn(input_size=input_size,
            batch_first=True)`` (e.g. ``functools.partial(FusedLSTM, hidden_size=128)``).
        input_size: features per step that reach the rnn (after the input layer).
        optimizer: factory ``optimizer(params)``, e.g. ``functools.partial(torch.optim.Adam, lr=2e-3)``.
        scheduler: optional factory ``scheduler(optimizer)``.
        scheduler_interval: ``"step"`` (every optimizer step) or ``"epoch"``. A
            ``ReduceLROnPlateau`` steps after each validation in fit instead, with ``val/loss``.
        tbptt_steps: truncated BPTT: cut each batch into chunks of this many steps, carry the
            detached state from chunk to chunk and take an optimizer step per chunk
            (:class:`~lightning_rnn.modules.tbptt.TruncatedBPTT`).
        stateful: carry the detached state from one batch to the next, from zeros at the start
            of every epoch (torch-rnn's remember_states); needs batches whose rows continue one
            another, as :class:`~lightning_rnn.data.ContiguousStreams` gives. A checkpoint written
            mid-epoch holds the carried state, and a run of one process resumed from it carries on.
        nonfinite_loss: a training loss (or gradient) that is not finite: ``"error"`` stops the run
            naming the step and batch, ``"skip"`` leaves the batch (with truncated BPTT the chunk)
            out, None does not check (:mod:`~lightning_rnn.modules.nonfinite`). A checkpoint
            written during fit refuses weights that are not finite.

    Clipping and accumulation are the Trainer's (``gradient_clip_val``,
    ``gradient_clip_algorithm``, ``accumulate_grad_batches``): Lightning's automatic
    optimization applies them, and with ``tbptt_steps`` the truncated-BPTT loop does
    (accumulating chunks). ``train/loss`` is logged once per batch, the mean over its chunks
    weighted by :meth:`loss_weight` (under DDP over every process's rows).
    """

    #: RNNModule arguments a subclass computes or fixes itself (e.g. ``input_size`` from
    #: ``embedding_dim``): left out of the logged hyperparameters, and out of checkpoints
    #: where the subclass's own arguments are not known (:mod:`.checkpoints`).
    derived_arguments: tuple[str, ...] = ()

    def __init__(
        self,
        rnn: Callable[..., nn.Module],
        input_size: int,
        optimizer: Callable[..., torch.optim.Optimizer],
        scheduler: Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler] | None = None,
        scheduler_interval: str = "step",
        tbptt_steps: int | None = None,
        stateful: bool = False,
        nonfinite_loss: str | None = "error",
    ):
        super().__init__()
        check_choice("scheduler_interval", scheduler_interval, ("step", "epoch"))
        check_int("tbptt_steps", tbptt_steps, 1, optional=True)
        check_flag("stateful", stateful)
        check_callable("optimizer", optimizer, "a factory optimizer(params)")
        check_callable("scheduler", scheduler, "a factory scheduler(optimizer)", optional=True)
        self.save_hyperparameters()  # the subclass's too
        # What the most derived class's constructor itself was given: all its checkpoint keeps.
        self._constructor_arguments = checkpoints.outermost_init_arguments(self, inspect.currentframe())
        # Kept here too: Lightning drops a factory that cannot be pickled (a lambda) from hparams.
        self._optimizer_factory, self._scheduler_factory = optimizer, scheduler
        self.rnn = build_rnn(rnn, input_size)
        self.input_layer: nn.Module = nn.Identity()
        self.num_directions = num_directions(self.rnn)
        carries = [name for name, on in (("stateful", stateful), ("tbptt_steps", tbptt_steps)) if on]
        if self.num_directions == 2 and carries:
            raise ValueError(f"{carries[0]}: carries the state forward in time, which a bidirectional rnn's reverse "
                             "direction does not run in (use a unidirectional rnn)")
        self.rnn_output_size = rnn_output_size(self.rnn)
        self.truncated_bptt = TruncatedBPTT(tbptt_steps) if tbptt_steps is not None else None
        self.carried = CarriedState(bool(stateful))
        self.nonfinite = NonFiniteGuard(nonfinite_loss)
        epoch_metrics.add_stage_metrics(self, self.build_metrics())
        self._training_state_to_load: dict | None = None  # set by on_load_checkpoint (resuming)

    # ----- model ------------------------------------------------------------------
    def encode(self, inputs, state: State = None, lengths: torch.Tensor | None = None):
        """Input layer and rnn: ``inputs`` (B, T, ...) -> (outputs (B, T, D*H), state). With
        ``lengths`` the embedded inputs are packed, and the outputs stay packed; packed inputs
        go through the input layer row by row, so it must act on each step alone."""
        if isinstance(inputs, PackedSequence):
            x = inputs._replace(data=self.input_layer(inputs.data))
        else:
            x = self.input_layer(inputs)
        if lengths is not None and not isinstance(x, PackedSequence):
            x = pack_padded_sequence(x, check_lengths(lengths, x), batch_first=True, enforce_sorted=False)
        return self.rnn(x, state)

    def check_float_steps(self, inputs) -> None:
        """For modules whose inputs are feature vectors per step: a ValueError naming
        ``inputs`` unless they are (B, T, input_size) floats or packed. Skipped where a
        subclass replaced the identity input layer (e.g. to embed token ids)."""
        if isinstance(self.input_layer, nn.Identity):
            check_float_steps(inputs, self.hparams.input_size)

    def head(self, features):
        """Predictions from the encoder's features (the subclass's output layer)."""
        raise NotImplementedError

    def forward(self, inputs, state: State = None, lengths: torch.Tensor | None = None):
        """``(predictions, state)`` for ``inputs``, starting from ``state`` (None: zeros)."""
        if lengths is not None and not isinstance(inputs, PackedSequence):
            lengths = check_lengths(lengths, inputs)
        features, state = self.encode(inputs, state, lengths)
        return self.head(features), state

    def compute_loss(self, predictions, batch: dict) -> torch.Tensor:
        """Scalar loss of ``predictions`` (what :meth:`head` returned: a ``PackedSequence``
        for a per-step head on packed inputs) against ``batch["targets"]``."""
        raise NotImplementedError

    # ----- metrics ----------------------------------------------------------------
    def build_metrics(self) -> MetricCollection | None:
        """Torchmetrics updated with ``(predictions, targets)`` every step; None: loss only.
        Called at the end of ``RNNModule.__init__``, with every argument in ``self.hparams``."""
        return None

    def derived_metrics(self, loss: torch.Tensor) -> dict[str, torch.Tensor]:
        """Metrics that are functions of the mean loss (e.g. bits per character)."""
        return {}

    def loss_weight(self, batch: dict) -> int:
        """How many items the batch's loss averages over, for the means over chunks and
        epochs: the targets' batch x time entries ((B, T, ...) targets), their real steps
        (packed targets), else B. Override where the loss averages over something else."""
        targets = batch["targets"]
        if isinstance(targets, PackedSequence):
            return len(targets.data)
        return targets.shape[:2].numel() if targets.dim() >= 2 else len(targets)

    # ----- steps ------------------------------------------------------------------
    def shared_step(self, batch: dict, stage: str, state: State = None):
        """Forward, loss and metric updates for one batch; returns ``(loss, predictions, state)``.
        In training the loss is checked first (``nonfinite_loss``): None for one that is not
        finite and is to be skipped, which then updates no metric."""
        predictions, state = self(batch["inputs"], state, batch.get("lengths"))
        loss = self.compute_loss(predictions, batch)
        if stage == "train" and not self.nonfinite.loss_is_finite(self, loss):
            return None, predictions, state
        getattr(self, f"{stage}_mean_loss").update(loss.detach(), self.loss_weight(batch))
        metrics = getattr(self, f"{stage}_metrics")
        if metrics is not None:
            scored, targets = real_steps(predictions, batch["targets"])
            metrics.update(scored.detach(), targets)
        return loss, predictions, state

    def split_batch(self, batch: dict) -> list[dict]:
        """The batch cut along time into chunks of ``tbptt_steps``
        (:func:`~lightning_rnn.modules.batches.split_along_time`); override for batches
        whose targets are not per step."""
        return [batch] if self.truncated_bptt is None else split_along_time(batch, self.truncated_bptt.steps)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor | None:
        self.nonfinite.batch_idx = batch_idx
        state = self.carried.initial("train", batch)
        if self.truncated_bptt is None:
            loss, _, state = self.shared_step(batch, "train", state)
            if loss is None:  # skipped: its state is not carried on, its gradients are zeros
                self.carried.keep("train", None)
                self.nonfinite.log_skipped(self)
                return self.nonfinite.skipped_batch_loss(self)
            weighted_loss, weight = loss.detach() * self.loss_weight(batch), self.loss_weight(batch)
        else:
            weighted_loss, weight, state = self.truncated_bptt.training_step(self, batch, state)
        self.carried.keep("train", state)
        self.nonfinite.log_skipped(self)
        if not weight:  # max_steps reached before the batch's first chunk, or every chunk skipped
            return None
        mean = epoch_metrics.log_train_loss(self, weighted_loss, weight, sequences_in(batch))
        # automatic optimization steps with the loss; the loop already did (callbacks such
        # as Lightning's lr_find read the batch's loss from the returned value)
        return loss if self.truncated_bptt is None else mean

    def _evaluation_step(self, batch: dict, stage: str) -> None:
        _, _, state = self.shared_step(batch, stage, self.carried.initial(stage, batch))
        self.carried.keep(stage, state)

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._evaluation_step(batch, "val")

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._evaluation_step(batch, "test")

    def predict_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0):
        """``Trainer.predict``: the predictions of :meth:`forward` for ``batch["inputs"]``
        (packed by ``batch["lengths"]`` where given), each sequence from a zero state."""
        return self(batch["inputs"], lengths=batch.get("lengths"))[0]

    # ----- optimization -----------------------------------------------------------
    #: The optimizer factory's learning rate, settable (Lightning's lr_find writes its suggestion here).
    lr = factory_learning_rate

    def configure_optimizers(self):
        # trainable parameters only: a finetuning callback (BaseFinetuning) freezes some first
        return configure_optimization(self._optimizer_factory, self._scheduler_factory,
                                      [p for p in self.parameters() if p.requires_grad],
                                      self.hparams.scheduler_interval, self.automatic_optimization, self._trainer)

    def lr_scheduler_step(self, scheduler, metric) -> None:
        if not is_plateau(scheduler):  # a plateau steps after each validation (on_validation_epoch_end)
            super().lr_scheduler_step(scheduler, metric)

    def on_before_optimizer_step(self, optimizer) -> None:
        """Checks the gradients (``nonfinite_loss``); with truncated BPTT, clips as the Trainer
        says: here, after a loss scaler (fp16) has unscaled the gradients. A subclass that
        overrides this hook calls super()."""
        self.nonfinite.before_optimizer_step(self, optimizer)
        if self.truncated_bptt is not None:
            self.truncated_bptt.clip_gradients(self, optimizer)

    def on_validation_model_zero_grad(self) -> None:
        # Lightning zeroes the gradients before a validation in fit; not those of the truncated-BPTT
        # loop's unfinished accumulation, which counts chunks where Lightning counts batches.
        if self.truncated_bptt is None or not self.truncated_bptt.backwards_since_step:
            super().on_validation_model_zero_grad()

    # ----- the Trainer ------------------------------------------------------------
    def configure_callbacks(self):
        self.automatic_optimization = True  # until setup: see switch_to_manual_optimization
        return []

    def setup(self, stage: str) -> None:
        validate_trainer(self.trainer, self)
        if stage == "fit" and self.truncated_bptt is not None:
            switch_to_manual_optimization(self)

    def on_fit_start(self) -> None:  # and at each validation and test: after the Trainer cast the model
        epoch_metrics.metrics_like_parameters(self)

    on_validation_start = on_test_start = on_fit_start

    def on_train_start(self) -> None:
        # once the strategy has moved and cast the parameters; a fit that resumes nothing starts afresh
        state, self._training_state_to_load = self._training_state_to_load or {}, None
        if self.truncated_bptt is not None:
            self.truncated_bptt.load_state_dict(self, state)
        self.carried.load_state_dict(state, self.trainer.world_size, self.device)
        self.carried.check_loader(self.trainer.train_dataloader)

    def on_train_epoch_start(self) -> None:
        self.carried.reset("train")

    def on_train_epoch_end(self) -> None:
        epoch_metrics.log_epoch(self, "train")

    def on_validation_epoch_start(self) -> None:
        self.carried.reset("val")

    def on_validation_epoch_end(self) -> None:
        epoch_metrics.log_epoch(self, "val")
        step_plateaus(self.trainer)

    def on_train_end(self) -> None:
        warn_unstepped_plateaus(self.trainer)

    def on_test_epoch_start(self) -> None:
        self.carried.reset("test")

    def on_test_epoch_end(self) -> None:
        epoch_metrics.log_epoch(self, "test")

    # ----- checkpoints ------------------------------------------------------------
    @property
    def hparams_initial(self):
        """The hyperparameters Lightning logs at the start of fit, factories as their plain
        description; ``hparams`` keeps the factories themselves."""
        return checkpoints.loggable_hyperparameters(super().hparams_initial, self.derived_arguments)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoints.save_hyperparameters(checkpoint, self, self._constructor_arguments)
        trainer = self._trainer
        if trainer is not None and trainer.state.fn == "fit":
            check_weights_finite(self)  # raises before anything is written
            state = {**(self.truncated_bptt.state_dict(self) if self.truncated_bptt else {}),
                     **self.carried.state_dict(trainer)}
            if state:
                checkpoint[checkpoints.TRAINING_STATE_KEY] = state

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        # Trainer.fit(ckpt_path=...) only: put back at on_train_start
        trainer = self._trainer
        resuming = trainer is not None and trainer.state.fn == "fit"
        self._training_state_to_load = checkpoint.get(checkpoints.TRAINING_STATE_KEY) if resuming else None

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path, map_location=None, hparams_file=None, strict=None,
                             weights_only: bool | None = None, **kwargs):
        """Lightning's ``load_from_checkpoint``, with the checkpoint's factories rebuilt from
        their plain descriptions, so that torch's ``weights_only`` loader reads it (see
        :func:`~lightning_rnn.modules.checkpoints.load_arguments`). Arguments in ``kwargs``
        override the checkpoint's, as in Lightning."""
        load = super().load_from_checkpoint
        checkpoint, kwargs = checkpoints.load_arguments(load, checkpoint_path, weights_only, kwargs)
        return load(checkpoint, map_location=map_location, hparams_file=hparams_file, strict=strict, **kwargs)
