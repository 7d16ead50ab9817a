#!/usr/bin/env bash
# Every GPU path in one run on a machine with a GPU, ending with one summary table (each
# check PASS, FAIL or SKIP with its figure). A deadline (LRNN_GPU_BUDGET_S, default 570 s)
# bounds the whole run: each step gets at most what is left, and what was not reached is
# a FAIL row saying so. The steps:
#   1. environment (python, torch, CUDA, GPU, nvcc, the Python packages the CLI needs);
#   2. build the 'cuda' backend (nvcc) and, alongside, the 'cpp' one;
#   3. at once: every CUDA test (kernel parity with the reference, layer parity with
#      torch.nn, bf16/fp16 autocast: the tests selected by 'cuda'), and in a second process
#      the cuda backend's self-check on every GPU (kernels/selfcheck.py), GPUMemoryLogger's
#      CUDA statistics and snapshot on the real allocator, MixedPrecision fp16 (loss scaling,
#      overflowing steps skipped) and bf16, then the default recipe with trainer=gpu for 300
#      steps (the loss must fall);
#   4. alone on the GPU: the benchmark against cuDNN (time and peak CUDA memory).
# Usage, from the repository root:  bash tests/gpu_checks.sh [OUT_DIR]
#   OUT_DIR (default $OUT, else ./gpu_results) gets summary.tsv, env.txt, build.log, tests.log,
#   checks.log, recipe.log, bench.log and bench.tgz; bulky outputs stay in $WORK_DIR.
# Needs torch with CUDA, nvcc, ninja, pytest and lightning. The CLI (step 3's recipe) and the
# benchmark need hydra-core and omegaconf; where pip cannot install them, run
#   bash tests/gpu_checks.sh --prepare
# on a development machine (its python has them) to copy these pure-Python packages into
# .gpu_site/ (LRNN_EXTRA_SITE), which this script puts on PYTHONPATH (docs/installation.md).
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
EXTRA=${LRNN_EXTRA_SITE:-$PWD/.gpu_site}

if [ "${1:-}" = "--prepare" ]; then
    "$PY" - "$EXTRA" <<'EOF'
import importlib, shutil, sys
from pathlib import Path

dest = Path(sys.argv[1])
for name in ("hydra", "omegaconf", "antlr4"):
    source = Path(importlib.import_module(name).__file__).parent
    shutil.copytree(source, dest / name, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    print(f"{name}: {source} -> {dest / name}")
EOF
    exit $?
fi

OUT_DIR=${1:-${OUT:-gpu_results}}
WORK_DIR=${WORK_DIR:-${TMPDIR:-/tmp}/lightning_rnn_gpu_checks}
BUDGET=${LRNN_GPU_BUDGET_S:-570}
mkdir -p "$OUT_DIR" "$WORK_DIR"
rm -f "$OUT_DIR/summary.tsv"
export PYTHONPATH="$PWD${EXTRA:+:$EXTRA}${PYTHONPATH:+:$PYTHONPATH}"
export WANDB_MODE=offline PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-$(nproc)}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$WORK_DIR/extensions}
CHECKS=("$PY" tests/gpu/checks.py "$OUT_DIR" --work "$WORK_DIR")
START=$SECONDS

# seconds a step may take now: its own limit, or what is left of the budget (15 s kept for
# the summary), whichever is less; 0 when nothing is left
allowed() {
    local left=$((BUDGET - (SECONDS - START) - 15))
    if [ "$left" -lt "$1" ]; then echo $((left > 0 ? left : 0)); else echo "$1"; fi
}
limited() {  # LIMIT CMD...: CMD under a timeout of LIMIT s; 124 at once when no time is left
    local limit=$1
    shift
    if [ "$limit" -le 0 ]; then return 124; fi
    timeout -k 10 "$limit" "$@"
}
rows() { cat "$OUT_DIR/summary.tsv" 2>/dev/null | wc -l; }
record() {  # NAME STATUS FIGURE [SECONDS]
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$(echo "$3" | tr '\t\n' '  ')" "${4:-}" >> "$OUT_DIR/summary.tsv"
    echo "[$2] $1: $3"
}
# the figure of a step that failed: its timeout, or the last line of its log that says why
why() {  # RC LIMIT LOG
    if [ "$1" -eq 124 ] || [ "$1" -eq 137 ]; then echo "timed out after $2 s (see $(basename "$3"))"
    else echo "exit $1: $(grep -E 'Error|Exception|Unavailable|error:|FAILED|No module' "$3" | grep -v HYDRA_FULL_ERROR \
        | tail -n 1 | cut -c1-300) (see $(basename "$3"))"; fi
}

echo "== 1. environment"
"$PY" - > "$OUT_DIR/env.txt" 2>&1 <<'EOF'
import shutil, subprocess, sys
import torch
gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
nvcc = shutil.which("nvcc")
nvcc = nvcc and subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.splitlines()[-1]
missing = []
for name in ("pytest", "ninja", "lightning", "hydra", "omegaconf"):
    try:
        __import__(name)
    except ImportError:
        missing.append(name)
print("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda", torch.version.cuda)
print("gpus:", gpus)
print("nvcc:", nvcc)
print("missing:", " ".join(missing) or "none")
EOF
cat "$OUT_DIR/env.txt"
env_line=$(tr '\n' ' ' < "$OUT_DIR/env.txt")
if grep -qE "^missing: .*(hydra|omegaconf)" "$OUT_DIR/env.txt"; then
    record environment FAIL "$env_line(for hydra and omegaconf: bash tests/gpu_checks.sh --prepare, see the header)"
