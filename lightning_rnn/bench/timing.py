"""Interleaved timing of several implementations in one process.

These CPUs are shared and noisy, so absolute times mean little; what is reproducible is
the ratio of two implementations timed side by side. :func:`interleave` runs warm-up
rounds, then timed rounds in which every implementation runs once, each round in a fresh
random order (seeded, so a run is repeatable): which implementation runs just before
another matters (its allocations leave the allocator, and so the page faults, in another
state), and a rotating order kept the same neighbours in most rounds. Every sample is
kept; medians and ratios of medians are what the reports use.
"""
from __future__ import annotations

import gc
import random
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Timings:
    """Seconds per call of each implementation, one sample per timed round."""

    samples: dict[str, list[float]]

    def median(self, name: str) -> float:
        """Median seconds per call of ``name``."""
        return statistics.median(self.samples[name])

    def ratio(self, name: str, baseline: str) -> float:
        """median(name) / median(baseline): below 1 means ``name`` is faster."""
        return self.median(name) / self.median(baseline)

    def medians(self) -> dict[str, float]:
        return {name: self.median(name) for name in self.samples}

    @property
    def rounds(self) -> int:
        """Timed rounds run (every implementation once per round)."""
        return min(len(v) for v in self.samples.values())


def interleave(
    fns: Mapping[str, Callable[[], object]],
    rounds: int,
    warmup: int = 1,
    sync: Callable[[], None] | None = None,
    min_seconds: float = 0.0,
    seed: int = 0,
) -> Timings:
    """Time each callable ``rounds`` times, interleaved, after ``warmup`` untimed rounds.

    With ``min_seconds`` > 0, timed rounds go on past ``rounds`` until they have taken
    that long in all, so a fast workload gets as many samples as its time allows (a
    median of 5 rounds of a few milliseconds each swings with the machine's load).
    ``sync`` (e.g. ``torch.cuda.synchronize``) is called before and after every timed
    call, so asynchronous devices are timed to completion. ``seed`` seeds the rounds' orders.
    """
    if rounds < 1:
        raise ValueError(f"rounds: expected an int >= 1, got {rounds!r}")
    if warmup < 0:
        raise ValueError(f"warmup: expected an int >= 0, got {warmup!r}")
    if isinstance(min_seconds, bool) or not isinstance(min_seconds, (int, float)) or not min_seconds >= 0:
        raise ValueError(f"min_seconds: expected a number >= 0, got {min_seconds!r}")
    names = list(fns)
    if not names:
        raise ValueError("fns: expected at least one callable to time")
    sync = sync or (lambda: None)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()  # a collection inside one timed call would bill it to that implementation
    try:
        r, elapsed, order = 0, 0.0, random.Random(seed)
        while r < rounds or elapsed < min_seconds:
            for name in order.sample(names, len(names)):
                sync()
                start = time.perf_counter()
                fns[name]()
                sync()
                samples[name].append(time.perf_counter() - start)
                elapsed += samples[name][-1]
            r += 1
    finally:
        if gc_was_enabled:
            gc.enable()
    return Timings(samples)
