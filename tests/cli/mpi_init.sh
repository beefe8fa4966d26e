#!/usr/bin/env bash
# train --init on a mesh under MPI (issue 49): a model directory with the project's BPE
# tokenizer, fine-tuned on tp=2 x dp=2 by 4 MPI processes, ends in the same bytes as the same
# run on 4 virtual GPUs (both the ordered reductions), carries the tokenizer beside the weights,
# and leaves no staged step-0 checkpoint behind. A staging that fails on rank 0 ends every
# process, each naming why (none waits for --timeout).
#   mpi_init.sh <llama4d binary> <source root>
set -euo pipefail
bin=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpi() {  # ranks, then llama4d arguments; shared-memory transports only
  local n=$1; shift
  mpirun --allow-run-as-root --oversubscribe --mca pml ob1 --mca btl self,vader -np "$n" "$bin" "$@"
}
# A tiny Llama 3 shape for data/tokenizer's 4,096 ids; one step on bytes writes random weights.
cat > "$tmp/config.json" <<'JSON'
{"vocab_size": 4096, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
 "bos_token_id": 3840, "eos_token_id": 3841}
JSON
"$bin" train --config "$tmp/config.json" --seq-len 16 --batch-size 2 --steps 1 --eval-every 0 --out "$tmp/model" > /dev/null 2>&1
model=$tmp/model/checkpoint
cp "$src/data/tokenizer/tokenizer.json" "$src/data/tokenizer/tokenizer_config.json" "$model/"
run=(--init "$model" --data "$src/data/corpus" --mesh tp=2,dp=2 --seq-len 32 --batch-size 4 --steps 3 --eval-every 0)
"$bin" train "${run[@]}" --out "$tmp/virtual" --json > "$tmp/virtual.json"
mpi 4 train "${run[@]}" --backend mpi --out "$tmp/mpi" --json > "$tmp/mpi.json"
for f in model.safetensors optimizer.safetensors; do
  cmp "$tmp/virtual/checkpoint/$f" "$tmp/mpi/checkpoint/$f" || { echo "--init on mpi: $f differs from virtual GPUs"; exit 1; }
done
[ -f "$tmp/mpi/checkpoint/tokenizer.json" ] || { echo "--init on mpi: no tokenizer.json beside the weights"; exit 1; }
[ ! -e "$tmp/mpi/init-checkpoint" ] || { echo "--init on mpi: the staged step-0 checkpoint was left behind"; exit 1; }
# Rank 0's staging fails (its <out>/init-checkpoint is a directory this program did not write):
# rank 0 names the cause and the job ends well inside --timeout (the other ranks stop saying rank
# 0 failed, unless mpirun has already ended them on rank 0's exit).
mkdir -p "$tmp/bad/init-checkpoint"
echo notes > "$tmp/bad/init-checkpoint/notes.txt"
set +e
timeout 120 bash -c "$(declare -f mpi); bin=$bin; mpi 4 train ${run[*]} --backend mpi --timeout 60 --out $tmp/bad" > "$tmp/bad.out" 2> "$tmp/bad.err"
code=$?
set -e
[ "$code" != 0 ] && [ "$code" != 124 ] || { echo "--init staging failure on mpi: exit $code"; cat "$tmp/bad.err"; exit 1; }
grep -q "refusing to replace non-empty directory '$tmp/bad/init-checkpoint'" "$tmp/bad.err" ||
  { echo "--init staging failure on mpi: rank 0 does not name the directory"; cat "$tmp/bad.err"; exit 1; }
echo "--init on tp=2,dp=2: 4 MPI processes wrote the bytes of 4 virtual GPUs; a staging failure on rank 0 ends all 4"
