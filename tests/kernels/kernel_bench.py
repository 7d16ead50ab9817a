"""Kernel-level speed check (not a test): ours vs torch.nn vs the GEMM-only bound.

    python tests/kernels/kernel_bench.py [--cell lstm] [--threads 1] [--rounds 15] [--hidden 64 128 256 512]

Batch 50, sequence 50, input size = hidden, --layers layers (GEMM-only: that many
layer-sized GEMM sets); fwd+bwd medians over interleaved
rounds (order shuffled per round) in one process, printed as ratios. "var" = packed batch with lengths 50..5
(real tokens 55% of the padded ones) against the same layer on the padded batch.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

from lightning_rnn import FusedGRU, FusedLSTM
from lightning_rnn.kernels import cpp


CLOCK = time.perf_counter  # with --threads 1: time.thread_time (CPU time; robust on a shared machine)


def timed(fn) -> float:
    t0 = CLOCK()
    fn()
    return CLOCK() - t0


def fwd_bwd(module, inp):
    def run():
        out, _ = module(inp)
        data = out.data if hasattr(out, "data") and not isinstance(out, torch.Tensor) else out
        data.backward(torch.ones_like(data))
    return run


def bench_point(cell: str, H: int, rounds: int, layers: int = 1, B: int = 50, T: int = 50) -> dict[str, float]:
    torch_cls, fused_cls = (nn.LSTM, FusedLSTM) if cell == "lstm" else (nn.GRU, FusedGRU)
    ref = torch_cls(H, H, num_layers=layers)
    ours = fused_cls.from_torch(ref, backend="cpp")
    x = torch.randn(T, B, H, requires_grad=True)
    lengths = torch.linspace(T, 5, B).round().long()
    p = pack_padded_sequence(x.detach(), lengths)
    packed = PackedSequence(p.data.clone().requires_grad_(), p.batch_sizes, p.sorted_indices, p.unsorted_indices)
    ext = cpp.load()
    bound = getattr(ext, f"{cell}_gemm_bound")
    x2 = x.detach().reshape(T * B, H)
    G = 4 if cell == "lstm" else 3
    w_ih, w_hh = torch.randn(G * H, H), torch.randn(G * H, H)
    full, var = torch.full((T,), B), packed.batch_sizes
    cases = {
        "torch": fwd_bwd(ref, x),
        "ours": fwd_bwd(ours, x),
        "gemm": lambda: [bound(x2, full, w_ih, w_hh) for _ in range(layers)],
        "ours_var": fwd_bwd(ours, packed),
        "torch_var": fwd_bwd(ref, packed),
        "gemm_var": lambda: [bound(packed.data.detach(), var, w_ih, w_hh) for _ in range(layers)],
    }
    times = {k: [] for k in cases}
    order = list(cases)
    for r in range(rounds + 2):
        random.Random(r).shuffle(order)  # no implementation always runs right after another
        for k in order:
            dt = timed(cases[k])
            if r >= 2:
                times[k].append(dt)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cell", default="lstm", choices=["lstm", "gru"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--hidden", type=int, nargs="+", default=[64, 128, 256, 512])
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--wall", action="store_true", help="wall-clock time even with one thread")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    global CLOCK
    if a.threads == 1 and not a.wall:
        CLOCK = time.thread_time
    print(f"{a.cell} threads={a.threads} clock={CLOCK.__name__}  B=50 T=50 I=H layers={a.layers}  medians of {a.rounds} interleaved rounds")
    print(f"{'H':>5} {'torch ms':>9} {'ours ms':>8} {'ours/torch':>10} {'ours/gemm':>9} {'torch/gemm':>10}"
          f" {'var/padded':>10} {'torch var/pad':>13} {'var/gemm_var':>12}")
    for H in a.hidden:
        m = bench_point(a.cell, H, a.rounds, a.layers)
        print(f"{H:>5} {m['torch']*1e3:>9.2f} {m['ours']*1e3:>8.2f} {m['ours']/m['torch']:>10.3f}"
              f" {m['ours']/m['gemm']:>9.3f} {m['torch']/m['gemm']:>10.3f} {m['ours_var']/m['ours']:>10.3f}"
              f" {m['torch_var']/m['torch']:>13.3f} {m['ours_var']/m['gemm_var']:>12.3f}", flush=True)


if __name__ == "__main__":
    main()
