#!/usr/bin/env bash
# The whole test suite: installs and builds what it needs, then runs every test in the release
# build, under AddressSanitizer + UBSan, and under ThreadSanitizer.
#   scripts/test.sh            all three
#   scripts/test.sh release    one preset (release | asan | tsan)
#   LLAMA4D_TRANSFORMERS=0 scripts/test.sh   without tests/transformers' comparisons
set -euo pipefail
cd "$(dirname "$0")/.."
presets=("$@")
[ ${#presets[@]} -gt 0 ] || presets=(release asan tsan)
jobs=$(nproc 2>/dev/null || echo 2)
scripts/setup.sh test
# The tests' Python (tests/requirements.txt, e.g. Hugging Face tokenizers for tests/tokenizer):
# a virtual environment made once, then reused. Only the test run needs it; scripts/main.sh
# builds without it and never calls pip.
python=$(scripts/python_env.sh)
# tests/transformers compares against Hugging Face transformers in an environment of its own
# (tests/transformers/requirements.txt: PyTorch and transformers, 2.2 GB, about 2 minutes to
# install on 2 cores), which takes cuBLAS, cuDNN and the rest from the CUDA toolkit. Made and run
# where the toolkit is (the release preset only: the comparisons are numerical, and the
# sanitizers check the same loading code through tests that need no Python);
# LLAMA4D_TRANSFORMERS=0 leaves them out, =1 insists.
transformers=""
want_transformers=${LLAMA4D_TRANSFORMERS:-auto}
if [ "$want_transformers" = auto ]; then
  if compgen -G "${CUDA_HOME:-/usr/local/cuda}/lib64/libcudart.so.*" >/dev/null; then
    want_transformers=1
  else
    echo "test.sh: tests/transformers skip: no CUDA toolkit libraries in ${CUDA_HOME:-/usr/local/cuda}/lib64 for PyTorch's wheel" >&2
    want_transformers=0
  fi
fi
case "$want_transformers" in
  1) if [[ " ${presets[*]} " == *" release "* ]]; then
       transformers=$(scripts/python_env.sh tests/transformers/requirements.txt)
     fi ;;
  0) ;;
  *) echo "test.sh: LLAMA4D_TRANSFORMERS=$want_transformers: expected 0 or 1" >&2; exit 2 ;;
esac
for preset in "${presets[@]}"; do
  echo "=== $preset: build"
  # cuDNN attention on (CMake keeps a cached OFF from scripts/main.sh otherwise); only the
  # release preset builds CUDA, so the others leave the option unused.
  cuda=()
  [ "$preset" = release ] && cuda=(-DLLAMA4D_CUDNN=ON)
  with_transformers=""
  [ "$preset" = release ] && with_transformers=$transformers
  scripts/build.sh "$preset" -DLLAMA4D_TEST_PYTHON="$python" -DLLAMA4D_TEST_TRANSFORMERS_PYTHON="$with_transformers" "${cuda[@]}"
  echo "=== $preset: test"
  ctest --preset "$preset" -j "$jobs"
done
