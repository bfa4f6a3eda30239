//! `raidkit serve` against real NBD clients: nbdinfo, qemu-io, nbdcopy,
//! libnbd (Python), fio's nbd engine, and ext4 through nbdfuse and a loop
//! mount; runs of writes and stalled readers through a hand-written client
//! (`common::nbd`; the protocol itself by hand is in `protocol.rs`).

mod common;

use common::nbd::*;
use common::*;
use serde_json::Value;
use std::io::Write;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

#[test]
fn nbdinfo_shows_size_and_honest_flags() {
    let dir = tmp();
    let ms = members(dir.path(), 4);
    create("5", &ms, "32M");
    let size = detail(&ms)["size"].as_u64().unwrap();
    let mut s = Served::start(dir.path(), &ms, &["--export", "lab"]);
    let o = tool("nbdinfo", &["--json", &s.uri]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let e = &v["exports"][0];
    assert_eq!(e["export-name"], "lab");
    assert_eq!(e["export-size"], size);
    for flag in [
        "can_flush",
        "can_fua",
        "can_multi_conn",
        "can_trim",
        "can_zero",
        "can_fast_zero",
        "can_cache",
    ] {
        assert_eq!(e[flag], true, "{flag}");
    }
    assert_eq!(e["is_read_only"], false);
    assert_eq!(e["block_size_maximum"], 32 << 20);
    // Three data members: a stripe (192 KiB) is no power of two, so the
    // preferred size is the chunk.
    assert_eq!(e["block_size_preferred"], 64 << 10);
    // The default export ("") is the same array; an unknown name is refused.
    let default_uri = s.uri.trim_end_matches("lab").to_string();
    let o = tool("nbdinfo", &["--size", &default_uri]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), size.to_string());
    let bad = try_tool("nbdinfo", &[&format!("{default_uri}nosuch")]);
    assert!(!bad.status.success());
    // Status through the control socket.
    let ctl = s.control.display().to_string();
    let st: Value =
        serde_json::from_slice(&ok(&["status", "--control", &ctl, "--json"]).stdout).unwrap();
    assert_eq!(st["state"], "optimal");
    assert_eq!(st["array"]["size"], size);
    assert_eq!(st["members"].as_array().unwrap().len(), 4);
    assert_eq!(st["members"][3]["path"], ms[3].as_str());
    assert_eq!(st["members"][3]["state"], "active");
    assert!(st["connections"]["total"].as_u64().unwrap() >= 3);
    assert!(st["io"]["reads"].as_u64().is_some());
    assert_eq!(s.stop().code(), Some(0));

    // Read-only: flagged, and writes get EPERM.
    let mut s = Served::start(dir.path(), &ms, &["--read-only"]);
    let v: Value = serde_json::from_slice(&tool("nbdinfo", &["--json", &s.uri]).stdout).unwrap();
    assert_eq!(v["exports"][0]["is_read_only"], true);
    let o = try_tool("qemu-io", &["-f", "raw", "-c", "write -P 1 0 4k", &s.uri]);
    let out = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    // qemu honours the read-only flag and will not even open it for writing.
    assert!(out.contains("Permission denied"), "{out}");
    // A client that writes anyway gets EPERM, and the data stays.
    let (mut r, _) = Raw::go(&s.uri);
    r.request(1, 0, 0, 4096, &[9u8; 4096]);
    assert_eq!(r.reply(0).0, 1, "write to a read-only export: EPERM");
    r.request(0, 0, 0, 4096, &[]);
    let (e, d) = r.reply(4096);
    assert_eq!(e, 0);
    assert!(d.iter().all(|&b| b == 0));
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn qemu_io_patterns_at_unaligned_offsets() {
    // With checksums (the default) and without (where the fast paths serve).
    for plain in [false, true] {
        let dir = tmp();
        let ms = members(dir.path(), 5);
        if plain {
            create_plain("6", &ms, "24M");
        } else {
            create("6", &ms, "24M");
        }
        // Also with zero-copy reads (the reads of 64 KiB and more).
        for extra in [&[][..], &["--zero-copy", "always"][..]] {
            qemu_io_patterns(dir.path(), &ms, extra, plain);
        }
    }
}

fn qemu_io_patterns(dir: &Path, ms: &[String], extra: &[&str], plain: bool) {
    let mut s = Served::start(dir, ms, extra);
    let cmds = [
        "write -P 0xab 1000 70000",
        "read -P 0xab 1000 70000",
        "write -z 5000 3000",
        "read -P 0 5000 3000",
        "read -P 0xab 1000 4000",
        "read -P 0xab 8000 63000",
        "aio_write -P 0x11 123457 99999",
        "aio_write -P 0x22 400001 65537",
        "aio_flush",
        "read -P 0x11 123457 99999",
        "read -P 0x22 400001 65537",
        "write -P 0x33 2097151 1",
        "read -P 0x33 2097151 1",
    ];
    let out = qemu_io(&s.uri, &cmds);
    assert!(!out.contains("Pattern verification failed"), "{out}");
    assert!(!out.contains("failed"), "{out}");
    assert_eq!(out.matches("read ").count(), 7, "{out}");
    // The reads of 64 KiB and more (three) are spliced, or else sent from
    // mappings of the (cached) member files; with checksums every block is
    // verified on its way: neither.
    if !plain {
        assert_eq!((zero_copy_reads(&s), io_count(&s, "mapped_reads")), (0, 0));
    } else if !extra.is_empty() {
        assert!(zero_copy_reads(&s) >= 3, "{extra:?}");
    } else {
        assert_eq!(zero_copy_reads(&s), 0);
        assert!(io_count(&s, "mapped_reads") >= 3);
    }
    assert_eq!(s.stop().code(), Some(0));
}

/// Run qemu-io's commands on `uri`; its output (stdout and stderr).
fn qemu_io(uri: &str, cmds: &[&str]) -> String {
    let mut a = vec!["-f", "raw"];
    for c in cmds {
        a.push("-c");
        a.push(c);
    }
    a.push(uri);
    let o = tool("qemu-io", &a);
    String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr)
}

