"""MixedPrecision: RNN-aware autocast with dynamic loss scaling for fp16.

Design. Lightning runs ``training_step`` / ``validation_step`` / ``test_step`` /
``predict_step`` inside its precision plugin's ``forward_context()``, and routes
``backward`` (``manual_backward`` too) and ``optimizer.step()`` through the plugin. So the
Lightning-native way to hook autocast is a precision plugin: :class:`RNNMixedPrecision`
is Lightning's own ``MixedPrecision`` plugin (autocast + ``torch.amp.GradScaler`` for
fp16) plus bookkeeping of the loss scale and of skipped steps. The callback installs it
in ``setup`` — before the strategy sets up the model and optimizers — and puts the
original plugin back in ``teardown`` (or ``on_exception``, when the run raises).

Composition with ``Trainer(precision=...)``:
- ``"32-true"`` (the default): the callback's plugin replaces the plain one;
- the matching mixed setting (``"bf16-mixed"`` for bf16, ``"16-mixed"`` for fp16): the
  Trainer's plugin is replaced by ours *with its scaler*, so there is exactly one
  autocast and one scaler (the callback's ``init_scale``/``growth_interval`` then must be
  left None: the Trainer's scaler has its own; giving them is a ValueError);
- anything else (the other dtype, ``"64-true"``, ``"bf16-true"``, ...): ValueError.

RNN-aware: under autocast the fused layers run their GEMMs in bf16/fp16, keep the cell
state and accumulations in fp32 and save the gates in the low precision
(:mod:`lightning_rnn.kernels.precision`); nothing else needs to change for them.

Logged (fp16, every training step): ``precision/loss_scale`` and
``precision/skipped_steps`` (optimizer steps skipped because of inf/NaN gradients, since the
run started: the count is saved in checkpoints with the scaler's state).
"""
from __future__ import annotations

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.plugins.precision import MixedPrecision as LightningMixedPrecision
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.plugins.precision import Precision

from ..utils.checks import check_choice, check_int, check_positive_number

_SKIPPED_KEY = "lightning_rnn_skipped_steps"  # beside the GradScaler's state in a checkpoint

# dtype name -> (torch dtype, Lightning's precision string)
DTYPES = {"bf16": (torch.bfloat16, "bf16-mixed"), "fp16": (torch.float16, "16-mixed")}


class RNNMixedPrecision(LightningMixedPrecision):
    """Lightning's autocast plugin that also counts the steps the GradScaler skipped."""

    def __init__(self, precision: str, device: str, scaler: torch.amp.GradScaler | None = None):
        super().__init__(precision, device, scaler)
        self.skipped_steps = 0

    def optimizer_step(self, optimizer, model, closure, **kwargs):
        if self.scaler is None:
            return super().optimizer_step(optimizer, model, closure, **kwargs)
        scale = self.scaler.get_scale()
        result = super().optimizer_step(optimizer, model, closure, **kwargs)
        # GradScaler.update() lowers the scale exactly when the step found inf/NaN and was skipped.
        if self.scaler.get_scale() < scale:
            self.skipped_steps += 1
        return result

    def state_dict(self) -> dict:
        """The scaler's state, and the skipped steps so far (they stay cumulative across a resume)."""
        state = super().state_dict()
        return {**state, _SKIPPED_KEY: self.skipped_steps} if self.scaler is not None else state

    def load_state_dict(self, state_dict: dict) -> None:
        state = dict(state_dict)
        self.skipped_steps = int(state.pop(_SKIPPED_KEY, 0))
        super().load_state_dict(state)

    @property
    def loss_scale(self) -> float | None:
        return None if self.scaler is None else self.scaler.get_scale()


