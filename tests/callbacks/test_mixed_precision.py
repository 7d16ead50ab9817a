"""MixedPrecision: autocast through Lightning's plugin, loss scaling, composition with precision=."""
import pytest
import torch

from lightning_rnn.callbacks import GPUMemoryLogger, MixedPrecision, RNNMixedPrecision

from callback_helpers import TinyClassifier, loader, make_trainer

BF16_LOSS_TOLERANCE = 0.02  # |mean loss bf16 - fp32| over the run, in nats


def _fit(callbacks, max_steps=12, **trainer_kwargs):
    torch.manual_seed(0)
    model = TinyClassifier(hidden=32)
    trainer, logger = make_trainer([*callbacks, GPUMemoryLogger(every_n_steps=4)], max_steps=max_steps, **trainer_kwargs)
    trainer.fit(model, loader(n=48, batch_size=8, min_len=20, max_len=30))
    return model, trainer, logger


def test_bf16_close_to_fp32_with_less_activation_memory():
    fp32, _, fp32_log = _fit([])
    bf16, trainer, bf16_log = _fit([MixedPrecision("bf16")])
    assert all(s["autocast"] == torch.bfloat16 and s["logits_dtype"] == torch.bfloat16 for s in bf16.seen)
    assert all(s["autocast"] is False for s in fp32.seen)
    assert type(trainer.strategy.precision_plugin).__name__ == "Precision"  # restored after fit
    loss32, loss16 = torch.tensor(fp32_log.values("train/loss")), torch.tensor(bf16_log.values("train/loss"))
    assert (loss16.mean() - loss32.mean()).abs() <= BF16_LOSS_TOLERANCE
    act32, act16 = fp32_log.values("memory/activation_mb"), bf16_log.values("memory/activation_mb")
    assert len(act16) == 3 and all(a <= 0.65 * b for a, b in zip(act16, act32))
    assert "precision/loss_scale" not in bf16_log.history  # bf16 needs no scaler


def test_composes_with_the_matching_trainer_precision():
    callback = MixedPrecision("bf16")
    model, trainer, _ = _fit([callback], max_steps=2, precision="bf16-mixed")
    assert all(s["autocast"] == torch.bfloat16 for s in model.seen)
    assert trainer.strategy.precision_plugin.precision == "bf16-mixed"  # Lightning's own plugin back


@pytest.mark.parametrize("dtype, precision", [("fp16", "bf16-mixed"), ("bf16", "64-true"), ("bf16", "bf16-true")])
def test_disagreeing_trainer_precision_is_an_error(dtype, precision):
    trainer, _ = make_trainer([MixedPrecision(dtype)], max_steps=1, precision=precision)
    with pytest.raises(ValueError, match=rf"MixedPrecision\(dtype='{dtype}'\) disagrees with Trainer\(precision='{precision}'\)"):
        trainer.fit(TinyClassifier(), loader(n=8))


class InfAtSecondStep(TinyClassifier):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if batch_idx == 1:
            self.before_skip = [p.detach().clone() for p in self.parameters()]
            return loss * float("inf")
        if batch_idx == 2:
            self.after_skip = [p.detach().clone() for p in self.parameters()]
        return loss


def test_fp16_scales_the_loss_and_skips_inf_steps():
    torch.manual_seed(0)
    model = InfAtSecondStep()
    callback = MixedPrecision("fp16", init_scale=1024.0)
    trainer, logger = make_trainer([callback], max_steps=3)
    trainer.fit(model, loader(n=24))
    assert logger.values("precision/loss_scale") == [1024.0, 512.0, 512.0]
    assert logger.values("precision/skipped_steps") == [0.0, 1.0, 1.0]
    for p, q in zip(model.before_skip, model.after_skip):  # the inf step changed nothing
        torch.testing.assert_close(p, q, rtol=0, atol=0)


@pytest.mark.filterwarnings("ignore:MixedPrecision.dtype='fp16'. on CPU:UserWarning")
def test_fp16_composed_with_a_trainer_scaler_uses_it_and_refuses_its_own_settings():
    """With a Trainer's 16-mixed plugin (given as a plugin: Lightning turns precision='16-mixed'
    into bf16 on CPU) the callback uses the Trainer's scaler, and refuses an init_scale it
    could not apply."""
    from lightning.pytorch.plugins.precision import MixedPrecision as LightningMixedPrecision

    def trainer_plugin():
        return LightningMixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu", init_scale=256.0))

    trainer, logger = make_trainer([MixedPrecision("fp16")], max_steps=2, plugins=[trainer_plugin()])
    trainer.fit(TinyClassifier(), loader(n=16))
    assert logger.values("precision/loss_scale") == [256.0, 256.0]
    for kwargs in (dict(init_scale=1024.0), dict(growth_interval=1)):
        trainer, _ = make_trainer([MixedPrecision("fp16", **kwargs)], max_steps=2, plugins=[trainer_plugin()])
        name = next(iter(kwargs))
        match = rf"{name}: MixedPrecision\({name}=.*loss scaler of Trainer\(precision='16-mixed'\)"
        with pytest.raises(ValueError, match=match):
            trainer.fit(TinyClassifier(), loader(n=16))


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(dtype="fp8"), ValueError, "dtype: expected one of 'bf16', 'fp16', got 'fp8'"),
    (dict(init_scale=0), ValueError, "init_scale: expected None or a finite number > 0, got 0"),
    (dict(init_scale="1024"), TypeError, "init_scale: expected None or a finite number > 0, got '1024'"),
    (dict(init_scale=float("inf")), ValueError, "init_scale: expected None or a finite number > 0, got inf"),
    (dict(dtype=["bf16"]), TypeError, r"dtype: expected one of 'bf16', 'fp16', got \['bf16'\]"),
    (dict(growth_interval=0), ValueError, "growth_interval: expected None or an int >= 1"),
    (dict(growth_interval=2.5), TypeError, "growth_interval: expected None or an int >= 1, got 2.5"),
    (dict(init_scale=1024.0), ValueError, "init_scale: sets fp16's loss scaling; 'bf16' has none"),  # not ignored
    (dict(dtype="bf16", growth_interval=3), ValueError, "growth_interval: sets fp16's loss scaling; 'bf16' has none"),
])
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        MixedPrecision(**kwargs)


def test_plugin_is_lightnings_mixed_precision():
    plugin = RNNMixedPrecision("bf16-mixed", "cpu")
    with plugin.forward_context():
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert plugin.loss_scale is None and plugin.skipped_steps == 0
