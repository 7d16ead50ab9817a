"""The Python checks of tests/gpu_checks.sh, each appending one row to ``OUT/summary.tsv``.

    python tests/gpu/checks.py OUT CHECK [CHECK ...] [--device cuda|cpu] [--work DIR]

CHECK: ``selfcheck`` (the cuda backend's self-check on every GPU, and an injected error
caught), ``memory`` (GPUMemoryLogger's CUDA statistics and snapshot on a real allocator),
``precision`` (MixedPrecision fp16 with loss scaling, and bf16), ``recipe:RUN_DIR`` (the
loss of a CLI run fell), ``benchmark:CSV`` (the benchmark's fused-vs-cuDNN grid),
``record:NAME:STATUS:FIGURE`` (a row from the shell), ``summary`` (prints the table; exit 1
if a row failed). A row is ``name, PASS|FAIL|SKIP, figure, seconds``. Without a GPU the CUDA
checks are SKIP rows; ``--device cpu`` runs the device-independent part of ``memory`` and
``precision`` (bf16) there, which is how this file is tested on a machine without a GPU.
``--work``: where the memory snapshot is written (default: the temporary folder).
"""
from __future__ import annotations

import csv
import dataclasses
import math
import pickle
import sys
import tempfile
import time
from pathlib import Path

import torch

STEPS = 60  # training steps of the memory and precision runs
VOCAB, T, BATCH = 16, 64, 32  # the delayed-copy task: predict the token DELAY steps back
DELAY = 2


