#!/usr/bin/env bash
# The processes of an MPI job check that they were launched alike before their first collective
# (issue 52, item 1): two processes started with another --lr, --mesh, model config or data each
# exit 2 naming the setting and both values, within the timeout, and save nothing. Before, they
# trained a mix of both runs (exit 0), or, with another --mesh, waited forever in
# MPI_Comm_create_group.
#   mpi_ranks_agree.sh <llama4d binary>
set -euo pipefail
bin=$1
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run=(train --backend mpi --preset tiny --seq-len 16 --batch-size 2 --steps 2 --eval-every 0 --timeout 20)
# Rank 0 runs "$1", rank 1 "$2" (extra flags, word-split), each its own command line as with
# `mpirun -np 1 a : -np 1 b`; expects a nonzero exit, every rank's error naming $3, no checkpoint.
expect_refused() {
  local out=$tmp/case$((++n))
  local rc=0
  # shellcheck disable=SC2086
  timeout 120 mpirun --allow-run-as-root --oversubscribe --mca pml ob1 --mca btl self,vader \
    -np 1 "$bin" "${run[@]}" --out "$out" $1 : -np 1 "$bin" "${run[@]}" --out "$out" $2 > "$tmp/log" 2>&1 || rc=$?
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { echo "[$1] vs [$2]: exit $rc (want a refusal, not success or a hang)"; cat "$tmp/log"; exit 1; }
  local named
  named=$(grep -acF "error: $3" "$tmp/log" || true)
  [ "$named" -eq 2 ] || { echo "[$1] vs [$2]: $named of 2 ranks say '$3'"; cat "$tmp/log"; exit 1; }
  [ ! -e "$out/checkpoint" ] || { echo "[$1] vs [$2]: a checkpoint was saved"; exit 1; }
  echo "[$1] vs [$2]: refused by both ranks: $(grep -a -m1 "error:" "$tmp/log")"
}
n=0
expect_refused "--mesh dp=2" "--mesh dp=2 --lr 0.01" "the ranks disagree on --lr: rank 0 has 0.003, rank 1 has 0.01"
expect_refused "--mesh dp=2" "--mesh pp=2" "the ranks disagree on --mesh: rank 0 has dp=2, rank 1 has pp=2"
expect_refused "--mesh dp=2 --seed 1" "--mesh dp=2 --seed 2" "the ranks disagree on --seed"
# The same flags, another rope_theta in the config file: the model config is compared, not its path.
"$bin" train --preset tiny --seq-len 16 --batch-size 2 --steps 1 --eval-every 0 --out "$tmp/base" > /dev/null 2>&1
mkdir -p "$tmp/a" "$tmp/b"
"$py" - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
cfg = json.load(open(f"{tmp}/base/checkpoint/config.json"))
for where, theta in (("a", 10000.0), ("b", 20000.0)):
    cfg["rope_theta"] = theta
    if "rope_parameters" in cfg:
        cfg["rope_parameters"]["rope_theta"] = theta
    json.dump(cfg, open(f"{tmp}/{where}/config.json", "w"))
PY
expect_refused "--mesh dp=2 --config $tmp/a/config.json" "--mesh dp=2 --config $tmp/b/config.json" \
  "the ranks disagree on model config rope_parameters.rope_theta: rank 0 has 10000.0, rank 1 has 20000.0"
# Another text: its tokens are compared (on separate nodes one path may hold two texts).
"$py" -c 'import sys; open(sys.argv[1], "w").write("one text " * 400); open(sys.argv[2], "w").write("and another " * 400)' \
  "$tmp/a/text.txt" "$tmp/b/text.txt"
expect_refused "--mesh dp=2 --data $tmp/a/text.txt" "--mesh dp=2 --data $tmp/b/text.txt" \
  "the ranks disagree on --data (its tokens): rank 0 has 3600 tokens"
