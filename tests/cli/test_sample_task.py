"""task=sample: streamed text, several samples, and nothing written but the text."""
import functools
import io

import lightning.pytorch as pl
import pytest
import torch
from cli_helpers import compose_config, run_cli
from torch.utils.data import DataLoader

from lightning_rnn import FusedLSTM
from lightning_rnn.modules import CharLanguageModel
from lightning_rnn.tasks import sample

VOCAB = "\nabcdef "


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A char LM (2 x 16 LSTM on the default backend) after one optimizer step."""
    torch.manual_seed(0)
    rnn = functools.partial(FusedLSTM, hidden_size=16, num_layers=2)
    model = CharLanguageModel(vocab=VOCAB, embedding_dim=6, rnn=rnn, optimizer=functools.partial(torch.optim.Adam),
                              val_sample_length=0)
    batches = [{"inputs": torch.randint(0, len(VOCAB), (2, 8)), "targets": torch.randint(0, len(VOCAB), (2, 8))}]
    trainer = pl.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu")
    trainer.fit(model, DataLoader(batches, batch_size=None))
    path = tmp_path_factory.mktemp("model") / "model.ckpt"
    trainer.save_checkpoint(path)
    return path


class Recorder(io.StringIO):
    """stdout that also keeps each write."""

    def __init__(self):
        super().__init__()
        self.writes = []

    def write(self, text):
        self.writes.append(text)
        return super().write(text)


def test_one_sample_is_written_as_it_is_generated(checkpoint, tmp_path, monkeypatch):
    cfg = compose_config(tmp_path, ["task=sample", f"ckpt_path={checkpoint}", "sample.length=200",
                                    "sample.start_text=ab", "sample.seed=3"])
    out = Recorder()
    monkeypatch.setattr("sys.stdout", out)
    text = sample.run(cfg)
    assert out.getvalue() == text + "\n" and text.startswith("ab") and len(text) == 202
    assert out.writes[0] == "ab" and len(out.writes) > 4  # the start, then chunks of steps, then "\n"


def test_several_samples_with_top_p_and_a_stop_string(checkpoint, tmp_path, monkeypatch):
    cfg = compose_config(tmp_path, ["task=sample", f"ckpt_path={checkpoint}", "sample.length=300",
                                    "sample.start_text=ab", "sample.num_samples=3", "sample.top_p=0.9",
                                    "sample.stop=ee", "sample.separator=|", "sample.seed=1"])
    out = Recorder()
    monkeypatch.setattr("sys.stdout", out)
    texts = sample.run(cfg)
    assert out.getvalue() == "".join(t + "|" for t in texts) and len(texts) == 3
    model = CharLanguageModel.load_from_checkpoint(checkpoint)
    assert texts == model.sample("ab", 300, 0.8, None, 1, top_p=0.9, num_samples=3, stop="ee")
    assert all("ee" not in t for t in texts)


def test_the_cli_writes_the_text_and_nothing_else(checkpoint, tmp_path):
    """No run directory, config copy or log file in the working directory."""
    result = run_cli(["task=sample", f"ckpt_path={checkpoint}", "sample.length=40", "sample.start_text=abc"], tmp_path)
    assert result.stdout.startswith("abc") and len(result.stdout) == 3 + 40 + 1
    assert list(tmp_path.iterdir()) == []