fn zero_copy_reads(s: &Served) -> u64 {
    io_count(s, "zero_copy_reads")
}

#[test]
fn nbdcopy_64mib_round_trip_on_raid5() {
    let dir = tmp();
    let ms = members(dir.path(), 4);
    create_plain("5", &ms, "32M");
    let mut s = Served::start(dir.path(), &ms, &[]);
    let data: Vec<u8> = {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(64);
        (0..64 << 20).map(|_| rng.gen()).collect()
    };
    let src = dir.path().join("src.bin");
    std::fs::write(&src, &data).unwrap();
    tool("nbdcopy", &[src.to_str().unwrap(), &s.uri]);
    let back = dir.path().join("back.bin");
    tool("nbdcopy", &[&s.uri, back.to_str().unwrap()]);
    let got = std::fs::read(&back).unwrap();
    assert!(got[..data.len()] == data[..], "nbdcopy data differs");
    // The client is on this machine: no zero-copy reads by default, but
    // the cached data is sent from mappings of the member files.
    assert_eq!(zero_copy_reads(&s), 0);
    assert!(io_count(&s, "mapped_reads") > 0);
    assert_eq!(s.stop().code(), Some(0));
    // Zero-copy reads (splice from the member files), mapped reads and
    // reads into a buffer, healthy and then degraded, where requests that
    // touch the missing member (here, with 64 KiB chunks, nearly all of
    // nbdcopy's 256 KiB ones) are rebuilt.
    for present in [&ms[..], &ms[1..]] {
        for (how, extra) in [
            ("zero_copy_reads", &["--zero-copy", "always"][..]),
            ("mapped_reads", &[][..]),
            ("none", &["--no-mapped-reads"][..]),
        ] {
            // Started degraded on purpose.
            let extra = [extra, &["--run"][..]].concat();
            let mut s = Served::start(dir.path(), present, &extra);
            std::fs::remove_file(&back).unwrap();
            tool("nbdcopy", &[&s.uri, back.to_str().unwrap()]);
            let got = std::fs::read(&back).unwrap();
            let n = present.len();
            assert!(
                got[..data.len()] == data[..],
                "{how}: data differs ({n} members)"
            );
            let (spliced, mapped) = (zero_copy_reads(&s), io_count(&s, "mapped_reads"));
            match how {
                "zero_copy_reads" => assert_eq!(mapped, 0),
                "mapped_reads" => assert_eq!(spliced, 0),
                _ => assert_eq!((spliced, mapped), (0, 0)),
            }
            if n == ms.len() && how != "none" {
                assert!(spliced + mapped > 0, "{how}");
            }
            assert_eq!(s.stop().code(), Some(0));
        }
    }
    // Offline read agrees and parity is consistent with the data.
    let off = ok(&args(&["read", "--offset", "0", "--length", "64M"], &ms));
    assert!(off.stdout == data);
    let without: Vec<String> = ms[1..].to_vec();
    let off = ok(&args(
        &["read", "--offset", "0", "--length", "64M"],
        &without,
    ));
    assert!(off.stdout == data, "degraded read after NBD writes differs");
}

