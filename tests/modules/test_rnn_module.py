"""RNNModule's training: Lightning's automatic optimization, or truncated BPTT's loop; carried state,
the Trainer's accumulation and clipping, schedulers."""
import functools
import math
import warnings

import lightning.pytorch as pl
import pytest
import torch
from modules_helpers import adam, batches_loader, char_lm, rnn_factory, tiny_trainer, token_batches
from torch import nn

from lightning_rnn.modules import RNNModule


class RecordStates(nn.Module):
    """Wraps an rnn and records the initial state it is given at each call."""

    def __init__(self, rnn):
        super().__init__()
        self.rnn, self.initial_states = rnn, []

    def forward(self, x, hx=None):
        self.initial_states.append(hx)
        return self.rnn(x, hx)


class RecordGradients(pl.Callback):
    """What each optimizer step sees: the embedding's gradient as the step starts, and the
    update it applies (with SGD at lr=1, the gradient after clipping)."""

    def __init__(self):
        self.embedding_grads, self.update_norms, self.update_max = [], [], []

    def on_train_start(self, trainer, module):
        for optimizer in trainer.optimizers:
            optimizer.register_step_post_hook(lambda *_: self.after(module))

    def on_before_optimizer_step(self, trainer, module, optimizer):  # after the backward, before clipping
        self.embedding_grads.append(module.input_layer.weight.grad.clone())
        self.params = [p.detach().clone() for p in module.parameters()]

    def after(self, module):
        updates = torch.cat([(p.detach() - q).flatten() for p, q in zip(module.parameters(), self.params)])
        self.update_norms.append(updates.norm().item())
        self.update_max.append(updates.abs().max().item())


#: The reference backend and the default ("auto": the cpp kernel on a CPU).
backends = pytest.mark.parametrize("backend", ["reference", "auto"])


@backends
def test_tbptt_steps_once_per_chunk_and_stops_gradients_at_chunk_boundaries(backend):
    model = char_lm(tbptt_steps=4, rnn=rnn_factory(backend=backend))
    model.rnn = recorder = RecordStates(model.rnn)
    grads = RecordGradients()
    trainer = tiny_trainer(max_epochs=1, callbacks=[grads])
    trainer.fit(model, batches_loader(token_batches(3, chunk_ids=[1, 2])))
    assert trainer.global_step == 6  # 3 batches x 2 chunks
    for chunk in range(6):
        first_chunk_grad, second_chunk_grad = grads.embedding_grads[chunk][1], grads.embedding_grads[chunk][2]
        if chunk % 2 == 0:  # chunk 1 reads only id 1
            assert first_chunk_grad.abs().sum() > 0 and second_chunk_grad.abs().sum() == 0
        else:  # chunk 2 reads only id 2: its loss must not reach chunk 1's inputs
            assert first_chunk_grad.abs().sum() == 0 and second_chunk_grad.abs().sum() > 0
    starts = recorder.initial_states
    assert starts[0] is None and starts[2] is None  # not stateful: each batch starts from zeros
    carried_h, carried_c = starts[1]
    assert carried_h.abs().sum() > 0 and not carried_h.requires_grad and not carried_c.requires_grad


@pytest.mark.parametrize("max_steps", [3, 5])
def test_tbptt_stops_at_max_steps_inside_a_batch(max_steps):
    """Two chunks (steps) per batch: an odd max_steps ends in the middle of a batch."""
    model = char_lm(tbptt_steps=4)
    model.rnn = recorder = RecordStates(model.rnn)
    trainer = tiny_trainer(max_steps=max_steps, limit_val_batches=0)
    trainer.fit(model, batches_loader(token_batches(4)))
    assert trainer.global_step == max_steps
    assert len(recorder.initial_states) == max_steps  # no forward for a chunk that would not step


