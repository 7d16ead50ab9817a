"""The plain PyTorch script a practitioner writes for a char-LSTM: the bar the recipes beat.

    python recipes/reference_script.py --data PATH/tinyshakespeare.txt --minutes 10

torch.nn.LSTM, an embedding and a linear head, Adam at a constant rate, random chunks of the
training text, gradient values clipped, validation every --val-every seconds. It scores the
same validation characters as the recipes (the data module's split, the last 5 % but the
test part, read as 50 streams with the state carried) and counts its validation in the
budget, as a Trainer's max_time does. Not part of the package: a baseline for
recipes/README.md.
"""
import argparse
import time

import torch
from torch import nn

from lightning_rnn.data import CharCorpusDataModule


class CharLSTM(nn.Module):
    def __init__(self, vocab: int, hidden: int, layers: int, dropout: float, embedding: int = 64):
        super().__init__()
        self.embed = nn.Embedding(vocab, embedding)
        self.lstm = nn.LSTM(embedding, hidden, layers, batch_first=True, dropout=dropout)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, x, state=None):
        out, state = self.lstm(self.embed(x), state)
        return self.head(out), state


@torch.no_grad()
def validate(model, ids: torch.Tensor, streams: int = 50, seq_len: int = 50) -> float:
    """Mean nats/char over ``ids`` read as ``streams`` contiguous streams, state carried."""
    model.eval()
    per_stream = (len(ids) - 1) // streams
    x = ids[: streams * per_stream].view(streams, per_stream)
    y = ids[1 : streams * per_stream + 1].view(streams, per_stream)
    state, total, count = None, 0.0, 0
    for t in range(0, per_stream - seq_len + 1, seq_len):
        logits, state = model(x[:, t : t + seq_len], state)
        total += nn.functional.cross_entropy(logits.flatten(0, 1), y[:, t : t + seq_len].flatten(), reduction="sum")
        count += y[:, t : t + seq_len].numel()
    model.train()
    return float(total / count)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True)
    p.add_argument("--minutes", type=float, default=10)
    p.add_argument("--hidden", type=int, default=384)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dropout", type=float, default=0.2)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--batch", type=int, default=50)
    p.add_argument("--seq-len", type=int, default=50)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--val-every", type=float, default=60, help="seconds between validations")
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    data = CharCorpusDataModule(path=args.data, batch_size=50, seq_len=50)
    data.setup("fit")
    train, val = data.datasets["train"], data.datasets["val"]
    model = CharLSTM(len(data.vocab.chars), args.hidden, args.layers, args.dropout)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    start = next_val = time.monotonic()
    budget, best, step = args.minutes * 60, float("inf"), 0
    while time.monotonic() - start < budget:
        starts = torch.randint(0, len(train) - args.seq_len - 1, (args.batch,))
        chunk = torch.stack([train[s : s + args.seq_len + 1] for s in starts.tolist()])
        logits, _ = model(chunk[:, :-1])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_value_(model.parameters(), 5.0)
        optimizer.step()
        step += 1
        now = time.monotonic()
        if now >= next_val or now - start >= budget:
            best = min(best, validate(model, val))
            next_val = time.monotonic() + args.val_every
            print(f"{(time.monotonic() - start) / 60:5.1f} min  step {step}  train {loss.item():.3f}  "
                  f"best val {best:.4f} nats/char", flush=True)
    print(f"final: best val {best:.4f} nats/char after {step} steps in {args.minutes:g} minutes")


if __name__ == "__main__":
    main()
