"""Generation speed: characters per second of a character language model's sampling, batch 1.

Each point is a character LM of torch.nn parts (an embedding, ``layers`` x ``hidden``
recurrent layers, a linear layer over ``vocab`` characters) with one set of weights; each
implementation generates ``length`` characters per timed call, all interleaved
(:func:`~lightning_rnn.bench.timing.interleave`), from the state after one character:

- ``compiled``: the compiled generation loop (:class:`~lightning_rnn.kernels.generate.CompiledDecoder`,
  what ``CharLanguageModel.sample`` runs on CPU), float32 weights; ``compiled_bf16``: the
  same with bfloat16 weights;
- ``fused_loop``: a Python loop over steps of the fused layer (FusedLSTM / FusedGRU),
  softmax and torch.multinomial: ``sample(decoder="loop")``'s work;
- ``plain``: the baseline, the same loop over torch.nn.LSTM / GRU steps.

The bound: a character reads every weight once, so it takes at least ``weight_bytes /
bandwidth``, with the bandwidth of copying a tensor larger than any cache (bytes read +
written per second). Weights that fit in a cache are read faster: there a ratio below 1
to the bound is the cache's doing.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from ..kernels.generate import CompiledDecoder, GenerationWeights
from ..layers import FusedGRU, FusedLSTM
from .config import BenchConfig, GenerationConfig
from .measure import Table
from .timing import interleave

#: (numerator, denominator) of the ratio columns, where both are measured
RATIOS = (("compiled", "plain"), ("fused_loop", "plain"), ("compiled", "bound"),
          ("compiled_bf16", "bound_bf16"), ("compiled_bf16", "compiled"))


def memory_bandwidth(megabytes: int, repeats: int = 5) -> float:
    """Bytes per second (read + written) of copying a float32 tensor of ``megabytes`` MiB
    into another: the median of ``repeats`` copies after one untimed."""
    numel = megabytes * 2**20 // 4
    source, target = torch.ones(numel), torch.empty(numel)
    target.copy_(source)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        target.copy_(source)
        times.append(time.perf_counter() - start)
    return 2 * numel * 4 / statistics.median(times)


class CharModel:
    """The parts of a character LM: embedding (vocab, E) -> ``layers`` x ``hidden`` -> linear."""

    def __init__(self, cell: str, layers: int, hidden: int, embedding_dim: int, vocab: int):
        self.cell = cell
        self.embedding = nn.Embedding(vocab, embedding_dim)
        self.rnn = {"lstm": FusedLSTM, "gru": FusedGRU}[cell](embedding_dim, hidden, layers, batch_first=True)
        self.linear = nn.Linear(hidden, vocab)

    def weights(self, dtype: torch.dtype) -> GenerationWeights:
        layers = [self.rnn.layer_weights(k, 0) for k in range(self.rnn.num_layers)]
        return GenerationWeights.pack(self.cell, self.embedding.weight, layers, self.linear.weight, self.linear.bias,
                                      dtype)


def step_loop(model: CharModel, rnn: nn.Module, length: int) -> Callable[[], None]:
    """``length`` characters, one step of ``rnn`` per character, drawn by softmax and multinomial."""

    @torch.no_grad()
    def run():
        generator = torch.Generator().manual_seed(0)
        ids, state = torch.zeros(1, 1, dtype=torch.long), None
        for _ in range(length):
            out, state = rnn(model.embedding(ids), state)
            ids = torch.multinomial(torch.softmax(model.linear(out[:, -1]), dim=-1), 1, generator=generator)

    return run


def compiled_loop(model: CharModel, length: int, dtype: torch.dtype) -> Callable[[], torch.Tensor]:
    """``length`` characters from the compiled loop with ``model``'s weights in ``dtype``."""
    weights = model.weights(dtype)
    with torch.no_grad():
        out, state = model.rnn(model.embedding(torch.zeros(1, 1, dtype=torch.long)))
        logits = model.linear(out[:, -1])
    return lambda: CompiledDecoder(weights, logits, state, 1.0, None, None,
                                   torch.Generator().manual_seed(0)).run(length)


def subjects(model: CharModel, section: GenerationConfig) -> dict[str, Callable[[], object]]:
    """The timed call of each of the section's implementations."""
    n = section.length
    makers = {
        "compiled": lambda: compiled_loop(model, n, torch.float32),
        "compiled_bf16": lambda: compiled_loop(model, n, torch.bfloat16),
        "fused_loop": lambda: step_loop(model, model.rnn, n),
        "plain": lambda: step_loop(model, model.rnn.to_torch(), n),
    }
    return {name: makers[name]() for name in section.implementations}


def run_generation(section: GenerationConfig, cfg: BenchConfig, *, log: Callable[[str], None] = print) -> Table:
    """One row per (cell, layers, hidden): each implementation's milliseconds and characters
    per second, the bounds, the ratios."""
    with _threads(section.threads) as threads:
        bandwidth = memory_bandwidth(section.bandwidth_mb)
        table = Table("generation", f"generation: characters per second at batch 1, {threads} thread(s)", notes=[
            "us/token: microseconds per character; bound: the weight bytes a character reads / the bandwidth of a "
            f"{section.bandwidth_mb} MiB copy (read + written); a ratio to it below 1: weights read from a cache",
        ])
        for cell in section.cells:
            for layers, hidden in section.models:
                row = _point(cell, layers, hidden, section, cfg, bandwidth, threads)
                table.rows.append(row)
                log(f"[generation] {cell} {layers}x{hidden}: " + ", ".join(
                    f"{k[: -len('_chars_per_s')]} {v:.0f}/s" for k, v in row.items() if k.endswith("_chars_per_s")))
    return table


def _point(cell: str, layers: int, hidden: int, section: GenerationConfig, cfg: BenchConfig, bandwidth: float,
           threads: int) -> dict:
    torch.manual_seed(cfg.seed)
    model = CharModel(cell, layers, hidden, section.embedding_dim, section.vocab)
    sizes = {dtype: model.weights(dtype).bytes_per_step for dtype in (torch.float32, torch.bfloat16)}
    fns = subjects(model, section)
    timings = interleave(fns, cfg.rounds, cfg.warmup, min_seconds=cfg.min_seconds, seed=cfg.seed)
    n = section.length
    row = {"cell": cell, "layers": layers, "hidden": hidden, "embedding": section.embedding_dim,
           "vocab": section.vocab, "batch": 1, "seq_len": n, "tokens": n, "threads": threads,
           "rounds": timings.rounds, "weight_bytes": sizes[torch.float32],
           "weight_bf16_bytes": sizes[torch.bfloat16], "bandwidth_gbs": bandwidth / 1e9}
    seconds = {name: timings.median(name) / n for name in fns}  # per character
    seconds["bound"] = sizes[torch.float32] / bandwidth
    seconds["bound_bf16"] = sizes[torch.bfloat16] / bandwidth
    for name, s in seconds.items():
        row[f"{name}_us_per_token"] = s * 1e6
        row[f"{name}_chars_per_s"] = 1 / s
    for num, den in RATIOS:
        if num in seconds and den in seconds:
            row[f"time_{num}/{den}"] = seconds[num] / seconds[den]
    return row


@contextlib.contextmanager
def _threads(threads: int | None):
    """torch's intra-op threads set to ``threads`` (None: as they are) while inside; yields the count."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
