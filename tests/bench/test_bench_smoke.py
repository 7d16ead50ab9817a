"""The whole benchmark on a tiny grid: every table, CSV, plot and ratio is there and sane.

No wall-clock thresholds: times on a shared CPU mean nothing; only memory (deterministic)
and the shape of the output are asserted.
"""
import csv
import math

import pytest
import torch

from lightning_rnn.bench import main
from lightning_rnn.bench.config import load_preset
from lightning_rnn.bench.gemm_only import gemm_flops_formula

IMPLS = ["ours", "torch", "naive", "gemm"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    cfg = load_preset(
        "smoke",
        [f"out_dir={out}", "threads=1", "rounds=2", "warmup=0", "table=plain", "varlen.cells=[lstm]"],
    )
    threads_before = torch.get_num_threads()
    lines = []
    result = main(cfg, log=lines.append)
    return cfg, result, lines, threads_before


def test_grid_has_every_point_and_implementation(run):
    cfg, result, _, _ = run
    rows = result.tables["grid"].rows
    points = {(r["cell"], r["layers"], r["hidden"]) for r in rows}
    assert points == {(c, l, h) for c in ("lstm", "gru") for l in (1, 2) for h in (8, 16)}
    for row in rows:
        for impl in IMPLS:
            assert row[f"{impl}_ms"] > 0
        for impl in ("ours", "torch", "naive"):
            assert row[f"{impl}_bytes"] > 0
        assert "gemm_bytes" not in row  # the lower bound has no activation memory


def test_ratios_are_positive_finite_and_consistent(run):
    _, result, _, _ = run
    for table in result.tables.values():
        for row in table.rows:
            ratios = {k: v for k, v in row.items() if k.startswith(("time_", "mem_"))}
            assert ratios, table.name
            for key, value in ratios.items():
                assert value > 0 and math.isfinite(value), (table.name, key, value)
                metric, pair = key.split("_", 1)
                a, b = pair.split("/")
                unit = "_bytes" if metric == "mem" else "_ms" if a + "_ms" in row else "_us_per_token"
                assert value == pytest.approx(row[a + unit] / row[b + unit])


def test_memory_ranking_on_the_grid(run):
    """Activation memory is deterministic: ours saves less than torch.nn's LSTM and the naive loop."""
    _, result, _, _ = run
    for row in result.tables["grid"].rows:
        assert row["mem_ours/naive"] < 1
        if row["cell"] == "lstm":
            assert row["mem_ours/torch"] < 0.5


def test_gemm_only_counts_the_layer_flops(run):
    _, result, _, _ = run
    for row in result.tables["grid"].rows:
        flops = gemm_flops_formula(row["cell"], row["input"], row["hidden"], row["layers"], row["tokens"])
        assert row["gemm_gflop"] == pytest.approx(flops / 1e9)


def test_csv_files_parse_with_the_expected_columns(run):
    _, result, _, _ = run
    for name, table in result.tables.items():
        with open(result.out_dir / f"{name}.csv", newline="") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
        assert len(rows) == len(table.rows)
        assert {"cell", "layers", "hidden", "batch", "seq_len", "tokens"} <= set(reader.fieldnames)
        for row in rows:
            for key, value in row.items():
                if key.endswith(("_ms", "_bytes")) or key.startswith(("time_", "mem_")):
                    assert float(value) > 0, (name, key)
    grid_cols = open(result.out_dir / "grid.csv").readline().strip().split(",")
    for col in ("ours_ms", "torch_ms", "naive_ms", "gemm_ms", "ours_bytes", "time_ours/torch", "time_ours/naive",
                "time_ours/gemm", "mem_ours/torch", "mem_ours/naive", "backend", "gemm_gflop"):
        assert col in grid_cols


def test_plots_and_markdown_exist(run):
    _, result, _, _ = run
    for name in ("lstm_time", "lstm_memory", "gru_time", "gru_memory", "scaling"):
        path = result.out_dir / f"{name}.png"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    text = (result.out_dir / "results.md").read_text()
    for table in result.tables.values():
        assert table.title in text
    assert "torch threads: 1" in text


def test_other_sections(run):
    cfg, result, _, _ = run
    varlen = result.tables["varlen"].rows
    assert [r["cell"] for r in varlen] == ["lstm"]
    assert varlen[0]["tokens"] < cfg.varlen.batch * cfg.varlen.seq_len
    assert varlen[0]["mem_ours.packed/ours.padded"] < 1  # packing saves only the real tokens
    scaling = result.tables["scaling"].rows
    assert [r["seq_len"] for r in scaling] == cfg.scaling.seq_lens
    # activation memory is linear in T: bytes per token the same at every length
    per_token = [r["ours_bytes"] / r["tokens"] for r in scaling]
    assert per_token[-1] == pytest.approx(per_token[0], rel=0.05)
    features = result.tables["features"]
    present = {k[:-3] for k in features.rows[0] if k.endswith("_ms")}
    skipped = [n for n in features.notes if n.startswith("skipped")]
    assert present | {n.split()[1].rstrip(":") for n in skipped} == set(cfg.features.implementations)
    if "ours+bf16" in present:
        assert features.rows[0]["mem_ours+bf16/ours"] <= 0.65


def test_projection_section(run):
    """One row per (layers, hidden, proj_size) with proj_size < hidden; ours saves less than torch.nn."""
    cfg, result, _, _ = run
    rows = result.tables["projection"].rows
    points = [(r["layers"], r["hidden"], r["proj"]) for r in rows]
    assert points == [(L, H, P) for L in cfg.projection.layers for H in cfg.projection.hidden
                      for P in cfg.projection.proj_sizes if P < H]
    assert all(0 < r["mem_ours/torch"] < 1 and r["time_ours/torch"] > 0 for r in rows)


def test_alone_section_runs_each_implementation_in_processes_of_its_own(run):
    """One row per point; each implementation's step time and page faults from its own
    worker processes; the input requires grad or not as configured; a worker's failure is
    reported with its error."""
    cfg, result, _, _ = run
    rows = result.tables["alone"].rows
    assert [(r["cell"], r["hidden"]) for r in rows] == [(c, h) for c in cfg.alone.cells for h in cfg.alone.hidden]
    for row in rows:
        assert row["processes"] == cfg.alone.pairs
        for impl in cfg.alone.implementations:
            assert row[f"{impl}_ms"] > 0 and row[f"{impl}_faults"] >= 0
            assert 0 <= row[f"{impl}_pool_mb"] < row[f"{impl}_peak_rss_mb"]
    from lightning_rnn.bench.alone import _run_worker

    spec = {"cell": "gru", "layers": 2, "hidden": 8, "batch": 3, "seq_len": 4, "steps": 2, "warmup": 1,
            "threads": 1, "seed": 0, "device": "cpu", "impl": "ours", "input_grad": True}
    done = _run_worker(spec)
    assert done["step_s"] > 0 and done["input_grad"] is True
    assert 0 <= done["pool_bytes"] < done["peak_rss_bytes"]  # the pool's share of the resident memory
    assert _run_worker(spec | {"input_grad": False})["input_grad"] is False
    with pytest.raises(RuntimeError, match="the worker for ours failed"):
        _run_worker(spec | {"cell": "rnn"})


@pytest.mark.parametrize(("command", "status"), [("exit 3", "exit status 3"), ("kill -9 $$", "killed by SIGKILL")])
def test_alone_worker_dying_silently_is_reported_with_its_status(monkeypatch, tmp_path, command, status):
    """A worker that dies without a word on stderr (the OOM killer, a crash) is reported
    with how it ended, not as a bare 'failed'."""
    from lightning_rnn.bench import alone

    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\n{command}\n")
    fake.chmod(0o755)
    monkeypatch.setattr(alone.sys, "executable", str(fake))
    with pytest.raises(RuntimeError, match=rf"the worker for ours failed \({status}\)"):
        alone._run_worker({"impl": "ours"})


def test_threads_fixed_for_the_run_and_restored(run):
    _, result, lines, threads_before = run
    assert result.threads == 1
    assert any("torch threads: 1" in line for line in lines)
    assert torch.get_num_threads() == threads_before


def test_the_smoke_preset_says_its_ratios_mean_nothing(run):
    """Printed first and in every table's header: a first look at the smoke run's ratios
    (an 'alone' ratio of 20x or 0.004x) is no measurement."""
    _, result, lines, _ = run
    assert lines[0].startswith("note: smoke preset:") and "mean anything" in lines[0]
    assert (result.out_dir / "grid.md").read_text().count(lines[0]) == 1
    assert load_preset("full").note is None


def test_replot_redraws_from_the_csvs(run):
    from lightning_rnn.bench.harness import replot
    from lightning_rnn.bench.report import read_csv

    _, result, _, _ = run
    assert read_csv(result.out_dir / "grid.csv").rows == result.tables["grid"].rows
    names = sorted(p.name for p in replot(result.out_dir))
    assert names == ["gru_memory.png", "gru_time.png", "lstm_memory.png", "lstm_time.png", "scaling.png"]


def lstm_weight_bytes(layers, hidden, embedding, vocab, element=4):
    """Bytes a character reads: every layer's W_ih, W_hh (element bytes each) and folded bias
    (float32), the output layer's weight and bias, one embedding row (float32)."""
    matrices = sum(4 * hidden * ((embedding if k == 0 else hidden) + hidden) for k in range(layers)) + vocab * hidden
    return matrices * element + 4 * (layers * 4 * hidden + vocab + embedding)


def test_generation_section(run):
    """Characters per second of every implementation, and the bound from the weights' bytes."""
    cfg, result, lines, _ = run
    section = cfg.generation
    rows = result.tables["generation"].rows
    assert [(r["cell"], r["layers"], r["hidden"]) for r in rows] == [
        (c, layers, hidden) for c in section.cells for layers, hidden in section.models]
    for row in rows:
        for name in (*section.implementations, "bound", "bound_bf16"):
            assert row[f"{name}_chars_per_s"] == pytest.approx(1e6 / row[f"{name}_us_per_token"])
        assert row["bound_chars_per_s"] == pytest.approx(row["bandwidth_gbs"] * 1e9 / row["weight_bytes"])
        assert row["bound_bf16_chars_per_s"] == pytest.approx(row["bandwidth_gbs"] * 1e9 / row["weight_bf16_bytes"])
        assert row["threads"] == 1 and row["batch"] == 1 and row["seq_len"] == section.length
        if row["cell"] == "lstm":
            args = (row["layers"], row["hidden"], section.embedding_dim, section.vocab)
            assert row["weight_bytes"] == lstm_weight_bytes(*args)
            assert row["weight_bf16_bytes"] == lstm_weight_bytes(*args, element=2)
    assert any(line.startswith("[generation] lstm 1x8: compiled ") for line in lines)
