#!/usr/bin/env bash
# The 1024-rank sweep of the scale page, in one command: 128 x 8 and 32 x 32 ranks, blocks of
# 8 B, 64 B, 512 B and 4 KiB, even and then uneven counts, every algorithm of hxmpi's one-shot
# and as a plan beside bare MPI_Alltoallv and MPI_Alltoall, on the calibrated slingshot preset.
# It takes hours on 2 cores: run it under nice.
#
#   nice -n 19 bash benchmarks/sweep_1024.sh [OUTDIR] [more python -m hxmpi.sim flags]
#
# Writes OUTDIR/simulate_1024_even.json and OUTDIR/simulate_1024_uneven.json (default OUTDIR:
# benchmarks/results); each replay's wall seconds are in its record's replay_s.
set -euo pipefail
out=${1:-benchmarks/results}
shift || true
for counts in even uneven; do
    flag=()
    [ "$counts" = uneven ] && flag=(--uneven)
    python -m hxmpi.sim --shape 128x8 --shape 32x32 -m 8:4096 --factor 8 --preset slingshot \
        --timeout 3600 "${flag[@]}" --json "$out/simulate_1024_$counts.json" "$@"
done