@backends
def test_stateful_carries_state_across_batches_and_resets_each_epoch(backend):
    model = char_lm(stateful=True, rnn=rnn_factory(backend=backend))
    model.rnn = recorder = RecordStates(model.rnn)
    tiny_trainer(max_epochs=2, limit_val_batches=0).fit(model, batches_loader(token_batches(3)))
    starts = recorder.initial_states
    assert len(starts) == 6
    assert starts[0] is None and starts[3] is None  # epoch starts
    for carried in (starts[1], starts[2], starts[4], starts[5]):
        assert carried is not None and not carried[0].requires_grad


def test_projected_lstm_carries_its_state_and_feeds_the_head():
    """proj_size: the head reads proj_size features per step; the carried h_0 has proj_size
    columns and c_0 hidden_size, across TBPTT chunks and across batches."""
    model = char_lm(rnn=rnn_factory(hidden_size=8, num_layers=2, proj_size=3), tbptt_steps=4, stateful=True)
    assert model.rnn_output_size == 3 and model.output_layer.module.in_features == 3
    model.rnn = recorder = RecordStates(model.rnn)
    trainer = tiny_trainer(max_epochs=1, limit_val_batches=0)
    trainer.fit(model, batches_loader(token_batches(2)))
    assert trainer.global_step == 4
    carried = recorder.initial_states[1:]
    assert len(carried) == 3 and all(hx[0].shape == (2, 2, 3) and hx[1].shape == (2, 2, 8) for hx in carried)


def test_tbptt_accumulation_steps_every_n_chunks_and_flushes_at_epoch_end():
    model = char_lm(tbptt_steps=4)
    trainer = tiny_trainer(max_epochs=1, accumulate_grad_batches=3)
    trainer.fit(model, batches_loader(token_batches(2)))  # 4 chunks: one step after 3, one flush
    assert trainer.global_step == 2


@pytest.mark.parametrize("tbptt_steps", [None, 4], ids=["automatic", "tbptt"])
@pytest.mark.parametrize("algorithm, limit", [("norm", 1e-3), ("value", 1e-4)])
def test_the_trainer_s_clipping_applies_before_each_step(algorithm, limit, tbptt_steps):
    grads = RecordGradients()
    model = char_lm(tbptt_steps=tbptt_steps, optimizer=functools.partial(torch.optim.SGD, lr=1.0))
    trainer = tiny_trainer(max_epochs=1, callbacks=[grads], gradient_clip_val=limit, gradient_clip_algorithm=algorithm)
    trainer.fit(model, batches_loader(token_batches(2)))
    observed = grads.update_norms if algorithm == "norm" else grads.update_max
    assert len(observed) == (2 if tbptt_steps is None else 4)
    assert max(observed) <= limit * 1.001 and min(observed) >= limit * 0.5


@pytest.mark.parametrize("tbptt_steps", [None, 8], ids=["automatic", "tbptt"])
@pytest.mark.filterwarnings("ignore:.*fp16.*:UserWarning")
def test_fp16_loss_scaling_clips_the_unscaled_gradients(tbptt_steps):
    """With a loss scaler the limit applies to the true gradients, not the scaled ones (65536x
    larger at the default scale)."""
    from lightning_rnn.callbacks import MixedPrecision

    updates = {}
    for precision in ("fp32", "fp16"):
        torch.manual_seed(0)
        model = char_lm(tbptt_steps=tbptt_steps, optimizer=functools.partial(torch.optim.SGD, lr=1.0))
        before = [p.detach().clone() for p in model.parameters()]
        callbacks = [MixedPrecision(dtype="fp16")] if precision == "fp16" else []
        torch.manual_seed(1)
        trainer = tiny_trainer(max_epochs=1, callbacks=callbacks, gradient_clip_val=0.1)
        trainer.fit(model, batches_loader(token_batches(1)))
        updates[precision] = torch.cat([(p.detach() - b).flatten() for p, b in zip(model.parameters(), before)])
    assert updates["fp32"].norm().item() == pytest.approx(0.1, rel=1e-4)  # the limit is active
    assert updates["fp16"].norm().item() == pytest.approx(0.1, rel=1e-2)


