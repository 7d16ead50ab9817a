"""What a module does with a training loss or gradient that is not finite (``nonfinite_loss``).

A NaN or an infinity in a loss spreads to every weight at the next optimizer step, and from
there into every checkpoint written afterwards: a ``ModelCheckpoint(save_last=True)`` would
write the broken weights over the last good ``last.ckpt``. Lightning's own tools act later or
elsewhere: ``Trainer(detect_anomaly=True)`` runs torch's anomaly mode (it names the backward op
that made a NaN, at several times the cost of a step), and ``EarlyStopping(check_finite=True)``
looks at its monitored metric only when that is logged (after a validation), stopping the run
gracefully, so the checkpoint callbacks still save that validation's weights. The module checks
every training step before its optimizer step instead:

- ``"error"``: stop the run with a :class:`NonFiniteLossError` that names the global step, the
  epoch and the batch; the weights, and so the checkpoints, are those of the last good step;
- ``"skip"``: leave the batch out (its gradients are zeros, no optimizer step changes a weight
  for it, its loss is not in ``train/loss``) or, with truncated BPTT, the chunk (no backward;
  its state is not carried on), and count it in ``train/skipped_steps``;
- ``None``: no check (one host read of the loss per step less, on a GPU a synchronization).

Gradients are checked before each optimizer step too (a finite loss can still overflow in the
backward), except while a loss scaler runs (fp16 mixed precision), which skips such steps
itself. Under DDP the processes agree first (one collective per step): one process's bad loss
stops or skips the step on all of them, which a collective they would otherwise wait in needs.
Whatever the setting, a checkpoint written during fit refuses weights that are not finite.
"""
from __future__ import annotations

import torch

from ..utils.checks import check_choice

ACTIONS = ("error", "skip")


class NonFiniteLossError(ValueError):
    """A training loss, gradient or weight that is not finite (see :mod:`.nonfinite`)."""


def check_action(value: str | None) -> str | None:
    return None if value is None else check_choice("nonfinite_loss", value, ACTIONS)


def _any_process(trainer, bad: bool) -> bool:
    """Whether ``bad`` holds on any process (every process calls this at the same point)."""
    if trainer.world_size > 1:
        return bool(trainer.strategy.reduce_boolean_decision(bad, all=False))
    return bad


def _where(trainer, batch_idx: int | None) -> str:
    batch = "" if batch_idx is None else f", batch {batch_idx}"
    return f"global step {trainer.global_step} (epoch {trainer.current_epoch}{batch})"


class NonFiniteGuard:
    """The checks of one module; ``action`` is ``"error"``, ``"skip"`` or None (off)."""

    def __init__(self, action: str | None):
        self.action = check_action(action)
        self.batch_idx: int | None = None  # the training batch in progress (for the error message)
        self.skipped = 0  # batches (chunks, with truncated BPTT) left out since the fit started
        # since the last optimizer step: a batch (chunk) learned from, one skipped
        self._learned = self._skipped_since_step = False

    def loss_is_finite(self, module, loss: torch.Tensor) -> bool:
        """True to go on with ``loss``; False to skip it (``"skip"``); raises (``"error"``)."""
        if self.action is None:
            return True
        trainer = module.trainer
        bad_here = not bool(torch.isfinite(loss.detach()).all())
        if not _any_process(trainer, bad_here):
            self._learned = True
            return True
        if self.action == "error":
            value = (f"{float(loss):g}" if loss.numel() == 1 else "not finite") if bad_here \
                else "finite here but not on another process"
            raise NonFiniteLossError(
                f"nonfinite_loss: the training loss is {value} at {_where(trainer, self.batch_idx)}; the run stops "
                "before its optimizer step, so the weights and checkpoints are those of the step before. Lower the "
                "learning rate, clip gradients (trainer.gradient_clip_val), or set nonfinite_loss=skip"
            )
        self.skipped += 1
        self._skipped_since_step = True
        return False

    @staticmethod
    def skipped_batch_loss(module) -> torch.Tensor:
        """What automatic optimization backpropagates for a skipped batch: zero, with a zero
        gradient for every trainable weight. Lightning refuses a training step that returns None
        under DDP, whose gradient averaging expects every weight's gradient from each process."""
        params = [p for p in module.parameters() if p.requires_grad]
        return torch.stack([p.sum() for p in params]).sum() * 0.0

    def log_skipped(self, module) -> None:
        if self.action == "skip":
            module.log("train/skipped_steps", float(self.skipped), batch_size=1)

    def before_optimizer_step(self, module, optimizer) -> None:
        """Drops the gradients where every batch since the last step was skipped (a step on
        zero gradients would still move the weights by an optimizer's momentum); then checks
        them: a gradient that is not finite raises (``"error"``) or is dropped (``"skip"``),
        so the step changes nothing. Not checked while a loss scaler (fp16) runs: it skips
        such steps itself."""
        all_skipped = self._skipped_since_step and not self._learned
        self._learned = self._skipped_since_step = False
        if self.action is None:
            return
        trainer = module.trainer
        if all_skipped:
            _drop_gradients(optimizer)
            return
        if getattr(trainer.precision_plugin, "scaler", None) is not None:
            return
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        finite = bool(torch.stack([torch.isfinite(g).all() for g in grads]).all()) if grads else True
        if not _any_process(trainer, not finite):
            return
        if self.action == "error":
            raise NonFiniteLossError(
                f"nonfinite_loss: the gradients are not finite at {_where(trainer, self.batch_idx)} (the loss was "
                "finite: the backward overflowed); the run stops before the optimizer step, so the weights and "
                "checkpoints are those of the step before. Lower the learning rate, clip gradients "
                "(trainer.gradient_clip_val), or set nonfinite_loss=skip"
            )
        _drop_gradients(optimizer)
        self.skipped += 1


def _drop_gradients(optimizer) -> None:
    """No gradient for any of ``optimizer``'s weights: its next step leaves them (and its state) as they are."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad = None


def check_weights_finite(module) -> None:
    """A NonFiniteLossError naming the first parameter that is not finite: raised while a
    checkpoint is written, before anything reaches the file."""
    for name, p in module.named_parameters():
        if not bool(torch.isfinite(p.detach()).all()):
            trainer = module.trainer
            raise NonFiniteLossError(
                f"nonfinite_loss: not saving a checkpoint at {_where(trainer, None)}: the weight {name} is not "
                "finite (the checkpoints already written are left as they are)"
            )
