#!/usr/bin/env bash
# Training throughput of one parallel plan with its ranks as MPI processes (mpirun) and as
# virtual GPUs (threads of one process), on this machine: the same preset, batch, mesh and step
# count, each run --json, tokens/s as `train` reports it (training tokens over the summed wall
# time of the steps: start-up, evaluation and the final checkpoint are not counted). Each backend
# runs REPEATS times, alternating; the median is compared.
# Target (issue 14, item 17): MPI within 1.2x of virtual, i.e. virtual / mpi <= 1.2.
#   bench/mpi_vs_virtual.sh [path/to/llama4d] [extra train flags...]
#   NP=4 MESH=dp=4 PRESET=small SEQ_LEN=256 STEPS=10 REPEATS=3 bench/mpi_vs_virtual.sh
# Prints a table on stderr and one JSON object on stdout; exits 1 if the target is missed and
# CHECK=1 is set.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/release/bin/llama4d}
[ $# -gt 0 ] && shift
np=${NP:-4}
mesh=${MESH:-dp=$np}
preset=${PRESET:-small}
seq_len=${SEQ_LEN:-256}
steps=${STEPS:-10}
repeats=${REPEATS:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpi_flags=(--oversubscribe --mca pml ob1 --mca btl self,vader)  # shared memory only: no network
[ "$(id -u)" -eq 0 ] && mpi_flags+=(--allow-run-as-root)         # Open MPI refuses root without it
train=(train --preset "$preset" --seq-len "$seq_len" --mesh "$mesh" --steps "$steps" --eval-every 0 --log-every 1000000 "$@")
for r in $(seq 1 "$repeats"); do
  "$bin" "${train[@]}" --out "$tmp/virtual$r" --json > "$tmp/virtual$r.json" 2> "$tmp/virtual$r.err" ||
    { cat "$tmp/virtual$r.err" >&2; exit 1; }
  mpirun "${mpi_flags[@]}" -np "$np" "$bin" "${train[@]}" --backend mpi --out "$tmp/mpi$r" --json \
    > "$tmp/mpi$r.json" 2> "$tmp/mpi$r.err" || { cat "$tmp/mpi$r.err" >&2; exit 1; }
done
/usr/bin/python3 - "$tmp" "$repeats" "$np" "$mesh" "$preset" "$steps" "${CHECK:-0}" "$seq_len" <<'PY'
import json, os, statistics, sys
tmp, repeats, np_, mesh, preset, steps, check, seq_len = sys.argv[1:9]
runs = {b: [json.load(open(f"{tmp}/{b}{r}.json")) for r in range(1, int(repeats) + 1)] for b in ("virtual", "mpi")}
tps = {b: [j["tokens_per_s"] for j in js] for b, js in runs.items()}
med = {b: statistics.median(v) for b, v in tps.items()}
ratio = med["virtual"] / med["mpi"]
for b in ("virtual", "mpi"):
    print(f"{b:8s} {med[b]:9.0f} tokens/s median  (runs: {', '.join(f'{x:.0f}' for x in tps[b])})", file=sys.stderr)
print(f"virtual / mpi = {ratio:.2f}  (target <= 1.2: {'met' if ratio <= 1.2 else 'MISSED'})", file=sys.stderr)
print(json.dumps({"preset": preset, "seq_len": int(seq_len), "mesh": mesh, "processes": int(np_), "steps": int(steps), "cores": os.cpu_count(),
                  "tokens_per_s": med, "runs": tps, "virtual_over_mpi": ratio, "target": 1.2,
                  "met": ratio <= 1.2}))
sys.exit(1 if check == "1" and ratio > 1.2 else 0)
PY
