#!/usr/bin/env python3
"""Compare two hisparse-bench results.json files point by point: the digest of every generated
token and the hot-buffer hits and misses must be equal (the CUDA engine against its CPU twin).

  python3 reports/engine_agreement.py CUDA/results.json CPU/results.json

Prints a Markdown table with each point's tok/s on both sides; exit 1 when any point differs or
either side has a failed point, 2 on unreadable input."""
import json
import sys

CHECKED = ("next_tokens_digest", "hits", "misses")


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"{path}: cannot read results ({e}); run `hisparse-bench run` with --out first")


def label(point):
    return " ".join(f"{k}={v}" for k, v in sorted(point.get("axes", {}).items()))


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    a, b = load(argv[1]), load(argv[2])
    pa, pb = a.get("points", []), b.get("points", [])
    if not pa or len(pa) != len(pb):
        print(f"the two runs have {len(pa)} and {len(pb)} points: run the same scenario on both")
        return 1
    backends = [r.get("metadata", {}).get("backend", "?") for r in (a, b)]
    print(f"| point | {backends[0]} tok/s | {backends[1]} tok/s | same tokens, hits, misses |")
    print("|---|---|---|---|")
    agree = 0
    for x, y in zip(pa, pb):
        mx, my = x.get("metrics") or {}, y.get("metrics") or {}
        failed = x.get("error") or y.get("error")
        same = not failed and all(mx.get(k) is not None and mx.get(k) == my.get(k) for k in CHECKED)
        agree += same
        rate = lambda m: f"{m['output_tokens_per_s']:.0f}" if m.get("output_tokens_per_s") else "-"
        verdict = "yes" if same else f"NO ({failed or ', '.join(k for k in CHECKED if mx.get(k) != my.get(k))})"
        print(f"| {label(x)} | {rate(mx)} | {rate(my)} | {verdict} |")
    print(f"\n{agree}/{len(pa)} points agree")
    return 0 if agree == len(pa) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
