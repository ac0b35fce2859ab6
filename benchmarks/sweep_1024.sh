#!/usr/bin/env bash
# The 1024-rank sweep of the scale page, in one command: 128 x 8 and 32 x 32 ranks, blocks of
# 8 B, 64 B, 512 B and 4 KiB on the calibrated slingshot preset with its NIC, linear world phases
# replayed coarsely (--coarse). First the scale table (hxmpi's one-shot and plan against Open MPI
# tuned and HAN with their CPU, and the CPU-free lower bound), then every algorithm of hxmpi's,
# even and uneven counts, beside bare MPI_Alltoallv and MPI_Alltoall. Run it under nice.
#
#   nice -n 19 bash benchmarks/sweep_1024.sh [OUTDIR] [more python -m hxmpi.sim flags]
#
# Writes OUTDIR/simulate_scale_1024.json, OUTDIR/simulate_1024_even.json and
# OUTDIR/simulate_1024_uneven.json (default OUTDIR: benchmarks/results); each replay's wall seconds
# are in its record's replay_s.
set -euo pipefail
out=${1:-benchmarks/results}
shift || true
python -m hxmpi.sim.scale --shape 128x8 --shape 32x32 -m 8:4096 --factor 8 --coarse --timeout 3600 \
    --json "$out/simulate_scale_1024.json"
for counts in even uneven; do
    flag=()
    [ "$counts" = uneven ] && flag=(--uneven)
    python -m hxmpi.sim --shape 128x8 --shape 32x32 -m 8:4096 --factor 8 --preset slingshot --coarse \
        --timeout 3600 "${flag[@]}" --json "$out/simulate_1024_$counts.json" "$@"
done
