"""AtomicCheckpointIO: a checkpoint file is the previous one or the new one, whole, whatever
happens during a save."""
import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

from lightning_rnn.utils.checkpoint_io import AtomicCheckpointIO

REPO = Path(__file__).resolve().parents[2]


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("cannot pickle this")


def checkpoint(value: float) -> dict:
    return {"state_dict": {"w": torch.full((1000,), value)}, "global_step": int(value)}


def files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.fixture
def saved(tmp_path):
    """A good checkpoint at tmp_path/last.ckpt, and its bytes."""
    path = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint(checkpoint(1.0), path)
    return path, path.read_bytes()


def test_a_save_replaces_the_file_with_one_from_the_same_directory(saved, monkeypatch):
    """The new file is written beside the target (one filesystem: the rename is atomic), then
    renamed over it; nothing else is left in the directory."""
    path, _ = saved
    renames = []
    replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: renames.append((Path(src), Path(dst))) or replace(src, dst))
    AtomicCheckpointIO().save_checkpoint(checkpoint(2.0), path)
    ((source, target),) = renames
    assert source.parent == target.parent == path.parent and target == path
    assert torch.load(path, weights_only=True)["global_step"] == 2
    assert files(path.parent) == ["last.ckpt"]


@pytest.mark.parametrize("failure", ["pickling", "disk full"])
def test_a_save_that_fails_midway_leaves_the_previous_file(saved, monkeypatch, failure):
    """A failure while the new file is written (an object that does not pickle, after the
    tensors; a full disk when it is flushed) leaves the previous checkpoint as it was, and no
    temporary file."""
    path, before = saved
    new = checkpoint(2.0)
    if failure == "pickling":
        new["callbacks"] = {"broken": Unpicklable()}
    else:
        def no_space(fd):
            raise OSError(errno.ENOSPC, "No space left on device")
        monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises((RuntimeError, OSError)):
        AtomicCheckpointIO().save_checkpoint(new, path)
    assert path.read_bytes() == before
    assert files(path.parent) == ["last.ckpt"]


def test_a_process_killed_while_saving_leaves_the_previous_file(saved):
    """SIGKILL after the new file is written and flushed, before the rename: the previous
    checkpoint is whole; the next save removes the killed process's temporary file."""
    path, before = saved
    script = textwrap.dedent(f"""
        import os, time, torch
        from lightning_rnn.utils.checkpoint_io import AtomicCheckpointIO

        def stall(src, dst):
            open({str(path.parent / "renaming")!r}, "w").close()
            time.sleep(600)
        os.replace = stall
        AtomicCheckpointIO().save_checkpoint({{"state_dict": {{"w": torch.full((1000,), 3.0)}}}}, {str(path)!r})
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([sys.executable, "-c", script], env=env)
    try:
        while not (path.parent / "renaming").exists():
            assert process.poll() is None, f"the saving process exited with {process.returncode}"
            time.sleep(0.05)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert path.read_bytes() == before
    (left,) = [name for name in files(path.parent) if name.endswith(".tmp")]
    assert left.startswith(".last.ckpt.")
    AtomicCheckpointIO().save_checkpoint(checkpoint(4.0), path)
    assert files(path.parent) == ["last.ckpt", "renaming"]


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch).square().mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_trainer_s_failing_save_keeps_its_last_checkpoint(tmp_path):
    """ModelCheckpoint(save_last=True) through the plugin: the third save fails while it writes
    (a callback's state that does not pickle); last.ckpt still holds step 2."""
    class BreaksTheThirdSave(pl.Callback):
        def __init__(self):
            self.saves = 0

        def state_dict(self):  # read before on_save_checkpoint, at each save
            return {"broken": Unpicklable()} if self.saves == 2 else {}

        def on_save_checkpoint(self, trainer, module, checkpoint):
            self.saves += 1

    trainer = pl.Trainer(max_steps=4, plugins=[AtomicCheckpointIO()], logger=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[
                             ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_last=True, save_top_k=0),
                             BreaksTheThirdSave()])
    with pytest.raises(RuntimeError, match="cannot pickle this"):
        trainer.fit(Tiny(), DataLoader(torch.randn(8, 2), batch_size=2))
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 2
    assert files(tmp_path) == ["last.ckpt"]
