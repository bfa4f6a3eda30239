#!/usr/bin/env python3
"""Seed inputs for the handshake fuzzers (fuzz/corpus/): a well-formed
client handshake for the server's, a well-formed server for the client's,
so that the fuzzer starts past the magic numbers. Run once; the seeds are
kept in the repository with what the fuzzer found from them."""
import os, struct, sys

root = os.path.join(os.path.dirname(__file__), "..", "fuzz", "corpus")
IHAVEOPT = 0x49484156454F5054
NBDMAGIC = 0x4E42444D41474943
REPLY = 0x0003E889045565A9


def opt(o, data=b""):
    return struct.pack(">QII", IHAVEOPT, o, len(data)) + data


def go(name=b"fuzz", infos=(1, 2, 3)):
    return struct.pack(">I", len(name)) + name + struct.pack(">H", len(infos)) + b"".join(
        struct.pack(">H", i) for i in infos)


def meta(name=b"fuzz", queries=(b"base:allocation",)):
    q = b"".join(struct.pack(">I", len(x)) + x for x in queries)
    return struct.pack(">I", len(name)) + name + struct.pack(">I", len(queries)) + q


client = {
    "go": struct.pack(">I", 3) + opt(8) + opt(3) + opt(10, meta()) + opt(9, meta()) + opt(6, go()) + opt(7, go()),
    "starttls": struct.pack(">I", 3) + opt(5) + opt(5, b"x") + opt(2),
    "export_name": struct.pack(">I", 1) + opt(3) + opt(1, b"fuzz"),
    "unknown": struct.pack(">I", 3) + opt(77, b"abc") + opt(7, go(b"nope")) + opt(2),
}


def rep(o, kind, data=b""):
    return struct.pack(">QIII", REPLY, o, kind, len(data)) + data


def simple(handle, error=0, data=b""):
    return struct.pack(">IIQ", 0x67446698, error, handle) + data


greeting = struct.pack(">QQH", NBDMAGIC, IHAVEOPT, 3)
info_export = struct.pack(">HQH", 0, 1 << 20, 1 | 4 | 256)
info_block = struct.pack(">HIII", 3, 1, 4096, 1 << 20)
server = {
    "go": greeting + rep(7, 3, info_export) + rep(7, 3, info_block) + rep(7, 1)
    + simple(1, 0, b"\xaa" * 4096) + simple(2, 5) + simple(3, 0, b"\x55" * 1024) + simple(4, 0, b"\x11" * 512),
    "old_server": greeting + rep(7, (1 << 31) | 1) + struct.pack(">QH", 1 << 20, 1) + simple(1, 0, b"\0" * 4096),
    "refused": greeting + rep(7, (1 << 31) | 6, b"no such export"),
}
for target, seeds in (("nbd_handshake", client), ("nbd_client", server)):
    d = os.path.join(root, target)
    os.makedirs(d, exist_ok=True)
    for name, b in seeds.items():
        with open(os.path.join(d, "seed-" + name), "wb") as f:
            f.write(b)
print("seeds written under", os.path.normpath(root), file=sys.stderr)
