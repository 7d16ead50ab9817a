"""Truncated backpropagation through time: the optimization loop of a module with ``tbptt_steps``.

Lightning 2 has no truncated BPTT, and its automatic optimization takes one optimizer step per
batch (or per ``accumulate_grad_batches`` batches). Truncated BPTT takes one per chunk of a
batch, so a module with ``tbptt_steps`` optimizes manually, with this loop; every other module
uses Lightning's automatic optimization. The loop applies the Trainer's settings as Lightning
would: ``gradient_clip_val`` / ``gradient_clip_algorithm`` before each step (through the
module's ``configure_gradient_clipping``) and ``accumulate_grad_batches``, counted in chunks.
"""
from __future__ import annotations

import torch
from lightning.pytorch.callbacks import GradientAccumulationScheduler

from .state import State, detach_state


def reject_tbptt(tbptt_steps, reason: str) -> None:
    """A ValueError for a module whose targets are not per step (``reason`` says why)."""
    if tbptt_steps is not None:
        raise ValueError(
            f"tbptt_steps: {reason}, and truncated BPTT needs a target for every step of every chunk "
            f"(got tbptt_steps={tbptt_steps!r}); leave it None, or subclass and override split_batch"
        )


class TruncatedBPTT:
    """Each training batch is cut along time into chunks (``module.split_batch``), which run
    in order, each starting from the detached final state of the one before; every
    ``Trainer(accumulate_grad_batches)`` backward passes (chunks) take an optimizer step, and
    the last batch of an epoch steps whatever it accumulated, then the epoch's schedulers.

    Lightning's ``global_step`` counts optimizer steps (one per chunk), so ``max_steps`` may
    stop a run inside a batch; ``val_check_interval`` counts batches, and the loggers' step
    (``log_every_n_steps``) batches per ``accumulate_grad_batches``, as Lightning counts them.

    Args:
        steps: time steps per chunk (``tbptt_steps``).
    """

    def __init__(self, steps: int):
        self.steps = steps
        self.backwards_since_step = 0

    def training_step(self, module, batch: dict, state: State) -> tuple[torch.Tensor | float, int, State]:
        """Run ``batch`` from ``state``; returns the sum of its chunks' losses, each times its
        :meth:`loss_weight` (detached), the sum of those weights, and the final state."""
        trainer = module.trainer
        accumulate = trainer.accumulate_grad_batches
        weighted_loss, weight = 0.0, 0
        for chunk in module.split_batch(batch):
            if 0 <= trainer.max_steps <= trainer.global_step:  # Lightning checks max_steps between batches only
                break
            loss, _, state = module.shared_step(chunk, "train", state)
            if loss is None:  # nonfinite_loss="skip": no backward, the next chunk starts from zeros
                state = None
                continue
            chunk_weight = module.loss_weight(chunk)
            weighted_loss, weight = weighted_loss + loss.detach() * chunk_weight, weight + chunk_weight
            module.manual_backward(loss / accumulate)
            state = detach_state(state)
            self.backwards_since_step += 1
            if self.backwards_since_step >= accumulate:
                self._optimizer_step(module)
        if trainer.is_last_batch:
            if self.backwards_since_step:
                self._optimizer_step(module)
            self.step_schedulers(module, "epoch")
        return weighted_loss, weight, state

    def _optimizer_step(self, module) -> None:
        optimizer = module.optimizers()
        optimizer.step()  # clips in the module's on_before_optimizer_step (after fp16 unscaling)
        optimizer.zero_grad(set_to_none=True)
        self.backwards_since_step = 0
        self.step_schedulers(module, "step")

    @staticmethod
    def clip_gradients(module, optimizer) -> None:
        """Clip as the Trainer says, through the hook Lightning calls in automatic optimization."""
        trainer = module.trainer
        module.configure_gradient_clipping(optimizer, trainer.gradient_clip_val, trainer.gradient_clip_algorithm)

    @staticmethod
    def step_schedulers(module, interval: str) -> None:
        """Step the schedulers of ``interval`` ("step" or "epoch") through ``lr_scheduler_step``."""
        for config in module.trainer.lr_scheduler_configs:
            if config.interval == interval:
                module.lr_scheduler_step(config.scheduler, None)

    def state_dict(self, module) -> dict:
        """The gradients of an accumulation cycle in progress (a checkpoint written between
        two of its chunks), which Lightning does not save; empty between cycles."""
        if not self.backwards_since_step:
            return {}
        gradients = {name: p.grad.detach().clone() for name, p in module.named_parameters() if p.grad is not None}
        return {"backwards_since_step": self.backwards_since_step, "gradients": gradients}

    def load_state_dict(self, module, state: dict) -> None:
        """Put back :meth:`state_dict`'s cycle; ``{}`` starts from no gradients (a fit that
        resumes nothing must not step with an unfinished earlier fit's gradients)."""
        gradients = state.get("gradients", {})
        for name, p in module.named_parameters():
            p.grad = gradients[name].to(p) if name in gradients else None
        self.backwards_since_step = int(state.get("backwards_since_step", 0))


def validate_trainer(trainer, module) -> None:
    """The Trainer's settings checked against ``module``'s once per fit, from its ``setup``:
    a ValueError naming a setting the truncated-BPTT loop cannot apply. (Clipping and
    accumulation are the Trainer's; with automatic optimization Lightning applies them.)"""
    if trainer.state.fn != "fit" or getattr(module, "truncated_bptt", None) is None:
        return
    if any(isinstance(c, GradientAccumulationScheduler) for c in trainer.callbacks):
        raise ValueError(
            f"GradientAccumulationScheduler: with tbptt_steps, {type(module).__name__} optimizes manually and "
            "accumulates Trainer(accumulate_grad_batches=N) chunks, one value for the run; remove the callback"
        )
    if trainer.accumulate_grad_batches > 1 and trainer.strategy.handles_gradient_accumulation:
        raise ValueError(
            f"accumulate_grad_batches: the {type(trainer.strategy).__name__} strategy accumulates gradients "
            "itself, which the truncated-BPTT loop cannot drive; use accumulate_grad_batches=1"
        )