@pytest.mark.parametrize("interval, expected_lr", [("step", 1e-2 * 0.5**4), ("epoch", 1e-2 * 0.5**2)])
def test_schedulers_step_at_their_interval(interval, expected_lr):
    scheduler = functools.partial(torch.optim.lr_scheduler.StepLR, step_size=1, gamma=0.5)
    model = char_lm(tbptt_steps=4, scheduler=scheduler, scheduler_interval=interval)
    tiny_trainer(max_epochs=2).fit(model, batches_loader(token_batches(1)))  # 2 epochs x 2 chunks
    assert model.optimizers().param_groups[0]["lr"] == pytest.approx(expected_lr)


@pytest.mark.parametrize("tbptt_steps", [None, 4], ids=["automatic", "tbptt"])
def test_reduce_on_plateau_steps_after_each_validation_with_val_loss(tbptt_steps):
    """The module steps a ReduceLROnPlateau after each validation of fit (not the sanity
    check), with val/loss, whichever way it optimizes."""
    scheduler = functools.partial(torch.optim.lr_scheduler.ReduceLROnPlateau, patience=0, factor=0.5,
                                  threshold=10.0, threshold_mode="abs")  # no validation counts as better
    model = char_lm(scheduler=scheduler, tbptt_steps=tbptt_steps)
    trainer = tiny_trainer(max_epochs=3, num_sanity_val_steps=1)
    trainer.fit(model, batches_loader(token_batches(1)), batches_loader(token_batches(1)))
    plateau = trainer.lr_scheduler_configs[0].scheduler
    assert plateau.last_epoch == 3  # three validations in fit, the sanity check not counted
    assert model.optimizers().param_groups[0]["lr"] == pytest.approx(1e-2 * 0.5**2)  # the 2nd and 3rd validation


def test_reduce_on_plateau_without_validation_warns():
    scheduler = functools.partial(torch.optim.lr_scheduler.ReduceLROnPlateau, patience=0)
    model = char_lm(scheduler=scheduler)
    with pytest.warns(UserWarning, match="ReduceLROnPlateau steps after each validation with val/loss"):
        tiny_trainer(max_epochs=1, limit_val_batches=0).fit(model, batches_loader(token_batches(1)))
    assert model.optimizers().param_groups[0]["lr"] == pytest.approx(1e-2)


def test_stateful_training_on_a_shuffling_loader_warns():
    batches = token_batches(4)
    model = char_lm(stateful=True)
    with pytest.warns(UserWarning, match="stateful=True .* this train dataloader shuffles"):
        tiny_trainer(max_epochs=1).fit(model, torch.utils.data.DataLoader(batches, batch_size=None, shuffle=True))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="stateful=True")
        tiny_trainer(max_epochs=1).fit(char_lm(stateful=True), batches_loader(batches))  # in order: no warning


@pytest.mark.parametrize("shuffle", [True, False])
def test_stateful_training_warns_on_the_sampler_ddp_puts_in_a_shuffling_loader(shuffle):
    """Under DDP Lightning replaces a shuffling loader's sampler with DistributedSampler(shuffle=True)
    (the rank's shard of one process's loader, given here explicitly: no process group needed)."""
    batches = token_batches(4)
    sampler = torch.utils.data.DistributedSampler(batches, num_replicas=2, rank=0, shuffle=shuffle)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tiny_trainer(max_epochs=1).fit(char_lm(stateful=True),
                                       torch.utils.data.DataLoader(batches, batch_size=None, sampler=sampler))
    warned = [w for w in caught if "stateful=True" in str(w.message)]
    assert len(warned) == (1 if shuffle else 0)


def test_cosine_schedule_without_a_step_count_is_an_error():
    """T_max follows trainer.max_steps on the command line: -1 in a run bounded by epochs."""
    scheduler = functools.partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=-1)
    model = char_lm(scheduler=scheduler)
    with pytest.raises(ValueError, match=r"scheduler: CosineAnnealingLR needs T_max >= 1 .*got -1"):
        tiny_trainer(max_epochs=1).fit(model, batches_loader(token_batches(1)))


