#!/usr/bin/env python3
"""Issue 3 and 4 speed targets against a hisparse-microbench JSON file (--benchmark_out).

Usage: reports/targets.py microbench.json [more.json ...]
       reports/targets.py --across run1.json run2.json [...]
Prints one Markdown row per target: the benchmark, the figure, the target and whether it is met;
a target whose benchmark is missing from the files is listed as "not run". The files of the first
form are one run together (a later file's case replaces an earlier one's). With --across each file
is its own run (say, one targets run per GPU lease, oldest first), and a row gives the last run's
figure, the range over the runs that have it, and in how many of them the target was met. Exit
status 0 whatever the figures: this is a report, not a gate (ctest and CI gate correctness; speed
is read by people). A file that cannot be read as JSON exits 2 with one line on stderr.
"""
import json
import sys

# (label, benchmark name prefix, counter, comparison, bound)
SWAP = "swap_in/pool_gb:16/"
SCAN = "fathom_scan/"
TARGETS = [
    ("#3 batch 64, 20% miss: time", SWAP + "batch:64/hot:4096/row:656/miss:0.2/", "us_per_call", "<=", 382),
    ("#3 batch 64, 20% miss: missed bytes", SWAP + "batch:64/hot:4096/row:656/miss:0.2/", "missed_GBps", ">=", 45),
    ("#3 batch 100, 20% miss", SWAP + "batch:100/hot:4096/row:656/miss:0.2/", "us_per_call", "<=", 600),
    ("#3 batch 100, hot 8192, 20% miss", SWAP + "batch:100/hot:8192/row:656/miss:0.2/", "us_per_call", "<=", 620),
    ("#3 batch 64, 0.1% miss", SWAP + "batch:64/hot:4096/row:656/miss:0.001/", "us_per_call", "<=", 10),
    ("#3 batch 1, 0.1% miss", SWAP + "batch:1/hot:4096/row:656/miss:0.001/", "us_per_call", "<=", 8),
    ("#3 batch 1, 20% miss", SWAP + "batch:1/hot:4096/row:656/miss:0.2/", "us_per_call", "<=", 20),
    ("#3 batch 1, 100% miss", SWAP + "batch:1/hot:4096/row:656/miss:1/", "us_per_call", "<=", 40),
    ("#3 1152-B rows, batch 64, 100% miss", SWAP + "batch:64/hot:4096/row:1152/miss:1/", "missed_GBps", ">=", 50),
    ("#4 HBM scan B48 128K batch 8 (fraction of HBM)", SCAN + "hbm/budget:48/context:131072/batch:8/", "ceiling_fraction", ">=", 0.5),
    ("#4 HBM scan B48 1M batch 32 (fraction of HBM)", SCAN + "hbm/budget:48/context:1048576/batch:32/", "ceiling_fraction", ">=", 0.5),
    # The host scan two ways: the measure, the step's plane transfer (the staging copy's
    # own span, first copy block's start to the last one's end, beside the scan), and the whole
    # step (launch to the last kernel's end: the transfer plus the scan's tail, merge, finalize).
    ("#4 host transfer B48 1M batch 1 (copy span, fraction of PCIe)", SCAN + "host/budget:48/context:1048576/batch:1/", "copy_ceiling_fraction", ">=", 0.9),
    ("#4 host transfer B48 1M batch 8 (copy span, fraction of PCIe)", SCAN + "host/budget:48/context:1048576/batch:8/", "copy_ceiling_fraction", ">=", 0.9),
    ("#4 host transfer B48 1M batch 32 (copy span, fraction of PCIe)", SCAN + "host/budget:48/context:1048576/batch:32/", "copy_ceiling_fraction", ">=", 0.9),
    ("#4 host transfer B48 128K batch 8 (copy span, fraction of PCIe)", SCAN + "host/budget:48/context:131072/batch:8/", "copy_ceiling_fraction", ">=", 0.9),
    ("#4 host scan B48 1M batch 1 (whole step, fraction of PCIe)", SCAN + "host/budget:48/context:1048576/batch:1/", "ceiling_fraction", ">=", 0.9),
    ("#4 host scan B48 1M batch 8 (whole step, fraction of PCIe)", SCAN + "host/budget:48/context:1048576/batch:8/", "ceiling_fraction", ">=", 0.9),
    ("#4 host scan B48 1M batch 32 (whole step, fraction of PCIe)", SCAN + "host/budget:48/context:1048576/batch:32/", "ceiling_fraction", ">=", 0.9),
    ("#4 host scan B48 128K batch 8 (whole step, fraction of PCIe)", SCAN + "host/budget:48/context:131072/batch:8/", "ceiling_fraction", ">=", 0.9),
    ("#4 planner batch 8, one graph replay", "fathom_plan/batch:8/", "us_per_call", "<=", 5),
]
# Context rows printed under the table (not targets): the floors under the latency targets. A
# two-kernel graph of empty 1024-thread kernels storing a row's 2048 padding outputs, the second
# launched with programmatic dependent launch as the swap-in's copy is (launch_floor); and one
# kernel gathering the host rows of a 0.1% call from a row list it already has (host_gather).
HOST_GATHER = "host_gather/method:sm_loads/row:656/stride:656/pattern:"
CONTEXT = [
    ("two-kernel graph floor, 1 block (under the batch-1 latency targets)",
     "launch_floor/nodes:2/pdl:1/blocks:1/writes:2048/", "us_per_call"),
    ("two-kernel graph floor, 64 blocks (under the batch-64 latency target)",
     "launch_floor/nodes:2/pdl:1/blocks:64/writes:2048/", "us_per_call"),
    ("host reads of a batch-1 / 0.1% call, rows known (one kernel)",
     HOST_GATHER + "rare_b1/blocks_per_sm:0/", "us_per_call"),
    ("host reads of a batch-64 / 0.1% call, rows known (one kernel)",
     HOST_GATHER + "rare_b64/blocks_per_sm:0/", "us_per_call"),
]
# The fused planner's cost is a difference of two scans.
FUSED = ("#4 planner fused into the scan (fused - given, 128K batch 8)",
         "fathom_scan_plan/fused/hbm/budget:48/context:131072/batch:8/",
         "fathom_scan_plan/given/hbm/budget:48/context:131072/batch:8/", 5)



