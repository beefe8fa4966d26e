#!/usr/bin/env bash
# Every GPU check of the CUDA backend in four parts, for a machine with a GPU reached from a
# machine without one: build here (scripts/build.sh release), carry the binaries there, run a part
# per call (each meant to fit 10 minutes on one H100; not yet timed), read what it wrote.
#   scripts/gpu_session.sh tests|verify|launch|bench
#     tests   tests/cuda (every op against the CPU, fp32 and bf16, tensor cores) and tests/nccl
#     verify  `verify --device cuda` on virtual GPUs over one GPU: dp, ZeRO-3, tp, pp, cp (both
#             algorithms) and a 4D mesh, each in fp32 and in bf16 (--json per run)
#     launch  NCCL on a world of one: bare, under mpirun and under torchrun; lesson 08's GPU phase
#     bench   bench/gpu_benchmark.sh: llama4d against PyTorch (eager and compiled) on the 124M and
#             1.5B shapes, and `bench --device cuda` in fp32
# The binaries it runs: build/release/bin/{llama4d,lesson08_graduating_to_gpus},
# build/release/share (the corpus), build/release/tests/{cuda/test_cuda,nccl/test_nccl}.
# Output: one file per step under $OUT (default runs/gpu), and summary.txt with each exit code.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
part=${1:-}
case "$part" in
  tests | verify | launch | bench) ;;
  *)
    echo "usage: scripts/gpu_session.sh tests|verify|launch|bench" >&2
    exit 2
    ;;
esac
out=${OUT:-runs/gpu}
bin=build/release/bin/llama4d
mkdir -p "$out"
export LLAMA4D_BIN="$PWD/$bin"  # where tests/nccl finds the CLI on this machine
failed=0

# step NAME COMMAND...: runs it, output to $out/NAME.txt, its exit code to summary.txt.
step() {
  local name=$1
  shift
  echo "=== $name: $*"
  local start=$SECONDS
  "$@" > "$out/$name.txt" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - start))s" | tee -a "$out/summary.txt"
  tail -n 4 "$out/$name.txt"
  [ "$rc" = 0 ] || failed=1
}

nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || echo "no nvidia-smi" > "$out/nvidia-smi.txt"
case "$part" in
  tests)
    step test_cuda build/release/tests/cuda/test_cuda
    step test_nccl build/release/tests/nccl/test_nccl
    ;;
  verify)
    while read -r name args; do
      for dtype in f32 bf16; do
        # shellcheck disable=SC2086  # args holds several options
        step "verify_${name}_$dtype" "$bin" verify --device cuda $args --dtype "$dtype" --steps 2 --seq-len 64 --json
      done
    done <<'PLANS'
dp2 --mesh dp=2
dp4_zero3 --mesh dp=4 --zero 3
tp2 --mesh tp=2
pp2_1f1b --mesh pp=2 --schedule 1f1b
cp2_allgather --mesh cp=2
cp2_ring --mesh cp=2 --cp-algo ring
4d --mesh tp=2,cp=2,pp=2,dp=2 --zero 1
PLANS
    ;;
  launch)
    step nccl_world_of_one "$bin" verify --device cuda --backend nccl --mesh dp=1 --steps 2 --json
    step nccl_mpirun mpirun --allow-run-as-root -np 1 "$bin" verify --device cuda --backend nccl --mesh dp=1 --steps 2
    step nccl_torchrun torchrun --nproc-per-node 1 --no-python "$bin" verify --device cuda --backend nccl --mesh dp=1 \
      --steps 2
    step lesson08 build/release/bin/lesson08_graduating_to_gpus --gpu auto --json
    ;;
  bench)
    step gpu_benchmark env OUT="$out/gpu_benchmark" SHAPES="124m 1.5b" bench/gpu_benchmark.sh "$bin"
    step bench_fp32_124m "$bin" bench --device cuda --config "$out/gpu_benchmark/124m.json" --batch-size 16 \
      --seq-len 1024 --json
    ;;
esac
exit "$failed"