def test_bf16_mixed_precision_trains_with_truncated_bptt():
    model = char_lm(tbptt_steps=4)
    trainer = tiny_trainer(max_epochs=1, precision="bf16-mixed")
    trainer.fit(model, batches_loader(token_batches(2)))
    assert trainer.global_step == 4
    assert torch.isfinite(trainer.callback_metrics["train/loss"])


def test_validation_logs_epoch_means_and_derived_metrics():
    model = char_lm()
    trainer = tiny_trainer(max_epochs=1)
    trainer.fit(model, batches_loader(token_batches(2)), batches_loader(token_batches(2)))
    metrics = {k: v.item() for k, v in trainer.callback_metrics.items()}
    assert metrics["val/bpc"] == pytest.approx(metrics["val/loss"] / math.log(2), rel=1e-5)
    assert metrics["val/ppl"] == pytest.approx(math.exp(metrics["val/loss"]), rel=1e-5)
    assert "train/epoch_loss" in metrics


def test_fit_after_validate_runs():
    """validate runs under inference mode: the metric states it resets must still be
    updatable by the next fit's validation (fit -> validate -> fit raised 'Inplace update
    to inference tensor outside InferenceMode')."""
    model = char_lm()
    batches = batches_loader(token_batches(2))
    tiny_trainer(max_epochs=1).fit(model, batches, batches)
    tiny_trainer().validate(model, batches)
    trainer = tiny_trainer(max_epochs=1)
    trainer.fit(model, batches, batches)
    assert torch.isfinite(trainer.callback_metrics["val/loss"])


def test_a_float64_model_keeps_float64_epoch_metrics():
    model = char_lm().double()
    batches = token_batches(3)
    trainer = tiny_trainer(max_epochs=1)
    trainer.fit(model, batches_loader(batches), batches_loader(batches))
    assert model.val_mean_loss.mean_value.dtype == torch.float64
    with torch.no_grad():  # the epoch mean of the val losses, by hand, in float64
        losses = [model.shared_step(b, "test")[0] for b in batches]
    expected = sum(losses) / len(losses)
    assert trainer.callback_metrics["val/loss"].item() == pytest.approx(expected.item(), rel=1e-12)


@pytest.mark.parametrize("precision", ["bf16-true", "16-true"])
def test_a_low_precision_model_keeps_float32_epoch_metrics(precision):
    """Lightning converts the metrics' float states with the model (module.to(dtype)); summed in
    bf16 the epoch mean of 400 losses of about 1.2 came out as 2.0."""
    model = char_lm()
    batches = token_batches(40)
    trainer = tiny_trainer(precision=precision)
    trainer.validate(model, batches_loader(batches))
    assert model.val_mean_loss.mean_value.dtype == torch.float32
    with torch.no_grad():  # the epoch mean of the (low-precision) val losses, by hand, in float64
        losses = torch.stack([model.shared_step(b, "test")[0] for b in batches]).double()
    assert trainer.callback_metrics["val/loss"].item() == pytest.approx(losses.mean().item(), rel=1e-6)


def test_split_batch_requires_equal_lengths():
    model = char_lm(tbptt_steps=4)
    chunks = model.split_batch({"inputs": torch.zeros(2, 10, dtype=torch.long), "targets": torch.zeros(2, 10)})
    assert [c["inputs"].shape[1] for c in chunks] == [4, 4, 2]
    with pytest.raises(ValueError, match="tbptt_steps: batch tensors differ"):
        model.split_batch({"inputs": torch.zeros(2, 10), "targets": torch.zeros(2, 3, 1)})


