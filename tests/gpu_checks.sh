#!/usr/bin/env bash
# The CUDA checks in one run on a GPU machine (about 5-8 minutes; each step has its own
# time limit, so the whole run ends within ~9.5 minutes and reports what it reached):
#   1. environment (python, torch, CUDA, GPU, nvcc);
#   2. build the 'cuda' backend (nvcc) and, meanwhile, the 'cpp' one (the layer tests
#      collect the CPU backends too);
#   3. every CUDA test: kernel parity with the reference in float64 (LSTM/GRU, packed,
#      reverse, proj_size, gradcheck), layer parity with torch.nn (multi-layer,
#      bidirectional, packed, checkpointed), bf16/fp16 autocast (tests selected by 'cuda');
#   4. the benchmark on the GPU, with the *_peak_bytes (CUDA memory) columns: a reduced
#      default preset (no callbacks/scaling sections).
# Usage, from the repository root:  bash tests/gpu_checks.sh [OUT_DIR]
# OUT_DIR (default $OUT, else ./gpu_results) gets env.txt, build.log, tests.log,
# bench.log and bench.tgz (the benchmark's CSV/Markdown/PNG files).
# Needs torch with CUDA, pytest, nvcc and ninja. The benchmark also needs omegaconf (and
# antlr4): where pip cannot install them, copy those pure-Python packages into a folder
# and name it in LRNN_EXTRA_SITE (default: .gpu_site in the repository root, if present);
# docs/installation.md ("The CUDA backend") says how.
set -u
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-gpu_results}}
mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
EXTRA=${LRNN_EXTRA_SITE:-$PWD/.gpu_site}
export PYTHONPATH="$PWD${EXTRA:+:$EXTRA}${PYTHONPATH:+:$PYTHONPATH}"
export WANDB_MODE=offline PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-$(nproc)}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/lightning_rnn_extensions}
status=0

echo "== 1. environment" | tee "$OUT_DIR/env.txt"
"$PY" - <<'EOF' 2>&1 | tee -a "$OUT_DIR/env.txt"
import shutil, subprocess, sys
import torch
print("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda", torch.version.cuda)
print("gpus:", [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
nvcc = shutil.which("nvcc")
print("nvcc:", nvcc and subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.splitlines()[-1])
for name in ("pytest", "ninja", "omegaconf", "lightning"):
    try:
        __import__(name)
        print(f"{name}: ok")
    except ImportError as err:
        print(f"{name}: MISSING ({err})")
EOF

echo "== 2. build (cuda, and cpp alongside)" | tee "$OUT_DIR/build.log"
timeout 300 "$PY" -c "from lightning_rnn.kernels import cpp; cpp.load(); print('cpp backend built')" \
    > "$OUT_DIR/build_cpp.log" 2>&1 &
cpp_pid=$!
start=$SECONDS
timeout 300 "$PY" -c "from lightning_rnn.kernels import cuda; cuda.load(); print('cuda backend built')" \
    >> "$OUT_DIR/build.log" 2>&1 || status=1
echo "cuda build: $((SECONDS - start)) s" >> "$OUT_DIR/build.log"
wait "$cpp_pid"; cat "$OUT_DIR/build_cpp.log" >> "$OUT_DIR/build.log"; rm -f "$OUT_DIR/build_cpp.log"
tail -n 5 "$OUT_DIR/build.log"

echo "== 3. CUDA tests" | tee "$OUT_DIR/tests.log"
timeout 240 "$PY" -m pytest tests/kernels tests/layers/test_parity.py -k cuda -q -rs -p no:cacheprovider \
    >> "$OUT_DIR/tests.log" 2>&1 || status=1
tail -n 15 "$OUT_DIR/tests.log"

echo "== 4. benchmark on the GPU" | tee "$OUT_DIR/bench.log"
timeout 150 "$PY" -m lightning_rnn.bench --preset default device=cuda out_dir=/tmp/lightning_rnn_bench \
    rounds=3 warmup=1 callbacks.enabled=false scaling.enabled=false \
    'grid.layers=[1,2]' 'grid.hidden=[128,512]' 'varlen.hidden=[512]' 'projection.hidden=[512]' \
    >> "$OUT_DIR/bench.log" 2>&1 || status=1
tar czf "$OUT_DIR/bench.tgz" -C /tmp lightning_rnn_bench 2>/dev/null
tail -n 15 "$OUT_DIR/bench.log"
echo "== done: status $status (0: every step passed)"
exit $status
