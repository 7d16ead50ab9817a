"""What gets measured: one workload (shapes) run by several implementations.

A :class:`Workload` fixes the cell, the stack and the batch; :func:`build_subjects`
turns it into one :class:`Subject` per implementation, all computing the same function
(weights copied from one torch.nn module):

- ``ours`` / ``ours:<backend>``: FusedLSTM/FusedGRU with ``backend="auto"`` or the named one;
- ``torch``: torch.nn.LSTM/GRU itself;
- ``naive``: the cell loop of :mod:`lightning_rnn.bench.baselines` (autograd throughout);
- ``gemm``: the GEMMs alone (:mod:`lightning_rnn.bench.gemm_only`), no memory figure;
- modifiers ``+ckpt`` (gradient checkpointing) and ``+bf16`` (autocast), see
  :mod:`lightning_rnn.bench.implementations`.

A subject's ``step`` is one forward + backward (input gradient included, parameter
gradients dropped afterwards so every call does the same work); ``saved_bytes`` counts
the activation memory of one forward.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

from ..kernels import dispatch
from ..layers import FusedGRU, FusedLSTM, FusedRNNBase
from ..kernels.checkpointing import chunk_length
from ..utils.memory import saved_tensor_bytes
from .baselines import CellLoop
from .gemm_only import GemmOnly
from .implementations import ImplSpec, parse_impl

FUSED = {"lstm": FusedLSTM, "gru": FusedGRU}
TORCH = {"lstm": nn.LSTM, "gru": nn.GRU}


@dataclass(frozen=True)
class Workload:
    """Shapes of one measurement. Input (T, B, I) time-major; ``lengths`` makes it packed."""

    cell: str
    num_layers: int
    hidden_size: int
    input_size: int
    batch: int
    seq_len: int
    lengths: tuple[int, ...] | None = None  # per sequence, longest = seq_len; None: all full
    device: str = "cpu"
    proj_size: int = 0  # LSTM: torch.nn's projection of h (ours and torch only)

    @property
    def packed(self) -> bool:
        return self.lengths is not None

    @property
    def batch_sizes(self) -> list[int]:
        """Rows of each time step, as in a PackedSequence."""
        if self.lengths is None:
            return [self.batch] * self.seq_len
        return [sum(1 for n in self.lengths if n > t) for t in range(self.seq_len)]

    @property
    def tokens(self) -> int:
        """Real (non-padding) tokens."""
        return sum(self.batch_sizes)


@dataclass
class Subject:
    """One implementation of a workload, ready to time and to meter."""

    name: str
    step: Callable[[], None]  # one forward + backward
    saved_bytes: Callable[[], int] | None = None  # activation bytes of one forward; None: not meaningful
    backend: str = ""  # the kernel backend "ours" resolved to
    extra: dict = field(default_factory=dict)  # e.g. {"gflop": ...} for gemm


def resolve_backend(spec: ImplSpec, device: str) -> tuple[str, str | None]:
    """(the concrete kernel backend of an ``ours`` implementation, the fallback warning or None).

    Raises :class:`~lightning_rnn.kernels.dispatch.BackendUnavailable` for a named
    backend that cannot be loaded here.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resolved = dispatch.resolve(spec.backend, torch.device(device))
    note = next((str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)), None)
    return resolved, note


def unavailable(spec: ImplSpec, device: str) -> str | None:
    """Why ``spec`` cannot run here (a missing feature or backend), or None if it can."""
    if "ckpt" in spec.modifiers and "checkpoint_chunk_size" not in inspect.signature(FusedRNNBase.__init__).parameters:
        return f"{spec.name}: the fused layers have no checkpoint_chunk_size yet"
    if spec.is_ours and spec.backend != "auto":
        try:
            dispatch.resolve(spec.backend, torch.device(device))
        except (dispatch.BackendUnavailable, ModuleNotFoundError) as err:
            return f"{spec.name}: backend {spec.backend!r} unavailable ({err})"
    if "bf16" in spec.modifiers and spec.base == "torch":
        failure = _torch_bf16_failure(device)
        if failure:
            return f"{spec.name}: torch.nn.LSTM fails under bf16 autocast here ({failure})"
    return None


@functools.lru_cache(maxsize=None)
def _torch_bf16_failure(device: str) -> str | None:
    """The error torch.nn.LSTM raises under bf16 autocast on ``device`` (on CPUs without
    native bf16, oneDNN: "could not create a primitive descriptor"), or None if it runs."""
    layer = nn.LSTM(4, 4).to(device)
    try:
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            layer(torch.randn(2, 1, 4, device=device))
    except RuntimeError as err:
        return str(err).splitlines()[0][:120]
    return None


def checkpoint_chunk(seq_len: int, chunk_size: int | None) -> int:
    """The chunk size '+ckpt' uses: ``chunk_size`` or the layer's "sqrt", ceil(sqrt(T)) (memory ~ sqrt(T))."""
    return chunk_size or chunk_length("sqrt", seq_len)