/// nbdcopy of 32 MiB to an array three times, each read back over NBD and
/// offline: the members start sparse, so the first pass finds no cached
/// pages and writes the ordinary way; the second finds them cached and
/// writes straight into the members; the third is told not to.
/// `all_mapped`: every request of the second pass is (nbdcopy's 256 KiB
/// requests are whole chunks or stripes); otherwise some are (a parity
/// array with stripes of another size takes runs of requests that end on
/// a stripe boundary, found among those already sent).
fn mapped_write_passes(dir: &Path, ms: &[String], all_mapped: bool, parity: bool) {
    let gen = |seed: u64| -> Vec<u8> {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        (0..32 << 20).map(|_| rng.gen()).collect()
    };
    let src = dir.join("src.bin");
    let back = dir.join("back.bin");
    for (pass, extra) in [
        (0u64, &[][..]),
        (1, &[][..]),
        (2, &["--no-mapped-writes"][..]),
    ] {
        let data = gen(pass);
        std::fs::write(&src, &data).unwrap();
        let mut s = Served::start(dir, ms, extra);
        // One connection: its requests come in order, so runs form.
        tool(
            "nbdcopy",
            &["--connections=1", src.to_str().unwrap(), &s.uri],
        );
        let mapped = io_count(&s, "mapped_writes");
        let writes = io_count(&s, "writes");
        match pass {
            0 | 2 => assert_eq!(mapped, 0, "pass {pass}"),
            _ if all_mapped => assert_eq!(mapped, writes, "pass {pass}: every write mapped"),
            _ => assert!(mapped > 0, "pass {pass}: {mapped} of {writes} mapped"),
        }
        let _ = std::fs::remove_file(&back);
        tool("nbdcopy", &[&s.uri, back.to_str().unwrap()]);
        assert!(std::fs::read(&back).unwrap()[..data.len()] == data[..]);
        assert_eq!(s.stop().code(), Some(0));
        let off = ok(&args(&["read", "--offset", "0", "--length", "32M"], ms));
        assert!(off.stdout == data, "pass {pass}: offline read differs");
        if parity {
            let o = ok(&args(&["check", "--json"], ms));
            let v: Value = serde_json::from_slice(&o.stdout).unwrap();
            assert_eq!(v["mismatches"], 0, "pass {pass}: {v}");
        }
    }
}

#[test]
fn writes_to_cached_pages_of_parity_arrays_go_straight_into_the_members() {
    // Chunks of 64 KiB: stripes of 256 KiB (RAID-5 of 5, RAID-6 of 6) and
    // of 192 KiB (RAID-5 of 4).
    for (level, n, all_mapped) in [("5", 5, true), ("6", 6, true), ("5", 4, false)] {
        let dir = tmp();
        let ms = members(dir.path(), n);
        create_plain(level, &ms, "16M");
        mapped_write_passes(dir.path(), &ms, all_mapped, true);
    }
}

