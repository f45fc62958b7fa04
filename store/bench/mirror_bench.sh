#!/usr/bin/env bash
# Mirrors over throttled drives (issue 7): a store of ~MIB MiB of ~1 MiB records and a full
# mirror in a disk-backed directory, read through the real pread and io_uring engines wrapped in
# the TEST-ONLY token-bucket throttle (store/tests/throttle/mod.rs): primary at P MiB/s, mirror
# at M MiB/s, disk weights P,M. Prints aggregate bandwidth next to the sum of the limits and the
# per-drive byte split next to the weights, unstriped (demand batches) and striped (single
# records). Keep the limits well below the real disk's bandwidth. Raw output goes to
# store/bench/results/.
#
# usage: store/bench/mirror_bench.sh [DIR] [MIB] [P_MIBPS] [M_MIBPS] [PASSES] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:-/var/tmp/coli-mirror-bench}
MIB=${2:-384}
P=${3:-200}
M=${4:-100}
PASSES=${5:-2}
ROUNDS=${6:-2}
OUT=store/bench/results
mkdir -p "$OUT"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo build -q -p coli-store --example mirror_bench
BIN=$CARGO_TARGET_DIR/debug/examples/mirror_bench
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
RAW=${RAW:-$OUT/$(date -u +%Y-%m-%d)-mirror-throttled.txt}
{
  echo "# mirror_bench $STAMP dir=$DIR mib=$MIB primary=${P}MiB/s mirror=${M}MiB/s passes=$PASSES rounds=$ROUNDS"
  uname -a; nproc; mkdir -p "$DIR"; df -T "$DIR" | tail -1
  for round in $(seq 1 "$ROUNDS"); do
    echo "# round $round: $(uptime)"
    "$BIN" "$DIR" "$MIB" "$P" "$M" "$PASSES" 2>&1
  done
} 2>&1 | tee "$RAW"
