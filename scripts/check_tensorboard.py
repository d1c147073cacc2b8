#!/usr/bin/env python3
"""Checks mgtrain's TensorBoard event files against its JSON log (the test tensorboard.sample).

usage: check_tensorboard.py TB_DIR LOG.jsonl

The records are read as TensorFlow's record reader reads them (length, masked CRC-32C of the
length, data, masked CRC-32C of the data; the CRC computed here from its polynomial), and each
Event is decoded by Debian's python3-protobuf from a description of TensorBoard's messages
built below with TensorBoard's field numbers (tensorboard/compat/proto/event.proto,
summary.proto, tensor.proto, tensor_shape.proto), not from mgtrain's .proto file. Checked: the
file version first, the configuration text holding the command line, then for every record of
the log the scalars of the same step with the same values (as float32), increasing steps,
and wall times within the run. Exits non-zero with a line saying what differs.
"""
import glob
import json
import os
import struct
import sys

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

F = descriptor_pb2.FieldDescriptorProto


def build_messages():
    fd = descriptor_pb2.FileDescriptorProto(name="tb_check.proto", package="tbcheck",
                                            syntax="proto3")

    def msg(name, fields, parent=None):
        m = (parent.nested_type if parent else fd.message_type).add(name=name)
        for fname, num, ftype, label, tname in fields:
            f = m.field.add(name=fname, number=num, type=ftype, label=label)
            if tname:
                f.type_name = tname
        return m

    opt, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    shape = msg("TensorShapeProto", [("dim", 2, F.TYPE_MESSAGE, rep, ".tbcheck.TensorShapeProto.Dim"),
                                     ("unknown_rank", 3, F.TYPE_BOOL, opt, None)])
    msg("Dim", [("size", 1, F.TYPE_INT64, opt, None), ("name", 2, F.TYPE_STRING, opt, None)], shape)
    msg("TensorProto", [("dtype", 1, F.TYPE_INT32, opt, None),
                        ("tensor_shape", 2, F.TYPE_MESSAGE, opt, ".tbcheck.TensorShapeProto"),
                        ("float_val", 5, F.TYPE_FLOAT, rep, None),
                        ("string_val", 8, F.TYPE_BYTES, rep, None)])
    meta = msg("SummaryMetadata", [("plugin_data", 1, F.TYPE_MESSAGE, opt,
                                    ".tbcheck.SummaryMetadata.PluginData"),
                                   ("display_name", 2, F.TYPE_STRING, opt, None),
                                   ("summary_description", 3, F.TYPE_STRING, opt, None),
                                   ("data_class", 4, F.TYPE_INT32, opt, None)])
    msg("PluginData", [("plugin_name", 1, F.TYPE_STRING, opt, None),
                       ("content", 2, F.TYPE_BYTES, opt, None)], meta)
    summary = msg("Summary", [("value", 1, F.TYPE_MESSAGE, rep, ".tbcheck.Summary.Value")])
    msg("Value", [("tag", 1, F.TYPE_STRING, opt, None),
                  ("simple_value", 2, F.TYPE_FLOAT, opt, None),
                  ("node_name", 7, F.TYPE_STRING, opt, None),
                  ("tensor", 8, F.TYPE_MESSAGE, opt, ".tbcheck.TensorProto"),
                  ("metadata", 9, F.TYPE_MESSAGE, opt, ".tbcheck.SummaryMetadata")], summary)
    msg("SourceMetadata", [("writer", 1, F.TYPE_STRING, opt, None)])
    msg("Event", [("wall_time", 1, F.TYPE_DOUBLE, opt, None),
                  ("step", 2, F.TYPE_INT64, opt, None),
                  ("file_version", 3, F.TYPE_STRING, opt, None),
                  ("summary", 5, F.TYPE_MESSAGE, opt, ".tbcheck.Summary"),
                  ("source_metadata", 10, F.TYPE_MESSAGE, opt, ".tbcheck.SourceMetadata")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.MessageFactory(pool).GetPrototype(
        pool.FindMessageTypeByName("tbcheck.Event"))


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_records(path):
    with open(path, "rb") as f:
        buf = f.read()
    out, off = [], 0
    while off < len(buf):
        if off + 12 > len(buf):
            raise SystemExit(f"{path}: a record header is cut short at byte {off}")
        n, lcrc = struct.unpack_from("<QI", buf, off)
        if masked(buf[off:off + 8]) != lcrc:
            raise SystemExit(f"{path}: the length CRC of the record at byte {off} is wrong")
        data = buf[off + 12:off + 12 + n]
        (dcrc,) = struct.unpack_from("<I", buf, off + 12 + n)
        if masked(data) != dcrc:
            raise SystemExit(f"{path}: the data CRC of the record at byte {off} is wrong")
        out.append(data)
        off += 16 + n
    return out


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def main():
    tb_dir, log_path = sys.argv[1], sys.argv[2]
    files = sorted(glob.glob(os.path.join(tb_dir, "*tfevents*")))
    if len(files) != 1:
        raise SystemExit(f"{tb_dir}: expected one event file, found {files}")
    Event = build_messages()
    events = []
    for data in read_records(files[0]):
        ev = Event()
        ev.ParseFromString(data)
        events.append(ev)
    log = [json.loads(line) for line in open(log_path)]
    config = log[0]
    if config.get("type") != "config" or "version" not in config or "command_line" not in config:
        raise SystemExit(f"{log_path}: the first record is not the configuration: {config}")
    if events[0].file_version != "brain.Event:2":
        raise SystemExit(f"first event: file_version {events[0].file_version!r}")
    text = events[1].summary.value[0]
    if (text.tag != "config" or text.metadata.plugin_data.plugin_name != "text"
            or text.tensor.dtype != 7):
        raise SystemExit(f"second event: not the configuration text: {text}")
    md = text.tensor.string_val[0].decode()
    if config["command_line"] not in md or config["version"] not in md:
        raise SystemExit("the configuration text lacks the command line or the version")
    scalars = {}  # (tag, step) -> value
    last_step, t0 = -1, events[0].wall_time
    for ev in events[2:]:
        if ev.step < last_step:
            raise SystemExit(f"steps go back: {ev.step} after {last_step}")
        last_step = ev.step
        if not (t0 <= ev.wall_time <= t0 + 3600):
            raise SystemExit(f"wall time {ev.wall_time} outside the run (start {t0})")
        for v in ev.summary.value:
            scalars[(v.tag, ev.step)] = v.simple_value
    checked = 0
    for rec in log[1:]:
        if rec["type"] == "train":
            step = rec["epoch"] * rec["steps"] + rec["step"] + 1
            want = {"train/loss": rec["loss"], "train/acc1": rec["acc1"], "train/acc5": rec["acc5"],
                    "train/lr": rec["lr"], "train/images_per_s": rec["images_per_s"],
                    "train/data_wait": rec["data_wait"]}
        elif rec["type"] == "epoch":
            step = None
            for (tag, s), v in scalars.items():
                if tag == "epoch/epoch" and int(v) == rec["epoch"]:
                    step = s
            if step is None:
                raise SystemExit(f"no epoch scalars for epoch {rec['epoch']}")
            want = {"epoch/train_loss": rec["train_loss"], "epoch/lr": rec["lr"],
                    "val/loss": rec["val_loss"], "val/acc1": rec["val_acc1"],
                    "val/acc5": rec["val_acc5"]}
            if "ema_val_acc1" in rec:
                want["val_ema/acc1"] = rec["ema_val_acc1"]
                want["val_ema/loss"] = rec["ema_val_loss"]
            if not any(tag.startswith("device0/") and s == step for tag, s in scalars):
                raise SystemExit(f"epoch {rec['epoch']}: no per-device step breakdown")
        else:
            continue
        for tag, value in want.items():
            got = scalars.get((tag, step))
            if got is None:
                raise SystemExit(f"{tag} at step {step}: missing")
            if abs(got - f32(value)) > 1e-6 * max(1.0, abs(value)):
                raise SystemExit(f"{tag} at step {step}: {got} in the event file, {value} in the log")
            checked += 1
    print(f"{files[0]}: {len(events)} events, {checked} scalars equal to the log's")


if __name__ == "__main__":
    main()
