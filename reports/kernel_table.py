#!/usr/bin/env python3
"""The kernels that take a traced decode step's GPU time, from a hisparse-bench trace.json.

  python3 reports/kernel_table.py TRACE.json [TOP]

For each NVTX "step" range in the trace (one per traced step, in sweep order), the GPU kernels
that ran inside it, summed by name: calls, total ms and share of the step's kernel time, the TOP
(default 12) largest first. CUPTI times the kernels (their launches serialised by the trace), so
read shares, not the step's wall time.
"""
import collections
import json
import sys


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    with open(sys.argv[1]) as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    steps = sorted((e for e in events if e.get("ph") == "X" and e.get("name") == "step"
                    and e.get("cat") == "nvtx"), key=lambda e: e["ts"])
    kernels = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"),
                     key=lambda e: e["ts"])
    if not steps:
        sys.exit(f"{sys.argv[1]}: no NVTX step range (was the run traced on the CUDA backend?)")
    at = 0
    for i, s in enumerate(steps):
        start, end = s["ts"], s["ts"] + s["dur"]
        per = collections.defaultdict(lambda: [0, 0.0])
        while at < len(kernels) and kernels[at]["ts"] < start:
            at += 1
        j = at
        while j < len(kernels) and kernels[j]["ts"] < end:
            k = kernels[j]
            per[k["name"]][0] += 1
            per[k["name"]][1] += k.get("dur", 0) / 1000.0
            j += 1
        total = sum(v[1] for v in per.values())
        print(f"\nstep {i}: {sum(v[0] for v in per.values())} kernels, {total:.2f} ms of kernel "
              f"time in a {s['dur'] / 1000.0:.2f} ms step\n")
        print("| kernel | calls | ms | share |\n|---|---|---|---|")
        for name, (calls, ms) in sorted(per.items(), key=lambda kv: -kv[1][1])[:top]:
            print(f"| {name[:90]} | {calls} | {ms:.2f} | {ms / total:.1%} |")


if __name__ == "__main__":
    main()
