#!/usr/bin/env bash
# Record more of SmolLM2's answers and train its EAGLE head on all of them, on a GPU, in a budget.
#
#   bash scripts/gpu_drafters.sh OUT [RECORD_SECONDS] [TRAIN_SECONDS]
#
# The same commands as on a CPU (`record`, `train-eagle`), with --device cuda and wide batches. The
# recording goes on where assets/recordings/smollm2-chat stopped, in float32 (the answers decoding
# writes on a CPU), for RECORD_SECONDS; its finished shards come back as OUT/answers.tar.gz (token
# ids, to commit). EAGLE then trains on every recorded answer, the last two shards held out and the
# one before them choosing the epoch, until validation stops rising or TRAIN_SECONDS have passed;
# the head comes back in OUT/eagle/. Everything printed goes to OUT/log.txt. SmolLM2 must be
# fetched first (`python -m decoding fetch smollm2`). Nothing here is run by the test suite.
set -euo pipefail
OUT=${1:?output folder}
RECORD_SECONDS=${2:-240}
TRAIN_SECONDS=${3:-150}
ANSWERS=assets/recordings/smollm2-chat
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/eagle"
exec > >(tr '\r' '\n' | grep --line-buffered -v -E 'it/s\]$|s/it\]$|answer/s|batch/s\]|step/s\]' | tee -a "$OUT/log.txt") 2>&1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
before=$(ls $ANSWERS/shard-*.json | wc -l)
python3 -m decoding record --model smollm2 --questions assets/questions/chat.json --out $ANSWERS \
  --device cuda --batch-size 512 --max-seconds "$RECORD_SECONDS"
after=$(ls $ANSWERS/shard-*.json | wc -l)
echo "shards: $before before, $after after"
tar -czf "$OUT/answers.tar.gz" $ANSWERS
python3 -m decoding train-eagle --model smollm2 --recorded $ANSWERS --device cuda --out /tmp/eagle \
  --heldout-shards 2 --validation-shards 1 --no-fused --unroll 4 --batch-tokens 4096 --epochs 8 --patience 2 \
  --max-seconds "$TRAIN_SECONDS"
# Shipped in float16, like the head before it (it loads in the model's dtype).
python3 -c "
import sys, torch; from safetensors.torch import load_file, save_file
w = load_file(sys.argv[1]); save_file({k: v.half() if v.is_floating_point() else v for k, v in w.items()}, sys.argv[2])
" /tmp/eagle/eagle.safetensors "$OUT/eagle/eagle.safetensors"
cp /tmp/eagle/eagle_config.json "$OUT/eagle/"
