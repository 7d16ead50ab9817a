"""Measuring a set of subjects side by side, and turning the result into one table row.

Columns of a row: the point's parameters and ``rounds`` (timed rounds run), then per
implementation ``<impl>_ms`` (median fwd+bwd milliseconds), ``<impl>_bytes`` (activation
bytes saved for backward by one forward) and, on CUDA, ``<impl>_peak_bytes``
(torch.cuda.max_memory_allocated over one fwd+bwd, above what was allocated before); then
the ratios, ``time_<a>/<b>`` and ``mem_<a>/<b>`` (below 1: ``a`` is faster / smaller).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from .implementations import parse_impl
from .subjects import Subject
from .timing import interleave


@dataclass(frozen=True)
class Measured:
    time_s: float | None  # median seconds per fwd+bwd
    saved_bytes: int | None  # activation memory of one forward
    peak_bytes: int | None  # CUDA only: peak allocated during one fwd+bwd, above the baseline
    rounds: int = 0  # timed rounds behind time_s


def measure(
    subjects: Mapping[str, Subject], rounds: int, warmup: int, device: str, min_seconds: float = 0.0
) -> dict[str, Measured]:
    """Activation memory of each subject, then interleaved fwd+bwd medians (see :func:`interleave`)."""
    dev = torch.device(device)
    on_cuda = dev.type == "cuda"
    saved = {name: s.saved_bytes() if s.saved_bytes else None for name, s in subjects.items()}
    peaks = {name: _cuda_peak(s, dev) if on_cuda else None for name, s in subjects.items()}
    # the benchmark's GPU, not the current one (bench.device=cuda:1)
    sync = (lambda: torch.cuda.synchronize(dev)) if on_cuda else None
    timings = interleave({name: s.step for name, s in subjects.items()}, rounds, warmup, sync, min_seconds)
    return {name: Measured(timings.median(name), saved[name], peaks[name], timings.rounds) for name in subjects}


def _cuda_peak(subject: Subject, device: torch.device) -> int:
    """Peak bytes allocated on ``device`` during one fwd+bwd, above what was allocated before."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    subject.step()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - base


@dataclass(frozen=True)
class Ratio:
    metric: str  # "time" or "mem"
    num: str
    den: str

    @property
    def column(self) -> str:
        return f"{self.metric}_{self.num}/{self.den}"

    def value(self, measured: Mapping[str, Measured]) -> float | None:
        if self.num not in measured or self.den not in measured:
            return None
        a, b = (_metric(measured[n], self.metric) for n in (self.num, self.den))
        return None if a is None or not b else a / b


def _metric(m: Measured, metric: str):
    return m.time_s if metric == "time" else m.saved_bytes


def standard_ratios(implementations: Sequence[str]) -> list[Ratio]:
    """The comparisons worth a column, among the implementations present:

    plain ours (``ours``, ``ours:<backend>``) vs torch, naive and gemm; a modified ours
    (``ours+ckpt``) vs its plain self and vs naive; torch vs gemm. Memory ratios skip
    gemm (it has no activation memory).
    """
    present = set(implementations)
    pairs: list[tuple[str, str]] = []
    for name in implementations:
        spec = parse_impl(name)
        if spec.modifiers:
            pairs += [(name, b) for b in (spec.plain, "naive") if b in present]
        elif spec.is_ours:
            pairs += [(name, b) for b in ("torch", "naive", "gemm") if b in present]
    if {"torch", "gemm"} <= present:
        pairs.append(("torch", "gemm"))
    ratios = [Ratio("time", a, b) for a, b in pairs]
    ratios += [Ratio("mem", a, b) for a, b in pairs if "gemm" not in (a, b)]
    return ratios


def point_row(params: Mapping[str, object], measured: Mapping[str, Measured], ratios: Iterable[Ratio]) -> dict:
    """One flat table row: parameters, per-implementation figures, ratios."""
    row = dict(params)
    row["rounds"] = max((m.rounds for m in measured.values()), default=0)
    for name, m in measured.items():
        row[f"{name}_ms"] = None if m.time_s is None else m.time_s * 1e3
        if m.saved_bytes is not None:
            row[f"{name}_bytes"] = m.saved_bytes
        if m.peak_bytes is not None:
            row[f"{name}_peak_bytes"] = m.peak_bytes
    for r in ratios:
        row[r.column] = r.value(measured)
    return row


def summarize(row: Mapping[str, object]) -> str:
    """A one-line digest of a row: times in ms, then the time ratios."""
    times = ", ".join(f"{k[:-3]} {v:.1f} ms" for k, v in row.items() if k.endswith("_ms") and v is not None)
    ratios = ", ".join(f"{k[5:]} {v:.2f}" for k, v in row.items() if k.startswith("time_") and v is not None)
    return f"{times}; {ratios}"


@dataclass
class Table:
    """One section's results: rows of :func:`point_row`, written as ``<name>.csv`` / ``<name>.md``."""

    name: str
    title: str
    rows: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # skipped implementations, backend fallbacks
