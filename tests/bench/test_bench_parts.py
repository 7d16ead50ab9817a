"""The benchmark's parts: interleaved timing, the GEMM-only lower bound, variable lengths."""
import pytest
import torch

from lightning_rnn.bench.gemm_only import GemmOnly, gemm_flops_formula
from lightning_rnn.bench.measure import Measured, Ratio, standard_ratios
from lightning_rnn.bench.timing import interleave
from lightning_rnn.bench.varlen import lengths_with_fill


def test_interleave_shuffles_the_order_each_round_and_keeps_every_sample():
    calls = []
    fns = {name: (lambda n=name: calls.append(n)) for name in "abc"}
    timings = interleave(fns, rounds=40, warmup=1)
    assert calls[:3] == ["a", "b", "c"]  # warm-up
    rounds = [calls[3 + 3 * r : 6 + 3 * r] for r in range(40)]
    assert all(sorted(r) == ["a", "b", "c"] for r in rounds)
    neighbours = {(r[i], r[i + 1]) for r in rounds for i in range(2)}
    assert len(neighbours) == 6  # each implementation ran right before each other one
    assert {r[0] for r in rounds} == {"a", "b", "c"}
    assert all(len(s) == 40 and min(s) >= 0 for s in timings.samples.values())
    assert timings.ratio("a", "a") == 1.0
    again = []
    interleave({name: (lambda n=name: again.append(n)) for name in "abc"}, rounds=40, warmup=1)
    assert again == calls  # seeded: a run is repeatable


def test_interleave_adds_rounds_until_min_seconds(monkeypatch):
    import lightning_rnn.bench.timing as timing

    ticks = iter(range(10_000))
    monkeypatch.setattr(timing.time, "perf_counter", lambda: 0.5 * next(ticks))  # every call: 0.5 s
    fns = {"a": lambda: None, "b": lambda: None}
    assert interleave(fns, rounds=2, warmup=0).rounds == 2
    timings = interleave(fns, rounds=2, warmup=1, min_seconds=4.0)  # 1 s of timed calls per round
    assert timings.rounds == 4 and all(len(s) == 4 for s in timings.samples.values())
    assert interleave(fns, rounds=6, warmup=0, min_seconds=1.0).rounds == 6  # rounds is the minimum
    with pytest.raises(ValueError, match="^min_seconds:"):
        interleave(fns, rounds=1, min_seconds=-1.0)


@pytest.mark.parametrize("cell, gates", [("lstm", 4), ("gru", 3)])
@pytest.mark.parametrize("batch_sizes", [[3] * 4, [3, 3, 2, 1]])
def test_gemm_only_does_exactly_the_layer_gemms(cell, gates, batch_sizes):
    I, H, L = 5, 6, 2
    plan = GemmOnly(cell, I, H, L, batch_sizes)
    N, T = sum(batch_sizes), len(batch_sizes)
    # per layer: input projection, T recurrent, T recurrent dh, dX, dW_ih, dW_hh
    assert len(plan.gemms) == L * (2 * T + 4)
    assert plan.flops == gemm_flops_formula(cell, I, H, L, N)
    by_hand = sum(6 * N * gates * H * ((I if layer == 0 else H) + H) for layer in range(L))
    assert plan.flops == by_hand
    shapes = {g.name: (g.m, g.k, g.n) for g in plan.gemms}
    assert shapes["layer0 x@W_ih^T"] == (N, I, gates * H)
    assert shapes["layer1 dW_hh"] == (gates * H, N, H)
    assert shapes[f"layer0 t{T - 1} h@W_hh^T"] == (batch_sizes[-1], H, gates * H)


def test_gemm_only_writes_its_products():
    plan = GemmOnly("lstm", 4, 4, 1, [2, 2])
    gemm, a, b, out = plan._ops[-1]  # dW_hh: its own output buffer, nothing writes its operands later
    assert gemm.name == "layer0 dW_hh"
    out.zero_()
    plan.run()
    torch.testing.assert_close(out, a @ b)


@pytest.mark.parametrize("fill", [0.3, 0.55, 0.9, 1.0])
def test_variable_lengths_have_the_asked_fill(fill):
    lengths = lengths_with_fill(50, 50, fill)
    assert len(lengths) == 50 and max(lengths) == 50 and min(lengths) >= 1
    assert abs(sum(lengths) / 2500 - fill) < 0.03


def test_ratios_compare_ours_with_each_baseline_and_modifiers_with_their_plain_self():
    cols = [r.column for r in standard_ratios(["ours", "ours+ckpt", "torch", "naive", "gemm"])]
    assert {"time_ours/torch", "time_ours/naive", "time_ours/gemm", "time_torch/gemm"} <= set(cols)
    assert {"time_ours+ckpt/ours", "mem_ours+ckpt/naive", "mem_ours/torch"} <= set(cols)
    assert "mem_ours/gemm" not in cols  # gemm has no activation memory
    m = {"a": Measured(2.0, 10, None), "b": Measured(4.0, 40, None)}
    assert Ratio("time", "a", "b").value(m) == 0.5 and Ratio("mem", "a", "b").value(m) == 0.25


