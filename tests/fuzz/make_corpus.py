#!/usr/bin/env python3
"""Writes the seed corpora of tests/fuzz/corpus/<target>/ (committed; rerun after a fixture
changes): copies of the test fixtures, and small .npy, safetensors and selection-trace files
written here with the standard library (numpy is not needed)."""
import json
import shutil
import struct
from pathlib import Path

root = Path(__file__).resolve().parents[2]
out = root / "tests/fuzz/corpus"


def target(name):
    d = out / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    return d


def copy(files, dest):
    for f in files:
        shutil.copy(f, dest / f.name)


def npy(descr, shape, values, major=1):
    """A .npy file as numpy.save writes it (header padded to a multiple of 64 bytes)."""
    shape_text = "(%s)" % ("%d," % shape[0] if len(shape) == 1 else ", ".join(map(str, shape)))
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape_text)
    fmt = {"<f4": "f", "<f2": "e", "<f8": "d", "<u2": "H", "<i4": "i", "<i8": "q"}[descr]
    data = struct.pack("<%d%s" % (len(values), fmt), *values)
    len_size = 2 if major == 1 else 4
    pad = -(6 + 2 + len_size + len(header) + 1) % 64
    header = (header + " " * pad + "\n").encode("latin1" if major < 3 else "utf8")
    size = struct.pack("<H" if major == 1 else "<I", len(header))
    return b"\x93NUMPY" + bytes([major, 0]) + size + header + data


def safetensors(tensors, metadata=None):
    """tensors: (name, dtype, shape, raw bytes), written in order."""
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def ramp(n):
    return [(i % 17) * 0.5 - 4.0 for i in range(n)]


def f32(values):
    return struct.pack("<%df" % len(values), *values)


def bf16(values):
    return b"".join(f32([v])[2:] for v in values)


d = target("scenario_yaml")
copy(sorted((root / "scenarios").glob("*.yaml")), d)
copy(sorted((root / "tests/fixtures/scenarios").glob("*.yaml")), d)
for f in sorted((root / "tests/fixtures/bad").glob("*.yaml")):
    shutil.copy(f, d / ("bad_" + f.name))
(d / "set_overrides.yaml").write_text(
    "#set sweep.concurrency=[1,2]\n#set workload.seed=7\n#set mode=hisparse\n"
    "name: overrides\nmodel: tiny-gqa\ncontext_length: 256\ntop_k: 16\n")

copy(sorted((root / "scenarios/models").glob("*.yaml")), target("model_yaml"))

d = target("npy")
(d / "f32_v1.npy").write_bytes(npy("<f4", [2, 3], ramp(6)))
(d / "f16_v2.npy").write_bytes(npy("<f2", [3], ramp(3), major=2))
(d / "bf16_v3.npy").write_bytes(npy("<u2", [2, 2], [0x3F80, 0xC000, 0x7F80, 0x0001], major=3))
(d / "f64_scalar.npy").write_bytes(npy("<f8", [], [1.5]))
(d / "i32.npy").write_bytes(npy("<i4", [2, 2], [1, -1, 7, 2147483647]))
(d / "i64_empty.npy").write_bytes(npy("<i8", [0, 4], []))

d = target("safetensors")
(d / "mixed.safetensors").write_bytes(safetensors(
    [("k", "BF16", [2, 3], bf16(ramp(6))), ("q", "F32", [4], f32(ramp(4))),
     ("h", "F16", [2], struct.pack("<2e", 1.0, -2.0)), ("s", "F8_E4M3", [3], b"\x38\x40\xb8"),
     ("i", "I32", [1], struct.pack("<i", 5))], {"format": "pt"}))
(d / "empty_tensor.safetensors").write_bytes(
    safetensors([("z", "F32", [0, 4], b""), ("x", "F32", [], f32([2.0]))]))
(d / "layers.safetensors").write_bytes(safetensors(
    [("layers.0.k", "BF16", [1, 4, 2], bf16(ramp(8))),
     ("layers.0.q", "F32", [1, 2, 2], f32(ramp(4)))]))

d = target("results_json")
for f in sorted((root / "tests/fixtures/results").glob("*.json")):
    shutil.copy(f, d / f.name)

d = target("selection_trace")
(d / "steps.txt").write_text("# hisparse selection trace: seq_len: selected positions\n"
                             "10: 5 9\n11: 5 10 2\n12: 3 11 -1\n")
(d / "long.txt").write_text("".join("%d: %s\n" % (100 + s, " ".join(
    str((7 * s + 13 * e) % (100 + s)) for e in range(8))) for s in range(12)))
(d / "i32_steps.npy").write_bytes(npy("<i4", [3, 4], [0, 5, 9, -1, 1, 5, 9, 1024, 2, 3, 4, 5]))
(d / "i64_streams.npy").write_bytes(
    npy("<i8", [2, 3, 2], [0, 1, 1, 2, 2, 3, 1000, 1023, 1, 1024, -1, 5]))
