#!/usr/bin/env bash
# Multi30k German->English benchmark of `attnlab train translate` (its default recipe):
# trained on train, selected on val (greedy BLEU every 500 steps), reported on test_2016_flickr with
# sacreBLEU (cased, 13a, detokenized) and chrF, greedy and beam 4.
#
#   bench/multi30k.sh                        # the full recipe: 60 minutes of training on 2 threads
#   MAX_SECONDS=900 THREADS=1 RUN=runs/m30k-15min bench/multi30k.sh   # a shortened check
#
# Environment: DATA (folder with train/val/test_2016_flickr .de/.en[.gz], default ../shared/data/multi30k),
# RUN (run folder, default runs/multi30k), MAX_SECONDS (default 3600), THREADS (default 2), BIN (default .venv/bin).
# Prints one JSON line per step and leaves everything in RUN (config, weights, metrics, hypotheses, scores).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-../shared/data/multi30k}
RUN=${RUN:-runs/multi30k}
MAX_SECONDS=${MAX_SECONDS:-3600}
THREADS=${THREADS:-2}
BIN=${BIN:-.venv/bin}

"$BIN/attnlab" train translate --train "$DATA/train" --valid "$DATA/val" --src de --tgt en --out "$RUN" \
  --max-seconds "$MAX_SECONDS" --threads "$THREADS" --no-progress | tee "$RUN.train.json"
mv "$RUN.train.json" "$RUN/train.json"

for beam in 1 4; do
  "$BIN/attnlab" eval translate "$RUN" --src-file "$DATA/test_2016_flickr.de.gz" \
    --ref-file "$DATA/test_2016_flickr.en.gz" --beam "$beam" --threads "$THREADS" --json --no-progress \
    --hyp-out "$RUN/test_2016_flickr.beam$beam.en" | tee "$RUN/test_2016_flickr.beam$beam.json"
done