def test_callback_study_results_become_tables():
    from lightning_rnn.bench.callback_figures import as_table

    rows = as_table("s", "t", {"rows": [{"T": 100, "bytes": 5}, {"T": 400, "bytes": 9}], "exponent": 0.5012})
    assert [r["T"] for r in rows.rows] == [100, 400] and rows.notes == ["exponent = 0.501"]
    single = as_table("p", "t", {"epoch_s_packed": 1.0, "epoch_s_padded": 2.0})
    assert single.rows == [{"epoch_s_packed": 1.0, "epoch_s_padded": 2.0}]


@pytest.mark.parametrize("style", ["rich", "plain"])
def test_tables_print_with_units_and_constants_hoisted(style, capsys):
    from lightning_rnn.bench.measure import Table
    from lightning_rnn.bench.report import markdown, print_table

    rows = [
        {"cell": "lstm", "batch": 50, "hidden": h, "ours_ms": 2.0 * h, "ours_bytes": 2**20 * h, "time_ours/torch": 0.9}
        for h in (64, 128)
    ]
    table = Table("grid", "a title", rows, ["a note"])
    print_table(table, style)
    out = capsys.readouterr().out
    for text in ("a title", "a note", "cell=lstm, batch=50", "ours ms", "ours MiB", "time ours/torch", "128.00", "0.90"):
        assert text in out, text
    md = markdown(table)
    assert "| hidden | ours ms | ours MiB | time ours/torch |" in md and "| 64 | 128.0 | 64.00 | 0.90 |" in md


def test_results_md_keeps_sections_of_earlier_runs(tmp_path):
    from lightning_rnn.bench.measure import Table
    from lightning_rnn.bench.report import write_markdown, write_results

    for name in ("varlen", "grid"):
        write_markdown(Table(name, f"{name} title", [{"x": 1}]), tmp_path, ["threads: 1"])
    write_markdown(Table("grid", "grid title, run 2", [{"x": 2}]), tmp_path)
    text = write_results(tmp_path, ["grid", "varlen"]).read_text()
    assert text.index("grid title, run 2") < text.index("varlen title")
    assert "*Run:* threads: 1" in text


def test_torch_under_bf16_is_skipped_with_the_reason_where_it_fails():
    """On CPUs without native bf16, torch.nn.LSTM under bf16 autocast raises in oneDNN: the
    benchmark skips 'torch+bf16' with a note rather than crash mid-run."""
    from lightning_rnn.bench.subjects import runnable

    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.nn.LSTM(4, 4)(torch.randn(2, 1, 4))
        fails = False
    except RuntimeError:
        fails = True
    keep, notes = runnable(["ours", "torch+bf16", "ours+bf16"], "cpu")
    assert keep == (["ours", "ours+bf16"] if fails else ["ours", "torch+bf16", "ours+bf16"])
    assert any(n.startswith("skipped torch+bf16: torch.nn.LSTM fails under bf16 autocast") for n in notes) == fails


def test_cuda_measurements_are_taken_on_the_benchmark_s_gpu(monkeypatch):
    """bench.device=cuda:1: the peak memory and the timing syncs are those of cuda:1, not of
    the current device (cuda:0 unless set), which saw none of the work. CUDA's calls are
    replaced by fakes that record the device they were asked about."""
    from lightning_rnn.bench.measure import measure
    from lightning_rnn.bench.subjects import Subject

    asked = []

    def fake(result=0):
        return lambda device=None: asked.append(None if device is None else torch.device(device)) or result

    for name in ("synchronize", "reset_peak_memory_stats", "memory_allocated", "max_memory_allocated"):
        monkeypatch.setattr(torch.cuda, name, fake())
    measured = measure({"ours": Subject("ours", lambda: None)}, rounds=2, warmup=1, device="cuda:1")
    assert measured["ours"].peak_bytes == 0 and measured["ours"].rounds >= 2
    assert asked and all(d == torch.device("cuda:1") for d in asked)


def test_page_faults_are_figures_never_hoisted_as_constants():
    """The 'alone' section's page faults per step are measurements: a column with the same
    count in every row (e.g. none at all) stays in the table, with its unit, rather than
    going into the caption with the parameters."""
    from lightning_rnn.bench.measure import Table
    from lightning_rnn.bench.report import caption, markdown

    rows = [{"cell": "lstm", "hidden": h, "ours_ms": 1.0 * h, "ours_faults": 0.0, "torch_faults": 3.5} for h in (8, 16)]
    table = Table("alone", "a title", rows)
    assert caption(table) == "cell=lstm"
    assert "| hidden | ours ms | ours faults | torch faults |" in markdown(table)
