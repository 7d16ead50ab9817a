"""The callbacks' own studies (docs/callbacks.md quotes them), as functions the benchmark calls.

Each function returns a plain dict of numbers; times are compared as ratios of runs made
in one process, interleaved. ``python -m lightning_rnn.bench.callbacks_bench`` prints all
of them (minutes, not seconds).

- :func:`checkpointing_vs_naive`: activation memory of a checkpointed FusedLSTM vs the naive
  LSTMCell loop (torch-rnn's 7x), and its fwd+bwd time vs the same layer without
  checkpointing, for "sqrt" and a few larger chunk sizes (fewer chunks: faster, more memory).
- :func:`checkpointing_scaling`: saved bytes vs T up to 10,000 with chunk_size="sqrt".
- :func:`mixed_precision_memory`: activation memory under bf16 autocast vs fp32, and the loss.
- :func:`packed_epoch_time`: one epoch with vs without PackedSequences on lengths U[10, 500].
"""
from __future__ import annotations

import math
import statistics
import time

import torch

from ..layers import FusedLSTM
from ..kernels.checkpointing import chunk_length
from ..utils.memory import saved_tensor_bytes
from .baselines import CellLoop


def _fwd_bwd(layer, x):
    def step():
        out = layer(x)[0]
        out.backward(torch.ones_like(out))

    return step


def checkpointing_vs_naive(
    hidden: int = 512, layers: int = 3, batch: int = 50, seq: int = 50, chunk_sizes=("sqrt", 10, 13, 17, 25),
    rounds: int = 15, backend: str = "auto", threads: int | None = 1,
) -> dict:
    """Saved bytes: checkpointed FusedLSTM vs CellLoop vs plain FusedLSTM; time: checkpointed / plain.

    One row per entry of ``chunk_sizes`` (the memory / time trade-off; the first is the
    headline, the callback's default "sqrt"). Input size = hidden, as in the torch-rnn
    grid. ``recompute_peak_bytes`` adds what one recomputed chunk holds during backward
    (the plain layer's saved bytes on one chunk's steps) to the saved bytes: the activation
    peak of the checkpointed backward. Times are medians of ``rounds`` rounds, each running
    the plain layer and every chunk size once in a rotating order; with ``threads`` set
    (default 1) torch uses that many threads and the time is this thread's CPU time, which
    other jobs on a shared machine disturb far less than wall time.
    """
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        layer = FusedLSTM(hidden, hidden, layers, backend=backend)
        loop = CellLoop.like(layer)
        x = torch.randn(seq, batch, hidden, requires_grad=True)

        def saved(chunk, inputs=x):
            layer.checkpoint_chunk_size = chunk
            return saved_tensor_bytes(lambda: layer(inputs)[0], exclude=layer)

        plain, naive = saved(None), saved_tensor_bytes(lambda: loop(x), exclude=loop)
        settings = [None, *chunk_sizes]
        clock = time.thread_time if threads is not None else time.perf_counter
        samples: dict = {setting: [] for setting in settings}
        for r in range(rounds + 1):  # round 0 warms up
            for i in range(len(settings)):
                setting = settings[(i + r) % len(settings)]
                layer.checkpoint_chunk_size = setting
                start = clock()
                _fwd_bwd(layer, x)()
                if r:
                    samples[setting].append(clock() - start)
        rows = []
        for setting in chunk_sizes:
            steps = chunk_length(setting, seq)
            ckpt, one_chunk = saved(setting), saved(None, x[:steps].detach().requires_grad_())
            rows.append({
                "chunk_size": str(setting), "steps_per_chunk": steps, "chunks": math.ceil(seq / steps),
                "saved_bytes_checkpointed": ckpt,
                "memory_naive_over_checkpointed": naive / ckpt,
                "memory_fused_over_checkpointed": plain / ckpt,
                "recompute_peak_bytes": ckpt + one_chunk,
                "memory_naive_over_recompute_peak": naive / (ckpt + one_chunk),
                "time_checkpointed_over_plain": statistics.median(samples[setting]) / statistics.median(samples[None]),
            })
        layer.checkpoint_chunk_size = None
    finally:
        torch.set_num_threads(previous_threads)
    return {
        "rows": rows,
        "saved_bytes_naive_loop": naive,
        "saved_bytes_fused": plain,
        "seconds_plain": statistics.median(samples[None]),
        "time_rounds": rounds,
    }


def checkpointing_scaling(
    lengths=(100, 400, 1600, 10_000),
    hidden: int = 32,
    layers: int = 2,
    batch: int = 4,
    input_size: int = 2,
    backend: str = "auto",
) -> dict:
    """Saved bytes vs T with chunk_size="sqrt" (and without), plus the fitted exponent.

    The recurrent part saves O(sqrt(T)) boundary states; the network input itself (T * B *
    input_size) is linear in T, so a small input_size (the adding problem's 2) is used and
    reported separately. ``exponent`` is the log-log slope of the state bytes between the
    shortest and longest T (0.5 = sqrt). ``recompute_peak_bytes`` adds one recomputed
    chunk's activations (held during backward) to the saved bytes. The longest T is also
    trained for one fwd+bwd step (``trained``: every gradient finite).
    """
    torch.manual_seed(0)
    layer = FusedLSTM(input_size, hidden, layers, backend=backend)

    def saved(chunk, x):
        layer.checkpoint_chunk_size = chunk
        return saved_tensor_bytes(lambda: layer(x)[0], exclude=layer)

    rows = []
    for T in lengths:
        x = torch.randn(T, batch, input_size, requires_grad=True)
        ckpt, plain = saved("sqrt", x), saved(None, x)
        one_chunk = saved(None, x[: chunk_length("sqrt", T)].detach().requires_grad_())
        rows.append({
            "T": T, "saved_bytes_checkpointed": ckpt, "saved_bytes_plain": plain,
            "recompute_peak_bytes": ckpt + one_chunk, "input_bytes": x.numel() * x.element_size(),
        })
    layer.checkpoint_chunk_size = "sqrt"
    _fwd_bwd(layer, x)()
    trained = all(bool(p.grad.isfinite().all()) for p in layer.parameters())
    layer.checkpoint_chunk_size = None
    first, last = rows[0], rows[-1]
    state = [r["saved_bytes_checkpointed"] - r["input_bytes"] for r in (first, last)]
    exponent = math.log(state[1] / state[0]) / math.log(last["T"] / first["T"])
    return {"rows": rows, "exponent": exponent, "trained": trained}


