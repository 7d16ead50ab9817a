"""GPUMemoryLogger: where the memory of a training step goes, to any logger.

Every ``every_n_steps`` training batches (the first, then one in every_n_steps; batches,
not optimizer steps) it measures one batch and logs, under ``memory/``:

- on CUDA: ``{phase}_peak_allocated_mb`` / ``{phase}_peak_reserved_mb`` for the phases
  ``forward`` (batch start, or the end of an optimizer step, -> before backward),
  ``backward`` (-> after backward) and ``optimizer`` (after backward -> the end of the
  optimizer step: unscaling, clipping, the step), resetting the peak stats at each phase
  start. With truncated BPTT or accumulation a batch repeats the phases (one forward and
  backward per chunk, steps between some of them); each is logged as its peak over the
  batch; ``bytes_per_token`` (step peak allocated / tokens in the batch);
  ``num_ooms`` and ``num_alloc_retries`` (cumulative, from torch.cuda.memory_stats);
- on any device: ``activation_mb``, the bytes the fused layers saved for backward in the
  step's forward (:class:`~lightning_rnn.utils.memory.SavedTensorsMeter` around each
  FusedLSTM/FusedGRU call), and ``activation_bytes_per_token``;
- on CPU: ``rss_mb`` (resident set size of the process), ``peak_rss_mb``, and
  ``kernel_pool_mb``: the part of ``rss_mb`` that the cpp kernels keep mapped, idle, for their
  next call (at most ``LIGHTNING_RNN_POOL_MB``, 256 MiB by default;
  :func:`lightning_rnn.kernels.cpp.release_pool` frees it).

With ``snapshot_path`` (CUDA only) it records the allocator history from setup and
writes a snapshot (``torch.cuda.memory._dump_snapshot``) at the end of training, which
https://pytorch.org/memory_viz opens.

Tokens per batch: ``lengths.sum()`` of a dict batch with ``lengths``, else the first
two dims of ``inputs`` (or of the first tensor in the batch: padding counts there). With
truncated BPTT ``activation_mb`` sums the step's chunks, of which one is alive at a time.

Torch 2.4.1 (not 2.13) skips, in the backward of a measured batch, the ``register_hook``
hooks on a fused layer's weights: it skips them for a leaf that an autograd.Function saved
under a saved-tensors hook, as the meter is. The gradients are right, and hooks after
accumulation (``register_post_accumulate_grad_hook``) run.
"""
from __future__ import annotations

import resource
from pathlib import Path

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn
from torch.nn.utils.rnn import PackedSequence

from ..kernels import cpp
from ..utils.checks import check_int
from ..utils.memory import SavedTensorsMeter
from .fused_layers import fused_layers

PHASES = ("forward", "backward", "optimizer")
_MB = 2.0**20


def _proc_status_bytes(field: str) -> int | None:
    """A ``kB`` field of /proc/self/status (Linux), in bytes; None elsewhere."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (VmHWM; getrusage's ru_maxrss elsewhere)."""
    peak = _proc_status_bytes("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def process_rss_bytes() -> int:
    """Resident set size of this process now (VmRSS; the peak where /proc is missing)."""
    rss = _proc_status_bytes("VmRSS")
    return rss if rss is not None else peak_rss_bytes()


def batch_tokens(batch) -> int:
    """Tokens in a batch: sum of ``lengths``, or B*T of the inputs."""
    if isinstance(batch, dict):
        if "lengths" in batch:
            return int(batch["lengths"].sum())
        if "inputs" in batch:
            batch = batch["inputs"]
    if isinstance(batch, PackedSequence):
        return int(batch.batch_sizes.sum())
    if isinstance(batch, (list, tuple)) and batch:
        batch = batch[0]
    if isinstance(batch, dict) and batch:
        batch = next(iter(batch.values()))
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0] * (batch.shape[1] if batch.dim() > 1 else 1))
    return 0


