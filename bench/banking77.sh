#!/usr/bin/env bash
# BANKING77 with the default recipe of `attnlab train classify` (issue 5).
#
#   bash bench/banking77.sh [RUN_FOLDER]
#
# Trains from scratch on ../shared/data/banking77/train.csv, holding out 10% of it for validation (model
# selection only; the official test split stays held out), then scores the kept weights on that validation
# split. No flag beyond the data and the split: the defaults are the recipe. Prints the validation accuracy
# and the wall time on the training command's last line.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${BANKING77:-../shared/data/banking77/train.csv}
RUN=${1:-runs/banking77}
BIN=${ATTNLAB:-.venv/bin/attnlab}
if [ -e "$RUN" ]; then
    echo "error: $RUN exists; give another run folder" >&2
    exit 2
fi
/usr/bin/time -f "process: %e s wall, %U s user, %S s system" \
    "$BIN" train classify --train "$DATA" --valid-fraction 0.1 --out "$RUN"
