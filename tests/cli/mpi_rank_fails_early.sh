#!/usr/bin/env bash
# A rank that fails before MPI starts (here: world rank 1 is given a --data file that does not
# exist, so it exits 2 while reading its input) ends the whole job: the other ranks do not wait
# for it forever. The job must be over within 30 s (mpirun's own default is to wait), with a
# non-zero status and rank 1's error naming the file.
#   mpi_rank_fails_early.sh <llama4d binary>
set -euo pipefail
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/rank.sh" <<WRAP
#!/usr/bin/env bash
data=""
[ "\$OMPI_COMM_WORLD_RANK" = 1 ] && data="--data $tmp/missing.txt"
exec "$bin" train --backend mpi --mesh dp=2 --batch-size 2 --preset tiny --seq-len 16 --steps 2 --eval-every 0 \
  --out "$tmp/run" \$data
WRAP
chmod +x "$tmp/rank.sh"
status=0
timeout 30 mpirun --allow-run-as-root --oversubscribe --mca pml ob1 --mca btl self,vader -np 2 "$tmp/rank.sh" \
  > "$tmp/log" 2>&1 || status=$?
if [ "$status" = 124 ]; then
  echo "the job still ran 30 s after rank 1 failed before MPI started:"; cat "$tmp/log"; exit 1
fi
if [ "$status" != 0 ] && grep -aq "missing.txt" "$tmp/log"; then
  grep -a "error" "$tmp/log"
  exit 0
fi
echo "exit status $status; rank 1's error naming missing.txt expected:"
cat "$tmp/log"
exit 1
