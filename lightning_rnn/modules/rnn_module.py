"""RNNModule: the LightningModule every recurrent model here derives from."""
from __future__ import annotations

import functools
import inspect
import numbers
import warnings
from typing import Callable

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.callbacks import GradientAccumulationScheduler
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence
from torch.utils.data import DistributedSampler, RandomSampler
from torchmetrics import MeanMetric, Metric, MetricCollection

from ..data.streams import trainer_batches_done
from ..utils.checks import check_flag
from . import factories
from .packing import pack_like
from .state import State, detach_state, state_batch_size

STAGES = ("train", "val", "test")


def build_rnn(rnn: Callable[..., nn.Module], input_size: int) -> nn.Module:
    """Call the factory ``rnn(input_size=input_size, batch_first=True)``."""
    if isinstance(rnn, nn.Module) or not callable(rnn):
        raise TypeError(
            "rnn: expected a factory called as rnn(input_size=..., batch_first=True), such as "
            f"functools.partial(FusedLSTM, hidden_size=128) or a Hydra `_partial_: true` config; got {rnn!r}"
        )
    module = rnn(input_size=input_size, batch_first=True)
    if not isinstance(module, nn.Module):
        raise TypeError(f"rnn: the factory returned {type(module).__name__}, expected a torch.nn.Module")
    return module


def _outermost_init_arguments(module: nn.Module, frame) -> set[str] | None:
    """Names of the arguments ``type(module).__init__`` received (its **kwargs expanded),
    found by walking up the chain of ``super().__init__`` calls from ``frame``; None when the
    chain does not reach the class itself (e.g. a base ``__init__`` called without super())
    or when it received values through ``*args`` (forwarded to a base, under names only the
    base's signature gives: then every hyperparameter is kept)."""
    found = None
    while frame is not None and frame.f_code.co_name == "__init__":
        local_vars = frame.f_locals
        cls = local_vars.get("__class__")
        params = inspect.signature(cls.__init__).parameters if cls is not None else None
        if params is None or local_vars.get(next(iter(params))) is not module:
            break
        names = set()
        for name, param in params.items():
            if param.kind is inspect.Parameter.VAR_KEYWORD:
                names.update(local_vars.get(name) or {})
            elif param.kind is not inspect.Parameter.VAR_POSITIONAL:
                names.add(name)
            elif local_vars.get(name):
                names = None
                break
        found = (cls, None if names is None else names - {next(iter(params))})
        frame = frame.f_back
    return found[1] if found is not None and found[0] is type(module) else None


def check_lengths(lengths, padded: torch.Tensor) -> torch.Tensor:
    """``lengths`` (a tensor, list or tuple of B ints in [1, T]) as a CPU int64 tensor, for
    the (B, T, ...) batch ``padded``; a ValueError naming ``lengths`` otherwise."""
    lengths = torch.as_tensor(lengths, device="cpu") if not isinstance(lengths, torch.Tensor) else lengths.cpu()
    if lengths.dim() != 1 or lengths.is_floating_point() or lengths.is_complex():
        raise ValueError(f"lengths: expected B integer lengths, got {lengths.dtype} of shape {tuple(lengths.shape)}")
    B, T = padded.shape[:2]
    if len(lengths) != B:
        raise ValueError(f"lengths: expected one length per sequence ({B}), got {len(lengths)}")
    if len(lengths) and (lengths.min() < 1 or lengths.max() > T):
        raise ValueError(f"lengths: expected lengths in [1, {T}] (the inputs' steps, dim 1), "
                         f"got {lengths.min().item()}..{lengths.max().item()}")
    return lengths.long()


def real_steps(predictions, targets):
    """``(predictions, targets)`` as a metric takes them: packed per-step predictions as
    their rows (``.data``) and the targets packed alike (padded (B, T, ...) ones by
    :func:`~lightning_rnn.modules.pack_like`), so padding is never scored; others as they are."""
    if not isinstance(predictions, PackedSequence):
        return predictions, targets
    targets = targets if isinstance(targets, PackedSequence) else pack_like(targets, predictions)
    return predictions.data, targets.data


def sequences_in(batch: dict) -> int:
    """Sequences in ``batch``: its ``lengths``' count where given (packed targets have one
    row per real step, not per sequence), else the targets' first dimension."""
    return len(batch["lengths"]) if "lengths" in batch else len(batch["targets"])


def reject_tbptt(tbptt_steps, reason: str) -> None:
    """A ValueError for a module whose targets are not per step (``reason`` says why)."""
    if tbptt_steps is not None:
        raise ValueError(
            f"tbptt_steps: {reason}, and truncated BPTT needs a target for every step of every chunk "
            f"(got tbptt_steps={tbptt_steps!r}); leave it None, or subclass and override split_batch"
        )


