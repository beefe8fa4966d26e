#!/usr/bin/env bash
# The fault-tolerance performance figures of issue 53, measured with `train --json` (wall clock of
# this machine; not a test):
#   1. in-memory copies every step (--memory-copy-every 1) on `small` with dp=4: their cost per
#      step (goodput "memory_copy_s" / steps) against the step time of the same run;
#   2. recovery on `medium` (dp=2, one GPU per node so a partner's copy is on another node): a
#      crash at step 3 recovered from the in-memory copies vs from the step-2 disk checkpoint:
#      the recovery's time: "detection_s" (from the last finished step to the end of the failed
#      attempt, which includes assembling the copies into an image), "restart_s" (the new
#      attempt's start: every rank's model built and initialized, then the state loaded) and
#      "other_s" (the supervisor between the attempts);
#   3. --async-checkpoint on `small` with dp=4: each checkpoint's stall against its snapshot, and
#      the synchronous save's stall.
# Usage: bench/fault_tolerance.sh [BIN] (default build/release/bin/llama4d). Env: OUT (scratch dir),
# SUMMARY_ONLY=1 (summarise the runs already in OUT).
set -euo pipefail
BIN=${1:-build/release/bin/llama4d}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
echo '{"seed": 1, "faults": [{"kind": "crash", "rank": 1, "step": 3}]}' > "$OUT/crash.json"
SMALL="--preset small --seq-len 128 --batch-size 8 --eval-every 0 --mesh dp=4 --gpus-per-node 1 --json"
MEDIUM="--preset medium --seq-len 16 --batch-size 2 --eval-every 0 --steps 3 --mesh dp=2 --gpus-per-node 1 --timeout 600 --json"
run() { local name=$1; shift; echo "+ $BIN train $* --out $OUT/$name" >&2; "$BIN" train "$@" --out "$OUT/$name" > "$OUT/$name.json" 2> "$OUT/$name.err"; }

if [ "${SUMMARY_ONLY:-0}" != 1 ]; then
run small_plain $SMALL --steps 10
run small_copies $SMALL --steps 10 --memory-copy-every 1 --max-restarts 1
run small_sync $SMALL --steps 6 --save-every 2
run small_async $SMALL --steps 6 --save-every 2 --async-checkpoint
run medium_disk $MEDIUM --save-every 2 --max-restarts 1 --faults "$OUT/crash.json"
run medium_memory $MEDIUM --memory-copy-every 1 --max-restarts 1 --faults "$OUT/crash.json"
fi

python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
j = lambda n: json.load(open(f"{out}/{n}.json"))
rec = lambda g: g["detection_s"] + g["restart_s"] + g["other_s"]
plain, copies = j("small_plain"), j("small_copies")
g = copies["goodput"]
step_plain = plain["tokens"] / plain["tokens_per_s"] / plain["steps_this_run"]
step_copies = copies["tokens"] / copies["tokens_per_s"] / copies["steps_this_run"]
per_copy = g["memory_copy_s"] / copies["steps_this_run"]
print(f"1. small dp=4: step {step_plain*1e3:.1f} ms without copies, {step_copies*1e3:.1f} ms with; "
      f"a copy every step takes {per_copy*1e3:.2f} ms = {100*per_copy/step_copies:.1f}% of the step (target <= 5%)")
for name in ("medium_disk", "medium_memory"):
    g = j(name)["goodput"]
    print(f"2. {name}: detection_s {g['detection_s']:.3f}, restart_s {g['restart_s']:.3f}, other_s {g['other_s']:.3f}, "
          f"recovery {rec(g):.3f} s; startup_s {g['startup_s']:.3f}, memory_copy_s {g['memory_copy_s']:.3f}, "
          f"checkpoint_s {g['checkpoint_s']:.3f}, recoveries {g['recoveries']}")
d, m = (j(n)["goodput"] for n in ("medium_disk", "medium_memory"))
print(f"   from memory {rec(d)/rec(m):.2f}x as fast as from disk (target >= 5x)")
for name in ("small_sync", "small_async"):
    for c in j(name)["checkpoints"]:
        print(f"3. {name}: step {c['step']}: stall {c['stall_s']*1e3:.1f} ms" +
              (f", snapshot {c['snapshot_s']*1e3:.1f} ms, wait {c['wait_s']*1e3:.1f} ms, background write {c['write_s'] and c['write_s']*1e3 or 0:.1f} ms" if c["async"] else ""))
PY
