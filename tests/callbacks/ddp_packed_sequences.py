"""PackedSequences under 2-process DDP on CPU (gloo); run by test_packed_sequences_ddp.py.

``python ddp_packed_sequences.py OUT_DIR``: Lightning starts the second process by running this
script again. Each process trains twice, with the train dataloader from a DataModule hook and
then passed to ``fit`` directly, and saves what it saw to ``OUT_DIR/{source}.rank{rank}.pt``.
"""
import sys
from pathlib import Path

import torch
from lightning.pytorch import LightningDataModule, Trainer
from torch.utils.data import DataLoader

from callback_helpers import TinyClassifier, VariableLengthDataset, pad_collate
from lightning_rnn.callbacks import PackedSequences

N, BATCH, EPOCHS, MIN_LEN, MAX_LEN = 64, 4, 2, 2, 40  # 8 batches per process per epoch


class IndexedDataset(VariableLengthDataset):
    def __getitem__(self, i):
        return {**super().__getitem__(i), "index": i}


def collate(items):
    batch = pad_collate(items)
    batch["index"] = torch.tensor([it["index"] for it in items])
    return batch


def make_loader() -> DataLoader:
    dataset = IndexedDataset(N, min_len=MIN_LEN, max_len=MAX_LEN)
    return DataLoader(dataset, batch_size=BATCH, shuffle=True, collate_fn=collate)


class Data(LightningDataModule):
    def train_dataloader(self):
        return make_loader()


class Recorder(TinyClassifier):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.seen[-1].update(epoch=self.current_epoch, index=batch["index"].tolist(), loss=float(loss))
        return loss


def train(source: str, out: Path) -> None:
    torch.manual_seed(0)
    model = Recorder()
    model.rnn.backend = "reference"  # no kernel build
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=EPOCHS, callbacks=[PackedSequences()],
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0,
    )
    if source == "hook":
        trainer.fit(model, datamodule=Data())
    else:
        trainer.fit(model, train_dataloaders=make_loader())
    batch_sampler = trainer.train_dataloader.batch_sampler
    torch.save({
        "world_size": trainer.world_size,
        "global_step": trainer.global_step,
        "samplers": (type(batch_sampler).__name__, type(batch_sampler.sampler).__name__),
        "seen": [{k: s[k] for k in ("epoch", "index", "lengths", "loss", "packed")} for s in model.seen],
        "initial": initial,
        "final": model.state_dict(),
    }, out / f"{source}.rank{trainer.global_rank}.pt")


if __name__ == "__main__":
    for source in ("hook", "loader"):
        train(source, Path(sys.argv[1]))
