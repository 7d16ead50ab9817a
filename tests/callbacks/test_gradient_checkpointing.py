"""GradientCheckpointing: switches the fused layers on and off; same training, less memory."""
import pytest
import torch

from lightning_rnn.callbacks import GPUMemoryLogger, GradientCheckpointing

from callback_helpers import TinyClassifier, loader, make_trainer


def _fit(callbacks, seed=0):
    torch.manual_seed(seed)
    model = TinyClassifier(num_layers=3, dropout=0.2)
    trainer, logger = make_trainer([*callbacks, GPUMemoryLogger(every_n_steps=1)], max_steps=3)
    trainer.fit(model, loader(n=24, shuffle=False))
    return model, logger


def test_same_training_and_less_activation_memory():
    plain, plain_log = _fit([])
    ckpt, ckpt_log = _fit([GradientCheckpointing("sqrt", modules=["head"])])
    assert [s["chunk_size"] for s in ckpt.seen] == ["sqrt"] * 3
    assert ckpt.rnn.checkpoint_chunk_size is None and "forward" not in vars(ckpt.head)  # restored
    for p, q in zip(plain.parameters(), ckpt.parameters(), strict=True):  # dropout included
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.tensor(ckpt_log.values("train/loss")), torch.tensor(plain_log.values("train/loss")))
    plain_mb, ckpt_mb = plain_log.values("memory/activation_mb"), ckpt_log.values("memory/activation_mb")
    assert len(ckpt_mb) == 3 and all(c < 0.35 * p for c, p in zip(ckpt_mb, plain_mb))


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(chunk_size=0), ValueError, r"chunk_size: expected 'sqrt' or an int >= 1, got 0"),  # None is refused
    (dict(chunk_size=None), ValueError, "chunk_size: expected 'sqrt' or an int >= 1, got None"),
    (dict(chunk_size="half"), ValueError, "chunk_size"),
    (dict(modules="head"), TypeError, "modules: expected a list"),
    (dict(modules=None), TypeError, "modules: expected a list of submodule names, got None"),  # was 'not iterable'
])
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        GradientCheckpointing(**kwargs)


def test_unknown_submodule_is_an_error():
    trainer, _ = make_trainer([GradientCheckpointing(4, modules=["decoder"])], max_steps=1)
    with pytest.raises(ValueError, match="modules: TinyClassifier has no submodule 'decoder'"):
        trainer.fit(TinyClassifier(), loader(n=8))


def test_wrapping_a_fused_layer_in_torch_checkpoint_too_warns():
    trainer, _ = make_trainer([GradientCheckpointing(4, modules=["rnn"])], max_steps=1)
    with pytest.warns(UserWarning, match="modules: 'rnn' is or holds a FusedLSTM/FusedGRU"):
        trainer.fit(TinyClassifier(), loader(n=8))


def test_layers_on_torch_nn_s_kernels_are_said_to_run_without_it():
    model = TinyClassifier()
    model.rnn.backend = "torch"
    trainer, _ = make_trainer([GradientCheckpointing(4)], max_steps=1)
    with pytest.warns(UserWarning, match="1 of the 1 fused layer.s. run backend='torch'"):
        trainer.fit(model, loader(n=8))
