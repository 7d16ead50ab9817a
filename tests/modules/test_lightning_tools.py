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
    """lr_find reads each step's loss from training_step's output (manual optimization returned
    none: every loss was NaN) and steps its scheduler through the module's optimizer steps."""
    model = char_lm()
    trainer = tiny_trainer(max_epochs=1, default_root_dir=tmp_path)
    finder = Tuner(trainer).lr_find(model, train_dataloaders=batches_loader(seeded_batches(30)), num_training=20,
                                    min_lr=1e-4, max_lr=1.0)
    losses, lrs = finder.results["loss"], finder.results["lr"]
    assert len(losses) == 20 and all(loss == loss for loss in losses)  # no NaN
    assert lrs == sorted(lrs) and lrs[-1] > 100 * lrs[0]
    assert finder.suggestion() is not None and model.lr == pytest.approx(finder.suggestion())


def test_lr_find_with_the_module_s_accumulation_is_an_error():
    """The finder raises the rate at each optimizer step but records every batch: with the
    module's accumulate_grad_batches=4 each rate was recorded 4 times and the suggestion
    (taken where the slope is steepest) set model.lr to ~1e-7."""
    model = char_lm(accumulate_grad_batches=4)
    trainer = tiny_trainer(max_epochs=1)
    with pytest.raises(ValueError, match=r"accumulate_grad_batches=4: Lightning's lr_find .* search with "
                                         r"accumulate_grad_batches=1"):
        Tuner(trainer).lr_find(model, train_dataloaders=batches_loader(seeded_batches(30)), num_training=20)
    tiny_trainer(max_epochs=1).fit(model, batches_loader(seeded_batches(4)))  # a fit is fine


def test_a_fit_after_an_unfinished_one_starts_from_no_gradients():
    """A fit that stopped inside an accumulation cycle (an exception; lr_find with the
    module's accumulation, before that was refused) left gradients and the module's count
    of backward passes, and the next fit stepped early with them. It now matches a fresh
    model's fit."""
    def fitted(search: bool):
        torch.manual_seed(0)
        model = char_lm(optimizer=functools.partial(torch.optim.SGD, lr=0.1), tbptt_steps=3,
                        accumulate_grad_batches=2)
        if search:
            model._backwards_since_step = 1  # as a search ending mid-cycle leaves it
            for p in model.parameters():
                p.grad = torch.ones_like(p)
        tiny_trainer(max_epochs=1).fit(model, batches_loader(seeded_batches(3)))
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


def test_gradient_accumulation_scheduler_is_refused_naming_the_module_argument():
    trainer = tiny_trainer(max_epochs=1, callbacks=[GradientAccumulationScheduler({0: 2})])
    with pytest.raises(ValueError, match="GradientAccumulationScheduler: .* accumulate_grad_batches="):
        trainer.fit(char_lm(), batches_loader(seeded_batches(2)))


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