#[test]
fn a_run_whose_next_header_comes_with_the_end_of_the_first_payload_is_still_placed() {
    // RAID-5 of 4, chunks of 64 KiB: stripes of 192 KiB. A write of 128 KiB
    // at 0 needs the next one (64 KiB at 128 KiB) to make a stripe, and its
    // header is not in the socket while the first payload is arriving: the
    // server takes that payload first and looks again.
    let dir = tmp();
    let ms = members(dir.path(), 4);
    create_plain("5", &ms, "16M");
    let mut s = Served::start(dir.path(), &ms, &[]);
    // The pages cached first (mapped writes go to cached pages only).
    let out = qemu_io(&s.uri, &["write -P 0x11 0 1M"]);
    assert!(!out.contains("failed"), "{out}");
    let before = io_count(&s, "mapped_writes");
    let (mut r, _) = Raw::go(&s.uri);
    let a = vec![0xa5u8; 128 << 10];
    let b = vec![0x5bu8; 64 << 10];
    let first = encode(1, 0, 1, 0, a.len() as u32, &a);
    let cut = first.len() - (64 << 10);
    r.s.write_all(&first[..cut]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let mut rest = first[cut..].to_vec();
    rest.extend_from_slice(&encode(1, 0, 2, 128 << 10, b.len() as u32, &b));
    r.s.write_all(&rest).unwrap();
    let mut cookies = [r.reply_with_cookie(0), r.reply_with_cookie(0)].map(|(err, cookie, _)| {
        assert_eq!(err, 0);
        cookie
    });
    cookies.sort();
    assert_eq!(cookies, [1, 2]);
    assert_eq!(io_count(&s, "mapped_writes") - before, 2);
    let out = qemu_io(
        &s.uri,
        &[
            "read -P 0xa5 0 128K",
            "read -P 0x5b 128K 64K",
            "read -P 0x11 192K 832K",
        ],
    );
    assert!(
        !out.contains("failed") && out.matches("read ").count() == 3,
        "{out}"
    );
    stop_and_check(&mut s, &ms);
}

/// A RAID-5 of 4 with 64 KiB chunks (192 KiB stripes) served, its first
/// 16 MiB cached (mapped writes go to cached pages only), and a connection
/// with a 12 MiB read whose reply the client does not read yet: a worker
/// stays busy sending it, the way a client with its whole queue depth in
/// flight keeps the server busy.
fn raid5_with_a_stuck_read(dir: &Path) -> (Served, Vec<String>) {
    let ms = members(dir, 4);
    create_plain("5", &ms, "24M");
    let s = Served::start(dir, &ms, &[]);
    let out = qemu_io(&s.uri, &["write -P 0x11 0 16M"]);
    assert!(!out.contains("failed"), "{out}");
    (s, ms)
}

#[test]
fn a_run_whose_next_header_is_late_is_waited_for_while_other_requests_are_served() {
    let dir = tmp();
    let (mut s, ms) = raid5_with_a_stuck_read(dir.path());
    let (a, b) = (vec![0xa5u8; 128 << 10], vec![0x5bu8; 64 << 10]);
    // Whether the server is already waiting when the second header comes
    // depends on timing (the worker may take the first write only once the
    // second is in, and then needs no wait): tried a few times, with longer
    // gaps, until one was waited for. Every attempt's data must be right.
    let mut waited = false;
    for attempt in 0..5u64 {
        let at = (12 << 20) + attempt * (192 << 10);
        let (mut r, _) = Raw::go(&s.uri);
        // The server waits only for what its socket can hold: 16 MiB of
        // writes first let the kernel grow the buffer (as under load).
        let fill = vec![0x11u8; 1 << 20];
        for i in 0..16u64 {
            r.s.write_all(&encode(1, 0, 100 + i, i << 20, 1 << 20, &fill))
                .unwrap();
        }
        for _ in 0..16 {
            assert_eq!(r.reply_with_cookie(0).0, 0);
        }
        let (runs, mapped) = (io_count(&s, "run_waits"), io_count(&s, "mapped_writes"));
        r.s.write_all(&encode(0, 0, 1, 0, 12 << 20, &[])).unwrap();
        r.s.write_all(&encode(1, 0, 2, at, a.len() as u32, &a))
            .unwrap();
        std::thread::sleep(Duration::from_micros(300 * (attempt + 1)));
        r.s.write_all(&encode(1, 0, 3, at + (128 << 10), b.len() as u32, &b))
            .unwrap();
        let got = r.replies(3, (1, 12 << 20));
        assert_eq!(
            got.iter().map(|g| (g.0, g.1)).collect::<Vec<_>>(),
            [(0, 1), (0, 2), (0, 3)]
        );
        assert!(got[0].2.iter().all(|&x| x == 0x11));
        let out = qemu_io(
            &s.uri,
            &[
                &format!("read -P 0xa5 {at} 128K"),
                &format!("read -P 0x5b {} 64K", at + (128 << 10)),
            ],
        );
        assert!(
            !out.contains("failed") && out.matches("read ").count() == 2,
            "{out}"
        );
        if io_count(&s, "run_waits") > runs {
            assert_eq!(io_count(&s, "run_waits") - runs, 1);
            assert_eq!(
                io_count(&s, "mapped_writes") - mapped,
                2,
                "the run went straight in"
            );
            waited = true;
            break;
        }
    }
    assert!(waited, "no run was waited for in 5 attempts");
    stop_and_check(&mut s, &ms);
}

#[test]
fn a_run_that_never_completes_is_answered_even_while_other_requests_are_served() {
    // The first write of a stripe, and no second one ever: the server waits
    // for it a little at most, then writes the part it has.
    let dir = tmp();
    let (mut s, ms) = raid5_with_a_stuck_read(dir.path());
    let (mut r, _) = Raw::go(&s.uri);
    let a = vec![0xa5u8; 128 << 10];
    r.s.write_all(&encode(0, 0, 1, 0, 12 << 20, &[])).unwrap();
    r.s.write_all(&encode(1, 0, 2, 12 << 20, a.len() as u32, &a))
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let got = r.replies(2, (1, 12 << 20));
    assert_eq!(
        got.iter().map(|g| (g.0, g.1)).collect::<Vec<_>>(),
        [(0, 1), (0, 2)]
    );
    assert_eq!(io_count(&s, "run_waits"), 0);
    let out = qemu_io(
        &s.uri,
        &["read -P 0xa5 12M 128K", "read -P 0x11 12416K 64K"],
    );
    assert!(
        !out.contains("failed") && out.matches("read ").count() == 2,
        "{out}"
    );
    stop_and_check(&mut s, &ms);
}

#[test]
fn writes_to_cached_pages_of_raid0_go_straight_into_the_members() {
    let dir = tmp();
    let ms = members(dir.path(), 3);
    create_plain("0", &ms, "16M");
    mapped_write_passes(dir.path(), &ms, true, false);
    // Unaligned writes across chunks, with FUA, and small ones beside them.
    let mut s = Served::start(dir.path(), &ms, &[]);
    let cmds = [
        "write -P 0x5a 12345 300000",
        "write -f -P 0x6b 1000001 700001",
        "write -P 0x7c 312345 100",
        "read -P 0x5a 12345 300000",
        "read -P 0x6b 1000001 700001",
        "read -P 0x7c 312345 100",
    ];
    let out = qemu_io(&s.uri, &cmds);
    assert!(!out.contains("failed"), "{out}");
    assert_eq!(out.matches("read ").count(), 3, "{out}");
    assert_eq!(io_count(&s, "mapped_writes"), 2);
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn libnbd_multiconn_flush_is_durable_and_errors_keep_connections() {
    let dir = tmp();
    let ms = members(dir.path(), 4);
    create("5", &ms, "24M");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/multiconn.py");
    let script = script.to_str().unwrap();
    let mut s = Served::start(dir.path(), &ms, &[]);
    let o = tool("/usr/bin/python3", &[script, "write", &s.uri]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("write: ok"));
    // Flushed data survives kill -9 of the server.
    s.kill9();
    let mut s = Served::start(dir.path(), &ms, &[]);
    let o = tool("/usr/bin/python3", &[script, "check", &s.uri]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("check: ok"));
    // nbdsh, the libnbd shell, sees the same bytes. (nbdsh is `python3 -m
    // nbd`; run it with the system Python that python3-libnbd installs into.)
    tool(
        "/usr/bin/python3",
        &[
            "-m",
            "nbd",
            "-u",
            &s.uri,
            "-c",
            "assert h.pread(7, 1000003) == bytes((i * 7 + 3) % 256 for i in range(7))",
        ],
    );
    assert_eq!(s.stop().code(), Some(0));
}

fn fio_verify(level: &str, n: usize) {
    let dir = tmp();
    let ms = members(dir.path(), n);
    create(level, &ms, "40M");
    let mut s = Served::start(dir.path(), &ms, &[]);
    let out = dir.path().join("fio.json");
    let o = tool(
        "fio",
        &[
            "--name=verify",
            "--ioengine=nbd",
            &format!("--uri={}", s.uri),
            "--rw=randwrite",
            "--bsrange=4k-128k",
            "--iodepth=16",
            "--numjobs=4",
            "--size=16M",
            "--offset_increment=16M",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            // No verify state file left in the working directory.
            "--verify_state_save=0",
            "--group_reporting",
            "--output-format=json",
            &format!("--output={}", out.display()),
        ],
    );
    let text = std::fs::read_to_string(&out).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "fio output: {e}: {text} {}",
            String::from_utf8_lossy(&o.stdout)
        )
    });
    let job = &v["jobs"][0];
    assert_eq!(job["error"], 0, "fio reported an error");
    assert!(job["write"]["io_bytes"].as_u64().unwrap() >= 64 << 20);
    assert!(
        job["read"]["io_bytes"].as_u64().unwrap() >= 64 << 20,
        "verify pass read nothing"
    );
    let ctl = s.control.display().to_string();
    let st: Value =
        serde_json::from_slice(&ok(&["status", "--control", &ctl, "--json"]).stdout).unwrap();
    assert_eq!(st["io"]["errors"], 0);
    assert_eq!(s.stop().code(), Some(0));
    // Redundancy agrees with the data: read it all degraded and compare.
    let whole = ok(&args(&["read", "--offset", "0", "--length", "64M"], &ms)).stdout;
    let gone: Vec<String> = ms[..n - 1].to_vec();
    let degraded = ok(&args(&["read", "--offset", "0", "--length", "64M"], &gone)).stdout;
    assert!(
        whole == degraded,
        "{level}: parity disagrees with data after fio"
    );
}

