"""The checkpointing study behind docs/callbacks.md's figures, on a tiny layer."""
from __future__ import annotations

from lightning_rnn.bench.callback_figures import as_table
from lightning_rnn.bench.callbacks_bench import checkpointing_vs_naive


def test_checkpointing_study_trades_memory_for_chunks_at_each_chunk_size():
    result = checkpointing_vs_naive(
        hidden=8, layers=2, batch=3, seq=16, chunk_sizes=("sqrt", 2, 8, 16), rounds=1, backend="reference"
    )
    rows = result["rows"]
    assert [r["chunk_size"] for r in rows] == ["sqrt", "2", "8", "16"]
    assert [(r["steps_per_chunk"], r["chunks"]) for r in rows] == [(4, 4), (2, 8), (8, 2), (16, 1)]
    by_steps = sorted(rows, key=lambda r: r["steps_per_chunk"])
    saved = [r["saved_bytes_checkpointed"] for r in by_steps]
    peak_extra = [r["recompute_peak_bytes"] - r["saved_bytes_checkpointed"] for r in by_steps]
    # fewer chunks: fewer boundary states saved, a larger chunk recomputed at a time
    assert saved == sorted(saved, reverse=True) and len(set(saved)) == len(saved)
    assert peak_extra == sorted(peak_extra) and len(set(peak_extra)) == len(peak_extra)
    for r in rows:
        assert r["saved_bytes_checkpointed"] < result["saved_bytes_fused"] < result["saved_bytes_naive_loop"]
        assert r["memory_naive_over_checkpointed"] == result["saved_bytes_naive_loop"] / r["saved_bytes_checkpointed"]
        assert r["time_checkpointed_over_plain"] > 0
    table = as_table("checkpoint_vs_naive", "t", result)
    assert len(table.rows) == 4 and any(note.startswith("saved_bytes_naive_loop = ") for note in table.notes)
