#!/usr/bin/env python3
"""Renders a hisparse trace.json (Chrome-trace / Perfetto JSON) as a static timeline PNG.

A picture for the README and for machines without a browser; for real investigation open the
trace at ui.perfetto.dev. Usage: render_trace.py trace.json out.png [--from-us A --to-us B | --focus NAME --window-us W]
Needs matplotlib. One row per track (host thread or CUDA stream), nested NVTX ranges stacked.
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

CATEGORY_COLOURS = {"kernel": "#1e88e5", "memcpy": "#fb8c00", "memset": "#8e24aa",
                    "cuda_api": "#b0bec5"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("png")
    ap.add_argument("--from-us", type=float, default=None)
    ap.add_argument("--to-us", type=float, default=None)
    ap.add_argument("--focus", default=None,
                    help="zoom on the first slice whose name contains this text")
    ap.add_argument("--window-us", type=float, default=200.0, help="width of the --focus window")
    ap.add_argument("--title", default="hisparse trace")
    args = ap.parse_args()

    events = json.load(open(args.trace))["traceEvents"]
    names = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") in ("process_name", "thread_name"):
            key = (e["pid"], e.get("tid")) if e["name"] == "thread_name" else (e["pid"], None)
            names[key] = e["args"]["name"]
    slices = [e for e in events if e.get("ph") == "X"]
    if not slices:
        sys.exit("no complete events in " + args.trace)
    if args.focus:
        hits = sorted(e["ts"] for e in slices if args.focus in e["name"])
        if not hits:
            sys.exit(f"no slice named like '{args.focus}' in {args.trace}")
        args.from_us = hits[0] - 0.1 * args.window_us
        args.to_us = args.from_us + args.window_us
    t0 = args.from_us if args.from_us is not None else min(e["ts"] for e in slices)
    t1 = args.to_us if args.to_us is not None else max(e["ts"] + e.get("dur", 0) for e in slices)
    slices = [e for e in slices if e["ts"] + e.get("dur", 0) >= t0 and e["ts"] <= t1]

    tracks = sorted({(e["pid"], e["tid"]) for e in slices})
    fig, ax = plt.subplots(figsize=(14, 0.9 + 0.55 * len(tracks)))
    labels = []
    for row, (pid, tid) in enumerate(tracks):
        labels.append(f"{names.get((pid, None), pid)} / {names.get((pid, tid), tid)}")
        stack = []  # end times of the enclosing slices: depth of nesting
        for e in sorted((e for e in slices if (e["pid"], e["tid"]) == (pid, tid)),
                        key=lambda e: (e["ts"], -e.get("dur", 0))):
            while stack and stack[-1] <= e["ts"]:
                stack.pop()
            depth = len(stack)
            stack.append(e["ts"] + e.get("dur", 0))
            colour = (e.get("args", {}).get("colour")
                      or CATEGORY_COLOURS.get(e.get("cat"), "#78909c"))
            height = 0.8 / (1 + 0.35 * depth)
            start = max(e["ts"], t0)  # clipped to the window
            end = min(e["ts"] + e.get("dur", 0), t1)
            width = max(end - start, (t1 - t0) * 1e-4)
            ax.broken_barh([(start - t0, width)], (row - height / 2, height), facecolors=colour,
                           edgecolors="black", linewidth=0.2)
            if end - start > (t1 - t0) * 0.08:
                ax.text(start - t0 + (end - start) / 2, row + 0.25 * depth, e["name"][:40],
                        ha="center", va="center", fontsize=6, clip_on=True)
    ax.set_xlim(0, t1 - t0)
    ax.set_yticks(range(len(tracks)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("microseconds")
    ax.set_title(args.title, fontsize=9)
    fig.tight_layout()
    fig.savefig(args.png, dpi=130)


if __name__ == "__main__":
    main()