def rnn_output_size(rnn: nn.Module) -> int:
    """Features per step of ``rnn``'s output: ``hidden_size`` (or ``proj_size``) x directions."""
    hidden = getattr(rnn, "proj_size", 0) or getattr(rnn, "hidden_size", None)
    if not isinstance(hidden, int):
        raise TypeError(f"rnn: {type(rnn).__name__} has no int attribute `hidden_size`; the head needs it")
    return hidden * (2 if getattr(rnn, "bidirectional", False) else 1)


class RNNModule(LightningModule):
    """Base LightningModule for recurrent models: input layer -> ``rnn`` -> head.

    Batches are dicts: ``inputs`` (B, T, ...), ``targets`` and optionally ``lengths`` (B,)
    for padded variable-length inputs (packed before the ``rnn``). ``inputs`` may also
    arrive already packed (a ``PackedSequence``), e.g. from a callback. Packed inputs give
    packed features: a per-step head (one through ``TemporalAdapter``) then predicts a
    ``PackedSequence``, which :meth:`compute_loss` receives as it is (align the padded
    targets with :func:`~lightning_rnn.modules.pack_like`) and the metrics receive as its
    real steps' rows, with the targets of those steps.

    Extension points, top to bottom (override any of them in a subclass):

    - :meth:`encode` ``(inputs, state, lengths) -> (features, state)``: input layer and rnn;
    - :meth:`head` ``(features) -> predictions``;
    - :meth:`compute_loss` ``(predictions, batch) -> loss`` (a scalar, mean over targets);
    - :meth:`loss_weight` ``(batch) -> int``: how many targets that mean is over;
    - :meth:`build_metrics` and :meth:`derived_metrics`: what is logged besides the loss;
    - :meth:`shared_step` ``(batch, stage, state) -> (loss, predictions, state)``;
    - :meth:`split_batch`: how a batch is cut along time for truncated BPTT.

    Args:
        rnn: factory of the recurrent encoder, called as ``rnn(input_size=input_size,
            batch_first=True)`` (e.g. ``functools.partial(FusedLSTM, hidden_size=128)``).
        input_size: features per step that reach the rnn (after the input layer).
        optimizer: factory ``optimizer(params)``, e.g. ``functools.partial(torch.optim.Adam, lr=2e-3)``.
        scheduler: optional factory ``scheduler(optimizer)``.
        scheduler_interval: ``"step"`` (every optimizer step) or ``"epoch"``. A
            ``ReduceLROnPlateau`` steps after each validation in fit instead, with ``val/loss``.
        tbptt_steps: truncated BPTT: cut each batch into chunks of this many steps, carry
            the detached state from chunk to chunk and take one optimizer step per chunk.
        stateful: carry the (detached) state from one batch to the next, reset at the
            start of every epoch (torch-rnn's remember_states). Needs batches whose rows
            continue one another, as :class:`~lightning_rnn.data.ContiguousStreams` gives.
            A batch of another size than the last (a short final batch) starts from zeros.
            A checkpoint written mid-epoch holds the carried state, and a run resumed from it
            continues with it (one process; under DDP it starts from zeros, as a checkpoint
            holds rank 0's rows only).
        grad_clip: clip gradients to this norm (or value) before each step; None: off.
        grad_clip_algorithm: ``"norm"`` or ``"value"``.
        accumulate_grad_batches: optimizer step every this many backward passes (chunks).
            A checkpoint written within a cycle (between the chunks of a batch) holds its
            gradients so far, and a run resumed from it completes that cycle.

    Optimization is manual (Lightning 2 has no TBPTT), so set clipping and accumulation
    here, not on the Trainer (``Trainer(gradient_clip_val=...)`` or
    ``accumulate_grad_batches=...`` is an error naming the module's argument); precision,
    strategies and callbacks work as usual. With ``tbptt_steps``, Lightning's
    ``global_step`` (so ``max_steps`` and ``ModelCheckpoint(every_n_train_steps=...)``)
    counts optimizer steps, one per chunk, while ``log_every_n_steps`` and
    ``val_check_interval`` count batches; ``every_n_train_steps`` is checked once per
    batch, so give it a multiple of the chunks per batch. ``train/loss`` is logged once per
    batch: the mean over its chunks, weighted by :meth:`loss_weight` (under DDP, over every
    process's rows: the global batch's loss).
    """

    #: RNNModule arguments a subclass computes or fixes itself (e.g. ``input_size`` from
    #: ``embedding_dim``, a pooling); left out of the logged hyperparameters
    #: (``hparams_initial``). ``hparams`` keeps them, as the modules read them there.
    #: (Checkpoints keep only what the subclass's own constructor received, see
    #: on_save_checkpoint; these are left out too where that is not known.)
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
        grad_clip: float | None = None,
        grad_clip_algorithm: str = "norm",
        accumulate_grad_batches: int = 1,
    ):
        super().__init__()
        if scheduler_interval not in ("step", "epoch"):
            raise ValueError(f"scheduler_interval: expected 'step' or 'epoch', got {scheduler_interval!r}")
        if tbptt_steps is not None and (isinstance(tbptt_steps, bool) or not isinstance(tbptt_steps, int)
                                        or tbptt_steps < 1):
            raise ValueError(f"tbptt_steps: expected None or an int >= 1, got {tbptt_steps!r}")
        check_flag("stateful", stateful)
        if grad_clip is not None and (isinstance(grad_clip, bool) or not isinstance(grad_clip, numbers.Real)
                                      or not grad_clip > 0):
            raise ValueError(f"grad_clip: expected None or a number > 0, got {grad_clip!r}")
        if grad_clip_algorithm not in ("norm", "value"):
            raise ValueError(f"grad_clip_algorithm: expected 'norm' or 'value', got {grad_clip_algorithm!r}")
        if isinstance(accumulate_grad_batches, bool) or not isinstance(accumulate_grad_batches, int) \
                or accumulate_grad_batches < 1:
            raise ValueError(f"accumulate_grad_batches: expected an int >= 1, got {accumulate_grad_batches!r}")
        if not callable(optimizer):
            raise TypeError(f"optimizer: expected a factory optimizer(params), got {optimizer!r}")
        if scheduler is not None and not callable(scheduler):
            raise TypeError(f"scheduler: expected None or a factory scheduler(optimizer), got {scheduler!r}")
        self.save_hyperparameters()  # the subclass's too
        # What the most derived class's constructor itself was given: the checkpoint keeps only
        # these, so load_from_checkpoint calls it as the user did (see on_save_checkpoint).
        self._constructor_arguments = _outermost_init_arguments(self, inspect.currentframe())
        # Kept here too: Lightning drops a factory that cannot be pickled (a lambda) from hparams.
        self._optimizer_factory, self._scheduler_factory = optimizer, scheduler
        self.automatic_optimization = False
        self.rnn = build_rnn(rnn, input_size)
        self.input_layer: nn.Module = nn.Identity()
        self.num_directions = 2 if getattr(self.rnn, "bidirectional", False) else 1
        carries = [name for name, on in (("stateful", stateful), ("tbptt_steps", tbptt_steps)) if on]
        if self.num_directions == 2 and carries:
            raise ValueError(f"{carries[0]}: carries the state forward in time, which a bidirectional rnn's reverse "
                             "direction does not run in (use a unidirectional rnn)")
        self.rnn_output_size = rnn_output_size(self.rnn)
        collection = self.build_metrics()
        for stage in STAGES:  # attributes train_mean_loss, val_metrics, ...
            setattr(self, f"{stage}_mean_loss", MeanMetric())
            setattr(self, f"{stage}_metrics", collection.clone(prefix=f"{stage}/") if collection is not None else None)
        self._carried: dict[str, State] = {}
        self._backwards_since_step = 0
        self._epoch_ending: int | None = None  # the epoch whose end has not run yet
        self._training_state_to_load: dict | None = None  # set by on_load_checkpoint (resuming)

    # ----- model ------------------------------------------------------------------
    def encode(self, inputs, state: State = None, lengths: torch.Tensor | None = None):
        """Input layer and rnn: ``inputs`` (B, T, ...) -> (outputs (B, T, D*H), state).

        With ``lengths`` the embedded inputs are packed, and the outputs stay packed.
        Already packed ``inputs`` go through the input layer row by row (its ``data``), so
        it must act on each step alone (an embedding, a linear map), as it does here.
        """
        if isinstance(inputs, PackedSequence):  # packed by a callback: the input layer maps the rows
            x = inputs._replace(data=self.input_layer(inputs.data))
        else:
            x = self.input_layer(inputs)
        if lengths is not None and not isinstance(x, PackedSequence):
            lengths = check_lengths(lengths, x)
            x = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        return self.rnn(x, state)

    def check_float_steps(self, inputs) -> None:
        """For modules whose inputs are feature vectors per step: a ValueError naming
        ``inputs`` unless they are (B, T, input_size) floats or packed. Skipped where a
        subclass replaced the identity input layer (e.g. to embed token ids)."""
        if not isinstance(self.input_layer, nn.Identity) or isinstance(inputs, PackedSequence):
            return
        if not isinstance(inputs, torch.Tensor) or inputs.dim() != 3 or not inputs.is_floating_point():
            described = f"{inputs.dtype} of shape {tuple(inputs.shape)}" if isinstance(inputs, torch.Tensor) \
                else type(inputs).__name__
            raise ValueError(f"inputs: expected floats of shape (B, T, {self.hparams.input_size}) or a "
                             f"PackedSequence, got {described}")

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
        """Scalar loss of ``predictions`` against ``batch["targets"]``.

        ``predictions`` are what :meth:`head` returned: a ``PackedSequence`` for a per-step
        head on packed inputs (a batch with ``lengths``), whose padded targets
        ``pack_like(batch["targets"], predictions)`` packs alike
        (:func:`~lightning_rnn.modules.pack_like`)."""
        raise NotImplementedError

    # ----- metrics ----------------------------------------------------------------
    def build_metrics(self) -> MetricCollection | None:
        """Torchmetrics updated with ``(predictions, targets)`` every step; None: loss only.

        Called once, at the end of ``RNNModule.__init__``; ``self.hparams``
        then holds every constructor argument, the subclass's included.
        """
        return None

    def derived_metrics(self, loss: torch.Tensor) -> dict[str, torch.Tensor]:
        """Metrics that are functions of the mean loss (e.g. bits per character)."""
        return {}

    def loss_weight(self, batch: dict) -> int:
        """How many items the batch's loss averages over, for the means over chunks and
        epochs: the targets' batch x time entries ((B, T, ...) targets), their real steps
        (packed targets, e.g. ``PackedSequences(pack_keys=["inputs", "targets"])``), else B.
        Override where the loss averages over something else (the real tokens of padded
        targets: ``int(batch["lengths"].sum())``)."""
        targets = batch["targets"]
        if isinstance(targets, PackedSequence):
            return len(targets.data)
        return targets.shape[:2].numel() if targets.dim() >= 2 else len(targets)

    # ----- steps ------------------------------------------------------------------
    def shared_step(self, batch: dict, stage: str, state: State = None):
        """Forward, loss and metric updates for one batch; returns ``(loss, predictions, state)``."""
        predictions, state = self(batch["inputs"], state, batch.get("lengths"))
        loss = self.compute_loss(predictions, batch)
        getattr(self, f"{stage}_mean_loss").update(loss.detach(), self.loss_weight(batch))
        metrics = getattr(self, f"{stage}_metrics")
        if metrics is not None:
            scored, targets = real_steps(predictions, batch["targets"])
            metrics.update(scored.detach(), targets)
        return loss, predictions, state

    def split_batch(self, batch: dict) -> list[dict]:
        """The batch cut along time into chunks of ``tbptt_steps`` (one chunk without TBPTT).

        Every tensor with a time dimension (dim >= 2) is cut along dim 1; all must have
        the same length. Override for batches whose targets are not per step.
        """
        steps = self.hparams.tbptt_steps
        if steps is None:
            return [batch]
        if "lengths" in batch or isinstance(batch["inputs"], PackedSequence):
            raise ValueError("tbptt_steps: truncated BPTT needs equal-length batches, got variable lengths")
        timed = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor) and v.dim() >= 2}
        lengths = {k: v.shape[1] for k, v in timed.items()}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"tbptt_steps: batch tensors differ in length along time (dim 1): {lengths}; "
                             "override split_batch for this kind of batch")
        pieces = {k: v.split(steps, dim=1) for k, v in timed.items()}
        num_chunks = len(next(iter(pieces.values())))
        return [{**batch, **{k: p[i] for k, p in pieces.items()}} for i in range(num_chunks)]

    def _initial_state(self, stage: str, batch: dict) -> State:
        """The state carried from the previous batch of ``stage`` (stateful), else None."""
        state = self._carried.get(stage) if self.hparams.stateful else None
        return state if state_batch_size(state) == sequences_in(batch) else None

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor | None:
        state = self._initial_state("train", batch)
        weighted_loss, weight = 0.0, 0
        for chunk in self.split_batch(batch):
            if self._max_steps_reached():  # Lightning checks max_steps only between batches
                break
            loss, _, state = self.shared_step(chunk, "train", state)
            chunk_weight = self.loss_weight(chunk)
            weighted_loss, weight = weighted_loss + loss.detach() * chunk_weight, weight + chunk_weight
            self.manual_backward(loss / self.hparams.accumulate_grad_batches)
            state = detach_state(state)
            self._backwards_since_step += 1
            if self._backwards_since_step == self.hparams.accumulate_grad_batches:
                self._optimizer_step()
        if self._backwards_since_step and self.trainer.is_last_batch:  # leftover accumulation
            self._optimizer_step()
        self._carried["train"] = state
        if not weight:
            return None
        # the batch's loss: its chunks' mean, weighted as the epoch mean weighs them; returned
        # (detached) for callbacks that read a step's output, such as Lightning's lr_find.
        # Under DDP the mean over every process's rows (the global batch's loss), before the
        # derived metrics are computed from it: each process alone holds only its shard's.
        if self.trainer.world_size > 1:
            totals = torch.stack([weighted_loss, torch.tensor(weight).to(weighted_loss)])
            weighted_loss, weight = self.trainer.strategy.reduce(totals, reduce_op="sum").unbind()
        loss = weighted_loss / weight
        self.log("train/loss", loss, prog_bar=True, batch_size=sequences_in(batch))
        self.log_dict({f"train/{k}": v for k, v in self.derived_metrics(loss).items()},
                      batch_size=sequences_in(batch))
        return loss

    def _evaluation_step(self, batch: dict, stage: str) -> None:
        _, _, state = self.shared_step(batch, stage, self._initial_state(stage, batch))
        self._carried[stage] = state

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._evaluation_step(batch, "val")

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._evaluation_step(batch, "test")

    def predict_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0):
        """``Trainer.predict``: the predictions of :meth:`forward` for ``batch["inputs"]``
        (packed by ``batch["lengths"]`` where given), each sequence from a zero state."""
        return self(batch["inputs"], lengths=batch.get("lengths"))[0]

    def configure_callbacks(self):
        """No callbacks; checks the Trainer's flags first (the earliest hook Lightning calls,
        before it refuses those it cannot apply to manual optimization, with advice to
        switch to automatic optimization, which this module cannot do)."""
        if self.trainer.state.fn != "fit":  # validate/test/predict: the flags are unused
            return []
        clip, accumulate = self.trainer.gradient_clip_val, self.trainer.accumulate_grad_batches
        refused = {"gradient_clip_val": ("grad_clip", clip, clip is not None and clip > 0),
                   "accumulate_grad_batches": ("accumulate_grad_batches", accumulate, accumulate != 1)}
        for flag, (argument, value, set_) in refused.items():
            if set_:
                raise ValueError(
                    f"Trainer({flag}={value!r}): {type(self).__name__} optimizes manually (truncated BPTT, "
                    f"stateful training), so Lightning cannot apply it; pass {argument}={value!r} to the "
                    f"module instead (model.{argument}={value!r} on the command line; Trainer({flag}) unset)"
                )
        if any(isinstance(c, GradientAccumulationScheduler) for c in self.trainer.callbacks):
            raise ValueError(
                f"GradientAccumulationScheduler: {type(self).__name__} optimizes manually (truncated BPTT, "
                "stateful training), so Lightning cannot apply it; set the module's accumulate_grad_batches= "
                "instead (one value for the run)"
            )
        return []

    @property
    def hparams_initial(self):
        """The hyperparameters Lightning logs at the start of fit: factories as their plain
        description (``rnn: {_target_: ...FusedLSTM, hidden_size: 128, ...}``), not as
        objects a logger cannot write. ``hparams`` keeps the factories themselves."""
        logged = super().hparams_initial
        for name in self.derived_arguments:
            logged.pop(name, None)
        for name, value in logged.items():
            if not factories.is_plain(value):
                try:
                    logged[name] = factories.describe(value)
                except factories.NotDescribable:
                    pass
        return logged

    # ----- checkpoints ------------------------------------------------------------
    #: Checkpoint key listing the hyperparameters saved as factory descriptions.
    FACTORIES_KEY = "lightning_rnn_factories"

    #: Checkpoint key of what a run resumed mid-epoch needs besides Lightning's own state.
    TRAINING_STATE_KEY = "lightning_rnn_training_state"

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # The class, so that a task can restore a checkpoint without being told its model.
        checkpoint["lightning_rnn_class"] = f"{type(self).__module__}.{type(self).__qualname__}"
        training_state = self._training_state()
        if training_state:
            checkpoint[self.TRAINING_STATE_KEY] = training_state
        hparams = checkpoint.get("hyper_parameters")
        if hparams is None:
            return
        # Only the arguments the class itself takes: a value a subclass computes and passes
        # to its base (input_size from its own sizes, a fixed pooling, ...) is computed again
        # on loading, and passing it too would give "multiple values for argument".
        # Keys starting with "_" are Lightning's own (LightningCLI's "_instantiator" and
        # "_class_path", which load_from_checkpoint needs to rebuild class_path arguments).
        if self._constructor_arguments is not None:
            hparams = {k: v for k, v in hparams.items() if k in self._constructor_arguments or k.startswith("_")}
        else:
            hparams = {k: v for k, v in hparams.items() if k not in self.derived_arguments}
        # Factories as plain data, so that torch's weights_only loader (which Lightning's
        # fit/validate/test/predict(ckpt_path=...) use) reads the checkpoint.
        described = []
        for name, value in list(hparams.items()):
            if factories.is_plain(value):
                continue
            try:
                hparams[name] = factories.describe(value)
            except factories.NotDescribable:
                continue  # kept as the object: this checkpoint then needs weights_only=False
            described.append(name)
        checkpoint["hyper_parameters"] = hparams
        checkpoint[self.FACTORIES_KEY] = described

    def _training_state(self) -> dict:
        """What the optimization carries from one batch to the next and Lightning does not save:
        the gradients of an accumulation cycle in progress (a checkpoint written between two
        of its backward passes, e.g. between the chunks of a truncated-BPTT batch) and, in the
        middle of an epoch, the state ``stateful=True`` carries into the next batch."""
        trainer, state = self._trainer, {}
        if self._backwards_since_step:
            state["backwards_since_step"] = self._backwards_since_step
            state["gradients"] = {name: p.grad.detach().clone() for name, p in self.named_parameters()
                                  if p.grad is not None}
        if trainer is not None and trainer.state.fn == "fit" and trainer.is_last_batch \
                and self._epoch_ending == trainer.current_epoch:
            # saved after the epoch's last batch, before its end: Lightning counts the epoch as
            # done when it resumes from here and never ends it, so the resumed run does
            state["epoch_end_pending"] = trainer.current_epoch
        carried = self._carried.get("train")
        if carried is not None and trainer is not None and trainer_batches_done(trainer) > 0:
            # each process carries its own rows, and a checkpoint holds rank 0's: one process only
            state["carried_state"], state["world_size"] = carried, trainer.world_size
        return state

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        # Trainer.fit(ckpt_path=...) only (load_from_checkpoint has no Trainer): put back at on_train_start,
        # once the strategy has moved and cast the parameters.
        trainer = self._trainer
        resuming = trainer is not None and trainer.state.fn == "fit"
        self._training_state_to_load = checkpoint.get(self.TRAINING_STATE_KEY) if resuming else None

    def _check_lr_search(self) -> None:
        """Lightning's learning-rate finder records a loss per batch and raises the rate at
        every optimizer step, which it assumes comes every ``Trainer(accumulate_grad_batches)``
        batches (1 here): with the module's own accumulation each rate would repeat and the
        suggestion would mean nothing."""
        searching = any(type(c).__name__ == "_LRCallback" for c in self.trainer.callbacks)
        if searching and self.hparams.accumulate_grad_batches > 1:
            raise ValueError(
                f"accumulate_grad_batches={self.hparams.accumulate_grad_batches}: Lightning's lr_find raises the "
                "learning rate at every optimizer step but records every batch, so with the module's own "
                "accumulation its suggestion means nothing; search with accumulate_grad_batches=1"
            )

    def _load_training_state(self) -> None:
        """Puts back what :meth:`_training_state` saved (see :meth:`on_load_checkpoint`); a
        fit that resumes nothing starts with no gradients of an earlier, unfinished
        accumulation cycle (an interrupted fit's, or lr_find's, whose end Lightning rewinds
        but for them)."""
        state, self._training_state_to_load = self._training_state_to_load, None
        if not state:
            self._backwards_since_step = 0
            for p in self.parameters():
                p.grad = None
            return
        gradients = state.get("gradients", {})
        for name, p in self.named_parameters():
            if name in gradients:
                p.grad = gradients[name].to(p)
        self._backwards_since_step = int(state.get("backwards_since_step", 0))
        pending = state.get("epoch_end_pending")
        if pending is not None and self.trainer.current_epoch > pending:  # resumed past an epoch never ended
            with warnings.catch_warnings():
                # the step belongs to the optimizer steps before the checkpoint, which torch's
                # check (a scheduler's first step before this process's first optimizer step) cannot see
                warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
                self._step_schedulers("epoch")
        carried = state.get("carried_state")
        if carried is not None and self.hparams.stateful and self.trainer.world_size == state["world_size"] == 1:
            device = next(self.parameters()).device
            self._carried["train"] = carried.to(device) if isinstance(carried, torch.Tensor) \
                else tuple(s.to(device) for s in carried)

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path, map_location=None, hparams_file=None, strict=None,
                             weights_only: bool | None = None, **kwargs):
        """Lightning's ``load_from_checkpoint``, with the factories in the checkpoint rebuilt.

        Checkpoints hold the ``rnn``, ``optimizer`` and ``scheduler`` factories as plain
        data (see :mod:`~lightning_rnn.modules.factories`), so they load with torch's
        ``weights_only`` loader. A factory with no such description that pickles (one
        holding a tensor, say) is pickled as it is; such a checkpoint, like those written
        before factories were described, needs ``weights_only=False``, as any pickle: load
        only checkpoints you trust. One that does not pickle (a lambda, a closure) Lightning
        leaves out of the checkpoint: pass it again (``optimizer=...``) to load.
        ``weights_only=None`` is torch's default, True since torch 2.6, and True here on
        older torch too (whose default, False, unpickles anything).
        Arguments in ``kwargs`` override those in the checkpoint, as in Lightning.
        """
        if weights_only is None and _TORCH_LOAD_UNPICKLES_BY_DEFAULT:
            weights_only = True
        saved = _read_checkpoint(checkpoint_path, weights_only)
        hparams = saved.get("hyper_parameters") or {}
        rebuilt = {k: factories.rebuild(hparams[k]) for k in saved.get(cls.FACTORIES_KEY, ()) if k not in kwargs}
        load = super().load_from_checkpoint
        if "weights_only" in inspect.signature(load).parameters:
            kwargs["weights_only"] = weights_only
        # else Lightning < 2.6, whose loader has no such argument (it would reach __init__); the
        # read above already applied it, and refused a pickled checkpoint as Lightning 2.6 would
        return load(
            checkpoint_path, map_location=map_location, hparams_file=hparams_file, strict=strict,
            **rebuilt, **kwargs,
        )

    # ----- optimization -----------------------------------------------------------
    @property
    def lr(self) -> float:
        """The learning rate of the optimizer factory (a ``functools.partial`` with ``lr``).

        Settable: Lightning's ``Tuner(trainer).lr_find(model)`` reads it and writes its
        suggestion here, which the next ``configure_optimizers`` (and the checkpoint's
        hyperparameters) then use.
        """
        factory = self.__dict__.get("_optimizer_factory")
        if not isinstance(factory, functools.partial) or "lr" not in factory.keywords:
            raise AttributeError(f"lr: the optimizer factory {factory!r} is not a functools.partial with an lr")
        return factory.keywords["lr"]

    @lr.setter
    def lr(self, value: float) -> None:
        factory = self.__dict__.get("_optimizer_factory")
        if not isinstance(factory, functools.partial):
            raise AttributeError(f"lr: the optimizer factory {factory!r} is not a functools.partial")
        self._optimizer_factory = functools.partial(factory.func, *factory.args, **{**factory.keywords, "lr": value})
        if "optimizer" in self.hparams:
            self.hparams["optimizer"] = self._optimizer_factory

    def configure_optimizers(self):
        # Trainable parameters only: a finetuning callback (Lightning's BaseFinetuning) freezes
        # some before this runs and adds them back as a param group of their own when it
        # unfreezes them, with the learning rate it was given.
        optimizer = self._optimizer_factory([p for p in self.parameters() if p.requires_grad])
        if self._scheduler_factory is None:
            return optimizer
        scheduler = self._scheduler_factory(optimizer)
        if isinstance(scheduler, torch.optim.lr_scheduler.CosineAnnealingLR) and scheduler.T_max < 1:
            raise ValueError(
                f"scheduler: CosineAnnealingLR needs T_max >= 1 (scheduler steps), got {scheduler.T_max}; "
                "on the command line T_max follows trainer.max_steps: set trainer.max_steps, or "
                "model.scheduler.T_max for a run bounded by epochs"
            )
        # ReduceLROnPlateau steps after each validation (see _step_schedulers), whatever
        # scheduler_interval says: a call per step would feed it a stale val/loss. Its
        # "epoch" here is for LearningRateMonitor, which logs its rate at each epoch start.
        interval = "epoch" if _on_plateau(scheduler) else self.hparams.scheduler_interval
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": interval}}

    def _max_steps_reached(self) -> bool:
        """Whether the Trainer's ``max_steps`` optimizer steps have been taken.

        With truncated BPTT one batch takes several steps; stopping between chunks keeps
        a run at exactly ``max_steps`` (a cosine schedule with ``T_max = max_steps`` would
        otherwise climb back up in the overshoot).
        """
        trainer = self._trainer
        max_steps = -1 if trainer is None else trainer.max_steps
        return max_steps is not None and max_steps >= 0 and trainer.global_step >= max_steps

    def _optimizer_step(self) -> None:
        """Step (clipping in :meth:`on_before_optimizer_step`), zero the gradients and step
        a per-step scheduler."""
        optimizer = self.optimizers()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self._backwards_since_step = 0
        self._step_schedulers("step")

    def on_before_optimizer_step(self, optimizer) -> None:
        """Clips the gradients (``grad_clip``). Lightning calls this inside the optimizer
        step, after a loss scaler (fp16) has unscaled the gradients, so the limit applies
        to the true gradients; clipping before ``optimizer.step()`` would clip the scaled
        ones (65536x too hard at the default scale). A subclass that overrides this hook
        calls ``super().on_before_optimizer_step(optimizer)``."""
        self.clip_gradients(optimizer, gradient_clip_val=self.hparams.grad_clip,
                            gradient_clip_algorithm=self.hparams.grad_clip_algorithm)

    def _step_schedulers(self, interval: str) -> None:
        """Step the schedulers of ``interval``: "step", "epoch", or "validation" (the end of
        a validation run in fit, for ReduceLROnPlateau, stepped with ``val/loss``)."""
        for config in self.trainer.lr_scheduler_configs:
            if _on_plateau(config.scheduler):
                if interval == "validation":
                    config.scheduler.step(float(self.trainer.callback_metrics[PLATEAU_METRIC]))
            elif config.interval == interval:
                config.scheduler.step()

    # ----- epoch boundaries -------------------------------------------------------
    def _log_epoch(self, stage: str) -> None:
        """Log the epoch means of ``stage`` (loss, derived metrics, torchmetrics) and reset."""
        mean_loss, metrics = getattr(self, f"{stage}_mean_loss"), getattr(self, f"{stage}_metrics")
        if mean_loss.update_count == 0:
            return
        loss = mean_loss.compute()
        name = "epoch_loss" if stage == "train" else "loss"
        values = {f"{stage}/{name}": loss}
        if stage != "train":
            values.update({f"{stage}/{k}": v for k, v in self.derived_metrics(loss).items()})
        if metrics is not None:
            values.update(metrics.compute())
        # Fresh states outside inference mode: Trainer.validate/test run under it, and states
        # made there could not be updated in place by a later fit's validation (which runs
        # without it): fit -> validate -> fit failed.
        with torch.inference_mode(False):
            if metrics is not None:
                metrics.reset()
            mean_loss.reset()
        # torchmetrics' compute() already synced the values across processes, so averaging
        # them again changes nothing; it tells Lightning they are global.
        self.log_dict(values, prog_bar=stage == "val", sync_dist=True)

    def on_fit_start(self) -> None:
        self._metrics_like_parameters()

    def on_validation_start(self) -> None:
        self._metrics_like_parameters()

    def on_test_start(self) -> None:
        self._metrics_like_parameters()

    def _metrics_like_parameters(self) -> None:
        """float64 metric states for a float64 model (torchmetrics keeps float32 through
        ``.double()``, which rounded the epoch means of a float64 run at about 1e-7), and
        float32 ones, not bf16/fp16, for a low-precision model: ``Trainer(precision="bf16-true")``
        (``"16-true"``) converts the metrics' float states with the model
        (``module.to(dtype)``), and a bf16 sum stops growing once it is large (an epoch
        mean loss of 1.2 came out as 2.0)."""
        float64 = any(p.dtype == torch.float64 for p in self.parameters())
        # outside inference mode (Trainer.validate/test run under it), as in _log_epoch: a
        # later fit must be able to update the converted states in place
        with torch.inference_mode(False):
            for metric in self.modules():
                if not isinstance(metric, Metric):
                    continue
                if float64:
                    metric.set_dtype(torch.float64)
                elif any(t.dtype in (torch.bfloat16, torch.float16) for t in _state_tensors(metric)):
                    metric.to(torch.float32)  # float states only: counts stay integers

    def on_train_start(self) -> None:
        self._epoch_ending = self.trainer.current_epoch  # a resumed epoch has no on_train_epoch_start
        self._check_lr_search()
        self._load_training_state()
        if self.hparams.stateful and _shuffles(self.trainer.train_dataloader):
            rank_zero_warn(
                "stateful=True carries each batch row's state into the same row of the next batch, "
                "which needs rows that continue one another (ContiguousStreams); this train "
                "dataloader shuffles (or buckets by length), so the carried state comes from unrelated "
                "sequences (set stateful=False)"
            )

    def on_train_epoch_start(self) -> None:
        self._carried.pop("train", None)
        self._epoch_ending = self.trainer.current_epoch  # until on_train_epoch_end

    def on_train_epoch_end(self) -> None:
        self._epoch_ending = None
        self._step_schedulers("epoch")
        self._log_epoch("train")

    def on_validation_epoch_start(self) -> None:
        self._carried.pop("val", None)

    def on_validation_epoch_end(self) -> None:
        self._log_epoch("val")
        trainer = self.trainer
        if trainer.state.fn == "fit" and not trainer.sanity_checking and PLATEAU_METRIC in trainer.callback_metrics:
            self._step_schedulers("validation")

    def on_train_end(self) -> None:
        plateaus = [c.scheduler for c in self.trainer.lr_scheduler_configs if _on_plateau(c.scheduler)]
        if any(s.last_epoch == 0 for s in plateaus):
            rank_zero_warn(
                f"scheduler: ReduceLROnPlateau steps after each validation with {PLATEAU_METRIC}, and no "
                "validation ran in this fit (give the Trainer validation data, or another scheduler)"
            )

    def on_test_epoch_start(self) -> None:
        self._carried.pop("test", None)

    def on_test_epoch_end(self) -> None:
        self._log_epoch("test")


