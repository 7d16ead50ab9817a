"""``nonfinite_loss`` under 2-process DDP on CPU (gloo); run by test_nonfinite.py.

``python ddp_nonfinite.py OUT_DIR ACTION``: Lightning starts the second process by running this
script again. Only rank 1's loss is NaN, at its batch 2; each process saves what it saw to
``OUT_DIR/rank{rank}.pt``: its weights after every batch and, for ``error``, the error's message.
"""
import sys
from pathlib import Path

import torch
from lightning.pytorch import Callback, Trainer
from modules_helpers import batches_loader, char_lm, token_batches

from lightning_rnn.modules.nonfinite import NonFiniteLossError

POISONED_RANK, POISONED_BATCH, BATCHES = 1, 2, 8  # DistributedSampler: 4 batches a process


class Record(Callback):
    def __init__(self):
        self.weights = []

    def on_train_batch_end(self, trainer, module, *args):
        self.weights.append({k: v.detach().clone() for k, v in module.state_dict().items()})


def main(out: Path, action: str) -> None:
    torch.manual_seed(0)
    model = char_lm(optimizer=lambda params: torch.optim.SGD(params, lr=0.5, momentum=0.9), nonfinite_loss=action)
    compute_loss = model.compute_loss

    def poisoned(predictions, batch):
        loss = compute_loss(predictions, batch)
        poison = model.global_rank == POISONED_RANK and model.nonfinite.batch_idx == POISONED_BATCH
        return loss * float("nan") if poison else loss
    model.compute_loss = poisoned
    record = Record()
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, callbacks=[record], logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0)
    torch.manual_seed(1)  # the same batches on both processes, which Lightning's DistributedSampler splits
    batches = token_batches(BATCHES)
    saved = {"error": None}
    try:
        trainer.fit(model, batches_loader(batches))
    except NonFiniteLossError as err:
        saved["error"] = str(err)
    saved.update(rank=trainer.global_rank, weights=record.weights, skipped=model.nonfinite.skipped)
    torch.save(saved, out / f"rank{trainer.global_rank}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
