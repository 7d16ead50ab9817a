"""GPUMemoryLogger on CPU: process RSS and the fused layers' activation bytes, every n steps."""
import pytest
import torch

from lightning_rnn.callbacks import GPUMemoryLogger
from lightning_rnn.callbacks.gpu_memory import batch_tokens
from lightning_rnn.utils.memory import saved_tensor_bytes

from callback_helpers import TinyClassifier, loader, make_trainer


def test_logs_rss_and_activation_bytes_every_n_steps():
    torch.manual_seed(0)
    model = TinyClassifier()
    trainer, logger = make_trainer([GPUMemoryLogger(every_n_steps=2)], max_steps=5)
    data = loader(n=40, batch_size=8, shuffle=False)
    trainer.fit(model, data)
    assert [step for step, _ in logger.history["memory/activation_mb"]] == [0, 2, 4]
    assert all(v > 50 for v in logger.values("memory/rss_mb"))
    assert all(p >= r for p, r in zip(logger.values("memory/peak_rss_mb"), logger.values("memory/rss_mb")))
    assert not any("peak_allocated" in k or "num_ooms" in k for k in logger.history)  # CUDA only

    # the first logged value is what the fused layer saves for that batch's padded forward
    batch = next(iter(data))
    fresh = TinyClassifier()
    fresh.load_state_dict(model.state_dict())
    expected = saved_tensor_bytes(lambda: fresh.rnn(batch["inputs"])[0], exclude=fresh.rnn)
    assert logger.values("memory/activation_mb")[0] * 2**20 == pytest.approx(expected)
    per_token = logger.values("memory/activation_bytes_per_token")[0]
    assert per_token == pytest.approx(expected / int(batch["lengths"].sum()))


def test_snapshot_on_cpu_warns_and_bad_interval_raises(tmp_path):
    with pytest.raises(ValueError, match="every_n_steps: expected an int >= 1, got 0"):
        GPUMemoryLogger(every_n_steps=0)
    trainer, _ = make_trainer([GPUMemoryLogger(snapshot_path=str(tmp_path / "snap.pickle"))], max_steps=1)
    with pytest.warns(UserWarning, match="snapshot_path needs a CUDA device"):
        trainer.fit(TinyClassifier(), loader(n=8))
    assert not (tmp_path / "snap.pickle").exists()


def test_batch_tokens():
    assert batch_tokens({"inputs": torch.zeros(3, 7, 2), "lengths": torch.tensor([7, 5, 1])}) == 13
    assert batch_tokens({"inputs": torch.zeros(3, 7, 2)}) == 21
    assert batch_tokens((torch.zeros(4, 6), torch.zeros(4))) == 24
