//! `raidkit serve` against a hand-written NBD client: what well-behaved
//! libraries never send (malformed requests, options out of order),
//! pipelined writes and how their replies are sent, the option phase and
//! block status.

mod common;

use common::nbd::*;
use common::*;
use serde_json::Value;
use std::io::{Read, Write};
use std::time::Duration;

#[test]
fn malformed_traffic_gets_errors_and_other_clients_keep_going() {
    let dir = tmp();
    let ms = members(dir.path(), 3);
    create("5", &ms, "24M");
    let mut s = Served::start(dir.path(), &ms, &[]);
    tool(
        "qemu-io",
        &["-f", "raw", "-c", "write -P 0x5a 0 1M", &s.uri],
    );

    // A bystander connection that must keep working throughout.
    let (mut keep, size) = Raw::go(&s.uri);

    // Garbage instead of a handshake: that connection is closed.
    let mut g = Raw::connect(&s.uri);
    g.s.write_all(&[0xff; 64]).unwrap();
    assert!(g.closed());
    // Bad option magic: closed.
    let mut g = Raw::connect(&s.uri);
    g.s.write_all(&3u32.to_be_bytes()).unwrap();
    g.s.write_all(&[0u8; 16]).unwrap();
    assert!(g.closed());

    let (mut r, sz) = Raw::go(&s.uri);
    assert_eq!(sz, size);
    const READ: u16 = 0;
    const WRITE: u16 = 1;
    r.request(READ, 0, size - 10, 11, &[]);
    assert_eq!(r.reply(11).0, 22, "read past the end: EINVAL");
    r.request(WRITE, 0, size - 10, 11, &[1u8; 11]);
    assert_eq!(r.reply(0).0, 28, "write past the end: ENOSPC");
    r.request(WRITE, 0, u64::MAX - 5, 11, &[1u8; 11]);
    assert_eq!(r.reply(0).0, 28, "write wrapping around: ENOSPC");
    // The NBD spec: a write or write-zeroes beyond the end is ENOSPC, a
    // trim (as a read) EINVAL; past the end and wrapping around alike.
    const TRIM: u16 = 4;
    const WRITE_ZEROES: u16 = 6;
    for (kind, what, want) in [(TRIM, "trim", 22), (WRITE_ZEROES, "write-zeroes", 28)] {
        r.request(kind, 0, size - 10, 11, &[]);
        assert_eq!(r.reply(0).0, want, "{what} past the end");
        r.request(kind, 0, u64::MAX - 5, 11, &[]);
        assert_eq!(r.reply(0).0, want, "{what} wrapping around");
    }
    r.request(99, 0, 0, 512, &[]);
    assert_eq!(r.reply(0).0, 22, "unknown command: EINVAL");
    r.request(READ, 0, 0, 48 << 20, &[]);
    assert_eq!(r.reply(0).0, 22, "read over the maximum: EINVAL");
    r.request(READ, 0x8000, 0, 512, &[]);
    assert_eq!(r.reply(0).0, 22, "unknown flag: EINVAL");
    r.request(READ, 0, 4096, 512, &[]);
    let (e, d) = r.reply(512);
    assert_eq!(e, 0);
    assert!(
        d.iter().all(|&b| b == 0x5a),
        "connection unusable after errors"
    );
    // A request with a bad magic: the connection is closed.
    r.s.write_all(&[0u8; 28]).unwrap();
    assert!(r.closed());

    // A write over the maximum payload: closed rather than skipping 48 MiB.
    let (mut r, _) = Raw::go(&s.uri);
    r.request(WRITE, 0, 0, 48 << 20, &[]);
    assert!(r.closed());

    // A client that vanishes in the middle of a write: nothing is written.
    let (mut r, _) = Raw::go(&s.uri);
    r.request(WRITE, 0, 8192, 4096, &[0xee; 1000]);
    drop(r);
    std::thread::sleep(Duration::from_millis(200));

    // The bystander still works and sees the old data.
    keep.request(READ, 0, 8192, 4096, &[]);
    let (e, d) = keep.reply(4096);
    assert_eq!(e, 0);
    assert!(
        d.iter().all(|&b| b == 0x5a),
        "a half-sent write reached the array"
    );
    keep.request(2, 0, 0, 0, &[]); // NBD_CMD_DISC
    assert!(keep.closed());
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn pipelined_contiguous_writes_each_get_their_own_reply() {
    // On a parity array the server merges runs of contiguous writes into
    // one array write; every request must still get its own reply, and a
    // run that reaches past the end must not take valid writes down with it.
    let dir = tmp();
    let ms = members(dir.path(), 4);
    create("5", &ms, "24M");
    let mut s = Served::start(dir.path(), &ms, &[]);
    let (mut r, size) = Raw::go(&s.uri);
    let mut burst = Vec::new();
    let mut expect = Vec::new();
    let base = 3 * 65536 + 512; // unaligned, crossing stripes
    for i in 0..24u64 {
        let data = vec![(i + 1) as u8; 40_000];
        burst.extend(encode(1, 0, 100 + i, base + i * 40_000, 40_000, &data));
        expect.extend(data);
    }
    // A run ending past the end of the array: the in-range write succeeds.
    burst.extend(encode(1, 0, 200, size - 8192, 4096, &[7u8; 4096]));
    burst.extend(encode(1, 0, 201, size - 4096, 8192, &[8u8; 8192]));
    // FUA and plain writes are not merged together, and both complete.
    burst.extend(encode(1, 1, 202, 0, 4096, &[9u8; 4096]));
    burst.extend(encode(3, 0, 203, 0, 0, &[])); // FLUSH
    r.s.write_all(&burst).unwrap();
    let mut seen = std::collections::HashMap::new();
    for _ in 0..28 {
        let (err, cookie, _) = r.reply_with_cookie(0);
        assert!(
            seen.insert(cookie, err).is_none(),
            "two replies for {cookie}"
        );
    }
    for i in 0..24u64 {
        assert_eq!(seen[&(100 + i)], 0, "write {i}");
    }
    assert_eq!(seen[&200], 0);
    assert_eq!(seen[&201], 28, "write past the end: ENOSPC");
    assert_eq!(seen[&202], 0);
    assert_eq!(seen[&203], 0);
    r.request(0, 0, base, expect.len() as u32, &[]);
    let (e, d) = r.reply(expect.len());
    assert_eq!(e, 0);
    assert!(d == expect, "merged writes stored the wrong data");
    r.request(0, 0, size - 8192, 8192, &[]);
    let (e, d) = r.reply(8192);
    assert_eq!(e, 0);
    assert!(d[..4096].iter().all(|&b| b == 7) && d[4096..].iter().all(|&b| b == 0));
    let ctl = s.control.display().to_string();
    let st: Value =
        serde_json::from_slice(&ok(&["status", "--control", &ctl, "--json"]).stdout).unwrap();
    assert!(
        st["io"]["merged_writes"].as_u64().unwrap() > 0,
        "no write was merged"
    );
    assert_eq!(st["io"]["writes"], 26);
    assert_eq!(s.stop().code(), Some(0));
    // Parity agrees: the same bytes read degraded.
    let o = ok(&args(
        &[
            "read",
            "--offset",
            &base.to_string(),
            "--length",
            &expect.len().to_string(),
        ],
        &ms[1..],
    ));
    assert!(o.stdout == expect);
}

#[test]
fn small_write_replies_share_sends_but_never_wait_for_a_request_still_arriving() {
    // While small writes queue up, the server may leave a reply in its
    // buffer for the next one's reply to take along; every reply still
    // comes, and none waits for a request whose payload has not all come.
    let dir = tmp();
    let ms = members(dir.path(), 4);
    create("5", &ms, "24M");
    for batched in [true, false] {
        let extra: &[&str] = if batched {
            &[]
        } else {
            &["--no-batch-replies"]
        };
        let mut s = Served::start(dir.path(), &ms, extra);
        let (mut r, _) = Raw::go(&s.uri);
        let fill = |i: u64| vec![(i as u8).wrapping_mul(7) ^ u8::from(batched); 4096];
        let mut burst = Vec::new();
        for i in 0..64u64 {
            burst.extend(encode(1, 0, i, i * 12288, 4096, &fill(i)));
        }
        r.s.write_all(&burst).unwrap();
        let got = r.replies(64, (u64::MAX, 0));
        for (i, (err, cookie, _)) in got.iter().enumerate() {
            assert_eq!((*err, *cookie), (0, i as u64));
        }
        let held = io_count(&s, "held_replies");
        if batched {
            assert!(held > 0, "no reply of 64 back-to-back writes was held");
        } else {
            assert_eq!(held, 0);
        }
        // A write, then the next one's header and a third of its payload
        // (enough to count as requests queueing up) in the same send; the
        // rest only once the first write's reply is in. (Not contiguous:
        // that one would be merged, which waits for it.)
        let (base, next) = (1 << 20, (1 << 20) + 131072);
        let mut two = encode(1, 0, 500, base, 4096, &[0xaa; 4096]);
        let second = encode(1, 0, 501, next, 61440, &[0xbb; 61440]);
        two.extend_from_slice(&second[..28 + 20480]);
        r.s.write_all(&two).unwrap();
        // (the socket's 10 s read timeout fails this if the reply is held)
        assert_eq!(r.reply_with_cookie(0), (0, 500, vec![]));
        r.s.write_all(&second[28 + 20480..]).unwrap();
        assert_eq!(r.reply_with_cookie(0), (0, 501, vec![]));
        for i in 0..64u64 {
            r.request(0, 0, i * 12288, 4096, &[]);
            assert_eq!(r.reply(4096), (0, fill(i)), "write {i}");
        }
        for (at, len, b) in [(base, 4096, 0xaa), (next, 61440, 0xbb)] {
            r.request(0, 0, at, len as u32, &[]);
            assert_eq!(r.reply(len), (0, vec![b; len]));
        }
        stop_and_check(&mut s, &ms);
    }
}

#[test]
fn list_export_name_and_abort_options() {
    let dir = tmp();
    let ms = members(dir.path(), 3);
    create("5", &ms, "16M");
    let size = detail(&ms)["size"].as_u64().unwrap();
    let mut s = Served::start(dir.path(), &ms, &["--export", "lab"]);
    tool(
        "qemu-io",
        &["-f", "raw", "-c", "write -P 0x3c 0 64k", &s.uri],
    );

    // LIST: one NBD_REP_SERVER naming the export, then the ACK.
    let mut r = options(&s.uri);
    r.option(3, &[]);
    let (kind, p) = r.option_reply();
    assert_eq!(kind, 2, "NBD_REP_SERVER");
    let len = be32(&p) as usize;
    assert_eq!(&p[4..4 + len], b"lab");
    assert_eq!(r.option_reply().0, 1, "NBD_REP_ACK after the list");
    // LIST with data is invalid, and negotiation goes on: ABORT is acked
    // and the server closes the connection.
    r.option(3, b"x");
    assert_eq!(r.option_reply().0, (1 << 31) | 3, "NBD_REP_ERR_INVALID");
    r.option(2, &[]);
    assert_eq!(r.option_reply().0, 1, "ABORT acknowledged");
    assert!(r.closed(), "the connection stays open after ABORT");

    // EXPORT_NAME (the old way in): size and flags, then transmission.
    for name in ["lab", ""] {
        let mut r = options(&s.uri);
        r.option(1, name.as_bytes());
        let mut h = [0u8; 10]; // size, flags; no zeroes (asked for)
        r.s.read_exact(&mut h).unwrap();
        assert_eq!(u64::from_be_bytes(h[..8].try_into().unwrap()), size);
        let flags = u16::from_be_bytes(h[8..10].try_into().unwrap());
        assert_eq!(flags & 1, 1, "NBD_FLAG_HAS_FLAGS");
        assert_eq!(flags & 2, 0, "read-only flag on a writable export");
        r.request(0, 0, 4096, 512, &[]);
        assert_eq!(r.reply(512), (0, vec![0x3c; 512]), "export '{name}'");
        r.request(1, 0, 8192, 512, &[0x4d; 512]);
        assert_eq!(r.reply(0).0, 0);
        r.request(0, 0, 8192, 512, &[]);
        assert_eq!(r.reply(512), (0, vec![0x4d; 512]));
    }
    // An unknown name: no export data, the connection is closed.
    let mut r = options(&s.uri);
    r.option(1, b"nosuch");
    assert!(r.closed());
    // The server took none of this badly.
    tool("qemu-io", &["-f", "raw", "-c", "read -P 0x3c 0 4k", &s.uri]);
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn block_status_reports_the_range_as_allocated_data() {
    let dir = tmp();
    let ms = members(dir.path(), 3);
    create("5", &ms, "16M");
    let mut s = Served::start(dir.path(), &ms, &[]);
    let mut r = options(&s.uri);
    r.option(8, &[]); // STRUCTURED_REPLY
    assert_eq!(r.option_reply().0, 1);
    // SET_META_CONTEXT for the default export: base:allocation.
    let mut q = 0u32.to_be_bytes().to_vec();
    q.extend_from_slice(&1u32.to_be_bytes());
    q.extend_from_slice(&(15u32).to_be_bytes());
    q.extend_from_slice(b"base:allocation");
    r.option(10, &q);
    let (kind, p) = r.option_reply();
    assert_eq!(kind, 4, "NBD_REP_META_CONTEXT");
    let id = be32(&p);
    assert_eq!(&p[4..], b"base:allocation");
    assert_eq!(r.option_reply().0, 1);
    let mut go = 0u32.to_be_bytes().to_vec();
    go.extend_from_slice(&0u16.to_be_bytes());
    r.option(7, &go);
    let mut size = 0;
    loop {
        let (kind, p) = r.option_reply();
        if kind == 1 {
            break;
        }
        assert_eq!(kind, 3, "NBD_REP_INFO");
        if p[..2] == [0, 0] {
            size = u64::from_be_bytes(p[2..10].try_into().unwrap());
        }
    }
    assert!(size > 0);
    // BLOCK_STATUS over 1 MiB at 4 KiB: one structured reply, done, of
    // type BLOCK_STATUS, for the negotiated context, whose extents cover
    // the range as data (flags 0: neither hole nor zero).
    let (at, len) = (4096u64, 1u32 << 20);
    r.s.write_all(&encode(7, 0, 77, at, len, &[])).unwrap();
    let mut h = [0u8; 20];
    r.s.read_exact(&mut h).unwrap();
    assert_eq!(be32(&h), 0x668e_33ef, "structured reply magic");
    let flags = u16::from_be_bytes(h[4..6].try_into().unwrap());
    let kind = u16::from_be_bytes(h[6..8].try_into().unwrap());
    assert_eq!(u64::from_be_bytes(h[8..16].try_into().unwrap()), 77);
    assert_eq!(
        (flags & 1, kind),
        (1, 5),
        "DONE, NBD_REPLY_TYPE_BLOCK_STATUS"
    );
    let mut p = vec![0u8; be32(&h[16..]) as usize];
    r.s.read_exact(&mut p).unwrap();
    assert_eq!(be32(&p), id, "context id");
    let extents: Vec<(u32, u32)> = p[4..].chunks(8).map(|e| (be32(e), be32(&e[4..]))).collect();
    assert!(
        !extents.is_empty() && (p.len() - 4).is_multiple_of(8),
        "{p:?}"
    );
    assert_eq!(extents.iter().map(|e| e.0 as u64).sum::<u64>(), len as u64);
    assert!(extents.iter().all(|e| e.1 == 0), "{extents:?}");
    // Past the end: an error, not a status.
    r.s.write_all(&encode(7, 0, 78, size - 4096, 8192, &[]))
        .unwrap();
    let mut h = [0u8; 20];
    r.s.read_exact(&mut h).unwrap();
    let kind = u16::from_be_bytes(h[6..8].try_into().unwrap());
    assert_eq!(kind & 0x8000, 0x8000, "an error reply, type {kind:#x}");
    let mut p = vec![0u8; be32(&h[16..]) as usize];
    r.s.read_exact(&mut p).unwrap();
    assert_eq!(be32(&p), 22, "EINVAL");
    // nbdinfo agrees: the whole export is one data extent.
    let o = tool("nbdinfo", &["--map", "--json", &s.uri]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let total: u64 = v
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            assert_eq!(e["type"], 0, "{e}");
            e["length"].as_u64().unwrap()
        })
        .sum();
    assert_eq!(total, size);
    assert_eq!(s.stop().code(), Some(0));
}
