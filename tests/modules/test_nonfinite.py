"""A training loss or gradient that is not finite (``nonfinite_loss``): the run stops naming the
step, or skips it; no checkpoint ever holds weights that are not finite."""
import functools
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from modules_helpers import batches_loader, char_lm, rnn_factory, tiny_trainer, token_batches

from lightning_rnn.modules.nonfinite import NonFiniteLossError

SGD = functools.partial(torch.optim.SGD, lr=0.5, momentum=0.9)
HERE = Path(__file__).resolve().parent


def poison_losses(model, calls, value=float("nan")):
    """The training loss of the ``calls``-th training calls of compute_loss (counted from 0)
    times ``value``: a NaN (or inf) loss, from a graph whose backward would spread it."""
    compute_loss, count = model.compute_loss, [0]

    def poisoned(predictions, batch):
        loss = compute_loss(predictions, batch)
        if model.training:
            count[0] += 1
            if count[0] - 1 in calls:
                loss = loss * value
        return loss
    model.compute_loss = poisoned


class RecordWeights(pl.Callback):
    """Every parameter, and SGD's momentum buffers, after each training batch."""

    def __init__(self):
        self.weights, self.momenta = [], []

    def on_train_batch_end(self, trainer, module, *args):
        self.weights.append({k: v.detach().clone() for k, v in module.state_dict().items()})
        state = trainer.optimizers[0].state
        self.momenta.append([state[p]["momentum_buffer"].clone() for p in module.parameters() if p in state])


def saved_weights(path):
    return torch.load(path, weights_only=True)["state_dict"]


def checkpoints(tmp_path):
    return ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1, save_last=True, filename="{step}")


def test_a_nan_loss_stops_the_run_naming_the_step_and_the_checkpoints_keep_the_step_before(tmp_path):
    model = char_lm(optimizer=SGD)
    poison_losses(model, {3})
    record = RecordWeights()
    trainer = tiny_trainer(max_epochs=1, callbacks=[record, checkpoints(tmp_path)], enable_checkpointing=True)
    with pytest.raises(NonFiniteLossError, match=r"the training loss is nan at global step 3 \(epoch 0, batch 3\)"):
        trainer.fit(model, batches_loader(token_batches(6)))
    assert len(record.weights) == 3 and trainer.global_step == 3  # the step of batch 3 never ran
    last = saved_weights(tmp_path / "last.ckpt")
    for name, value in model.state_dict().items():
        assert torch.isfinite(value).all(), name
        assert torch.equal(last[name], value) and torch.equal(record.weights[-1][name], value), name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "step=1.ckpt", "step=2.ckpt", "step=3.ckpt"]


@pytest.mark.parametrize("value", [float("inf"), float("-inf")])
def test_an_infinite_loss_is_an_error_too(value):
    model = char_lm()
    poison_losses(model, {0}, value)
    with pytest.raises(NonFiniteLossError, match=r"the training loss is -?inf at global step 0 \(epoch 0, batch 0\)"):
        tiny_trainer(max_epochs=1).fit(model, batches_loader(token_batches(2)))


def test_gradients_that_overflow_under_a_finite_loss_stop_the_run_before_the_step(tmp_path):
    model = char_lm(optimizer=SGD)
    record = RecordWeights()
    weight = model.output_layer.module.weight
    weight.register_hook(lambda grad: grad * math.inf if len(record.weights) == 2 else grad)
    trainer = tiny_trainer(max_epochs=1, callbacks=[record, checkpoints(tmp_path)], enable_checkpointing=True)
    with pytest.raises(NonFiniteLossError, match=r"the gradients are not finite at global step 2 \(epoch 0, batch 2\)"):
        trainer.fit(model, batches_loader(token_batches(4)))
    last = saved_weights(tmp_path / "last.ckpt")
    for name, value in model.state_dict().items():
        assert torch.isfinite(value).all() and torch.equal(last[name], value), name


@pytest.mark.parametrize("tbptt_steps", [None, 4], ids=["automatic", "tbptt"])
def test_a_checkpoint_refuses_weights_that_are_not_finite_and_leaves_the_last_one(tmp_path, tbptt_steps):
    """Weights broken outside the loss (here by a callback, before the checkpoint callback saves):
    the save raises before it writes, also with the checks off."""
    class BreakWeights(pl.Callback):
        def on_train_batch_end(self, trainer, module, *args):
            if trainer.global_step == 4:
                with torch.no_grad():
                    module.output_layer.module.bias[0] = float("nan")

    model = char_lm(nonfinite_loss=None, tbptt_steps=tbptt_steps)
    trainer = tiny_trainer(max_epochs=1, callbacks=[BreakWeights(), checkpoints(tmp_path)], enable_checkpointing=True)
    with pytest.raises(NonFiniteLossError, match=r"not saving a checkpoint at global step 4 .*"
                                                 r"output_layer\.module\.bias is not finite"):
        trainer.fit(model, batches_loader(token_batches(4)))
    checkpoint = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == (3 if tbptt_steps is None else 2)  # a step per batch, or per chunk (2)
    assert all(torch.isfinite(v).all() for v in checkpoint["state_dict"].values())


