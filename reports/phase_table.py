#!/usr/bin/env python3
"""Per-point step time and its GPU phases from a hisparse-bench results.json, as a Markdown table.

  python3 reports/phase_table.py RESULTS.json
"""
import json
import sys


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
    phases = sorted({p for pt in points for p in ((pt.get("metrics") or {}).get("phase_ms") or {})})
    print("| point | running | tok/s | step ms | " + " | ".join(phases) + " | hit rate |")
    print("|---" * (len(phases) + 5) + "|")
    for pt in points:
        m = pt.get("metrics") or {}
        label = " ".join(f"{k}={v}" for k, v in sorted(pt.get("axes", {}).items()))
        if pt.get("error"):
            print(f"| {label} | failed: {pt['error']} |")
            continue
        ph = m.get("phase_ms") or {}
        cells = " | ".join(f"{ph[p]:.2f}" if p in ph else "-" for p in phases)
        hit = m.get("hit_rate")
        print(f"| {label} | {m.get('running_requests')} | {m.get('output_tokens_per_s', 0):.1f} | "
              f"{(m.get('step_ms') or {}).get('median', 0):.1f} | {cells} | "
              f"{'-' if hit is None else f'{hit:.3f}'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
