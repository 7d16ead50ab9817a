"""torch-rnn's batch layout: every batch row reads its own contiguous stream of text."""
from __future__ import annotations

import torch
from torch.utils.data import IterableDataset, get_worker_info


class ContiguousStreams(IterableDataset):
    """Batches of ``(batch_size, seq_len)`` windows in which row ``b`` of batch ``i + 1``
    continues row ``b`` of batch ``i``, so a hidden state carried across batches sees
    unbroken text (torch-rnn / char-rnn's layout).

    The token sequence is cut into ``batch_size * world_size`` equal streams; process
    ``rank`` owns streams ``rank * batch_size ... (rank + 1) * batch_size - 1``. With one
    process and batch ``B * W``, or ``W`` processes and batch ``B`` each, the global
    batch is identical. Being an ``IterableDataset`` it yields whole batches
    (use ``DataLoader(batch_size=None)``) and Lightning does not re-shard it.

    Yields:
        dict with ``inputs`` and ``targets``: ``(batch_size, seq_len)`` int64, targets
        being the inputs shifted by one character.
    """

    def __init__(self, tokens: torch.Tensor, batch_size: int, seq_len: int, rank: int = 0, world_size: int = 1):
        super().__init__()
        if tokens.dim() != 1:
            raise ValueError(f"tokens: expected a 1-D tensor of ids, got shape {tuple(tokens.shape)}")
        for name, value in (("batch_size", batch_size), ("seq_len", seq_len), ("world_size", world_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank: expected 0 <= rank < world_size={world_size}, got {rank!r}")
        num_streams = batch_size * world_size
        self.num_batches = (tokens.numel() - 1) // (num_streams * seq_len)
        if self.num_batches < 1:
            raise ValueError(
                f"tokens: {tokens.numel()} tokens are too few for {num_streams} streams of seq_len={seq_len}"
            )
        used = num_streams * self.num_batches * seq_len
        streams = slice(rank * batch_size, (rank + 1) * batch_size)
        self.inputs = tokens[:used].view(num_streams, -1)[streams]  # (B, num_batches * seq_len)
        self.targets = tokens[1 : used + 1].view(num_streams, -1)[streams]
        self.seq_len = seq_len

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self):
        # DataLoader workers: worker k yields batches k, k + W, ...; the loader takes one from
        # each worker in turn, so the batches still arrive in order (each exactly once).
        info = get_worker_info()
        first, step = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(first, self.num_batches, step):
            window = slice(i * self.seq_len, (i + 1) * self.seq_len)
            yield {"inputs": self.inputs[:, window], "targets": self.targets[:, window]}
