#!/usr/bin/python3
"""libnbd checks against a running raidkit export.

usage: multiconn.py write URI   -- write on one connection, flush on a second,
                                   read on a third; errors for bad requests
       multiconn.py check URI   -- the data written by 'write' is there
"""
import errno
import sys

import nbd

PATTERN_OFF = 1_000_003  # deliberately unaligned
PATTERN = bytes((i * 7 + 3) % 256 for i in range(200_001))


def connect(uri):
    h = nbd.NBD()
    # Let bad requests reach the server instead of being stopped by libnbd.
    h.set_strict_mode(0)
    h.connect_uri(uri)
    return h


def expect_error(what, fn, want):
    try:
        fn()
    except nbd.Error as e:
        if e.errnum != want:
            sys.exit(f"{what}: expected errno {want}, got {e.errnum} ({e})")
        return
    sys.exit(f"{what}: expected an error, got success")


def write(uri):
    h1, h2, h3 = connect(uri), connect(uri), connect(uri)
    for h in (h1, h2, h3):
        assert h.can_multi_conn(), "CAN_MULTI_CONN not advertised"
        assert h.can_flush() and h.can_fua()
    size = h1.get_size()
    h1.pwrite(PATTERN, PATTERN_OFF)
    h2.flush()
    got = h3.pread(len(PATTERN), PATTERN_OFF)
    assert got == PATTERN, "write on connection 1 not visible on connection 3"

    # Out of range and malformed requests get errors; the connection lives on.
    expect_error("read past the end", lambda: h3.pread(4096, size - 100), errno.EINVAL)
    expect_error("write past the end", lambda: h3.pwrite(b"x" * 4096, size - 100), errno.ENOSPC)
    expect_error("zero past the end", lambda: h3.zero(8192, size), errno.ENOSPC)
    expect_error("read at 2^63", lambda: h3.pread(512, 1 << 63), errno.EINVAL)
    expect_error("read of 48 MiB (over the maximum)", lambda: h3.pread(48 << 20, 0), errno.EINVAL)
    expect_error("unknown flag", lambda: h3.pread(512, 0, flags=1 << 9), errno.EINVAL)
    expect_error("fast zero", lambda: h3.zero(4096, 0, flags=nbd.CMD_FLAG_FAST_ZERO), errno.ENOTSUP)
    assert h3.pread(len(PATTERN), PATTERN_OFF) == PATTERN, "connection unusable after errors"

    # Zeroes, trim and cache are accepted; FUA writes are durable at once.
    h1.zero(5000, PATTERN_OFF + 100)
    assert h2.pread(5000, PATTERN_OFF + 100) == b"\0" * 5000
    h1.pwrite(PATTERN[100:5100], PATTERN_OFF + 100, flags=nbd.CMD_FLAG_FUA)
    h1.trim(4096, size - 8192)
    h1.cache(4096, 0)
    for h in (h1, h2, h3):
        h.shutdown()
    print("write: ok")


def check(uri):
    h = connect(uri)
    got = h.pread(len(PATTERN), PATTERN_OFF)
    assert got == PATTERN, "flushed data lost across a server kill"
    h.shutdown()
    print("check: ok")


if __name__ == "__main__":
    {"write": write, "check": check}[sys.argv[1]](sys.argv[2])