class Failed(AssertionError):
    """A check's claim that did not hold; its message is the row's figure."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise Failed(message)


# ----- the cuda backend's self-check ----------------------------------------------------
def run_selfcheck(device: str) -> str:
    from lightning_rnn.kernels import dispatch, selfcheck

    figures = []
    for index in range(torch.cuda.device_count()):
        gpu = torch.device("cuda", index)
        backend = dispatch.resolve_backend("cuda", gpu)  # builds, checks; SelfCheckFailed on a mismatch
        (first,) = [r for r in selfcheck.reports() if r.device == gpu]
        again = selfcheck.run(backend, gpu)
        check(not again.mismatches, "; ".join(map(str, again.mismatches[:3])))
        f32 = selfcheck.run(backend, gpu, torch.float32)
        check(not f32.mismatches, "float32: " + "; ".join(map(str, f32.mismatches[:3])))

        def off(*args, **kwargs):
            out, h_n, c_n = backend.lstm(*args, **kwargs)
            return out, h_n, c_n + 1e-6

        caught = selfcheck.run(dataclasses.replace(backend, lstm=off), gpu).mismatches
        check(bool(caught) and all(m.case.cell == "lstm" and "c_n" in m.tensor for m in caught),
              f"an injected 1e-6 error in c_n: {len(caught)} mismatches, {caught[:1]}")
        check(dispatch.resolve("auto", gpu) == "cuda", "backend='auto' does not pick 'cuda'")
        figures.append(f"{gpu} {str(first.dtype)[6:]}: worst error {first.worst:.0e}, {first.seconds * 1e3:.0f} ms "
                       f"first (CUDA/cuBLAS set-up), {again.seconds * 1e3:.0f} ms again; float32 worst "
                       f"{f32.worst:.0e}; injected error caught")
    check(bool(figures), "no CUDA device")
    return "; ".join(figures)


# ----- a small model on a task it learns in a few dozen steps ---------------------------
def _model():
    from lightning.pytorch import LightningModule

    from lightning_rnn import FusedLSTM

    class DelayedCopy(LightningModule):
        """Embedding -> 2-layer FusedLSTM -> linear: the token DELAY steps back at each step."""

        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, 32)
            self.rnn = FusedLSTM(32, 128, num_layers=2, batch_first=True)
            self.head = torch.nn.Linear(128, VOCAB)
            self.seen: list[tuple] = []  # (autocast dtype or None, rnn output dtype) per step

        def training_step(self, batch, batch_idx):
            out = self.rnn(self.embed(batch))[0]  # (B, T, H)
            logits = self.head(out[:, DELAY:])
            device = batch.device.type
            self.seen.append((torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None,
                              out.dtype))
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB),
                                                     batch[:, :-DELAY].reshape(-1))
            self.log("train/loss", loss.detach(), batch_size=len(batch))
            return loss

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-2)

    return DelayedCopy()


def _fit(device: str, callbacks, steps: int = STEPS):
    from lightning.pytorch import Trainer
    from lightning.pytorch.loggers import Logger

    class Recorder(Logger):
        name, version = "recorder", 0

        def __init__(self):
            super().__init__()
            self.history: dict[str, list[float]] = {}

        def log_metrics(self, metrics, step=None):
            for key, value in metrics.items():
                self.history.setdefault(key, []).append(float(value))

        def log_hyperparams(self, *args, **kwargs):
            pass

    torch.manual_seed(0)
    data = torch.randint(0, VOCAB, (steps * BATCH, T))
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH)
    model, logger = _model(), Recorder()
    trainer = Trainer(accelerator="gpu" if device == "cuda" else "cpu", devices=1, max_steps=steps, logger=logger,
                      callbacks=list(callbacks), log_every_n_steps=1, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(model, loader)
    return model, logger.history


def _loss_fell(history, factor: float = 0.5) -> tuple[float, float]:
    losses = history["train/loss"]
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    check(all(math.isfinite(v) for v in losses), f"a non-finite loss: {losses}")
    check(last < factor * first, f"the loss did not fall below {factor} of its start: {first:.3f} -> {last:.3f}")
    return first, last


# ----- GPUMemoryLogger on CUDA ------------------------------------------------------------
def run_memory(device: str, work: Path) -> str:
    from lightning_rnn.callbacks import GPUMemoryLogger

    snapshot = work / "memory_snapshot.pickle"
    on_cuda = device == "cuda"
    logger_cb = GPUMemoryLogger(every_n_steps=10, snapshot_path=str(snapshot) if on_cuda else None)
    _, history = _fit(device, [logger_cb], steps=40)
    measured = len(history.get("memory/activation_mb", []))
    check(measured == 4, f"{measured} measured steps of 40, every 10: expected 4")
    act = max(history["memory/activation_mb"])
    check(act > 0, "no activation bytes counted")
    if not on_cuda:
        return f"cpu: activations {act:.1f} MB (CUDA statistics not checked)"
    peaks = {p: max(history[f"memory/{p}_peak_allocated_mb"]) for p in ("forward", "backward", "optimizer")}
    reserved = {p: max(history[f"memory/{p}_peak_reserved_mb"]) for p in peaks}
    check(all(v > 0 for v in peaks.values()), f"a zero peak: {peaks}")
    check(all(reserved[p] >= peaks[p] for p in peaks), f"reserved below allocated: {reserved} {peaks}")
    check(act <= peaks["forward"], f"activations {act:.1f} MB above the forward peak {peaks['forward']:.1f} MB")
    check(max(history["memory/num_ooms"]) == 0, "an out-of-memory retry")
    per_token = max(history["memory/bytes_per_token"])
    check(per_token > 0, "bytes_per_token is 0")
    check(snapshot.exists(), f"no snapshot at {snapshot}")
    with open(snapshot, "rb") as f:
        state = pickle.load(f)
    events = sum(len(trace) for trace in state.get("device_traces", []))
    check(bool(state.get("segments")) and events > 0, f"an empty snapshot: {len(state.get('segments', []))} "
                                                      f"segments, {events} events")
    return (f"peak allocated fwd/bwd/opt {peaks['forward']:.1f}/{peaks['backward']:.1f}/{peaks['optimizer']:.1f} MB, "
            f"activations {act:.1f} MB, {per_token:.0f} B/token; snapshot {snapshot.stat().st_size / 1e6:.1f} MB "
            f"with {events} allocator events")


# ----- MixedPrecision on CUDA ---------------------------------------------------------------
def run_precision(device: str) -> str:
    from lightning_rnn.callbacks import MixedPrecision
    from lightning_rnn.kernels import dispatch

    figures = []
    dtypes = ("fp16", "bf16") if device == "cuda" else ("bf16",)
    for name in dtypes:
        # fp16: a loss scale (2^24) whose gradients overflow fp16's range (65504): the first steps
        # must be skipped and the scale lowered until they fit
        callback = MixedPrecision(name, init_scale=2.0**24) if name == "fp16" else MixedPrecision(name)
        model, history = _fit(device, [callback])
        want = torch.float16 if name == "fp16" else torch.bfloat16
        check(all(seen == (want, want) for seen in model.seen), f"{name}: autocast/output dtypes {model.seen[:2]}")
        first, last = _loss_fell(history)
        figure = f"{name}: loss {first:.2f} -> {last:.2f}"
        if name == "fp16":
            scales, skipped = history["precision/loss_scale"], history["precision/skipped_steps"]
            check(skipped[-1] >= 1 and scales[-1] < scales[0], f"fp16: no step skipped ({skipped[-1]:.0f}) or the "
                                                               f"scale not lowered ({scales[0]:.0f} -> {scales[-1]:.0f})")
            figure += f", scale 2^{math.log2(scales[0]):.0f} -> 2^{math.log2(scales[-1]):.0f}, {skipped[-1]:.0f} skipped"
        figures.append(figure)
    figures.append(f"backend {dispatch.resolve('auto', torch.device(device))}")
    return "; ".join(figures)


# ----- the recipe run and the benchmark (run by the shell; read here) ---------------------
def read_recipe(run_dir: str) -> str:
    runs = sorted(Path(run_dir).glob("**/metrics.csv"))
    check(bool(runs), f"no metrics.csv under {run_dir}")
    with open(runs[-1]) as f:
        rows = list(csv.DictReader(f))
    history = {"train/loss": [float(r["train/loss"]) for r in rows if r.get("train/loss")]}
    steps = max(int(r["step"]) for r in rows) + 1
    first, last = _loss_fell(history, factor=0.75)
    val = [float(r["val/loss"]) for r in rows if r.get("val/loss")]
    check(len(val) >= 2 and val[-1] < val[0], f"val/loss did not fall: {val}")
    log = Path(run_dir) / "run.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    check("falling back" not in text and "self-check" not in text, "a backend fell back (see run.log)")
    return f"{steps} steps: train/loss {first:.2f} -> {last:.2f}, val/loss {val[0]:.2f} -> {val[-1]:.2f}"


def read_bench(grid_csv: str) -> str:
    with open(grid_csv) as f:
        rows = list(csv.DictReader(f))
    check(bool(rows), f"no rows in {grid_csv}")
    check(all(r["backend"] == "cuda" for r in rows), f"'ours' ran on {sorted({r['backend'] for r in rows})}")
    check(all(r.get("ours_peak_bytes") and r.get("torch_peak_bytes") for r in rows), "no CUDA peak memory columns")
    figures = []
    for cell in sorted({r["cell"] for r in rows}):
        biggest = max((r for r in rows if r["cell"] == cell), key=lambda r: (int(r["layers"]), int(r["hidden"])))
        time_ratio = float(biggest["ours_ms"]) / float(biggest["torch_ms"])
        mem_ratio = float(biggest["ours_peak_bytes"]) / float(biggest["torch_peak_bytes"])
        figures.append(f"{cell} {biggest['layers']}x{biggest['hidden']}: {float(biggest['ours_ms']):.2f} ms vs cuDNN "
                       f"{float(biggest['torch_ms']):.2f} ms ({time_ratio:.2f}x), peak memory {mem_ratio:.2f}x")
    return f"{len(rows)} points; " + "; ".join(figures)


# ----- rows and the table -------------------------------------------------------------------
def record(out: Path, name: str, status: str, figure: str, seconds: float | None = None) -> None:
    figure = " ".join(figure.split())  # one line, no tabs
    with open(out / "summary.tsv", "a") as f:
        f.write(f"{name}\t{status}\t{figure}\t{'' if seconds is None else f'{seconds:.0f}'}\n")
    print(f"[{status}] {name}: {figure}", flush=True)


def summary(out: Path) -> int:
    path = out / "summary.tsv"
    rows = [line.rstrip("\n").split("\t") for line in path.read_text().splitlines()] if path.exists() else []
    rows = [(r + [""] * 4)[:4] for r in rows]
    head = ("check", "result", "s", "figure")
    table = [head] + [(name, status, seconds, figure) for name, status, figure, seconds in rows]
    widths = [max(len(r[k]) for r in table) for k in range(3)]
    print("\n== summary")
    for r in table:
        print("  ".join(r[k].ljust(widths[k]) for k in range(3)) + "  " + r[3])
    failed = [r[0] for r in rows if r[1] == "FAIL"]
    print(f"{len(rows) - len(failed)} of {len(rows)} checks passed or skipped" +
          (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    options = {"--device": "cuda", "--work": tempfile.gettempdir()}
    for option in options:
        if option in argv:
            options[option] = argv.pop(argv.index(option) + 1)
            argv.remove(option)
    device, work = options["--device"], options["--work"]
    out, names = Path(argv[0]), argv[1:]
    out.mkdir(parents=True, exist_ok=True)
    status = 0
    for name in names:
        if name == "summary":
            status |= summary(out)
            continue
        kind, _, arg = name.partition(":")
        if kind == "record":
            row, status_, figure = arg.split(":", 2)
            record(out, row, status_, figure)
            continue
        start = time.perf_counter()
        runs = {"selfcheck": lambda: run_selfcheck(device), "memory": lambda: run_memory(device, Path(work)),
                "precision": lambda: run_precision(device), "recipe": lambda: read_recipe(arg),
                "benchmark": lambda: read_bench(arg)}
        if kind not in runs:
            raise SystemExit(f"CHECK: expected one of {', '.join(runs)}, summary or record:..., got {name!r}")
        if device == "cuda" and kind in ("selfcheck", "memory", "precision") and not torch.cuda.is_available():
            record(out, kind, "SKIP", "no CUDA device visible")
            continue
        try:
            figure, result = runs[kind](), "PASS"
        except Exception as err:  # noqa: BLE001 (a row says what failed; the next check still runs)
            figure, result = f"{type(err).__name__}: {err}"[:400], "FAIL"
            status = 1
        record(out, kind, result, figure, time.perf_counter() - start)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
