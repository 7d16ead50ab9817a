"""A training step alone in a process: what a user's training loop sees, allocator included.

The other sections time implementations side by side in one process, interleaved, so
that a shared machine's load falls on all of them alike. They then share the process's
memory allocator too: whether glibc maps a big buffer again on every call (page faults,
each page zero-filled on first touch) depends on what else the process allocated, and so
on the other implementations. Here each implementation runs in a fresh process of its
own: ``warmup`` then ``steps`` training steps (forward, mean squared output as the loss,
backward, an Adam step), reporting the median step time and the page faults per step,
and the process's peak resident memory with the share the kernels' buffer pool holds.
With ``input_grad`` (the default) the input requires grad, as in the grid, so the
backward computes dx; without it the fused layers skip that GEMM, which torch.nn's oneDNN
LSTM backward computes either way, so the two settings compare different amounts of work.
Processes alternate (ours, torch, torch, ours, ...) for ``pairs`` pairs, and a point
reports the median of its processes' medians.

``python -m lightning_rnn.bench.alone '<json>'`` is the worker: it prints one JSON line.
"""
from __future__ import annotations

import itertools
import json
import resource
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch

from .config import AloneConfig, BenchConfig
from .implementations import parse_impl
from .measure import Table


def run_alone(section: AloneConfig, cfg: BenchConfig, threads: int, *, log: Callable[[str], None] = print) -> Table:
    """One row per (cell, layers, hidden): each implementation's step in processes of its own."""
    dx = "input requires grad" if section.input_grad else "input without grad (no dx)"
    table = Table("alone", f"a training step alone in a process ({section.pairs} alternating pairs of processes, "
                  f"median of {section.steps} steps each after {section.warmup}; {dx})")
    names = section.implementations
    for cell, layers, hidden in itertools.product(section.cells, section.layers, section.hidden):
        spec = {"cell": cell, "layers": layers, "hidden": hidden, "batch": section.batch,
                "seq_len": section.seq_len, "steps": section.steps, "warmup": section.warmup,
                "threads": threads, "seed": cfg.seed, "device": cfg.device, "input_grad": section.input_grad}
        runs: dict[str, list[dict]] = {name: [] for name in names}
        for pair in range(section.pairs):
            for name in names if pair % 2 == 0 else names[::-1]:
                runs[name].append(_run_worker(spec | {"impl": name}))
        row: dict = {"cell": cell, "layers": layers, "hidden": hidden, "batch": section.batch,
                     "seq_len": section.seq_len, "tokens": section.batch * section.seq_len,
                     "processes": section.pairs}
        for name in names:
            row[f"{name}_ms"] = statistics.median(r["step_s"] for r in runs[name]) * 1e3
            row[f"{name}_faults"] = statistics.median(r["faults"] for r in runs[name])
            row[f"{name}_peak_rss_mb"] = statistics.median(r["peak_rss_bytes"] for r in runs[name]) / 2**20
            row[f"{name}_pool_mb"] = statistics.median(r["pool_bytes"] for r in runs[name]) / 2**20
        for a, b in itertools.permutations(names, 2):
            if parse_impl(a).is_ours and parse_impl(b).base == "torch":
                row[f"time_{a}/{b}"] = row[f"{a}_ms"] / row[f"{b}_ms"]
        table.rows.append(row)
        times = ", ".join(f"{n} {row[f'{n}_ms']:.1f} ms ({row[f'{n}_faults']:g} faults, peak RSS "
                          f"{row[f'{n}_peak_rss_mb']:.0f} MB of which pool {row[f'{n}_pool_mb']:.0f} MB)" for n in names)
        log(f"[alone] {cell} layers={layers} hidden={hidden}: {times}")
    return table


def _run_worker(spec: dict) -> dict:
    done = subprocess.run([sys.executable, "-m", "lightning_rnn.bench.alone", json.dumps(spec)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        status = (f"killed by {signal.Signals(-done.returncode).name}" if done.returncode < 0
                  else f"exit status {done.returncode}")
        raise RuntimeError(f"bench.alone: the worker for {spec['impl']} failed ({status}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def train_alone(spec: dict) -> dict:
    """The worker's loop; returns the median step seconds, page faults per step and
    whether the last step computed a gradient for the input."""
    from .subjects import FUSED, TORCH

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(spec["seed"])
    impl = parse_impl(spec["impl"])
    hidden, device = spec["hidden"], torch.device(spec["device"])
    reference = TORCH[spec["cell"]](hidden, hidden, spec["layers"]).to(device)
    layer = reference if impl.base == "torch" else FUSED[spec["cell"]].from_torch(reference, backend=impl.backend)
    optimizer = torch.optim.Adam(layer.parameters(), lr=1e-3)
    x = torch.randn(spec["seq_len"], spec["batch"], hidden, device=device).requires_grad_(spec["input_grad"])
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times, faults, input_grad = [], [], False
    for step in range(spec["warmup"] + spec["steps"]):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        sync()
        start = time.perf_counter()
        out, _ = layer(x)
        out.square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        input_grad, x.grad = x.grad is not None, None
        sync()
        if step >= spec["warmup"]:
            times.append(time.perf_counter() - start)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    # what the process holds after the loop: its peak resident set, and of it the kernels'
    # pool of idle buffers (kept mapped between calls; cap LIGHTNING_RNN_POOL_MB, docs/layers.md)
    pool = 0
    if impl.base != "torch" and device.type == "cpu":
        from ..kernels import cpp

        pool = cpp.pool_idle_bytes()
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return {"step_s": statistics.median(times), "faults": statistics.median(faults), "input_grad": input_grad,
            "pool_bytes": pool, "peak_rss_bytes": peak_rss}


if __name__ == "__main__":
    print(json.dumps(train_alone(json.loads(sys.argv[1]))))