class GPUMemoryLogger(Callback):
    """Log peak memory per phase (CUDA), activation bytes of the fused layers, RSS (CPU).

    Args:
        every_n_steps: measure one training batch in this many.
        snapshot_path: CUDA: file for a memory snapshot of the run (None: no snapshot).
        snapshot_max_entries: allocator events kept for the snapshot.
    """

    def __init__(self, every_n_steps: int = 50, snapshot_path: str | None = None, snapshot_max_entries: int = 100_000):
        self.every_n_steps = check_int("every_n_steps", every_n_steps, 1)
        self.snapshot_path = snapshot_path
        self.snapshot_max_entries = check_int("snapshot_max_entries", snapshot_max_entries, 1)
        self._measuring = False
        self._meters: list[SavedTensorsMeter] = []
        self._handles = []
        self._metrics: dict[str, float] = {}
        self._recording = False
        self._batches_seen = 0  # training batches since fit started
        self._open_phase: str | None = None  # the phase whose peak is being measured

    # ----- set-up -------------------------------------------------------------------
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.snapshot_path is not None and stage == "fit" and not self._recording:
            if self._cuda(trainer):
                # the folder now: a bad path fails before the run, not after it
                Path(self.snapshot_path).parent.mkdir(parents=True, exist_ok=True)
                torch.cuda.memory._record_memory_history(max_entries=self.snapshot_max_entries)
                self._recording = True
            else:
                rank_zero_warn("GPUMemoryLogger: snapshot_path needs a CUDA device; no snapshot will be written")

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # here, not in setup: layers a module builds in configure_model() or setup() exist now
        if self._handles:
            return
        self._batches_seen = 0
        layers = fused_layers(pl_module)
        for layer in layers:
            self._handles.append(layer.register_forward_pre_hook(self._enter_meter))
            # always_call: a forward that raises still closes its meter (a saved-tensors hook
            # left open would see every tensor the process saves for backward from then on)
            self._handles.append(layer.register_forward_hook(self._exit_meter, always_call=True))
        # The end of each optimizer step closes the "optimizer" phase: with manual optimization
        # (truncated BPTT) the next chunk's forward follows it within the same batch.
        for optimizer in trainer.optimizers:
            self._handles.append(optimizer.register_step_post_hook(lambda *_: self._after_optimizer_step(trainer)))
        if not trainer.loggers:
            rank_zero_warn("GPUMemoryLogger: the Trainer has no logger; nothing will be logged")
        elif not layers:
            rank_zero_warn(
                "GPUMemoryLogger: the model has no FusedLSTM/FusedGRU layers; memory/activation_mb stays 0 "
                "(other layers' saved activations are not measured)"
            )

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        while self._meters:  # open only if a run stopped inside a measured forward
            self._meters.pop().__exit__(None, None, None)
        self._measuring = False

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        # Lightning skips teardown and on_train_end when a run raises
        self.teardown(trainer, pl_module, "fit")
        if self._recording:
            torch.cuda.memory._record_memory_history(enabled=None)
            self._recording = False

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._recording:
            torch.cuda.memory._dump_snapshot(self.snapshot_path)
            torch.cuda.memory._record_memory_history(enabled=None)
            self._recording = False

    @staticmethod
    def _cuda(trainer: Trainer) -> bool:
        return trainer.strategy.root_device.type == "cuda"

    # ----- activation bytes of the fused layers --------------------------------------
    def _enter_meter(self, layer, args) -> None:
        if self._measuring and torch.is_grad_enabled():
            meter = SavedTensorsMeter(exclude=layer)
            meter.__enter__()
            self._meters.append(meter)

    def _exit_meter(self, layer, args, output) -> None:
        if self._measuring and torch.is_grad_enabled() and self._meters:
            meter = self._meters.pop()
            meter.__exit__(None, None, None)
            self._activation_bytes += meter.bytes

    # ----- phases ---------------------------------------------------------------------
    def _phase_start(self, trainer: Trainer, phase: str) -> None:
        self._open_phase = phase
        if self._cuda(trainer):
            torch.cuda.reset_peak_memory_stats()

    def _phase_end(self, trainer: Trainer, phase: str) -> None:
        self._open_phase = None
        if self._cuda(trainer):
            allocated, reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
            for kind, value in (("allocated", allocated), ("reserved", reserved)):
                key = f"{phase}_peak_{kind}_mb"  # max over the step's repeats of the phase (TBPTT chunks)
                self._metrics[key] = max(self._metrics.get(key, 0.0), value / _MB)
            self._step_peak = max(self._step_peak, allocated)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int) -> None:
        self._measuring = self._batches_seen % self.every_n_steps == 0
        self._batches_seen += 1
        if self._measuring:
            self._metrics, self._activation_bytes, self._step_peak = {}, 0, 0
            self._tokens, self._step = batch_tokens(batch), trainer.global_step
            self._phase_start(trainer, "forward")

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss) -> None:
        if self._measuring:  # from the batch start, a step's end or (accumulating) the last backward
            self._phase_end(trainer, "forward")
            self._phase_start(trainer, "backward")

    def on_after_backward(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._measuring:
            self._phase_end(trainer, "backward")
            self._phase_start(trainer, "optimizer")

    def _after_optimizer_step(self, trainer: Trainer) -> None:
        if self._measuring and self._open_phase == "optimizer":
            self._phase_end(trainer, "optimizer")
            self._phase_start(trainer, "forward")  # the next chunk's, if the batch has one

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        if not self._measuring:
            return
        self._measuring = False
        if self._open_phase == "optimizer":  # no step since the last backward (accumulating)
            self._phase_end(trainer, "optimizer")
        self._open_phase = None  # after the batch's last step: nothing of the step's phases
        metrics = dict(self._metrics)
        tokens = max(self._tokens, 1)
        metrics["activation_mb"] = self._activation_bytes / _MB
        metrics["activation_bytes_per_token"] = self._activation_bytes / tokens
        if self._cuda(trainer):
            stats = torch.cuda.memory_stats()
            metrics["bytes_per_token"] = self._step_peak / tokens
            metrics["num_ooms"] = float(stats.get("num_ooms", 0))
            metrics["num_alloc_retries"] = float(stats.get("num_alloc_retries", 0))
        else:
            metrics["rss_mb"] = process_rss_bytes() / _MB
            metrics["peak_rss_mb"] = peak_rss_bytes() / _MB
            metrics["kernel_pool_mb"] = cpp.pool_idle_bytes() / _MB
        # Straight to the loggers (as Lightning's DeviceStatsMonitor does): self.log would repeat
        # the last value at every step in between.
        for logger in trainer.loggers:
            logger.log_metrics({f"memory/{k}": float(v) for k, v in metrics.items()}, step=self._step)
