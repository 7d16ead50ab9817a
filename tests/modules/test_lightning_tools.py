"""The module with Lightning's own tools: lr_find, finetuning callbacks, GradientAccumulationScheduler,
LightningCLI (its checkpoints load with load_from_checkpoint; a scheduler is a class_path)."""
import functools

import pytest
import torch
from lightning.pytorch.callbacks import BaseFinetuning, GradientAccumulationScheduler
from lightning.pytorch.tuner import Tuner
from modules_helpers import adam, batches_loader, char_lm, tiny_trainer, token_batches

from lightning_rnn.modules import CharLanguageModel


def seeded_batches(count):
    torch.manual_seed(0)
    return token_batches(count, rows=4)


def test_lr_is_the_optimizer_factory_s_and_setting_it_rebuilds_the_factory():
    model = char_lm(optimizer=adam(lr=3e-3))
    assert model.lr == 3e-3
    model.lr = 0.02
    assert model.configure_optimizers().param_groups[0]["lr"] == 0.02
    assert model.hparams.optimizer.keywords["lr"] == 0.02  # what checkpoints record
    model._optimizer_factory = lambda params: torch.optim.SGD(params, lr=0.1)
    assert not hasattr(model, "lr")  # Lightning's lr_find then says to give attr_name


def test_lr_find_records_the_losses_and_sets_its_suggestion(tmp_path):
    """lr_find reads each step's loss from training_step's output (none would record NaN) and
    steps its scheduler through the module's optimizer steps."""
    model = char_lm()
    trainer = tiny_trainer(max_epochs=1, default_root_dir=tmp_path)
    finder = Tuner(trainer).lr_find(model, train_dataloaders=batches_loader(seeded_batches(30)), num_training=20,
                                    min_lr=1e-4, max_lr=1.0)
    losses, lrs = finder.results["loss"], finder.results["lr"]
    assert len(losses) == 20 and all(loss == loss for loss in losses)  # no NaN
    assert lrs == sorted(lrs) and lrs[-1] > 100 * lrs[0]
    assert finder.suggestion() is not None and model.lr == pytest.approx(finder.suggestion())


@pytest.mark.parametrize("tbptt_steps, recorded", [(None, 20), (4, 10)], ids=["automatic", "tbptt"])
def test_lr_find_with_the_trainer_s_accumulation_records_each_rate_once(tbptt_steps, recorded, tmp_path):
    """The finder raises the rate at every optimizer step (20) and records the loss every
    accumulate_grad_batches=2 batches; accumulation is the Trainer's, so no rate is recorded
    twice. (With truncated BPTT a batch of 2 chunks takes one step.)"""
    model = char_lm(tbptt_steps=tbptt_steps)
    trainer = tiny_trainer(max_epochs=1, accumulate_grad_batches=2, default_root_dir=tmp_path)
    finder = Tuner(trainer).lr_find(model, train_dataloaders=batches_loader(seeded_batches(60)), num_training=20,
                                    min_lr=1e-4, max_lr=1.0, early_stop_threshold=None)
    losses, lrs = finder.results["loss"], finder.results["lr"]
    assert len(losses) == recorded and all(loss == loss for loss in losses)  # no NaN
    assert all(a < b for a, b in zip(lrs, lrs[1:]))


def test_a_fit_after_an_unfinished_one_starts_from_no_gradients():
    """A fit that stopped inside an accumulation cycle (an exception, an interrupted search)
    leaves gradients and the loop's count of backward passes; the next fit must not step
    early with them: it matches a fresh model's fit."""
    def fitted(search: bool):
        torch.manual_seed(0)
        model = char_lm(optimizer=functools.partial(torch.optim.SGD, lr=0.1), tbptt_steps=3)
        if search:
            model.truncated_bptt.backwards_since_step = 1  # as a search ending mid-cycle leaves it
            for p in model.parameters():
                p.grad = torch.ones_like(p)
        tiny_trainer(max_epochs=1, accumulate_grad_batches=2).fit(model, batches_loader(seeded_batches(3)))
        return [p.detach().clone() for p in model.parameters()]

    for after, fresh in zip(fitted(True), fitted(False)):
        assert torch.equal(after, fresh)


