#!/usr/bin/env bash
# Every GPU check of the CUDA backend in four parts, and the CPU backend's scaling on the GPU
# machine's cores in a fifth, for a machine with a GPU reached from a machine without one: build
# here (scripts/build.sh release), carry the binaries there, run a part per call (each meant to
# fit 10 minutes on one H100 with 16 cores; not yet timed), read what it wrote.
#   scripts/gpu_session.sh tests|verify|launch|bench|cpu
#     tests   tests/cuda (every op against the CPU, fp32 and bf16, tensor cores) and tests/nccl
#     verify  `verify --device cuda` on virtual GPUs over one GPU: dp, ZeRO-3, tp, pp, cp (both
#             algorithms) and a 4D mesh, each in fp32 and in bf16 (--json per run)
#     launch  NCCL on a world of one: bare, under mpirun and under torchrun; lesson 08's GPU phase
#     bench   bench/gpu_benchmark.sh: llama4d against PyTorch (eager and compiled) on the 124M and
#             1.5B shapes, and `bench --device cuda` in fp32
#     cpu     the CPU backend on every core: `bench --threads-sweep` on small and medium (tokens/s and
#             GEMM GFLOP/s beside the reference BLAS on 1, 2, 4, ... threads), and the same step in
#             PyTorch (bench/compare_torch.sh) on 2 and all threads. REFERENCE_BLAS names a
#             libopenblas.so.0 carried over when the machine has none on its library path.
# The binaries it runs: build/release/bin/{llama4d,lesson08_graduating_to_gpus},
# build/release/share (the corpus), build/release/tests/{cuda/test_cuda,nccl/test_nccl}.
# Output: one file per step under $OUT (default runs/gpu), and summary.txt with each exit code.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
part=${1:-}
case "$part" in
  tests | verify | launch | bench | cpu) ;;
  *)
    echo "usage: scripts/gpu_session.sh tests|verify|launch|bench|cpu" >&2
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
  cpu)
    cores=$(nproc)
    blas=()
    [ -n "${REFERENCE_BLAS:-}" ] && blas=(--reference-blas "$REFERENCE_BLAS")
    step cpu_sweep_small "$bin" bench --threads-sweep "${blas[@]}" --json
    step cpu_sweep_medium "$bin" bench --preset medium --threads-sweep --warmup 1 --iters 3 "${blas[@]}" --json
    python=${PYTHON:-python3}  # an interpreter with a current PyTorch
    for threads in $(printf '%s\n' 2 "$cores" | sort -un); do
      step "torch_small_${threads}_threads" env THREADS="$threads" PYTHON="$python" bench/compare_torch.sh "$bin"
    done
    step "torch_medium_${cores}_threads" env THREADS="$cores" PRESET=medium PYTHON="$python" \
      bench/compare_torch.sh "$bin"
    ;;
esac
exit "$failed"
