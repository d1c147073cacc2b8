#!/usr/bin/env python3
# Writes the safetensors test files: good/ (golden files laid out by hand, as the reference writer and a sloppier one would) and bad/ (one defect each).
"""Usage: scripts/make_safetensors_corpus.py [OUTDIR]   (default: tests/data/safetensors)

Plain python3 (struct + json), no safetensors package: Debian 12 has no python3-safetensors,
so the golden files follow the format description instead of the reference code. The outputs
are committed; rerun this after changing it. tests/test_safetensors.c checks the good files'
contents against the formulas below and that every bad file is refused.
"""
import json
import os
import struct
import sys

DTYPE = {  # name -> (struct code, size)
    "F64": ("d", 8), "F32": ("f", 4), "F16": ("e", 2), "I64": ("q", 8),
    "I32": ("i", 4), "I16": ("h", 2), "I8": ("b", 1), "U8": ("B", 1), "BOOL": ("?", 1),
}


def pack(dtype, values):
    code, _ = DTYPE[dtype]
    return struct.pack("<%d%s" % (len(values), code), *values)


def bf16(values):
    # BF16 is the top half of an F32; these values are exact in BF16
    return b"".join(struct.pack("<f", v)[2:] for v in values)


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def safetensors(tensors, metadata=None, compact=True, pad=True, order=None):
    """tensors: list of (name, dtype, shape, raw bytes). Returns the file's bytes."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    data = b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if order is not None:
        header = {k: header[k] for k in order}
    if compact:
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    else:
        text = json.dumps(header, indent=2, ensure_ascii=True).encode()
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data


def raw_file(header_text, data=b"", length=None):
    """A file around a header given as text or bytes, with the length field forced if asked."""
    if isinstance(header_text, str):
        header_text = header_text.encode()
    n = len(header_text) if length is None else length
    return struct.pack("<Q", n) + header_text + data


def golden_torch_like():
    """A tiny ResNet-shaped state dict, laid out as the reference writer lays it out:
    compact JSON, __metadata__ first, tensors sorted by alignment (descending) then name,
    header padded with spaces to a multiple of 8."""
    t = []
    t.append(("conv1.weight", "F32", [2, 1, 3, 3], pack("F32", [0.25 * i - 2 for i in range(18)])))
    t.append(("bn1.weight", "F32", [2], pack("F32", [1.0, 1.0])))
    t.append(("bn1.bias", "F32", [2], pack("F32", [0.0, 0.0])))
    t.append(("bn1.running_mean", "F32", [2], pack("F32", [0.5, -0.5])))
    t.append(("bn1.running_var", "F32", [2], pack("F32", [1.5, 2.5])))
    t.append(("bn1.num_batches_tracked", "I64", [], pack("I64", [12345678901])))
    t.append(("layer1.0.bn1.num_batches_tracked", "I64", [], pack("I64", [-1])))
    t.append(("fc.weight", "F32", [3, 2], pack("F32", [1e-3 * i for i in range(6)])))
    t.append(("fc.bias", "F32", [3], pack("F32", [-1.0, 0.0, 1.0])))
    t.append(("extra.f64", "F64", [2], pack("F64", [3.141592653589793, -2.5e-300])))
    t.append(("extra.f16", "F16", [3], pack("F16", [1.0, -2.0, 0.5])))
    t.append(("extra.bf16", "BF16", [2], bf16([1.0, -3.0])))
    t.append(("extra.i32", "I32", [2], pack("I32", [-7, 2147483647])))
    t.append(("extra.i16", "I16", [2], pack("I16", [-300, 300])))
    t.append(("extra.i8", "I8", [2], pack("I8", [-128, 127])))
    t.append(("extra.u8", "U8", [3], pack("U8", [0, 128, 255])))
    t.append(("extra.bool", "BOOL", [2, 2], pack("BOOL", [True, False, False, True])))
    t.append(("extra.empty", "F32", [0, 4], b""))
    size = {n: DTYPE.get(d, ("", 2))[1] for n, d, _, _ in t}
    t.sort(key=lambda x: (-size[x[0]], x[0]))
    meta = {"format": "pt", "epoch": "3", "note": "gr\u00fc\u00dfe \u2713"}
    return safetensors(t, metadata=meta)


def golden_sloppy():
    """Another writer's choices: indented ASCII-escaped JSON, keys out of offset order, no
    padding (data starts unaligned), no metadata."""
    t = [
        ("a.u8", "U8", [3], pack("U8", [1, 2, 3])),
        ("b.f32", "F32", [2], pack("F32", [1.5, -1.5])),
        ("c.\u00e9", "I64", [1], pack("I64", [-9007199254740993])),
    ]
    return safetensors(t, compact=False, pad=False, order=["c.\u00e9", "b.f32", "a.u8"])


def bad_files():
    f32x2 = pack("F32", [1.0, 2.0])
    ok_entry = '{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'
    good = safetensors([("a", "F32", [2], f32x2)])
    b = {}
    b["empty"] = b""
    b["seven_bytes"] = good[:7]
    b["truncated_length"] = good[:4]
    b["header_beyond_file"] = raw_file('{"a":' + ok_entry + "}", f32x2, length=len(good) + 100)
    b["huge_header_length"] = struct.pack("<Q", 2**64 - 1) + good[8:]
    b["header_over_limit"] = struct.pack("<Q", 100_000_001) + good[8:]
    b["zero_header_length"] = raw_file("", f32x2)
    b["not_json"] = raw_file("{this is not json}", f32x2)
    b["not_json_start"] = raw_file("hello world", f32x2)
    b["bom"] = raw_file(b"\xef\xbb\xbf{}")
    b["non_utf8"] = raw_file(b'{"a\xff":' + ok_entry.encode() + b"}", f32x2)
    b["overlong_utf8"] = raw_file(b'{"a\xc0\xaf":' + ok_entry.encode() + b"}", f32x2)
    b["surrogate_utf8"] = raw_file(b'{"a\xed\xa0\x80":' + ok_entry.encode() + b"}", f32x2)
    b["truncated_utf8"] = raw_file(b'{"a":' + ok_entry.encode() + b"}\xe2\x82", f32x2)
    b["control_char"] = raw_file(b'{"a\x01":' + ok_entry.encode() + b"}", f32x2)
    b["nul_in_header"] = raw_file(b'{"a":' + ok_entry.encode() + b"}\x00", f32x2)
    b["nul_escape"] = raw_file('{"a\\u0000b":' + ok_entry + "}", f32x2)
    b["lone_surrogate_escape"] = raw_file('{"a\\ud800":' + ok_entry + "}", f32x2)
    b["trailing_garbage"] = raw_file('{"a":' + ok_entry + "} x", f32x2)
    b["two_objects"] = raw_file('{"a":' + ok_entry + "}{}", f32x2)
    b["deep_nesting"] = raw_file('{"a":' + "[" * 5000 + "]" * 5000 + "}")
    b["not_object"] = raw_file("[1,2,3]", f32x2)
    b["entry_not_object"] = raw_file('{"a":[1,2]}', f32x2)
    b["missing_dtype"] = raw_file('{"a":{"shape":[2],"data_offsets":[0,8]}}', f32x2)
    b["missing_shape"] = raw_file('{"a":{"dtype":"F32","data_offsets":[0,8]}}', f32x2)
    b["missing_offsets"] = raw_file('{"a":{"dtype":"F32","shape":[2]}}', f32x2)
    b["duplicate_field"] = raw_file(
        '{"a":{"dtype":"F32","dtype":"I32","shape":[2],"data_offsets":[0,8]}}', f32x2)
    b["dtype_not_string"] = raw_file('{"a":{"dtype":4,"shape":[2],"data_offsets":[0,8]}}', f32x2)
    b["unknown_dtype"] = raw_file('{"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}}', f32x2)
    b["lowercase_dtype"] = raw_file('{"a":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}}', f32x2)
    b["shape_not_list"] = raw_file('{"a":{"dtype":"F32","shape":2,"data_offsets":[0,8]}}', f32x2)
    b["shape_bool"] = raw_file('{"a":{"dtype":"F32","shape":[true],"data_offsets":[0,4]}}', f32x2[:4])
    b["shape_string"] = raw_file('{"a":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}}', f32x2)
    b["negative_dim"] = raw_file('{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}', f32x2)
    b["fractional_dim"] = raw_file('{"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,8]}}', f32x2)
    b["huge_dim"] = raw_file('{"a":{"dtype":"F32","shape":[1e300],"data_offsets":[0,8]}}', f32x2)
    b["overflowing_shape"] = raw_file(
        '{"a":{"dtype":"F32","shape":[4294967296,4294967296,1024],"data_offsets":[0,8]}}', f32x2)
    b["overflow_then_zero"] = raw_file(
        '{"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296,0],"data_offsets":[0,0]}}')
    b["overflowing_bytes"] = raw_file(
        '{"a":{"dtype":"F64","shape":[4294967296,1073741824],"data_offsets":[0,8]}}', f32x2)
    b["offsets_reversed"] = raw_file('{"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}', f32x2)
    b["offsets_beyond_data"] = raw_file('{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}', f32x2)
    b["offsets_one_entry"] = raw_file('{"a":{"dtype":"F32","shape":[2],"data_offsets":[8]}}', f32x2)
    b["offsets_three_entries"] = raw_file(
        '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}}', f32x2)
    b["offsets_negative"] = raw_file('{"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}}', f32x2)
    b["offsets_fractional"] = raw_file(
        '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8.5]}}', f32x2)
    b["offsets_huge"] = raw_file(
        '{"a":{"dtype":"F32","shape":[2],"data_offsets":[18446744073709551608,18446744073709551616]}}',
        f32x2)
    b["overlapping_tensors"] = raw_file(
        '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
        '"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', pack("F32", [1, 2, 3]))
    b["same_offsets"] = raw_file(
        '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
        '"b":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}}', f32x2)
    b["empty_inside_other"] = raw_file(
        '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
        '"b":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}}', f32x2)
    b["hole"] = raw_file(
        '{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
        '"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}', pack("F32", [1, 2, 3]))
    b["leading_hole"] = raw_file('{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', f32x2)
    b["trailing_bytes"] = raw_file('{"a":' + ok_entry + "}", f32x2 + b"\0\0\0\0")
    b["no_tensors_with_data"] = raw_file("{}", f32x2)
    b["size_mismatch"] = raw_file('{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', f32x2)
    b["f64_size_mismatch"] = raw_file('{"a":{"dtype":"F64","shape":[2],"data_offsets":[0,8]}}', f32x2)
    b["i64_as_i32_size"] = raw_file(
        '{"bn1.num_batches_tracked":{"dtype":"I64","shape":[],"data_offsets":[0,4]}}',
        pack("I32", [7]))
    b["duplicate_names"] = raw_file(
        '{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
        '"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', f32x2)
    b["metadata_non_string"] = raw_file('{"__metadata__":{"epoch":3},"a":' + ok_entry + "}", f32x2)
    b["metadata_not_object"] = raw_file('{"__metadata__":"x","a":' + ok_entry + "}", f32x2)
    b["metadata_twice"] = raw_file(
        '{"__metadata__":{},"a":' + ok_entry + ',"__metadata__":{}}', f32x2)
    b["metadata_duplicate_key"] = raw_file(
        '{"__metadata__":{"k":"1","k":"2"},"a":' + ok_entry + "}", f32x2)
    return b


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "tests", "data", "safetensors")
    for sub in ("good", "bad"):
        os.makedirs(os.path.join(out, sub), exist_ok=True)
    files = {"good/torch_like.safetensors": golden_torch_like(),
             "good/sloppy.safetensors": golden_sloppy(),
             "good/empty_header.safetensors": raw_file("{}      ")}
    for name, data in bad_files().items():
        files["bad/%s.safetensors" % name] = data
    for rel, data in sorted(files.items()):
        with open(os.path.join(out, rel), "wb") as fh:
            fh.write(data)
    print("wrote %d files under %s" % (len(files), os.path.normpath(out)))


if __name__ == "__main__":
    main()
