#!/usr/bin/env bash
# Under mpirun, each process computes with the node's cores divided by the processes on the node
# (at least 1), not a team on every core: 4 processes on 2 cores each spinning 2 threads ran
# dp=4 at a fifth of the virtual backend's speed (issue 14, item 17). --threads still wins.
#   mpi_threads.sh <llama4d binary>
# Run without OMP_NUM_THREADS (which would count as the user's choice) and without
# OMP_WAIT_POLICY (so the passive-wait restart under mpirun is exercised too).
set -euo pipefail
bin=$1
np=2
unset OMP_NUM_THREADS OMP_WAIT_POLICY
flags=(--oversubscribe --bind-to none --mca pml ob1 --mca btl self,vader)
[ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
bench=(bench --preset tiny --seq-len 32 --batch-size 2 --mesh dp=$np --backend mpi --iters 1 --warmup 0
       --gemm-n 64 --gemm-seconds 0.01 --json)
threads_per_rank() { /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["parallel"]["threads_per_rank"])'; }
# The expectation, from the machine: online cores / processes, at least 1, at most what the
# process may run on (its affinity; --bind-to none leaves it whole).
online=$(getconf _NPROCESSORS_ONLN)
allowed=$(nproc)
want=$(( online / np )); [ "$want" -lt 1 ] && want=1; [ "$want" -gt "$allowed" ] && want=$allowed
got=$(mpirun "${flags[@]}" -np $np "$bin" "${bench[@]}" | threads_per_rank)
[ "$got" -eq "$want" ] || { echo "default: $got threads per rank, expected $want ($online cores / $np processes)"; exit 1; }
echo "default: $got threads per rank ($online cores, $np processes on the node)"
got=$(mpirun "${flags[@]}" -np $np "$bin" "${bench[@]}" --threads 3 | threads_per_rank)
[ "$got" -eq 3 ] || { echo "--threads 3: got $got threads per rank"; exit 1; }
echo "--threads 3: 3 threads per rank"