#[test]
fn fio_four_connections_verify_on_raid5() {
    fio_verify("5", 4);
}

#[test]
fn fio_four_connections_verify_on_raid6() {
    fio_verify("6", 5);
}

/// A FUSE mount of an export (nbdfuse) and, optionally, a loop mount of
/// the file system inside; both undone on drop.
struct Fuse {
    dir: PathBuf,
    child: Option<Guarded>,
    mnt: Option<PathBuf>,
}

impl Fuse {
    fn start(dir: &Path, uri: &str) -> Fuse {
        std::fs::create_dir_all(dir).unwrap();
        let pidfile = dir.with_extension("pid");
        let _ = std::fs::remove_file(&pidfile);
        let child = Guarded::spawn(Command::new("nbdfuse").args([
            "-P",
            pidfile.to_str().unwrap(),
            dir.to_str().unwrap(),
            uri,
        ]));
        let f = Fuse {
            dir: dir.to_path_buf(),
            child: Some(child),
            mnt: None,
        };
        wait_for("nbdfuse", 30, || {
            pidfile.exists() && dir.join("nbd").exists()
        });
        f
    }

    fn file(&self) -> String {
        self.dir.join("nbd").display().to_string()
    }

    fn mount(&mut self, mnt: &Path) {
        std::fs::create_dir_all(mnt).unwrap();
        tool(
            "mount",
            &["-o", "loop", &self.file(), mnt.to_str().unwrap()],
        );
        self.mnt = Some(mnt.to_path_buf());
    }