elif grep -q "gpus: \[\]" "$OUT_DIR/env.txt" || grep -q "nvcc: None" "$OUT_DIR/env.txt" \
        || ! grep -q "^missing: none" "$OUT_DIR/env.txt"; then
    record environment FAIL "$env_line"
else
    record environment PASS "$env_line"
fi

echo "== 2. build (cuda, and cpp alongside)"
limit=$(allowed 300)
limited "$limit" "$PY" -c "from lightning_rnn.kernels import cpp; cpp.load(); print('cpp backend built')" \
    > "$WORK_DIR/build_cpp.log" 2>&1 &
cpp_pid=$!
begin=$SECONDS
limited "$limit" "$PY" -c "from lightning_rnn.kernels import cuda; cuda.load(); print('cuda backend built')" \
    > "$OUT_DIR/build.log" 2>&1
rc=$?
took=$((SECONDS - begin))
if [ $rc -eq 0 ]; then record "build cuda" PASS "$took s" "$took"; else record "build cuda" FAIL "$(why $rc "$limit" "$OUT_DIR/build.log")" "$took"; fi
wait "$cpp_pid"
rc=$?
cat "$WORK_DIR/build_cpp.log" >> "$OUT_DIR/build.log"
if [ $rc -eq 0 ]; then record "build cpp" PASS "built (alongside the cuda build)" "$((SECONDS - begin))"
else record "build cpp" FAIL "$(why $rc "$limit" "$WORK_DIR/build_cpp.log")" "$((SECONDS - begin))"; fi

echo "== 3. CUDA tests | self-check, memory, precision, recipe"
tests_limit=$(allowed 300)
begin=$SECONDS
limited "$tests_limit" "$PY" -m pytest tests/kernels tests/layers/test_parity.py -k cuda -q -rs -p no:cacheprovider \
    > "$OUT_DIR/tests.log" 2>&1 &
tests_pid=$!

limit=$(allowed 180)
before=$(rows)
limited "$limit" "${CHECKS[@]}" selfcheck memory precision > "$OUT_DIR/checks.log" 2>&1
rc=$?
grep -E '^\[(PASS|FAIL|SKIP)\]' "$OUT_DIR/checks.log"
if [ $(($(rows) - before)) -lt 3 ]; then  # stopped before its last row (a timeout, a crash)
    record "self-check, memory, precision" FAIL "not all reached: $(why $rc "$limit" "$OUT_DIR/checks.log")"
fi

limit=$(allowed 180)
recipe_dir="$WORK_DIR/recipe"
rm -rf "$recipe_dir"
mkdir -p "$recipe_dir"
start_recipe=$SECONDS
limited "$limit" "$PY" -m lightning_rnn trainer=gpu logger=csv trainer.max_steps=300 "hydra.run.dir=$recipe_dir" \
    > "$recipe_dir/run.log" 2>&1
rc=$?
cp "$recipe_dir/run.log" "$OUT_DIR/recipe.log"
if [ $rc -eq 0 ]; then
    "${CHECKS[@]}" "recipe:$recipe_dir" >> "$OUT_DIR/checks.log" 2>&1
    tail -n 1 "$OUT_DIR/checks.log"
else
    record recipe FAIL "$(why $rc "$limit" "$OUT_DIR/recipe.log")" "$((SECONDS - start_recipe))"
fi

wait "$tests_pid"
rc=$?
counts=$(grep -E '[0-9]+ (passed|failed|skipped|error)' "$OUT_DIR/tests.log" | tail -n 1 | tr -d '=')
if [ $rc -eq 0 ] && echo "$counts" | grep -q passed; then
    record "cuda tests" PASS "$counts" "$((SECONDS - begin))"
else
    record "cuda tests" FAIL "${counts:-$(why $rc "$tests_limit" "$OUT_DIR/tests.log")}" "$((SECONDS - begin))"
fi
tail -n 15 "$OUT_DIR/tests.log"

echo "== 4. benchmark against cuDNN"
limit=$(allowed 150)
bench_dir="$WORK_DIR/bench"
rm -rf "$bench_dir"
begin=$SECONDS
limited "$limit" "$PY" -m lightning_rnn.bench --preset default device=cuda "out_dir=$bench_dir" rounds=5 warmup=2 \
    plots=false table=plain callbacks.enabled=false scaling.enabled=false alone.enabled=false \
    generation.enabled=false features.enabled=false projection.enabled=false \
    'grid.implementations=[ours,torch,gemm]' 'grid.layers=[1,2]' 'grid.hidden=[128,512]' 'varlen.hidden=[512]' \
    > "$OUT_DIR/bench.log" 2>&1
rc=$?
tar czf "$OUT_DIR/bench.tgz" -C "$WORK_DIR" bench 2>/dev/null
if [ $rc -eq 0 ]; then
    "${CHECKS[@]}" "benchmark:$bench_dir/grid.csv" >> "$OUT_DIR/checks.log" 2>&1
    tail -n 1 "$OUT_DIR/checks.log"
else
    record benchmark FAIL "$(why $rc "$limit" "$OUT_DIR/bench.log")" "$((SECONDS - begin))"
fi

echo "== done in $((SECONDS - START)) s"
"${CHECKS[@]}" summary