#: What a ReduceLROnPlateau scheduler is stepped with.
PLATEAU_METRIC = "val/loss"


def _shuffles(loader) -> bool:
    """Whether a DataLoader draws its items in random order, or regroups them by length
    (the PackedSequences callback's bucketing). Under DDP Lightning has replaced a
    shuffling sampler with a ``DistributedSampler(shuffle=True)``."""
    from ..callbacks.length_bucketing import LengthBucketBatchSampler

    def random(sampler) -> bool:
        return isinstance(sampler, RandomSampler) or (isinstance(sampler, DistributedSampler) and sampler.shuffle)

    batch_sampler = getattr(loader, "batch_sampler", None)
    return (random(getattr(loader, "sampler", None)) or isinstance(batch_sampler, LengthBucketBatchSampler)
            or random(getattr(batch_sampler, "sampler", None)))


def _state_tensors(metric: Metric) -> list[torch.Tensor]:
    """A torchmetrics Metric's state tensors (list states flattened)."""
    tensors = []
    for value in metric.metric_state.values():
        tensors.extend(value if isinstance(value, list) else [value])
    return tensors


def _on_plateau(scheduler) -> bool:
    return isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


#: torch.load's weights_only defaults to False before torch 2.6 (True from 2.6 on).
_TORCH_LOAD_UNPICKLES_BY_DEFAULT = tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 6)


def _read_checkpoint(path, weights_only: bool | None) -> dict:
    """The checkpoint at ``path`` (a path, URL or file object), memory-mapped where it can be."""
    from lightning.fabric.utilities.cloud_io import _load

    if hasattr(path, "seek"):
        start = path.tell()
        try:
            return _load(path, map_location="cpu", weights_only=weights_only)
        finally:
            path.seek(start)
    try:
        return torch.load(path, map_location="cpu", weights_only=weights_only, mmap=True)
    except (RuntimeError, OSError, ValueError):  # not a local zip-format file: a URL, an old format
        return _load(path, map_location="cpu", weights_only=weights_only)
