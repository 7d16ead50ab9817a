"""Time-step bookkeeping for one direction of one recurrent layer.

Every backend works on the *packed, time-major* layout that ``torch.nn.utils.rnn``
uses: the rows of step ``t`` are ``data[offset[t] : offset[t] + batch_sizes[t]]``,
``batch_sizes`` is non-increasing, and row ``b`` of a step is sequence ``b`` of the
length-sorted batch. A full (unpadded) batch is the special case
``batch_sizes == [B] * T``; then ``data`` is just ``x.view(T * B, I)``.

At step ``t`` only the first ``batch_sizes[t]`` rows are computed, so the cost of a
layer follows the real tokens, not the padding.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch


@dataclass(frozen=True)
class Steps:
    """The schedule of one direction: which rows each step touches, in which order."""

    batch_sizes: tuple[int, ...]
    reverse: bool

    @classmethod
    def from_batch_sizes(cls, batch_sizes: torch.Tensor, reverse: bool) -> "Steps":
        return cls(tuple(int(b) for b in batch_sizes.tolist()), bool(reverse))

    @cached_property
    def offsets(self) -> tuple[int, ...]:
        """offsets[t]: first row of step t in the packed data."""
        out, total = [], 0
        for n in self.batch_sizes:
            out.append(total)
            total += n
        return tuple(out)

    @property
    def num_rows(self) -> int:
        return sum(self.batch_sizes)

    @property
    def batch(self) -> int:
        return self.batch_sizes[0]

    def order(self) -> range:
        """Steps in the order the recurrence visits them."""
        T = len(self.batch_sizes)
        return range(T - 1, -1, -1) if self.reverse else range(T)

    def rows(self, t: int) -> slice:
        """The packed rows of step t."""
        return slice(self.offsets[t], self.offsets[t] + self.batch_sizes[t])

    def sequence_index(self, device: torch.device) -> torch.Tensor:
        """(N,) the sequence (row of the length-sorted batch) each token belongs to."""
        return torch.cat([torch.arange(n) for n in self.batch_sizes]).to(device)

    def prev_index(self, device: torch.device) -> torch.Tensor:
        """(N,) index of each token's previous state in ``cat([init (B rows), states (N rows)])``.

        The previous state of token (t, b) is the state after the step visited before
        t, if row b was active there, else the initial state of row b. Used by the
        backward pass to gather h_{t-1} (and c_{t-1}) for all tokens at once.
        """
        T, B = len(self.batch_sizes), self.batch
        parts = []
        for t in range(T):
            n = self.batch_sizes[t]
            p = t + 1 if self.reverse else t - 1
            rows = torch.arange(n)
            if 0 <= p < T:
                m = min(self.batch_sizes[p], n)
                parts.append(torch.where(rows < m, B + self.offsets[p] + rows, rows))
            else:
                parts.append(rows)
        return torch.cat(parts).to(device)


def gather_prev(init: torch.Tensor, states: torch.Tensor, prev_index: torch.Tensor) -> torch.Tensor:
    """(N, H) state before each token: rows of ``cat([init, states])`` picked by ``prev_index``."""
    return torch.cat([init, states]).index_select(0, prev_index)