class FreezeThenUnfreeze(BaseFinetuning):
    def freeze_before_training(self, module):
        self.freeze(module.rnn)

    def finetune_function(self, module, current_epoch, optimizer):
        if current_epoch == 1:
            self.unfreeze_and_add_param_group(module.rnn, optimizer, lr=1e-3, initial_denom_lr=1.0)


def test_a_finetuning_callback_freezes_then_adds_the_rnn_with_its_own_learning_rate():
    model = char_lm(optimizer=functools.partial(torch.optim.SGD, lr=0.5))
    frozen = [p.detach().clone() for p in model.rnn.parameters()]
    trainer = tiny_trainer(max_epochs=1, callbacks=[FreezeThenUnfreeze()])
    trainer.fit(model, batches_loader(seeded_batches(2)))
    assert all(torch.equal(p, q) for p, q in zip(model.rnn.parameters(), frozen))  # frozen in epoch 0
    trainer = tiny_trainer(max_epochs=2, callbacks=[FreezeThenUnfreeze()])
    model = char_lm(optimizer=functools.partial(torch.optim.SGD, lr=0.5))
    trainer.fit(model, batches_loader(seeded_batches(2)))
    groups = [(len(g["params"]), g["lr"]) for g in model.optimizers().optimizer.param_groups]
    assert groups == [(len(list(model.parameters())) - len(frozen), 0.5), (len(frozen), 1e-3)]
    assert not all(torch.equal(p, q) for p, q in zip(model.rnn.parameters(), frozen))


def test_gradient_accumulation_scheduler_works_and_is_refused_with_tbptt():
    """Lightning's own with automatic optimization; with truncated BPTT (manual) a clear error,
    not Lightning's advice to switch to automatic optimization."""
    trainer = tiny_trainer(max_epochs=1, callbacks=[GradientAccumulationScheduler({0: 2})])
    trainer.fit(char_lm(), batches_loader(seeded_batches(4)))
    assert trainer.global_step == 2
    trainer = tiny_trainer(max_epochs=1, callbacks=[GradientAccumulationScheduler({0: 2})])
    with pytest.raises(ValueError, match=r"GradientAccumulationScheduler: with tbptt_steps, CharLanguageModel .* "
                                         r"Trainer\(accumulate_grad_batches=N\)"):
        trainer.fit(char_lm(tbptt_steps=4), batches_loader(seeded_batches(2)))


def test_lightning_cli_checkpoint_loads_and_takes_a_scheduler_class_path(tmp_path):
    pytest.importorskip("jsonargparse")
    from lightning.pytorch.cli import LightningCLI

    args = [
        "fit", "--model.vocab=abc", "--model.embedding_dim=4", "--model.val_sample_length=0",
        "--model.rnn=lightning_rnn.FusedGRU", "--model.rnn.hidden_size=6", "--model.rnn.backend=reference",
        "--model.optimizer=torch.optim.SGD", "--model.optimizer.lr=0.1",
        "--model.scheduler=torch.optim.lr_scheduler.StepLR", "--model.scheduler.step_size=1",
        "--model.scheduler.gamma=0.5",
        "--trainer.max_epochs=1", "--trainer.logger=false", "--trainer.enable_progress_bar=false",
        f"--trainer.default_root_dir={tmp_path}",
    ]

    class CLI(LightningCLI):
        def fit(self, model, **kwargs):  # no data module in the CLI: the test's batches
            self.trainer.fit(model, batches_loader(seeded_batches(2)))

    cli = CLI(CharLanguageModel, args=args, save_config_callback=None, subclass_mode_model=False)
    assert isinstance(cli.model.rnn, torch.nn.Module) and type(cli.model.rnn).__name__ == "FusedGRU"
    assert cli.model.optimizers().param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**2)  # StepLR, per step
    checkpoint = next(tmp_path.rglob("*.ckpt"))
    restored = CharLanguageModel.load_from_checkpoint(checkpoint)
    assert type(restored.rnn).__name__ == "FusedGRU" and restored.rnn.hidden_size == 6
    for a, b in zip(restored.parameters(), cli.model.parameters()):
        assert torch.equal(a, b)
