"""What the kernels need to know of a cell type: its gates, its states, its options."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CellSpec:
    name: str  # "lstm" or "gru": the backends' entry point, and torch's op (torch._VF.<name>)
    num_gates: int  # G: weight_ih is (G*H, I)
    num_states: int  # 2 for (h, c), 1 for h
    projects: bool = False  # accepts proj_size > 0 (torch.nn: LSTM only)


LSTM = CellSpec(name="lstm", num_gates=4, num_states=2, projects=True)
GRU = CellSpec(name="gru", num_gates=3, num_states=1)