    fn umount(&mut self) {
        if let Some(m) = self.mnt.take() {
            tool("umount", &[m.to_str().unwrap()]);
        }
    }

    fn stop(&mut self) {
        self.umount();
        if let Some(mut c) = self.child.take() {
            let _ = try_tool("fusermount3", &["-u", self.dir.to_str().unwrap()]);
            c.wait_within(Duration::from_secs(60));
        }
    }
}

impl Drop for Fuse {
    fn drop(&mut self) {
        // (no panics here: this may run while a test unwinds)
        let limit = Duration::from_secs(30);
        if let Some(m) = self.mnt.take() {
            cleanup("umount", &["-l", &m.display().to_string()], limit);
        }
        if let Some(mut c) = self.child.take() {
            cleanup(
                "fusermount3",
                &["-u", "-z", &self.dir.display().to_string()],
                limit,
            );
            c.kill();
        }
    }
}

#[test]
fn ext4_on_the_export_survives_a_server_restart() {
    let dir = tmp();
    let ms = members(dir.path(), 4);
    create("5", &ms, "48M");
    let fusedir = dir.path().join("fuse");
    let mnt = dir.path().join("mnt");
    let mut s = Served::start(dir.path(), &ms, &[]);
    let mut f = Fuse::start(&fusedir, &s.uri);
    tool("mkfs.ext4", &["-q", "-F", &f.file()]);
    f.mount(&mnt);
    let mut files = Vec::new();
    {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(4);
        std::fs::create_dir_all(mnt.join("run42")).unwrap();
        for i in 0..20 {
            let len = if i == 0 {
                20 << 20
            } else {
                rng.gen_range(1..300_000)
            };
            let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            let name = format!("run42/event-{i:03}.dat");
            std::fs::write(mnt.join(&name), &data).unwrap();
            files.push((name, data));
        }
    }
    f.stop();
    assert_eq!(s.stop().code(), Some(0), "{}", s.log());
    let d = detail(&ms);
    assert_eq!(d["state"], "optimal");

    let mut s = Served::start(dir.path(), &ms, &[]);
    let mut f = Fuse::start(&fusedir, &s.uri);
    f.mount(&mnt);
    for (name, data) in &files {
        let got = std::fs::read(mnt.join(name)).unwrap();
        assert!(&got == data, "{name} differs after restart");
    }
    f.umount();
    tool("e2fsck", &["-fn", &f.file()]);
    f.stop();
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn sigterm_finishes_cleanly_and_marks_the_array_clean() {
    let dir = tmp();
    let ms = members(dir.path(), 3);
    create("5", &ms, "24M");
    let mut s = Served::start(dir.path(), &ms, &[]);
    tool("qemu-io", &["-f", "raw", "-c", "write -P 7 0 1M", &s.uri]);
    let e: Value = serde_json::from_slice(&ok(&["examine", &ms[0], "--json"]).stdout).unwrap();
    assert_eq!(e["state"], "dirty", "a written, running array is dirty");
    assert!(s.control.exists());
    // While it runs, nobody else may write its members.
    let input = dir.path().join("x.bin");
    std::fs::write(&input, [1u8; 10]).unwrap();
    let o = raidkit_refused(&args(
        &["write", "--offset", "0", "--in", input.to_str().unwrap()],
        &ms,
    ));
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("in use"));
    let o = raidkit_refused(&args(&["serve", "--listen", "127.0.0.1:0"], &ms));
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("in use"));
    assert_eq!(s.stop().code(), Some(0));
    assert!(!s.control.exists(), "control socket left behind");
    let e: Value = serde_json::from_slice(&ok(&["examine", &ms[0], "--json"]).stdout).unwrap();
    assert_eq!(e["state"], "clean");
    let o = ok(&args(&["read", "--offset", "0", "--length", "1M"], &ms));
    assert!(o.stdout.iter().all(|&b| b == 7));
}

