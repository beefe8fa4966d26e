#!/usr/bin/env bash
# What `train` writes in --out is not lost or mixed (issue 52, item 6):
#   - a row of metrics.jsonl that cannot be written (here the file is /dev/full) ends the run with
#     an error naming the file, not exit 0 with the rows gone;
#   - a second run on the same --out, while the first holds it, is refused with exit 2 naming
#     the first (its pid), and the first run's files are untouched.
#   out_dir_writes.sh <llama4d binary>
set -euo pipefail
bin=$1
tmp=$(mktemp -d)
first=""
cleanup() {
  [ -n "$first" ] && kill "$first" 2>/dev/null && wait "$first" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
run=(train --preset tiny --seq-len 16 --batch-size 2 --eval-every 0 --threads 1)

# metrics.jsonl is restarted through metrics.jsonl.tmp, renamed over it: a link to /dev/full there
# becomes the file the rows are appended to.
mkdir "$tmp/full"
ln -s /dev/full "$tmp/full/metrics.jsonl.tmp"
rc=0
"$bin" "${run[@]}" --steps 2 --out "$tmp/full" > "$tmp/log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] && grep -q "error: cannot write $tmp/full/metrics.jsonl" "$tmp/log" ||
  { echo "a metrics row written to /dev/full: exit $rc"; cat "$tmp/log"; exit 1; }
echo "metrics on /dev/full: exit $rc, $(grep error "$tmp/log")"

# The first run trains until killed; the second starts once the first holds the directory.
"$bin" "${run[@]}" --steps 1000000 --out "$tmp/shared" > /dev/null 2>&1 &
first=$!
for _ in $(seq 200); do
  [ -s "$tmp/shared/metrics.jsonl" ] && break
  sleep 0.05
done
[ -s "$tmp/shared/metrics.jsonl" ] || { echo "the first run wrote no metrics"; exit 1; }
rc=0
"$bin" "${run[@]}" --steps 2 --out "$tmp/shared" > "$tmp/log" 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q "error: --out $tmp/shared is in use by another run (llama4d train, pid $first on " "$tmp/log" ||
  { echo "a second run on a held --out: exit $rc"; cat "$tmp/log"; exit 1; }
[ ! -e "$tmp/shared/checkpoint" ] || { echo "the refused run saved a checkpoint"; exit 1; }
echo "a second run on a held --out: exit 2, $(grep error "$tmp/log")"
# Once the holder is gone (killed: the lock goes with its process), the directory is free again.
kill "$first"
wait "$first" 2>/dev/null || true
first=""
"$bin" "${run[@]}" --steps 2 --out "$tmp/shared" > "$tmp/log" 2>&1 || { echo "after the holder died:"; cat "$tmp/log"; exit 1; }
[ ! -e "$tmp/shared/.llama4d-run" ] || { echo "the holder file outlived its run"; exit 1; }
echo "after the holder was killed, a new run on its --out trains"
