#!/usr/bin/env bash
# The MPI backend gives the same bits as the virtual backend: the same plan, run as OS
# processes under mpirun and as threads (as many as the mesh has ranks), must both pass verify (bitwise equal to one device for
# data and pipeline parallelism with ordered reductions; within the measured bounds for ring reductions,
# tensor and context parallelism), and report identical losses and identical per-tensor errors.
#   mpi_vs_virtual.sh <llama4d binary> [case,case,...]   (default: every case)
set -euo pipefail
bin=$1
only=${2:-}
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run() {  # name, then verify flags
  local name=$1; shift
  if [ -n "$only" ] && [[ ",$only," != *",$name,"* ]]; then return; fi
  "$bin" verify --steps 2 "$@" --json > "$tmp/$name.virtual.json"
  local np
  np=$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["ranks"])' "$tmp/$name.virtual.json")
  # Shared-memory transports only: nothing touches the network.
  mpirun --allow-run-as-root --oversubscribe --mca pml ob1 --mca btl self,vader -np "$np" "$bin" verify --backend mpi --steps 2 "$@" --json > "$tmp/$name.mpi.json"
  "$py" - "$tmp/$name.virtual.json" "$tmp/$name.mpi.json" "$name" "$np" <<'PY'
import json, sys
v, m = (json.load(open(p)) for p in sys.argv[1:3])
name, np = sys.argv[3], int(sys.argv[4])
assert v["ok"] and m["ok"], f"{name}: virtual ok={v['ok']} mpi ok={m['ok']}"
assert v["losses_parallel"] == m["losses_parallel"], f"{name}: losses differ {v['losses_parallel']} vs {m['losses_parallel']}"
assert len(m["per_rank"]) == np, f"{name}: the MPI report has {len(m['per_rank'])} of {np} ranks"
assert v["per_rank"] == m["per_rank"], f"{name}: per-rank findings differ"
for a, b in zip(v["tensors"], m["tensors"]):
    assert a == b, f"{name}: {a['name']}: virtual {a} mpi {b}"
print(f"{name}: same bits on mpi and virtual (bitwise vs one device: {v['bitwise']})")
PY
}
run dp --mesh dp=4 --zero 0
run zero3 --mesh dp=4 --zero 3
run hsdp --mesh dp_shard=2,dp_replicate=2 --zero 3
run ring --mesh dp=4 --zero 2 --algo ring --grad-clip 0
# Tensor parallelism (with sequence parallelism's in-place all-gathers and reduce-scatters) under
# ZeRO-2 on the data-parallel dim, and tp=4 with replicated KV heads (tiny has 2).
run tp_sp_zero2 --mesh tp=2,dp=2 --zero 2
run tp4_no_sp --mesh tp=4 --sp off
# Pipeline parallelism: point-to-point activations and gradients between processes, with ZeRO-3
# on the data-parallel dim, and a zero-bubble schedule on 4 stages (tiny has 2 layers: 2 stages
# of one layer each, so 4 stages need the six-layer small).
run pp_zero3 --mesh pp=2,dp=2 --zero 3 --micro-batches 2
run pp4_zb --preset small --seq-len 32 --mesh pp=4 --schedule zb-h1 --micro-batches 4 --batch-size 4
# Context parallelism: keys and values all-gathered and their gradients reduce-scattered between
# processes, with ZeRO-3 over cp x dp.
run cp_zero3 --mesh cp=2,dp=2 --zero 3
run cp_ring --mesh cp=4 --cp-algo ring
# 4D: tensor, context and pipeline parallelism together on 8 processes, and all four on 16
# (ZeRO-3 over cp x dp, the ring algorithm, selective checkpointing).
run tp_cp_pp --mesh tp=2,cp=2,pp=2 --seq-len 24 --micro-batches 2
run 4d_ring_zero3 --mesh tp=2,cp=2,pp=2,dp=2 --zero 3 --cp-algo ring --ac selective --seq-len 24 --micro-batches 2