@pytest.mark.parametrize("kwargs, error, message", [
    ({"rnn": nn.LSTM(4, 8)}, TypeError, "rnn: expected a factory"),
    ({"tbptt_steps": 0}, ValueError, "tbptt_steps: expected None or an int >= 1, got 0"),
    ({"tbptt_steps": "4"}, TypeError, "tbptt_steps: expected None or an int >= 1, got '4'"),
    ({"scheduler_interval": "batch"}, ValueError, "scheduler_interval: expected one of 'step', 'epoch', got 'batch'"),
    ({"scheduler_interval": 1}, TypeError, "scheduler_interval: expected one of 'step', 'epoch', got 1"),
    ({"stateful": "no"}, TypeError, "stateful: expected a bool, got 'no'"),  # not read as True
    ({"optimizer": "adam"}, TypeError, "optimizer: expected a factory optimizer"),
    ({"scheduler": "cosine"}, TypeError, "scheduler: expected None or a factory scheduler"),
    ({"rnn": rnn_factory(bidirectional=True), "stateful": True}, ValueError,
     "stateful: carries the state forward in time, which a bidirectional"),
    ({"rnn": rnn_factory(bidirectional=True), "tbptt_steps": 4}, ValueError, "tbptt_steps: carries the state"),
])
def test_bad_arguments_are_named(kwargs, error, message):
    with pytest.raises(error, match=message):
        char_lm(**kwargs)


def test_base_module_accepts_any_rnn_factory():
    class Tagger(RNNModule):
        """A minimal subclass: per-step regression with torch.nn.GRU."""

        def __init__(self, **kwargs):
            super().__init__(input_size=3, **kwargs)
            self.output_layer = nn.Linear(self.rnn_output_size, 1)

        def head(self, features):
            return self.output_layer(features)

        def compute_loss(self, predictions, batch):
            return nn.functional.mse_loss(predictions, batch["targets"])

    model = Tagger(rnn=functools.partial(nn.GRU, hidden_size=5, bidirectional=True), optimizer=adam())
    assert model.rnn_output_size == 10
    batches = [{"inputs": torch.randn(4, 6, 3), "targets": torch.randn(4, 6, 1)} for _ in range(2)]
    trainer = tiny_trainer(max_epochs=1)
    trainer.fit(model, batches_loader(batches))
    assert trainer.global_step == 2


def test_train_loss_is_the_batchs_mean_over_its_chunks_weighted_by_their_steps():
    """Chunks of 4, 4 and 2 steps: train/loss is their mean weighted 4:4:2, not the last
    chunk's loss."""
    model = char_lm(tbptt_steps=4)
    chunk_losses, logged = [], []
    compute_loss = model.compute_loss
    model.compute_loss = lambda predictions, batch: chunk_losses.append(compute_loss(predictions, batch)) or \
        chunk_losses[-1]

    class Logged(pl.Callback):
        def on_train_batch_end(self, trainer, *args):
            logged.append(trainer.callback_metrics["train/loss"].item())

    trainer = tiny_trainer(max_epochs=1, callbacks=[Logged()])
    trainer.fit(model, batches_loader(token_batches(2, steps=10)))
    assert len(chunk_losses) == 6 and trainer.global_step == 6
    for batch in range(2):
        first, second, last = (loss.item() for loss in chunk_losses[3 * batch : 3 * batch + 3])
        assert logged[batch] == pytest.approx((4 * first + 4 * second + 2 * last) / 10)
        assert logged[batch] != pytest.approx(last)


def test_without_tbptt_lightning_optimizes_with_the_trainer_s_accumulation():
    """5 batches, a step every 2 and one for the last: Lightning's automatic optimization."""
    model = char_lm(stateful=True)
    trainer = tiny_trainer(max_epochs=1, accumulate_grad_batches=2)
    trainer.fit(model, batches_loader(token_batches(5)))
    assert model.automatic_optimization and trainer.global_step == 3


@backends
def test_tbptt_with_one_chunk_a_batch_matches_automatic_optimization(backend):
    """The truncated-BPTT loop applies the Trainer's accumulation and clipping as Lightning does:
    with chunks as long as the batches, both give the same weights (5 batches: two full
    accumulation cycles, then the epoch's last batch steps on its own). float32: the two
    loops scale the loss by the accumulation in another order (a rounding apart per step)."""
    weights = {}
    for tbptt_steps in (None, 8):
        torch.manual_seed(0)
        model = char_lm(tbptt_steps=tbptt_steps, stateful=True, optimizer=functools.partial(torch.optim.SGD, lr=0.5),
                        rnn=rnn_factory(backend=backend))
        trainer = tiny_trainer(max_epochs=2, accumulate_grad_batches=2, gradient_clip_val=0.05)
        torch.manual_seed(1)
        trainer.fit(model, batches_loader(token_batches(5)))
        assert trainer.global_step == 6
        weights[tbptt_steps] = [p.detach().clone() for p in model.parameters()]
    for automatic, manual in zip(weights[None], weights[8]):
        torch.testing.assert_close(manual, automatic, rtol=1e-6, atol=1e-7)


