#!/usr/bin/env python3
"""Where a kernel's instructions and stalls go, from Nsight Compute's SASS source page.

Input: the CSV of `ncu -i REPORT --page source --csv --print-source sass` (one kernel) and,
optionally, `--details` the CSV of `ncu -i REPORT --page details --csv`. Output (markdown): the
launch's headline metrics, the opcode mix, the stall reasons, the basic blocks (runs of
consecutive SASS lines executed the same number of times) that hold the most instructions, and
the instructions grouped by execution count, which separates a loop body from per-round and
per-tile code. `--per N` divides the instruction counts by N (say, the number of 64-token blocks
of every stream) to give instructions per unit of work.

  python3 reports/sass_blocks.py scan_sass.csv --details scan_details.csv --per 4194304
"""
import argparse
import collections
import csv
import sys

HEADLINE = [
    "Duration",
    "Executed Ipc Active",
    "Issue Slots Busy",
    "Eligible Warps Per Scheduler",
    "No Eligible",
    "Achieved Active Warps Per SM",
    "Registers Per Thread",
    "Dynamic Shared Memory Per Block",
    "DRAM Throughput",
    "L1/TEX Cache Throughput",
]


def read_sass(path):
    """(kernel name, rows): rows of (address, executions, stall samples, stall by reason, text)."""
    with open(path, newline="") as f:
        table = list(csv.reader(f))
    if len(table) < 3 or not table[0] or table[0][0] != "Kernel Name":
        sys.exit(f"error: {path}: not an ncu source page (want the CSV of "
                 "`ncu -i REPORT --page source --csv --print-source sass`)")
    kernel, header = table[0][1], table[1]
    col = {name: i for i, name in enumerate(header)}
    for need in ("Address", "Source", "Instructions Executed"):
        if need not in col:
            sys.exit(f"error: {path}: no '{need}' column; export with --print-source sass")
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    samples = "Warp Stall Sampling (All Samples)"
    rows = []
    def number(r, name):
        return float(r[col[name]] or 0) if name in col else 0.0

    for r in table[2:]:
        if len(r) != len(header):
            continue
        rows.append((r[col["Address"]], int(number(r, "Instructions Executed")), number(r, samples),
                     {k[len("stall_"):]: number(r, k) for k in reasons}, r[col["Source"]].strip()))
    return kernel, rows


def opcode(text):
    words = text.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def basic_blocks(rows):
    """Runs of consecutive lines with one execution count: [first, last, executions, stalls]."""
    runs = []
    for i, (_, n, s, _, _) in enumerate(rows):
        if runs and runs[-1][2] == n and runs[-1][1] == i - 1:
            runs[-1][1] = i
            runs[-1][3] += s
        else:
            runs.append([i, i, n, s])
    return runs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sass", help="CSV of ncu's source page (--print-source sass)")
    ap.add_argument("--details", help="CSV of ncu's details page, for the headline metrics")
    ap.add_argument("--per", type=float, default=0.0,
                    help="units of work the launch did: instruction counts are also given per unit")
    ap.add_argument("--top", type=int, default=15, help="basic blocks and count groups listed")
    args = ap.parse_args()

    kernel, rows = read_sass(args.sass)
    total = sum(n for _, n, _, _, _ in rows)
    samples = sum(s for _, _, s, _, _ in rows) or 1.0
    if total == 0:
        sys.exit(f"error: {args.sass}: no executed instructions (was the kernel profiled?)")
    per = (lambda n: f" ({n / args.per:.1f} per unit)") if args.per > 0 else (lambda n: "")

    print(f"# {kernel}\n")
    if args.details:
        with open(args.details, newline="") as f:
            details = list(csv.DictReader(f))
        for name in HEADLINE:
            for d in details:
                if d.get("Metric Name") == name:
                    print(f"- {name}: {d['Metric Value']} {d.get('Metric Unit', '')}".rstrip())
                    break
        print()
    print(f"Warp instructions executed: {total:,}{per(total)}\n")

    mix = collections.Counter()
    stalls = collections.Counter()
    for _, n, _, by_reason, text in rows:
        mix[opcode(text)] += n
        stalls.update(by_reason)
    print("| opcode | instructions | share |\n| --- | ---: | ---: |")
    for op, n in mix.most_common(12):
        print(f"| {op} | {n:,} | {100 * n / total:.1f}% |")
    stall_total = sum(stalls.values()) or 1.0
    print("\nStall samples: " + ", ".join(
        f"{k} {100 * v / stall_total:.0f}%" for k, v in stalls.most_common(10) if v > 0) + "\n")

    runs = basic_blocks(rows)
    print("| basic block (SASS lines) | lines | executions | instructions | stall samples | first "
          "instruction |\n| --- | ---: | ---: | ---: | ---: | --- |")
    for first, last, n, s in sorted(runs, key=lambda b: -b[2] * (b[1] - b[0] + 1))[:args.top]:
        size = last - first + 1
        share = f"{100 * n * size / total:.1f}%{per(n * size)}"
        print(f"| {first + 1}-{last + 1} | {size} | {n:,} | {share} | {100 * s / samples:.1f}% "
              f"| `{rows[first][4][:60]}` |")

    by_count = collections.Counter()
    for first, last, n, _ in runs:
        by_count[n] += n * (last - first + 1)
    print("\n| executions per line | instructions | share |\n| ---: | ---: | ---: |")
    for n, instructions in by_count.most_common(args.top):
        if n:
            share = 100 * instructions / total
            print(f"| {n:,} | {instructions:,}{per(instructions)} | {share:.1f}% |")


if __name__ == "__main__":
    main()