def mixed_precision_memory(
    hidden: int = 512, layers: int = 3, batch: int = 50, seq: int = 50, train_steps: int = 60, backend: str = "auto"
) -> dict:
    """bf16 autocast vs fp32: activation memory of a FusedLSTM, and the loss of a short run.

    Memory: saved bytes of one forward at the torch-rnn grid point. Loss: the same model
    (FusedLSTM(8, 64) -> Linear) trained ``train_steps`` Adam steps on next-step prediction
    of noisy sines, from the same initial weights and data, with and without autocast;
    reports the mean loss over the last 10 steps of each and their difference.
    """
    torch.manual_seed(0)
    layer = FusedLSTM(hidden, hidden, layers, backend=backend)
    x = torch.randn(seq, batch, hidden, requires_grad=True)
    fp32 = saved_tensor_bytes(lambda: layer(x)[0], exclude=layer)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = saved_tensor_bytes(lambda: layer(x)[0], exclude=layer)
    losses = {name: _train_sines(train_steps, on, backend) for name, on in (("fp32", False), ("bf16", True))}
    return {
        "saved_bytes_fp32": fp32,
        "saved_bytes_bf16": bf16,
        "memory_bf16_over_fp32": bf16 / fp32,
        "final_loss_fp32": losses["fp32"],
        "final_loss_bf16": losses["bf16"],
        "loss_delta": losses["bf16"] - losses["fp32"],
    }


def _train_sines(steps: int, autocast: bool, backend: str) -> float:
    torch.manual_seed(0)
    t = torch.arange(101.0).view(-1, 1, 1)
    freq = torch.rand(1, 32, 8) * 0.3
    series = torch.sin(t * freq + torch.rand(1, 32, 8) * 6) + 0.05 * torch.randn(101, 32, 8)  # (T+1, B, 8)
    rnn, head = FusedLSTM(8, 64, 2, backend=backend), torch.nn.Linear(64, 8)
    params = [*rnn.parameters(), *head.parameters()]
    optimizer = torch.optim.Adam(params, lr=3e-3)
    tail = []
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            prediction = head(rnn(series[:-1])[0])
        loss = torch.nn.functional.mse_loss(prediction.float(), series[1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        tail = (tail + [loss.item()])[-10:]
    return sum(tail) / len(tail)


def packed_epoch_time(
    num_sequences: int = 256, min_len: int = 10, max_len: int = 500, batch_size: int = 32, hidden: int = 128,
    repeats: int = 2, backend: str = "auto",
) -> dict:
    """One training epoch with vs without PackedSequences on lengths uniform in [min_len, max_len].

    Without the callback the model runs the padded batches (what a model that ignores the
    lengths pays for); with it, batches are length-bucketed and packed. ``packed_only`` packs
    without bucketing. Same initial weights and data. Reported: each run's mean and last
    training loss, and the largest step-by-step loss difference between the padded and the
    packed-only run (the same batches in the same order: the curves should coincide up to
    float rounding); bucketing forms other batches, so its curve agrees only statistically.
    """
    from lightning.pytorch import Trainer

    from ..callbacks import PackedSequences
    from .callbacks_study import LengthClassifier, variable_length_loader

    configs = {"padded": [], "packed_only": [PackedSequences(bucketing=False)], "bucketed_packed": [PackedSequences()]}
    seconds: dict[str, list[float]] = {name: [] for name in configs}
    losses: dict[str, list[float]] = {}
    for _ in range(repeats):
        for name, callbacks in configs.items():  # interleaved
            torch.manual_seed(0)
            model = LengthClassifier(hidden=hidden, backend=backend)
            trainer = Trainer(
                accelerator="cpu", max_epochs=1, callbacks=callbacks, logger=False, enable_checkpointing=False,
                enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
            )
            loader = variable_length_loader(num_sequences, min_len, max_len, batch_size)
            start = time.perf_counter()
            trainer.fit(model, loader)
            seconds[name].append(time.perf_counter() - start)
            losses[name] = model.losses
    best = {name: min(v) for name, v in seconds.items()}
    return {
        "seconds_padded": best["padded"],
        "seconds_bucketed_packed": best["bucketed_packed"],
        "seconds_packed_only": best["packed_only"],
        "time_ratio": best["bucketed_packed"] / best["padded"],
        "time_ratio_packed_only": best["packed_only"] / best["padded"],
        **{f"mean_loss_{name}": sum(v) / len(v) for name, v in losses.items()},
        **{f"last_loss_{name}": v[-1] for name, v in losses.items()},
        "loss_max_diff_packed_only": max(abs(a - b) for a, b in zip(losses["padded"], losses["packed_only"])),
    }


if __name__ == "__main__":  # pragma: no cover - manual benchmark
    import json

    for study in (checkpointing_vs_naive, checkpointing_scaling, mixed_precision_memory, packed_epoch_time):
        print(study.__name__, json.dumps(study(), indent=1))
