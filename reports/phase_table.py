#!/usr/bin/env python3
"""Per-point step time and its phases from a hisparse-bench results.json, as Markdown tables.

  python3 reports/phase_table.py RESULTS.json

The first table holds the host-timed phases (metrics.phase_ms, median ms per step); a second one,
printed when the run was traced (--trace, CUDA backend), the GPU time of each phase measured by
CUPTI (metrics.gpu_phase_ms, mean ms per step).
"""
import json
import sys


def label_of(pt):
    return " ".join(f"{k}={v}" for k, v in sorted(pt.get("axes", {}).items()))


def table(points, key, title):
    phases = sorted({p for pt in points for p in ((pt.get("metrics") or {}).get(key) or {})})
    if not phases:
        return False
    print(f"{title}\n")
    print("| point | running | tok/s | step ms | " + " | ".join(phases) + " | hit rate |")
    print("|---" * (len(phases) + 5) + "|")
    for pt in points:
        m = pt.get("metrics") or {}
        if pt.get("error"):
            print(f"| {label_of(pt)} | failed: {pt['error']} |")
            continue
        ph = m.get(key) or {}
        cells = " | ".join(f"{ph[p]:.2f}" if p in ph else "-" for p in phases)
        hit = m.get("hit_rate")
        print(f"| {label_of(pt)} | {m.get('running_requests')} | {m.get('output_tokens_per_s', 0):.1f} | "
              f"{(m.get('step_ms') or {}).get('median', 0):.1f} | {cells} | "
              f"{'-' if hit is None else f'{hit:.3f}'} |")
    print()
    return True


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        with open(argv[1], encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"{argv[1]}: cannot read results ({e})")
    points = doc.get("points", [])
    meta = doc.get("metadata") or {}
    device = meta.get("device")
    if isinstance(device, dict):
        device = device.get("name", "?")
    print(f"backend {meta.get('backend', '?')}, device {device or '?'}\n")
    table(points, "phase_ms", "Host-timed phases (median ms per step)")
    table(points, "gpu_phase_ms", "GPU time per phase (CUPTI, mean ms per step)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
