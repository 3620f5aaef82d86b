#!/usr/bin/env python3
"""Pivots a hisparse-microbench sweep (Google Benchmark JSON) into a Markdown table.

Case names are `family/key:value/key:value/...`. Pick the family, the keys that make the rows and
the key whose values make the columns; each cell is a format string over the case's counters.

  python3 reports/grid_tables.py microbench.json --family swap_in/pool_gb:16 \
      --rows batch,hot,row --cols miss --cell '{us_per_call:.1f} us ({missed_GBps:.1f} GB/s)'

The table starts with the file's device, revision and date, so it can be read away from the JSON.
Cases that report an error show it in their cell. Bad input (no matching case, a missing key or
counter) exits 2 with one line on stderr.
"""
import argparse
import sys

from targets import fail, read_json, short_revision  # reports/targets.py, beside this script


def name_keys(name):
    """{key: value} of a case name's key:value parts (the /iterations:... suffix dropped)."""
    parts = name.split("/iterations:")[0].split("/")
    return dict(p.split(":", 1) for p in parts if ":" in p)


def sort_key(value):
    try:
        return (0, float(value), value)
    except ValueError:
        return (1, 0.0, value)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json")
    ap.add_argument("--family", required=True,
                    help="name prefix of the cases, e.g. swap_in/pool_gb:16 or fathom_scan/hbm")
    ap.add_argument("--rows", required=True, help="comma-separated keys that make a row")
    ap.add_argument("--cols", required=True, help="the key whose values make the columns")
    ap.add_argument("--cell", default="{us_per_call:.1f} us",
                    help="format string over the case's counters")
    args = ap.parse_args()
    data = read_json(args.json)
    rows_keys = args.rows.split(",")
    cells, col_values, row_values = {}, set(), set()
    for case in data.get("benchmarks", []):
        name = case["name"]
        if not name.startswith(args.family + "/"):
            continue
        keys = name_keys(name)
        missing = [k for k in rows_keys + [args.cols] if k not in keys]
        if missing:
            fail(f"{args.json}: case {name} has no key {missing[0]}; keys are {', '.join(keys)}")
        row = tuple(keys[k] for k in rows_keys)
        col = keys[args.cols]
        if case.get("error_occurred"):
            text = "error: " + case.get("error_message", "")
        else:
            try:
                text = args.cell.format(**case)
            except KeyError as e:
                counters = [k for k, v in case.items()
                            if isinstance(v, (int, float)) and not isinstance(v, bool)]
                fail(f"--cell: case {name} has no counter {e}; it has {', '.join(counters)}")
        cells[(row, col)] = text
        row_values.add(row)
        col_values.add(col)
    if not cells:
        fail(f"{args.json}: no case starts with '{args.family}/'")
    ctx = data.get("context", {})
    print(f"{ctx.get('hisparse_device', 'unknown device')}, "
          f"git {short_revision(ctx.get('hisparse_git_revision', 'unknown'))}, {ctx.get('date', '?')}, "
          f"backend {ctx.get('hisparse_backend', '?')}\n")
    cols = sorted(col_values, key=sort_key)
    print("| " + " | ".join(rows_keys) + " | " + " | ".join(f"{args.cols} {c}" for c in cols) + " |")
    print("| " + " | ".join("---" for _ in rows_keys) + " | " + " | ".join("---:" for _ in cols) + " |")
    for row in sorted(row_values, key=lambda r: [sort_key(v) for v in r]):
        print("| " + " | ".join(row) + " | " + " | ".join(cells.get((row, c), "") for c in cols) + " |")


if __name__ == "__main__":
    main()