class MixedPrecision(Callback):
    """Train under autocast in ``dtype``; fp16 gets dynamic loss scaling.

    Args:
        dtype: ``"bf16"`` (CPU and CUDA) or ``"fp16"`` (CUDA; GradScaler).
        init_scale: fp16's initial loss scale (None: 2**16).
        growth_interval: fp16: steps without inf/NaN before the scale doubles (None: 2000).
            Both configure the callback's own scaler, under ``Trainer(precision="32-true")``;
            with ``"16-mixed"`` the Trainer's scaler is used, and giving them is an error.
    """

    def __init__(self, dtype: str = "bf16", init_scale: float | None = None, growth_interval: int | None = None):
        check_choice("dtype", dtype, tuple(DTYPES))
        check_positive_number("init_scale", init_scale, optional=True)  # an inf scale never comes down
        check_int("growth_interval", growth_interval, 1, optional=True)
        given = [name for name, value in (("init_scale", init_scale), ("growth_interval", growth_interval))
                 if value is not None]
        if dtype != "fp16" and given:  # bf16 has fp32's range: no loss scaling, nothing to set
            raise ValueError(f"{given[0]}: sets fp16's loss scaling; {dtype!r} has none (leave it None)")
        self.dtype = dtype
        self.torch_dtype, self.lightning_precision = DTYPES[dtype]
        self.init_scale, self.growth_interval = init_scale, growth_interval
        self._original: Precision | None = None
        self.plugin: RNNMixedPrecision | None = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        current = trainer.strategy.precision_plugin
        if isinstance(current, RNNMixedPrecision) and current is self.plugin:
            return
        device = trainer.strategy.root_device.type
        if isinstance(current, LightningMixedPrecision):
            if current.precision != self.lightning_precision:
                raise ValueError(self._disagreement(current.precision, device))
            scaler = current.scaler  # compose: keep the Trainer's scaler, one autocast
            given = {k: v for k, v in (("init_scale", self.init_scale), ("growth_interval", self.growth_interval))
                     if v is not None}
            if scaler is not None and given:
                raise ValueError(
                    f"{next(iter(given))}: MixedPrecision({', '.join(f'{k}={v!r}' for k, v in given.items())}) "
                    f"cannot configure the loss scaler of Trainer(precision={current.precision!r}), which it "
                    "uses as it is; leave them None, or use Trainer(precision='32-true') for the callback's own scaler"
                )
        elif type(current) is Precision:  # precision="32-true"
            scaler = None
            if self.dtype == "fp16":
                scaler = torch.amp.GradScaler(
                    device,
                    init_scale=2.0**16 if self.init_scale is None else self.init_scale,
                    growth_interval=2000 if self.growth_interval is None else self.growth_interval,
                )
        else:
            raise ValueError(self._disagreement(getattr(current, "precision", type(current).__name__), device))
        if device == "cpu" and self.dtype == "fp16":
            rank_zero_warn(
                "MixedPrecision(dtype='fp16') on CPU: the model's fp16 matmuls outside the fused layers run in "
                "torch's fallback on most CPUs, many times slower than fp32 (Lightning itself runs "
                "precision='16-mixed' as bf16 on CPU); use dtype='bf16' on CPU."
            )
        if device == "cpu" and self.dtype == "bf16" and not _cpu_has_fast_bf16():
            rank_zero_warn(
                "MixedPrecision(dtype='bf16') on a CPU without a fast bf16 GEMM (oneDNN reports none): activation "
                "memory halves and the fused layers run their GEMMs in fp32 on bf16 values, but the model's "
                "other bf16 matmuls (nn.Linear, ...) run in torch's fallback, many times slower than fp32."
            )
        self._original = current
        self.plugin = RNNMixedPrecision(self.lightning_precision, device, scaler)
        trainer.strategy.precision_plugin = self.plugin

    def _disagreement(self, precision: str, device: str) -> str:
        # Lightning runs precision='16-mixed' as 'bf16-mixed' on CPU: there only '32-true' composes with
        # fp16, so '16-mixed' is not suggested (it would only lead to the error below)
        fp16_on_cpu = device == "cpu" and self.dtype == "fp16"
        converted = fp16_on_cpu and precision == "bf16-mixed"
        note = " (Lightning runs precision='16-mixed' as 'bf16-mixed' on CPU)" if converted else ""
        matching = "" if fp16_on_cpu else f" or precision={self.lightning_precision!r}"
        return (
            f"dtype: MixedPrecision(dtype={self.dtype!r}) disagrees with Trainer(precision={precision!r}){note}; "
            f"use Trainer(precision='32-true'){matching}, or drop one of the two"
        )

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        if self.plugin is None or self.plugin.scaler is None:
            return
        pl_module.log("precision/loss_scale", self.plugin.loss_scale, batch_size=1)
        pl_module.log("precision/skipped_steps", float(self.plugin.skipped_steps), batch_size=1)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self.teardown(trainer, pl_module, "fit")  # Lightning skips teardown when a run raises

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self._original is not None and trainer.strategy.precision_plugin is self.plugin:
            trainer.strategy.precision_plugin = self._original
        self._original, self.plugin = None, None


def _cpu_has_fast_bf16() -> bool:
    """Whether oneDNN runs bf16 natively on this CPU (else bf16 matmuls are emulated)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False