#[test]
fn serving_on_a_unix_socket_only() {
    let dir = tmp();
    let ms = members(dir.path(), 3);
    create("5", &ms, "16M");
    let sock = dir.path().join("nbd.sock");
    let sp = sock.display().to_string();
    let mut s = Served::start_on(dir.path(), &ms, &["--socket", &sp], &[]);
    assert!(s.uri.starts_with("nbd+unix:///"), "{}", s.uri);
    assert!(s.uri.ends_with(&format!("?socket={sp}")), "{}", s.uri);
    assert!(sock.exists());
    let out = qemu_io(
        &s.uri,
        &["write -P 0x61 12345 100000", "read -P 0x61 12345 100000"],
    );
    assert!(
        !out.contains("failed") && out.contains("read 100000/100000"),
        "{out}"
    );
    let size = detail(&ms)["size"].as_u64().unwrap();
    let o = tool("nbdinfo", &["--size", &s.uri]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), size.to_string());
    // No TCP listener: the status lists the socket as the only endpoint.
    let ctl = s.control.display().to_string();
    let st: Value =
        serde_json::from_slice(&ok(&["status", "--control", &ctl, "--json"]).stdout).unwrap();
    assert_eq!(st["endpoints"], serde_json::json!([s.uri]), "{st}");
    // A second server on the same socket is refused while this one runs.
    let other = members(&dir.path().join("o"), 3);
    std::fs::create_dir_all(dir.path().join("o")).unwrap();
    create("5", &other, "16M");
    let o = raidkit_refused(&args(&["serve", "--socket", &sp], &other));
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(s.stop().code(), Some(0));
    assert!(!sock.exists(), "socket left behind");
    let o = ok(&args(
        &["read", "--offset", "12345", "--length", "100000"],
        &ms,
    ));
    assert!(o.stdout.iter().all(|&b| b == 0x61));
}

