#!/usr/bin/env bash
# BANKING77 with the default recipe of `attnlab train classify` (issue 5).
#
#   bash bench/banking77.sh [RUN_FOLDER]     # default: runs/banking77 in the repository
#
# Environment: BANKING77 (the CSV, default ../shared/data/banking77/train.csv beside the repository), ATTNLAB (the
# command, default the repository's .venv/bin/attnlab). Relative paths are read from the caller's folder.
#
# Trains from scratch on ../shared/data/banking77/train.csv, holding out 10% of it for validation (model
# selection only; the official test split stays held out), then scores the kept weights on that validation
# split. No flag beyond the data and the split: the defaults are the recipe. Prints the validation accuracy
# and the wall time on the training command's last line.
set -euo pipefail
# Paths given by the caller are the caller's: made absolute before the script moves to the repository root.
here=$(pwd)
absolute() { case "$1" in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$here/$1" ;; esac; }
DATA=$(absolute "${BANKING77:-$(dirname "$0")/../../shared/data/banking77/train.csv}")
RUN=$(absolute "${1:-$(dirname "$0")/../runs/banking77}")
BIN=${ATTNLAB:-$(dirname "$0")/../.venv/bin/attnlab}
case "$BIN" in */*) BIN=$(absolute "$BIN") ;; esac  # (a bare command name is looked up on PATH)
cd "$(dirname "$0")/.."
if [ -e "$RUN" ]; then
    echo "error: $RUN exists; give another run folder" >&2
    exit 2
fi
/usr/bin/time -f "process: %e s wall, %U s user, %S s system" \
    "$BIN" train classify --train "$DATA" --valid-fraction 0.1 --out "$RUN"
