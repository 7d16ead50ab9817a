"""Exact resumption: a run resumed with ``Trainer.fit(..., ckpt_path=...)`` from a checkpoint
continues as the uninterrupted run did: the same losses and weights, bit for bit.

Every case runs with the reference backend in float64 and with the default backend
(``"auto"``: the cpp kernel on a CPU) in float32, as the command line trains. The tolerance
is zero in both: a checkpoint holds the float32 weights, optimizer state and carried state
exactly, and on one intra-op thread (tests/conftest.py) the kernel computes the same values
from the same inputs in the same order, so a resumed run that differs in any bit has
restored something wrongly (a float32 rounding difference would show within a step)."""
import functools

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint
from modules_helpers import char_lm, rnn_factory, tiny_trainer

from lightning_rnn.callbacks import PackedSequences
from lightning_rnn.data import CharCorpusDataModule, ForecastingDataModule, SequenceClassificationDataModule
from lightning_rnn.kernels import dispatch
from lightning_rnn.modules import SequenceClassifier, SequenceRegressor


SGD = functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9)

#: backend -> the precision its runs train in: the executable spec in float64, the default as the CLI runs it.
BACKENDS = {"reference": "64-true", "auto": "32-true"}
backends = pytest.mark.parametrize("backend", list(BACKENDS))


class RecordLosses(Callback):
    def __init__(self):
        self.seen = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.seen.append((trainer.current_epoch, batch_idx, trainer.global_step, float(outputs["loss"])))


def fit(make, max_steps, root, ckpt_path=None, save_step=None, callbacks=list, precision="64-true", **trainer_args):
    """Losses of every batch (epoch, batch, global step, loss) and the final weights of a fit of
    ``make()``'s (model, datamodule) in ``precision`` with ``callbacks()``, seeded as a new
    process with the same command is."""
    pl.seed_everything(0, verbose=False)
    model, data = make()
    if precision == "64-true":
        model = model.double()  # before the restore: Trainer(precision="64-true") would cast after it
    record = RecordLosses()
    callbacks = [record, *callbacks()]
    if save_step is not None:
        callbacks.append(ModelCheckpoint(dirpath=root, every_n_train_steps=save_step, save_top_k=-1,
                                         filename="{step}"))
    trainer = tiny_trainer(max_steps=max_steps, precision=precision, callbacks=callbacks, limit_val_batches=0,
                           enable_checkpointing=save_step is not None, default_root_dir=root, **trainer_args)
    trainer.fit(model, datamodule=data, ckpt_path=ckpt_path)
    return record.seen, model.state_dict()


def assert_resumes_exactly(tmp_path, make, max_steps, save_step, **trainer_args):
    whole, whole_weights = fit(make, max_steps, tmp_path / "whole", save_step=save_step, **trainer_args)
    assert len({float(seen[3]) for seen in whole}) > 1  # it trained
    saved_after = next(i for i, seen in enumerate(whole) if seen[2] >= save_step)
    resumed, resumed_weights = fit(make, max_steps, tmp_path / "resumed",
                                   ckpt_path=tmp_path / "whole" / f"step={save_step}.ckpt", **trainer_args)
    assert resumed == whole[saved_after + 1:]
    for name, value in whole_weights.items():
        assert torch.equal(resumed_weights[name], value), name
    return whole


def test_the_default_backend_here_is_the_compiled_kernel():
    """What the "auto" cases run: the cpp kernel, not a fallback to the reference."""
    assert dispatch.resolve("auto", torch.device("cpu")) == "cpp"


