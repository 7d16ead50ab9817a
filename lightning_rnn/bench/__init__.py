"""Benchmark harness: ours vs torch.nn vs a naive cell loop vs GEMM-only."""
