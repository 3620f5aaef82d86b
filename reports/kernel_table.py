#!/usr/bin/env python3
"""The kernels that take a traced decode step's GPU time, from a hisparse-bench trace.json.

  python3 reports/kernel_table.py TRACE.json [TOP]

For each sweep point in the trace (one Perfetto process pair per point, named by its label), the
GPU kernels that ran inside its NVTX "step" ranges, summed by name and averaged over the point's
traced steps: calls and ms per step, and share of the step's kernel time, the TOP (default 12)
largest first. CUPTI times the kernels (their launches serialised by the trace), so read shares,
not the step's wall time.
"""
import collections
import json
import sys


def point_labels(events):
    """pid -> sweep point label (the process name without its " - host" / " - GPU d" suffix)."""
    labels = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            labels[e["pid"]] = e.get("args", {}).get("name", str(e["pid"])).rsplit(" - ", 1)[0]
    return labels


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    with open(sys.argv[1]) as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    labels = point_labels(events)
    steps = sorted((e for e in events if e.get("ph") == "X" and e.get("name") == "step"
                    and e.get("cat") == "nvtx"), key=lambda e: e["ts"])
    kernels = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"),
                     key=lambda e: e["ts"])
    if not steps:
        sys.exit(f"{sys.argv[1]}: no NVTX step range (was the run traced on the CUDA backend?)")
    points = collections.OrderedDict()  # label -> {"steps": n, "wall": ms, "per": name -> [calls, ms]}
    at = 0
    for s in steps:
        label = labels.get(s.get("pid"), "run")
        p = points.setdefault(label, {"steps": 0, "wall": 0.0,
                                      "per": collections.defaultdict(lambda: [0, 0.0])})
        p["steps"] += 1
        p["wall"] += s["dur"] / 1000.0
        start, end = s["ts"], s["ts"] + s["dur"]
        while at < len(kernels) and kernels[at]["ts"] < start:
            at += 1
        j = at
        while j < len(kernels) and kernels[j]["ts"] < end:
            k = kernels[j]
            p["per"][k["name"]][0] += 1
            p["per"][k["name"]][1] += k.get("dur", 0) / 1000.0
            j += 1
    for label, p in points.items():
        n = p["steps"]
        total = sum(v[1] for v in p["per"].values()) / n
        calls = sum(v[0] for v in p["per"].values()) / n
        print(f"\n{label}: {n} traced steps, per step {calls:.0f} kernels, {total:.2f} ms of "
              f"kernel time in a {p['wall'] / n:.2f} ms step (traced)\n")
        print("| kernel | calls | ms | share |\n|---|---|---|---|")
        for name, (c, ms) in sorted(p["per"].items(), key=lambda kv: -kv[1][1])[:top]:
            print(f"| {name[:90]} | {c / n:.3g} | {ms / n:.2f} | {ms / n / total:.1%} |")


if __name__ == "__main__":
    main()