def fail(message):
    """Bad input: one line on stderr, exit 2 (the project's convention)."""
    print("error: " + message, file=sys.stderr)
    sys.exit(2)


def read_json(path):
    """A --benchmark_out file as a dict, or fail() naming the file and what to pass instead."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{path}: {e}; pass a hisparse-microbench --benchmark_out file")


def short_revision(rev):
    """The first 12 hex digits, keeping the "-dirty" mark of a tree that differs from its HEAD."""
    return rev[:12] + ("-dirty" if rev.endswith("-dirty") else "")

def load(paths, sources):
    """Every case that ran, by name; `sources` gets one provenance line per file."""
    runs = {}
    for path in paths:
        data = read_json(path)
        c = data.get("context", {})
        resolve = c.get("hisparse_swap_in_resolve")  # HISPARSE_MICROBENCH_RESOLVE, when set
        sources.append(f"{path}: {c.get('hisparse_device', 'device not recorded')}, "
                       f"git {short_revision(c.get('hisparse_git_revision', 'unknown'))}, {c.get('date', '')}"
                       + (f", swap-in resolve {resolve.split(' ')[0]}" if resolve else ""))
        for b in data.get("benchmarks", []):
            if not b.get("error_occurred"):
                runs[b["name"]] = b
    return runs


def find(runs, prefix):
    for name, b in runs.items():
        if name.startswith(prefix):
            return b
    return None


def met(value, op, bound):
    return value <= bound if op == "<=" else value >= bound


def figures(runs):
    """(label, value or None, unit, op, bound) for every target of one run, the fused planner last."""
    rows = []
    for label, prefix, counter, op, bound in TARGETS:
        b = find(runs, prefix)
        rows.append((label, b[counter] if b is not None and counter in b else None, counter, op, bound))
    label, fused, given, bound = FUSED
    f, g = find(runs, fused), find(runs, given)
    d = f["us_per_call"] - g["us_per_call"] if f is not None and g is not None else None
    rows.append((label, d, "us", "<=", bound))
    return rows


def context_figures(runs):
    """(label, value, counter) for the context rows one run has."""
    context = [(label, find(runs, prefix), counter) for label, prefix, counter in CONTEXT]
    return [(label, b[counter], counter) for label, b, counter in context if b and counter in b]


def bound_text(op, bound, unit):
    return f"{op} {bound} us" if unit == "us" else f"{op} {bound}"


def number_text(value, unit):
    """A figure's digits: 3 significant for the fused planner's microseconds, else 4."""
    return f"{value:.3g}" if unit == "us" else f"{value:.4g}"


def value_text(value, unit):
    return f"{number_text(value, unit)} {unit}"


def range_text(values, unit):
    """One figure when the runs agree, else low-high with the unit once."""
    low, high = min(values), max(values)
    if low == high:
        return value_text(low, unit)
    return f"{number_text(low, unit)}-{number_text(high, unit)} {unit}"


def runs_text(n):
    return f"{n} run{'' if n == 1 else 's'}"


def print_one_run(runs):
    print("| target | figure | bound | met |")
    print("| --- | ---: | ---: | --- |")
    for label, v, unit, op, bound in figures(runs):
        if v is None:
            print(f"| {label} | not run | {bound_text(op, bound, unit)} | - |")
        else:
            print(f"| {label} | {value_text(v, unit)} | {bound_text(op, bound, unit)} | "
                  f"{'yes' if met(v, op, bound) else 'no'} |")
    context = context_figures(runs)
    if context:
        print()
        print("Context (not targets):")
        for label, v, counter in context:
            print(f"- {label}: {value_text(v, counter)}")


def print_across(all_runs):
    print(f"| target | last run | range over {runs_text(len(all_runs))} | met in | bound |")
    print("| --- | ---: | ---: | ---: | ---: |")
    per_run = [figures(runs) for runs in all_runs]
    for i, (label, _, unit, op, bound) in enumerate(per_run[0]):
        values = [rows[i][1] for rows in per_run]
        seen = [v for v in values if v is not None]
        if not seen:
            print(f"| {label} | not run | - | - | {bound_text(op, bound, unit)} |")
            continue
        last = "not run" if values[-1] is None else value_text(values[-1], unit)
        hits = sum(1 for v in seen if met(v, op, bound))
        print(f"| {label} | {last} | {range_text(seen, unit)} | {hits} of {len(seen)} | "
              f"{bound_text(op, bound, unit)} |")
    context = {}
    for runs in all_runs:
        for label, v, counter in context_figures(runs):
            context.setdefault((label, counter), []).append(v)
    if context:
        print()
        print("Context (not targets), range over the runs that have it:")
        for (label, counter), vs in context.items():
            print(f"- {label}: {range_text(vs, counter)} ({runs_text(len(vs))})")


def main(argv):
    args = argv[1:]
    across = bool(args) and args[0] == "--across"
    if across:
        args = args[1:]
    if not args:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    sources = []
    all_runs = [load([path], sources) for path in args] if across else [load(args, sources)]
    for line in sources:
        print(f"- {line}")
    print()
    if across:
        print_across(all_runs)
    else:
        print_one_run(all_runs[0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
