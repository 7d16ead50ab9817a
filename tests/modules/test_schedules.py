"""BudgetCosine: warm-up and cosine over the run's budget, given in steps, epochs or time."""
import functools
import math
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.callbacks import Callback, Timer
from modules_helpers import batches_loader, char_lm, tiny_trainer, token_batches

from lightning_rnn.modules.schedules import BudgetCosine, trainer_progress


def _scheduler(**kwargs):
    return BudgetCosine(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0), **kwargs)


def test_the_factor_warms_up_linearly_then_follows_the_cosine_to_its_floor():
    s = _scheduler(warmup_steps=4, min_ratio=0.1)
    assert [s.factor(k, 0.0) for k in range(5)] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0])
    assert s.factor(10, 0.5) == pytest.approx(0.1 + 0.9 * 0.5)
    assert s.factor(10, 1.0) == pytest.approx(0.1) and s.factor(10, 2.0) == pytest.approx(0.1)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="min_ratio"):
        _scheduler(min_ratio=1.5)
    with pytest.raises(ValueError, match="warmup_steps"):
        _scheduler(warmup_steps=-1)


class Rates(Callback):
    def __init__(self):
        self.rates = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.rates.append(trainer.optimizers[0].param_groups[0]["lr"])


@pytest.mark.parametrize("bound", ["max_steps", "max_epochs"])
def test_a_fit_follows_its_steps_or_epochs_to_the_floor(bound):
    """Eight batches per epoch: 16 optimizer steps as max_steps=16 or as max_epochs=2; the
    rate falls along the cosine and ends near the floor, whichever bound is given."""
    torch.manual_seed(0)
    scheduler = functools.partial(BudgetCosine, warmup_steps=0, min_ratio=0.1)
    model = char_lm(scheduler=scheduler)
    rates = Rates()
    limits = dict(max_steps=16) if bound == "max_steps" else dict(max_epochs=2)
    tiny_trainer(callbacks=[rates], **limits).fit(model, batches_loader(token_batches(8)))
    want = [1e-2 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * k / 16))) for k in range(16)]
    assert rates.rates == pytest.approx(want, rel=1e-6)


def test_progress_follows_the_timer_of_a_time_budget():
    """With max_time only, the progress is the Timer's elapsed share of the budget."""
    timer = Timer(duration="00:00:01:40")  # 100 s
    timer.time_elapsed = lambda stage="train": 25.0
    trainer = SimpleNamespace(estimated_stepping_batches=float("inf"), global_step=10, callbacks=[timer])
    assert trainer_progress(trainer) == pytest.approx(0.25)
    trainer.estimated_stepping_batches = 20  # and a step bound that ends it first
    assert trainer_progress(trainer) == pytest.approx(0.5)


def test_the_state_dict_holds_no_callable():
    s = _scheduler(progress=lambda: 0.5)
    assert "progress" not in s.state_dict()
    torch.save(s.state_dict(), __import__("io").BytesIO())
