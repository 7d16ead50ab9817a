"""The recurrent state a ``stateful`` module carries from one batch into the next."""
from __future__ import annotations

import torch
from lightning.pytorch.utilities import rank_zero_warn

from ..data.samplers import reorders_rows
from .batches import sequences_in
from .state import State, detach_state, state_batch_size


class CarriedState:
    """Per stage ("train", "val", "test"), the detached final state of the last batch, which
    starts the next batch when ``enabled`` (torch-rnn's remember_states). A batch of another
    size than the last (a short final batch) starts from zeros; each epoch starts from
    zeros (:meth:`reset`)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._states: dict[str, State] = {}

    def initial(self, stage: str, batch: dict) -> State:
        """The state ``batch`` starts from: the carried one if it fits, else None (zeros)."""
        state = self._states.get(stage) if self.enabled else None
        return state if state_batch_size(state) == sequences_in(batch) else None

    def keep(self, stage: str, state: State) -> None:
        if self.enabled:
            self._states[stage] = detach_state(state)

    def reset(self, stage: str) -> None:
        self._states.pop(stage, None)

    def state_dict(self, trainer) -> dict:
        """For a checkpoint written in the middle of a training epoch: the state the next
        batch starts from, and the number of processes (each carries its own rows, and a
        checkpoint holds rank 0's). Empty after an epoch's last batch: the next epoch
        starts from zeros."""
        carried = self._states.get("train")
        if carried is None or trainer is None or trainer.is_last_batch:
            return {}
        return {"carried_state": carried, "world_size": trainer.world_size}

    def load_state_dict(self, state: dict, world_size: int, device: torch.device) -> None:
        """Carry on from a checkpoint's state: in a run of one process, as it was written."""
        carried = state.get("carried_state")
        if carried is None or not self.enabled or not world_size == state.get("world_size") == 1:
            return
        self._states["train"] = carried.to(device) if isinstance(carried, torch.Tensor) \
            else tuple(s.to(device) for s in carried)

    def check_loader(self, loader) -> None:
        """A warning where the train loader's rows do not continue one another."""
        if self.enabled and reorders_rows(loader):
            rank_zero_warn(
                "stateful=True carries each batch row's state into the same row of the next batch, "
                "which needs rows that continue one another (ContiguousStreams); this train "
                "dataloader shuffles (or buckets by length), so the carried state comes from unrelated "
                "sequences (set stateful=False)"
            )
