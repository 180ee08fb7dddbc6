#!/usr/bin/env bash
# The H200 measurements issues 11 and 17 still wait for, in one go (about 9 minutes), written
# under OUT: the engine benchmark on a fresh machine start (issue 17's headline and first-run
# figures), the unsplit decode batches timed (issue 11), and sustained decode (issue 11).
#   bash benchmarks/pending_h200.sh OUT [SECONDS]
# SECONDS (default 560) bounds the whole: each step gets what the earlier ones left. It runs
# nothing on another GPU: these figures are judged against H200 ones.
set -u
out=${1:?usage: bash benchmarks/pending_h200.sh OUT [SECONDS]}
budget=${2:-560}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
echo "GPU: ${gpu:-none}"
case "$gpu" in *H200*) ;; *) echo "not an H200: nothing to run"; exit 0 ;; esac
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$out/gpu.txt"
date -u >> "$out/gpu.txt"
export PYTHONUNBUFFERED=1
t0=$(date +%s)
left() { echo $(( budget - ($(date +%s) - t0) )); }

timeout 170 python3 benchmarks/bench_engine.py --models qwen3_0_6b --repeat 3 --skip-decode \
    --out "$out/bench_qwen3_fresh.json" 2>&1 | tail -n 6
echo "bench done at $(( $(date +%s) - t0 )) s"

[ "$(left)" -gt 40 ] && timeout "$(left)" python3 benchmarks/measure_served_batches.py time \
    --profile testbed/sim/costmodel/profiles/h200_qwen3_0_6b.json \
    --batches benchmarks/results/fidelity/experiments/unsplit_batches.json \
    --out "$out/unsplit_timed_h200_qwen3_0_6b.json" 2>&1 | tail -n 5
echo "unsplit batches done at $(( $(date +%s) - t0 )) s"

[ "$(left)" -gt 60 ] && timeout "$(left)" python3 benchmarks/exp_sustained_decode.py --model qwen3_0_6b --rounds 1 \
    --out "$out/sustained_h200_qwen3_0_6b.json" 2>&1 | tail -n 18
echo "all done at $(( $(date +%s) - t0 )) s"
# Then, here: python benchmarks/exp_unsplit_decode.py --timed OUT/unsplit_timed_h200_qwen3_0_6b.json
