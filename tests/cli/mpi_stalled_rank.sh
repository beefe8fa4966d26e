#!/usr/bin/env bash
# A rank that stops answering (here: SIGSTOP) is named in the error, and so is the rank that
# reports it (issue 14, item 14): "rank 0: timeout in all_reduce ...: no answer from rank 1",
# not "no answer from some rank".
#   mpi_stalled_rank.sh <llama4d binary>
set -euo pipefail
bin=$1
tmp=$(mktemp -d)
mpirun --allow-run-as-root --oversubscribe --mca pml ob1 --mca btl self,vader -np 3 "$bin" train --backend mpi \
  --mesh dp=3 --batch-size 3 --preset tiny --seq-len 16 --steps 1000000 --eval-every 0 --timeout 2 \
  --out "$tmp/run" > "$tmp/log" 2>&1 &
launcher=$!
stopped=""
cleanup() {
  [ -n "$stopped" ] && kill -CONT "$stopped" 2>/dev/null || true
  kill "$launcher" 2>/dev/null || true
  wait "$launcher" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
# Once the ranks are training, stop world rank 1.
for _ in $(seq 200); do
  [ -s "$tmp/run/metrics.jsonl" ] && break
  sleep 0.1
done
for pid in $(pgrep -P "$launcher"); do
  if tr '\0' '\n' < "/proc/$pid/environ" | grep -qx 'OMPI_COMM_WORLD_RANK=1'; then stopped=$pid; fi
done
[ -n "$stopped" ] || { echo "rank 1 not found among the children of mpirun"; cat "$tmp/log"; exit 1; }
kill -STOP "$stopped"
for _ in $(seq 300); do
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.1
done
if grep -aq "no answer from rank 1" "$tmp/log" && grep -aqE "error: rank [02]: timeout" "$tmp/log"; then
  grep -a "timeout" "$tmp/log"
  exit 0
fi
echo "the timeout report does not name both ranks:"
grep -a "error" "$tmp/log" || cat "$tmp/log"
exit 1
