#!/usr/bin/env bash
# Multi30k German->English benchmark of `attnlab train translate`: trained on train, selected on val (greedy
# BLEU every 500 steps and at the end), reported on test_2016_flickr with sacreBLEU (cased, 13a, detokenized)
# and chrF, greedy and beam 4 (length penalty 1.0, chosen on val).
#
#   bench/multi30k.sh                        # the recipe: at most 60 minutes of training on 2 threads
#   MAX_SECONDS=900 THREADS=1 RUN=runs/m30k-15min bench/multi30k.sh   # a shortened check
#   bench/multi30k.sh --d-ff 512             # extra arguments go to `attnlab train translate`
#
# The recipe is the command's defaults (d 256, 3+3 layers, 4 heads, ff 1024, dropout 0.1, shared and tied
# embeddings, label smoothing 0.1, AdamW (0.9, 0.98)) with RECIPE below: a joint BPE vocabulary of 8,000,
# batches of 2,000 padded positions a side, and a learning rate that warms up for 300 steps and decays by a
# cosine to 0 at step 1,900. On two idle cores of this machine kind a step takes 1.86 to 1.97 s, so the hour
# ends the run near step 1,830-1,900, where the learning rate is below 0.5% of its peak. On a slower machine
# lower --max-steps, so that the decay ends inside the time budget.
#
# Environment: DATA (folder with train/val/test_2016_flickr .de/.en[.gz], default ../shared/data/multi30k beside the
# repository), RUN (run folder, default runs/multi30k in the repository), MAX_SECONDS (default 3600), THREADS (default
# 2), BIN (default the repository's .venv/bin). Relative paths are read from the caller's folder.
# Leaves everything in RUN: config, weights, metrics, result.json (steps, time, best validation scores), test
# hypotheses and their scores.
set -euo pipefail
# Paths given by the caller are the caller's: made absolute before the script moves to the repository root.
here=$(pwd)
absolute() { case "$1" in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$here/$1" ;; esac; }
DATA=$(absolute "${DATA:-$(dirname "$0")/../../shared/data/multi30k}")
RUN=$(absolute "${RUN:-$(dirname "$0")/../runs/multi30k}")
BIN=$(absolute "${BIN:-$(dirname "$0")/../.venv/bin}")
MAX_SECONDS=${MAX_SECONDS:-3600}
THREADS=${THREADS:-2}
cd "$(dirname "$0")/.."
RECIPE=(--vocab-size 8000 --max-tokens 2000 --schedule cosine --warmup 300 --max-steps 1900)

"$BIN/attnlab" train translate --train "$DATA/train" --valid "$DATA/val" --src de --tgt en --out "$RUN" \
  --max-seconds "$MAX_SECONDS" --threads "$THREADS" --no-progress "${RECIPE[@]}" "$@"

for beam in 1 4; do
  "$BIN/attnlab" eval translate "$RUN" --src-file "$DATA/test_2016_flickr.de.gz" \
    --ref-file "$DATA/test_2016_flickr.en.gz" --beam "$beam" --threads "$THREADS" --json --no-progress \
    --hyp-out "$RUN/test_2016_flickr.beam$beam.en" | tee "$RUN/test_2016_flickr.beam$beam.json"
done