@pytest.fixture
def char_data(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("abcab cabba acbca " * 50)

    def make():
        return CharCorpusDataModule(path=str(path), batch_size=3, seq_len=8)
    return make


@pytest.mark.parametrize(("module_args", "trainer_args", "max_steps", "save_step"), [
    # 3 chunks a batch, a step every 2: the checkpoint at step 4 (after batch 2) has one chunk's gradients
    (dict(tbptt_steps=3), dict(accumulate_grad_batches=2), 9, 4),
    (dict(stateful=True), {}, 8, 3),  # the state carried into batch 3
    (dict(stateful=True), dict(accumulate_grad_batches=2), 5, 2),  # Lightning's accumulation, batches 3-4 next
    (dict(stateful=True, tbptt_steps=3), dict(accumulate_grad_batches=2, gradient_clip_val=0.05), 9, 4),
])
@backends
def test_a_char_lm_resumed_mid_epoch_continues_as_the_uninterrupted_run(tmp_path, char_data, module_args,
                                                                        trainer_args, max_steps, save_step, backend):
    def make():
        data = char_data()
        data.setup()
        rnn = rnn_factory(backend=backend)
        return char_lm(vocab=data.vocab.chars, rnn=rnn, optimizer=SGD, **module_args), data
    assert_resumes_exactly(tmp_path, make, max_steps, save_step, precision=BACKENDS[backend], **trainer_args)


def classification(backend="reference", **module_args):
    def make():
        data = SequenceClassificationDataModule(num_samples=60, num_classes=3, min_len=3, max_len=12, batch_size=8)
        data.setup()
        model = SequenceClassifier(**data.model_kwargs(), rnn=rnn_factory(hidden_size=6, backend=backend),
                                   optimizer=SGD, **module_args)
        return model, data
    return make


@pytest.mark.parametrize("save_step", [3, 6], ids=["mid-epoch", "end-of-epoch"])  # 6 batches an epoch
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@backends
def test_a_shuffled_classification_run_resumes_with_the_batches_and_order_it_had(tmp_path, save_step, packed,
                                                                                 backend):
    """The train loader shuffles from the seed and the epoch, and skips an epoch's batches already
    seen (a plain shuffling DataLoader started the resumed epoch over in another order)."""
    callbacks = lambda: [PackedSequences(bucket_size=16)] if packed else []  # noqa: E731
    assert_resumes_exactly(tmp_path, classification(backend), 14, save_step, callbacks=callbacks,
                           precision=BACKENDS[backend])


@backends
def test_a_forecaster_resumed_mid_epoch_continues_as_the_uninterrupted_run(tmp_path, backend):
    def make():
        data = ForecastingDataModule(num_steps=200, input_len=8, horizon=2, batch_size=16)
        data.setup()
        rnn = rnn_factory(hidden_size=6, backend=backend)
        return SequenceRegressor(**data.model_kwargs(), rnn=rnn, optimizer=SGD), data
    assert_resumes_exactly(tmp_path, make, 12, 4, precision=BACKENDS[backend])


def test_a_checkpoint_on_an_epoch_s_last_batch_resumes_its_epoch_schedulers(tmp_path, recwarn):
    """Saved after an epoch's last batch but before its end (every_n_train_steps = the batches
    of an epoch): the resumed run steps the epoch's scheduler, which Lightning, counting that
    epoch as done, never ends (the learning rate had stayed a step behind), without torch's
    warning that a scheduler stepped before the optimizer (its optimizer steps came before
    the checkpoint)."""
    halving = functools.partial(torch.optim.lr_scheduler.StepLR, step_size=1, gamma=0.5)
    make = classification(scheduler=halving, scheduler_interval="epoch")
    assert_resumes_exactly(tmp_path, make, 14, 6)
    # and again from such a checkpoint written by a resumed run (whose first epoch had no start)
    whole, whole_weights = fit(make, 20, tmp_path / "whole")
    fit(make, 20, tmp_path / "first", ckpt_path=tmp_path / "whole" / "step=6.ckpt", save_step=6)
    again, again_weights = fit(make, 20, tmp_path / "again", ckpt_path=tmp_path / "first" / "step=12.ckpt")
    assert again == [seen for seen in whole if seen[2] > 12]
    for name, value in whole_weights.items():
        assert torch.equal(again_weights[name], value), name
    assert not [w for w in recwarn if "lr_scheduler.step()" in str(w.message)]