def test_skip_leaves_the_weights_and_the_optimizer_as_they_were(tmp_path):
    """SGD with momentum: a step on zero gradients would still move the weights; the skipped
    batch's step moves nothing. The batches after it train on."""
    model = char_lm(optimizer=SGD, nonfinite_loss="skip")
    poison_losses(model, {2})
    record = RecordWeights()
    logged = []

    class Logged(pl.Callback):
        def on_train_batch_end(self, trainer, *args):
            logged.append(float(trainer.callback_metrics["train/skipped_steps"]))

    trainer = tiny_trainer(max_epochs=1, callbacks=[record, Logged(), checkpoints(tmp_path)],
                           enable_checkpointing=True)
    trainer.fit(model, batches_loader(token_batches(5)))
    before, skipped, after = record.weights[1], record.weights[2], record.weights[3]
    for name in before:
        assert torch.equal(skipped[name], before[name]), name
    assert any(not torch.equal(after[name], skipped[name]) for name in before)
    assert record.momenta[1]
    for kept, was in zip(record.momenta[2], record.momenta[1], strict=True):
        assert torch.equal(kept, was)
    assert all(torch.isfinite(m).all() for m in record.momenta[-1])
    assert logged == [0, 0, 1, 1, 1]
    assert trainer.global_step == 5 and model.nonfinite.skipped == 1
    assert all(torch.isfinite(v).all() for v in saved_weights(tmp_path / "last.ckpt").values())


def test_a_skipped_batch_inside_an_accumulation_adds_nothing_to_it():
    """Two batches a step: the step of a cycle with a skipped batch applies the other batch's
    gradients, exactly as a zero loss in its place does."""
    weights = []
    for skip in (True, False):
        torch.manual_seed(0)
        model = char_lm(optimizer=SGD, nonfinite_loss="skip" if skip else "error")
        poison_losses(model, {1}, float("nan") if skip else 0.0)
        torch.manual_seed(1)
        trainer = tiny_trainer(max_epochs=1, accumulate_grad_batches=2)
        trainer.fit(model, batches_loader(token_batches(4)))
        assert trainer.global_step == 2
        weights.append(model.state_dict())
    for name, value in weights[1].items():
        assert torch.equal(weights[0][name], value), name


def test_skip_with_tbptt_leaves_the_chunk_out_and_starts_the_next_from_zeros():
    """Three chunks a batch; the second chunk of the first batch is skipped: no step for it (5 of
    6 steps), and the third chunk starts from a zero state rather than the skipped one's."""
    class RecordStarts(torch.nn.Module):
        def __init__(self, rnn):
            super().__init__()
            self.rnn, self.starts = rnn, []

        def forward(self, x, hx=None):
            self.starts.append(hx)
            return self.rnn(x, hx)

    model = char_lm(tbptt_steps=4, nonfinite_loss="skip", rnn=rnn_factory(backend="auto"))
    model.rnn = recorder = RecordStarts(model.rnn)
    starts = recorder.starts
    poison_losses(model, {1})
    trainer = tiny_trainer(max_epochs=1)
    trainer.fit(model, batches_loader(token_batches(2, steps=12)))
    assert trainer.global_step == 5 and model.nonfinite.skipped == 1
    assert starts[0] is None and starts[1] is not None and starts[2] is None and starts[4] is not None
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_the_setting_is_checked():
    with pytest.raises(ValueError, match="nonfinite_loss: expected one of 'error', 'skip', got 'warn'"):
        char_lm(nonfinite_loss="warn")


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory) -> dict[str, list[dict]]:
    """action -> what ranks 0 and 1 saved (ddp_nonfinite.py: rank 1's loss is NaN at batch 2)."""
    runs = {}
    for action in ("skip", "error"):
        out = tmp_path_factory.mktemp(f"ddp_{action}")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parents[1]),
                                                            os.environ.get("PYTHONPATH", "")]),
               "OMP_NUM_THREADS": "1"}
        env.pop("MASTER_PORT", None)  # Lightning picks a free port
        # a session of its own, so that a hang (rank 1 is Lightning's child, not ours) is ended as a whole
        process = subprocess.Popen([sys.executable, str(HERE / "ddp_nonfinite.py"), str(out), action], cwd=out,
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True)
        try:
            output, _ = process.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            output = "(a process still ran after 240 s: a collective that one rank never joined)"
        finally:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        assert process.returncode == 0, f"exit {process.returncode}\n{output[-3000:]}"
        runs[action] = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    return runs


def test_under_ddp_one_process_s_nan_skips_the_step_on_both(ddp_runs):
    """Lightning refuses a training step that returns None under DDP; the skipped batch
    backpropagates zeros instead, and neither process's step moves a weight."""
    for saved in ddp_runs["skip"]:
        assert saved["error"] is None and saved["skipped"] == 1 and len(saved["weights"]) == 4
        before, skipped, after = saved["weights"][1:4]
        assert all(torch.equal(skipped[k], v) for k, v in before.items())
        assert any(not torch.equal(after[k], v) for k, v in skipped.items())
    rank0, rank1 = ddp_runs["skip"]
    for name, value in rank0["weights"][-1].items():
        assert torch.equal(rank1["weights"][-1][name], value), name


def test_under_ddp_one_process_s_nan_stops_both(ddp_runs):
    rank0, rank1 = ddp_runs["error"]
    assert "the training loss is nan at global step 2 (epoch 0, batch 2)" in rank1["error"]
    assert "the training loss is finite here but not on another process at global step 2" in rank0["error"]
    assert len(rank0["weights"]) == len(rank1["weights"]) == 2