@backends
def test_a_validation_inside_a_tbptt_accumulation_keeps_its_gradients(backend):
    """Lightning zeroes the gradients before a validation in fit where, counting batches, no
    accumulation is in progress. The loop counts chunks: batches of 3, 2, 2 and 2 chunks with
    a step every 2 chunks are inside a cycle after batch 2. The weights must be those of the
    same run without validation."""
    weights = []
    for limit_val_batches in (0, 1):
        torch.manual_seed(0)
        batches = token_batches(1, steps=12) + token_batches(3, steps=8)
        model = char_lm(tbptt_steps=4, optimizer=functools.partial(torch.optim.SGD, lr=0.5),
                        rnn=rnn_factory(backend=backend))
        trainer = tiny_trainer(max_epochs=1, accumulate_grad_batches=2, val_check_interval=1,
                               limit_val_batches=limit_val_batches)
        trainer.fit(model, batches_loader(batches), batches_loader(token_batches(1)))
        assert trainer.global_step == 5
        weights.append([p.detach().clone() for p in model.parameters()])
    for without, with_validation in zip(*weights):
        assert torch.equal(without, with_validation)


def test_the_module_optimizes_manually_only_in_a_fit_with_tbptt():
    """Lightning refuses the Trainer's clipping and accumulation for a manually optimized module;
    the module turns manual in setup, after that check, and is automatic again for the next run,
    also after a run that raised."""
    model = char_lm(tbptt_steps=4)
    seen = []

    class Record(pl.Callback):
        def on_train_batch_start(self, trainer, module, *args):
            seen.append(module.automatic_optimization)

    for _ in range(2):
        tiny_trainer(max_epochs=1, callbacks=[Record()], gradient_clip_val=1.0,
                     accumulate_grad_batches=2).fit(model, batches_loader(token_batches(1)))
    assert seen == [False, False]
    with pytest.raises(ValueError, match="inputs"):  # a run that stops with an error, skipping teardown
        batch = {"inputs": torch.zeros(2, 8), "targets": torch.zeros(2, 8, dtype=torch.long)}  # not ids
        tiny_trainer(max_epochs=1).fit(model, batches_loader([batch]))
    tiny_trainer(max_epochs=1, gradient_clip_val=1.0).fit(model, batches_loader(token_batches(1)))
    (metrics,) = tiny_trainer(gradient_clip_val=1.0).validate(model, batches_loader(token_batches(1)), verbose=False)
    assert "val/loss" in metrics


def test_a_plateau_scheduler_steps_after_each_validation_inside_an_epoch():
    """Automatic optimization: Lightning would step it once per epoch; the module steps it
    after each of the 2 validations of these 4 steps (of an 8-batch epoch)."""
    scheduler = functools.partial(torch.optim.lr_scheduler.ReduceLROnPlateau, patience=0, factor=0.5,
                                  threshold=10.0, threshold_mode="abs")
    model = char_lm(scheduler=scheduler)
    trainer = tiny_trainer(max_steps=4, val_check_interval=2)
    trainer.fit(model, batches_loader(token_batches(8)), batches_loader(token_batches(1)))
    assert trainer.lr_scheduler_configs[0].scheduler.last_epoch == 2
    assert model.optimizers().param_groups[0]["lr"] == pytest.approx(1e-2 * 0.5)


def test_trainer_flags_of_fit_do_not_stop_validation():
    """Clipping is a fit setting: Trainer.validate with it set runs as Lightning would."""
    trainer = tiny_trainer(gradient_clip_val=1.0)
    (metrics,) = trainer.validate(char_lm(), batches_loader(token_batches(1)), verbose=False)
    assert "val/loss" in metrics
