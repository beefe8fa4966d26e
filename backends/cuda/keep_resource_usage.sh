#!/bin/sh
# The CUDA backend's compiler launcher (backends/cuda/CMakeLists.txt): runs the compile it is given
# (ccache and nvcc, with --resource-usage) and keeps ptxas's report of every kernel (registers,
# shared memory, stack frame, spills) beside the object as <object>.ptxas.txt, which
# tests/cuda/ptxas_budget.py holds to the kernels' budget without a GPU. The report's lines are not
# passed on (every compile would print them); anything else on stderr is. ccache replays a cached
# compile's stderr, so a cache hit writes the same report.
out=""
prev=""
for arg in "$@"; do
  [ "$prev" = "-o" ] && out=$arg
  prev=$arg
done
log="${out:-resource_usage}.ptxas.txt"
"$@" 2> "$log.part"
rc=$?
grep -Ev '^ptxas info +:|^ +[0-9]+ bytes stack frame, ' "$log.part" >&2
mv "$log.part" "$log"
exit $rc
