#!/usr/bin/env python3
"""Checks lesson 06's --json summary (read from stdin) against the README's formulas, written here
again from the model's shape, independently of the program:
  - every exercise passes and none is missing (ring's only where the build has ring attention);
  - attention FLOPs: the 2 cp split gives every rank (2cp-1) c^2 + c(c+1) pairs per head and row,
    a contiguous cut r T^2 + T(T+1)/2, and the ranks together one device's S(S+1)/2;
  - bytes per rank and step: all-gather (cp-1) 2n forward, (cp-1) 2n + (cp-1) 2n backward, or ring
    (cp-1) 6n + 2n, per layer and micro-batch, n = B T nkv hd;
  - activations of a cp rank times cp equal one device's;
  - under the document mask the ranks together score the sum over each row's documents of
    len (len + 1) / 2 pairs per head, and send the same bytes as without it;
  - the equivalence checks (fp32 within bounds, fp64 against the plain trainer, cp x dp ZeRO-3) hold.

  lesson06_context_parallel --json | lesson06_check.py
"""
import json
import sys


def main():
    j = json.load(sys.stdin)
    bad = []
    for key in ("split", "attention_flops", "kv_traffic", "ring", "gqa", "memory", "exercises", "equivalence",
                "equivalence_fp64", "equivalence_cp_dp_zero3", "document_mask", "passed"):
        if key not in j:
            bad.append(f"key '{key}' missing")
    if bad:
        print("\n".join("FAILED: " + b for b in bad))
        return 1
    sp = j["split"]
    cp, S, B, L = sp["cp"], sp["seq_len"], sp["rows"], sp["layers"]
    nh, nkv, hd, m = sp["nh"], sp["nkv"], sp["hd"], j["micro_batches"]
    c, T = S // (2 * cp), S // cp
    n = B * T * nkv * hd
    ring = sp["cp_algo"] == "ring"

    ids = {e["id"] for e in j["exercises"]}
    want = {"A1", "A2", "A3", "G4", "R1", "R2", "R3", "Q1", "M1", "M2", "F1", "K1", "K2", "D1", "D2"}
    want |= {"G5"} if ring else {"G1", "G2", "G3"}
    want |= {"R4", "R5", "R6", "R7"}
    if not want <= ids:
        bad.append(f"exercises missing: {sorted(want - ids)}")
    failed = [e["id"] for e in j["exercises"] if not e["pass"]]
    if failed:
        bad.append(f"exercises failed: {failed}")

    af = j["attention_flops"]
    per_pair = 4 * hd * nh * B
    balanced = [per_pair * ((2 * cp - 1) * c * c + c * (c + 1))] * cp
    contiguous = [per_pair * (r * T * T + T * (T + 1) // 2) for r in range(cp)]
    if af["balanced"] != balanced:
        bad.append(f"balanced FLOPs {af['balanced']} != {balanced}")
    if len(set(af["balanced"])) != 1:
        bad.append("balanced FLOPs differ between ranks")
    if af["contiguous"] != contiguous:
        bad.append(f"contiguous FLOPs {af['contiguous']} != {contiguous}")
    if sum(af["contiguous"]) != per_pair * S * (S + 1) // 2 or sum(af["balanced"]) != sum(af["contiguous"]):
        bad.append("the ranks' attention FLOPs do not add up to one device's")

    kv = j["kv_traffic"]
    if ring:
        if kv["ring_measured"] != [L * m * ((cp - 1) * 6 * n + 2 * n) * 4] * cp:
            bad.append(f"ring bytes {kv['ring_measured']}")
    else:
        one = [L * m * (cp - 1) * 2 * n * 4] * cp
        for key in ("forward_measured", "backward_allgather_measured", "reduce_scatter_measured"):
            if kv[key] != one:
                bad.append(f"{key} {kv[key]} != {one}")
    call = j["allgather_call"]
    if call["forward_sent"] != [(cp - 1) * 2 * n * 4] * cp or call["backward_sent"] != [(cp - 1) * 4 * n * 4] * cp:
        bad.append("one all-gather call's bytes differ from (cp-1) 2n and (cp-1) 4n")
    if call["backward_scratch"] != [4 * cp * n * 4] * cp:
        bad.append(f"all-gather backward scratch {call['backward_scratch']} != 4 cp n x 4")
    if j["ring"]["backward_scratch"] != [8 * n * 4] * cp:
        bad.append(f"ring backward scratch {j['ring']['backward_scratch']} != 8n x 4")
    if j["gqa"]["sent_without_gqa"] != [x * nh // nkv for x in call["forward_sent"]]:
        bad.append("without GQA the all-gather should send nh/nkv times the bytes")

    dm = j["document_mask"]
    if len(dm["lengths"]) != B or any(sum(row) != S for row in dm["lengths"]):
        bad.append(f"document lengths {dm['lengths']} do not cut {B} rows of {S} tokens")
    if not any(len(row) > 1 for row in dm["lengths"]):
        bad.append("no demonstration row crosses a document boundary")
    masked = sum(n * (n + 1) // 2 for row in dm["lengths"] for n in row)
    if sum(dm["rank_flops"]) != 4 * hd * nh * masked:
        bad.append(f"masked attention FLOPs {sum(dm['rank_flops'])} != 4 hd nh x {masked} pairs")
    if dm["sent_masked"] != dm["sent_causal"]:
        bad.append("the document mask changed the bytes sent")

    mem = j["memory"]
    if any(a * cp != mem["one_device_activations"] for a in mem["rank_activations"]):
        bad.append(f"activations x cp {mem['rank_activations']} != one device's {mem['one_device_activations']}")
    if any(f * cp != mem["one_device_step_flops"] for f in mem["rank_step_flops"]):
        bad.append("step FLOPs x cp != one device's")

    if not j["equivalence"]["ok"]:
        bad.append("equivalence (fp32) not ok")
    e64 = j["equivalence_fp64"]
    if not e64["ok"] or e64["plain_max_rel_err"] > 1e-12:
        bad.append(f"fp64 equivalence: ok {e64['ok']}, plain {e64['plain_max_rel_err']}")
    if not j["equivalence_cp_dp_zero3"]["ok"]:
        bad.append("cp x dp ZeRO-3 equivalence not ok")
    if not j["passed"]:
        bad.append("passed is false")

    if bad:
        print("\n".join("FAILED: " + b for b in bad))
        return 1
    print(f"lesson06: cp={cp}, S={S}: {len(ids)} exercises, FLOPs, bytes, memory and equivalence as the formulas say")
    return 0


if __name__ == "__main__":
    sys.exit(main())