def build_subjects(
    workload: Workload, implementations: Sequence[str], *, checkpoint_chunk_size: int | None = None
) -> dict[str, Subject]:
    """One Subject per implementation name, all with the same weights and input values."""
    projection = {"proj_size": workload.proj_size} if workload.proj_size else {}  # torch.nn.GRU refuses the key
    ref = TORCH[workload.cell](workload.input_size, workload.hidden_size, workload.num_layers, **projection)
    ref = ref.to(workload.device)
    x = torch.randn(workload.seq_len, workload.batch, workload.input_size, device=workload.device)  # (T, B, I)
    chunk = checkpoint_chunk(workload.seq_len, checkpoint_chunk_size)
    return {impl: _build(parse_impl(impl), workload, ref, x, chunk) for impl in implementations}


def _build(spec: ImplSpec, workload: Workload, ref: nn.Module, x: torch.Tensor, chunk: int) -> Subject:
    autocast = torch.bfloat16 if "bf16" in spec.modifiers else None
    if workload.proj_size and spec.base in ("naive", "gemm"):
        raise ValueError(f"implementations: {spec.base!r} has no projection (proj_size); use ours or torch")
    if spec.base == "gemm":
        plan = GemmOnly(
            workload.cell, workload.input_size, workload.hidden_size, workload.num_layers,
            workload.batch_sizes, device=workload.device, dtype=autocast or torch.float32,
        )  # fmt: skip
        return Subject(spec.name, plan.run, None, extra={"gflop": plan.flops / 1e9})
    module, backend = _module(spec, workload, ref, chunk)
    inp = _input(x, workload)
    device_type = torch.device(workload.device).type
    ctx = (lambda: torch.autocast(device_type, dtype=autocast)) if autocast else contextlib.nullcontext
    params = list(module.parameters())
    leaf = inp.data if isinstance(inp, PackedSequence) else inp
    grads: list[torch.Tensor] = []  # the output gradient, made on the first call (output's shape and dtype)

    def step() -> None:
        with ctx():
            out = _output(module(inp))
        if not grads:
            grads.append(torch.randn_like(out))
        out.backward(grads[0])
        for p in params:
            p.grad = None
        leaf.grad = None

    def saved_bytes() -> int:
        with ctx():
            return saved_tensor_bytes(lambda: _output(module(inp)), exclude=module)

    return Subject(spec.name, step, saved_bytes, backend)


def _module(spec: ImplSpec, workload: Workload, ref: nn.Module, chunk: int) -> tuple[nn.Module, str]:
    """(the module that runs ``spec``, with ``ref``'s weights; the kernel backend ours resolved to)."""
    if spec.base == "naive":
        if workload.packed:
            raise ValueError("implementations: 'naive' cannot run packed (variable-length) batches")
        return CellLoop.like(ref), ""
    if spec.base == "torch":
        return copy.deepcopy(ref), ""
    backend, _ = resolve_backend(spec, workload.device)
    module = FUSED[workload.cell].from_torch(ref, backend=spec.backend)
    if "ckpt" in spec.modifiers:
        module.checkpoint_chunk_size = chunk
    return module, backend


def _input(x: torch.Tensor, workload: Workload):
    """A fresh leaf requiring grad: the padded (T, B, I) batch or its PackedSequence."""
    if not workload.packed:
        return x.clone().requires_grad_(True)
    lengths = torch.tensor(workload.lengths)
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    data = packed.data.detach().clone().requires_grad_(True)  # a leaf: no unpacking in backward
    return PackedSequence(data, packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices)


def _output(result) -> torch.Tensor:
    """The output sequence as a tensor, from (out, state) or out, padded or packed."""
    out = result[0] if isinstance(result, tuple) else result
    return out.data if isinstance(out, PackedSequence) else out



def runnable(implementations: Sequence[str], device: str) -> tuple[list[str], list[str]]:
    """(the implementations that can run here, notes on the ones skipped and on backend fallbacks).

    The backend each ``ours`` really runs is a column of every row (``backend``).
    """
    keep, notes = [], []
    for name in implementations:
        spec = parse_impl(name)
        reason = unavailable(spec, device)
        if reason:
            notes.append(f"skipped {reason}")
            continue
        keep.append(name)
        if spec.is_ours:
            backend, fallback = resolve_backend(spec, device)
            if fallback:
                notes.append(f"{name} runs the {backend!r} backend: {fallback}")
    return keep, list(dict.fromkeys(notes))


def point_params(workload: Workload, subjects: dict[str, Subject]) -> dict:
    """The parameter columns of a table row for this workload."""
    params = {
        "cell": workload.cell,
        "layers": workload.num_layers,
        "hidden": workload.hidden_size,
        **({"proj": workload.proj_size} if workload.proj_size else {}),
        "input": workload.input_size,
        "batch": workload.batch,
        "seq_len": workload.seq_len,
        "tokens": workload.tokens,
    }
    backends = {s.backend for s in subjects.values() if s.backend}
    if backends:
        params["backend"] = "/".join(sorted(backends))
    for s in subjects.values():
        if "gflop" in s.extra:
            params["gemm_gflop"] = s.extra["gflop"]
    return params
