#!/usr/bin/env bash
# The whole test suite: installs and builds what it needs, then runs every test in the release
# build, under AddressSanitizer + UBSan, and under ThreadSanitizer.
#   scripts/test.sh            all three
#   scripts/test.sh release    one preset (release | asan | tsan)
#   LLAMA4D_TRANSFORMERS=1 scripts/test.sh release   with tests/transformers' comparisons too
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
# LLAMA4D_TRANSFORMERS=1 also makes tests/transformers' environment (PyTorch with its CUDA
# packages and transformers: 5.6 GB, about 5.5 minutes on 2 cores) and runs those tests; without
# it they skip.
transformers=""
if [ "${LLAMA4D_TRANSFORMERS:-0}" = 1 ]; then
  transformers=$(scripts/python_env.sh tests/transformers/requirements.txt)
fi
for preset in "${presets[@]}"; do
  echo "=== $preset: build"
  # cuDNN attention on (CMake keeps a cached OFF from scripts/main.sh otherwise); only the
  # release preset builds CUDA, so the others leave the option unused.
  cuda=()
  [ "$preset" = release ] && cuda=(-DLLAMA4D_CUDNN=ON)
  scripts/build.sh "$preset" -DLLAMA4D_TEST_PYTHON="$python" -DLLAMA4D_TEST_TRANSFORMERS_PYTHON="$transformers" "${cuda[@]}"
  echo "=== $preset: test"
  ctest --preset "$preset" -j "$jobs"
done
