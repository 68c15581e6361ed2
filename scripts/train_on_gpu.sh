#!/bin/bash
# One training run of the built-in model on a lent GPU, within a 9-minute budget: rows generated
# there by worker processes, bf16 autocast. Into $OUT (files of at most 16 MiB, few of them): the
# export's weight shards, the rest of the export as export-meta.tar, train.log. The state (weights +
# optimiser) stays in /tmp. Back here: mkdir D && tar -xf export-meta.tar -C D && cp *.safetensors D/
#
#   bash scripts/train_on_gpu.sh                 # the 8.9M shape from scratch, 8 minutes
#   MINUTES=5 SHAPE="192 6 6 576" bash scripts/train_on_gpu.sh
#
# The tokenizer is the CPU run's (runs/tiny-llada/tokenizer, carried to the machine) where present,
# so that a GPU export and the CPU runs share one vocabulary; else it is trained there first.
set -euo pipefail
OUT=${OUT:-/tmp/gpu-out}
MINUTES=${MINUTES:-8}
DEVICE=${DEVICE:-cuda}                      # DEVICE=cpu: a dry run of this script here
PY=${PY:-python3}                           # the interpreter that holds torch
read -r D LAYERS HEADS MLP <<< "${SHAPE:-256 8 8 768}"
STATE=/tmp/gpu-run
EXPORT=/tmp/gpu-export
mkdir -p "$STATE/tokenizer" "$OUT"
if [ -f runs/tiny-llada/tokenizer/tokenizer.json ]; then cp runs/tiny-llada/tokenizer/* "$STATE/tokenizer/"; fi
WORKERS=$(( $(nproc) > 3 ? $(nproc) - 2 : 1 ))
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
PYTHONPATH=. PYTHONUNBUFFERED=1 "$PY" scripts/train_tiny.py --recipe tiny-llada --device "$DEVICE" \
    --workers "$WORKERS" --state-dir "$STATE" --out "$EXPORT" --vocab-size 4096 \
    --d-model "$D" --n-layers "$LAYERS" --n-heads "$HEADS" --mlp-hidden-size "$MLP" --seq-len 192 \
    --batch-size 512 --lr 3e-3 --warmup-steps 200 --total-steps 1000000 --decay-minutes 3 \
    --max-minutes "$MINUTES" --save-every-minutes 3 --eval-every 500 --gen-len 256 2>&1 | tee "$OUT/train.log"
PYTHONPATH=. "$PY" scripts/copy_probe.py "$EXPORT" 2>&1 | tail -1 | tee -a "$OUT/train.log"
cp "$EXPORT"/*.safetensors "$OUT/"
tar -C "$EXPORT" -cf "$OUT/export-meta.tar" --exclude='*.safetensors' .
ls -la "$OUT"