/// fdatasync and fsync calls the server `pid` makes on each member file
/// while `act` runs, counted with strace (attached to every thread, and
/// to the threads they start, before `act`; detached after).
fn member_syncs(pid: u32, ms: &[String], out: &Path, act: impl FnOnce()) -> Vec<usize> {
    let mut fds = std::collections::HashMap::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap() {
        let e = e.unwrap();
        if let Ok(target) = std::fs::read_link(e.path()) {
            if let Some(i) = ms.iter().position(|m| Path::new(m) == target) {
                fds.insert(e.file_name().to_string_lossy().to_string(), i);
            }
        }
    }
    assert!(fds.len() >= ms.len(), "member files not open: {fds:?}");
    let _ = std::fs::remove_file(out);
    let mut st = Guarded::spawn(
        Command::new("strace")
            .args(["-f", "-qq", "-e", "trace=fsync,fdatasync", "-o"])
            .arg(out)
            .args(["-p", &pid.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null()),
    );
    let tracer = st.id().to_string();
    wait_for("strace to attach to every thread", 30, || {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .all(|t| {
                std::fs::read_to_string(t.unwrap().path().join("status"))
                    .unwrap_or_default()
                    .lines()
                    .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["TracerPid:", &tracer])
            })
    });
    act();
    // SIGINT: strace detaches and writes out what it saw.
    // SAFETY: kill(2) on our own, unreaped child.
    unsafe { libc::kill(st.id() as i32, libc::SIGINT) };
    st.wait_within(Duration::from_secs(30));
    let text = std::fs::read_to_string(out).unwrap();
    let mut n = vec![0; ms.len()];
    for l in text.lines() {
        for call in ["fdatasync(", "fsync("] {
            if let Some(i) = l.find(call) {
                let fd: String = l[i + call.len()..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                if let Some(&m) = fds.get(&fd) {
                    n[m] += 1;
                }
            }
        }
    }
    n
}

#[test]
fn flush_and_fua_reach_every_members_stable_storage() {
    // kill -9 keeps the page cache, so the kill tests would pass with
    // FLUSH doing nothing: here the server's own system calls are watched.
    // RAID-0 (no journal, no bitmap): writes alone sync nothing, so every
    // sync seen comes from the FLUSH or the FUA.
    let dir = tmp();
    let ms = members(dir.path(), 3);
    create("0", &ms, "16M");
    let mut s = Served::start(dir.path(), &ms, &[]);
    let trace = dir.path().join("strace.txt");
    let (mut r, _) = Raw::go(&s.uri);
    // The first write marks the array dirty (durably), before any watching.
    r.request(1, 0, 0, 192 << 10, &[0x11; 192 << 10]);
    assert_eq!(r.reply(0).0, 0);
    r.request(3, 0, 0, 0, &[]);
    assert_eq!(r.reply(0).0, 0);
    let pid = s.pid();
    // Plain writes to every member (64 KiB chunks): no sync.
    let n = member_syncs(pid, &ms, &trace, || {
        for m in 0..3u64 {
            r.request(1, 0, m * (64 << 10) + 4096, 4096, &[0x22; 4096]);
            assert_eq!(r.reply(0).0, 0);
        }
    });
    assert_eq!(
        n,
        [0, 0, 0],
        "syncs without a flush: the check below proves nothing"
    );
    // FLUSH: every member's data made durable before the reply.
    let n = member_syncs(pid, &ms, &trace, || {
        r.request(3, 0, 0, 0, &[]);
        assert_eq!(r.reply(0).0, 0);
    });
    assert!(n.iter().all(|&c| c >= 1), "FLUSH synced members {n:?}");
    // A FUA write to member 1's chunk: that member at least, before the reply.
    let n = member_syncs(pid, &ms, &trace, || {
        r.request(1, 1, (64 << 10) + 8192, 4096, &[0x33; 4096]);
        assert_eq!(r.reply(0).0, 0);
    });
    assert!(n[1] >= 1, "FUA write synced members {n:?}");
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn sigterm_finishes_the_requests_in_flight() {
    // A mirror whose second member takes 300 ms over every operation:
    // three writes are in flight (none done) when SIGTERM comes; each still
    // gets its success reply, the server exits 0, and the data is there.
    let dir = tmp();
    let ms = members(dir.path(), 2);
    create("1", &ms, "16M");
    let slow = vec![ms[0].clone(), format!("fault:{}?delay=300ms", ms[1])];
    let mut s = Served::start(dir.path(), &slow, &[]);
    let (mut r, _) = Raw::go(&s.uri);
    let at = |i: u64| i * (1 << 20) + 4096;
    for i in 1..=3u64 {
        r.s.write_all(&encode(1, 0, i, at(i), 4096, &[i as u8; 4096]))
            .unwrap();
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(io_count(&s, "writes"), 0, "the writes were not in flight");
    // SAFETY: kill(2) on our own child (the server), not yet reaped.
    unsafe { libc::kill(s.pid() as i32, libc::SIGTERM) };
    let got = r.replies(3, (u64::MAX, 0));
    assert_eq!(
        got.iter().map(|g| (g.0, g.1)).collect::<Vec<_>>(),
        [(0, 1), (0, 2), (0, 3)]
    );
    assert!(r.closed(), "the connection outlived the server's stop");
    assert_eq!(s.stop().code(), Some(0), "{}", s.log());
    for i in 1..=3u64 {
        let o = ok(&args(
            &["read", "--offset", &at(i).to_string(), "--length", "4096"],
            &ms,
        ));
        assert!(o.stdout.iter().all(|&b| b == i as u8), "write {i}");
    }
    let e: Value = serde_json::from_slice(&ok(&["examine", &ms[1], "--json"]).stdout).unwrap();
    assert_eq!(e["state"], "clean");
}

/// Bytes the files take on disk.
fn allocated(ms: &[String]) -> u64 {
    use std::os::unix::fs::MetadataExt;
    ms.iter()
        .map(|m| std::fs::metadata(m).unwrap().blocks() * 512)
        .sum()
}

#[test]
fn the_preferred_block_size_is_a_whole_stripe_where_that_is_a_power_of_two() {
    let dir = tmp();
    let ms = members(dir.path(), 5);
    create("5", &ms, "16M");
    let mut s = Served::start(dir.path(), &ms, &[]);
    let v: Value = serde_json::from_slice(&tool("nbdinfo", &["--json", &s.uri]).stdout).unwrap();
    assert_eq!(v["exports"][0]["block_size_preferred"], 256 << 10);
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn trim_reads_back_zeroes_frees_the_space_and_keeps_redundancy_consistent() {
    for (level, n) in [("0", 4), ("1", 2), ("5", 4), ("6", 4), ("10", 4)] {
        // On the machine's disk: the members get direct I/O and the file
        // system frees what is punched out.
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let ms = members(dir.path(), n);
        create(level, &ms, "64M");
        let mut s = Served::start(dir.path(), &ms, &[]);
        qemu_io(&s.uri, &["write -P 0xab 0 6M"]);
        let before = allocated(&ms);
        // Not stripe-aligned at either end: parity levels free the whole
        // stripes inside and zero the edges.
        let (lo, len) = (100 << 10, 3 << 20);
        qemu_io(&s.uri, &[&format!("discard {lo} {len}")]);
        let out = dir.path().join("out.img");
        tool("nbdcopy", &[&s.uri, out.to_str().unwrap()]);
        let got = std::fs::read(&out).unwrap();
        for (i, &b) in got.iter().enumerate() {
            let want = if (lo..lo + len).contains(&i) || i >= 6 << 20 {
                0
            } else {
                0xab
            };
            assert_eq!(b, want, "RAID-{level}: byte {i}");
        }
        std::fs::remove_file(&out).unwrap();
        stop_and_check(&mut s, &ms);
        let after = allocated(&ms);
        assert!(
            after + (2 << 20) <= before,
            "RAID-{level}: {before} bytes allocated before the trim, {after} after"
        );
        // The whole device at once, as mkfs does: more stripes than the
        // journal holds intent records for at a time.
        let mut s = Served::start(dir.path(), &ms, &[]);
        let size = detail(&ms)["size"].as_u64().unwrap();
        qemu_io(&s.uri, &[&format!("discard 0 {size}")]);
        tool("nbdcopy", &[&s.uri, out.to_str().unwrap()]);
        let got = std::fs::read(&out).unwrap();
        assert!(got.iter().all(|&b| b == 0), "RAID-{level}: not all zero");
        std::fs::remove_file(&out).unwrap();
        stop_and_check(&mut s, &ms);
    }
}
