#!/usr/bin/env bash
# Record and train at scale on a GPU: the same commands as on a CPU, with --device cuda.
#
#   bash scripts/gpu_record_train.sh MODEL OUT [QUESTIONS]
#
# MODEL: a wheel model name the machine has fetched (smollm2), a folder or a hub id. OUT: where the
# recording and the heads go. The recording resumes where it stopped; run the script again after an
# interruption. Batches are far wider than on a CPU: a GPU step costs about the same for 1 or 256 rows.
# Nothing here is run by the test suite.
set -euo pipefail
MODEL=${1:?model}
OUT=${2:?output folder}
QUESTIONS=${3:-assets/questions/chat.json}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"

python -m decoding record-bench --model "$MODEL" --questions "$QUESTIONS" --device cuda --batch-size 256 --count 512 \
  | tee "$OUT/record_bench.txt"
python -m decoding record --model "$MODEL" --questions "$QUESTIONS" --device cuda --batch-size 256 \
  --out "$OUT/recording"
python -m decoding train-eagle --model "$MODEL" --recorded "$OUT/recording" --device cuda --out "$OUT/eagle" \
  --epochs 20 --batch-tokens 4096 --heldout-shards 4 --validation-shards 4 --resume
# Medusa's heads read no base pass while they train (recorded_heads.py): the CPU trains them.
python -m decoding train-heads --model "$MODEL" --recorded "$OUT/recording" --out "$OUT/heads" \
  --epochs 10 --heldout-shards 4 --validation-shards 4 --patience 2
