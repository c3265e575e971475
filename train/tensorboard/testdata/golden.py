#!/usr/bin/env python3
"""Golden TFRecord bytes for tensorboard_test.go, computed independently of the Go code.

Run from this directory:

    /usr/bin/python3 golden.py > golden.txt

It uses only the standard library (no tensorflow, no protobuf): a bitwise CRC-32C
(Castagnoli, reflected polynomial 0x82F63B78), TFRecord's mask, and a hand encoding of

    Event{wall_time: 1700000000.5, step: 42,
          summary: Summary{value: [Value{tag: "loss", simple_value: 2.5},
                                   Value{tag: "lr", simple_value: 0.001}]}}

following event.proto (wall_time=1 double, step=2 int64, summary=5) and summary.proto
(Summary.value=1, Value.tag=1 string, Value.simple_value=2 float).
"""
import struct


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def mask(crc):
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def key(field, wire):
    return varint(field << 3 | wire)


def length_delimited(field, payload):
    return key(field, 2) + varint(len(payload)) + payload


def value(tag, simple):
    return length_delimited(1, tag.encode()) + key(2, 5) + struct.pack("<f", simple)


assert crc32c(b"123456789") == 0xE3069283
assert mask(0xE3069283) == 0xC78AB0E5  # worked by hand in tensorboard_test.go

summary = length_delimited(1, value("loss", 2.5)) + length_delimited(1, value("lr", 0.001))
event = (key(1, 1) + struct.pack("<d", 1700000000.5)
         + key(2, 0) + varint(42)
         + length_delimited(5, summary))
length = struct.pack("<Q", len(event))
record = length + struct.pack("<I", mask(crc32c(length))) + event + struct.pack("<I", mask(crc32c(event)))
print(record.hex())
