//! Checksums end to end, driven as a user would: data written with
//! nbdcopy, bytes of member files flipped behind the server's back (data
//! and parity blocks), the array served again, and then: every read
//! returns the data written (healed from redundancy), the members'
//! checksum counters rise, `raidkit scrub` repairs what reads did not
//! touch and a second scrub finds nothing; damage beyond redundancy is an
//! I/O error, never wrong data.

mod common;

use common::*;
use rand::seq::SliceRandom;
use rand::Rng;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Stdio};

const DATA: usize = 4 << 20;

fn random(seed: u64, n: usize) -> Vec<u8> {
    use rand::SeedableRng;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen()).collect()
}

fn data_offset(m: &str) -> u64 {
    let e: Value = serde_json::from_slice(&ok(&["examine", "--json", m]).stdout).unwrap();
    assert_eq!(e["checksums"]["algorithm"], "crc32c", "{e}");
    e["data_offset"].as_u64().unwrap()
}

/// Flip the 4 bytes at `off` of file `m`; returns what was there.
fn flip(m: &str, off: u64) -> [u8; 4] {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m)
        .unwrap();
    let mut b = [0u8; 4];
    f.read_exact_at(&mut b, off).unwrap();
    f.write_all_at(&b.map(|x| !x), off).unwrap();
    b
}

fn bytes_at(m: &str, off: u64) -> [u8; 4] {
    use std::os::unix::fs::FileExt;
    let mut b = [0u8; 4];
    std::fs::File::open(m)
        .unwrap()
        .read_exact_at(&mut b, off)
        .unwrap();
    b
}

fn status(s: &Served) -> Value {
    let ctl = s.control.display().to_string();
    serde_json::from_slice(&ok(&["status", "--control", &ctl, "--json"]).stdout).unwrap()
}

fn checksum_errors(st: &Value) -> Vec<u64> {
    st["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["errors"]["checksum"].as_u64().unwrap())
        .collect()
}

/// `raidkit scrub --wait --json`: (exit code, its last_scrub).
fn scrub(s: &Served) -> (Option<i32>, Value) {
    let ctl = s.control.display().to_string();
    let o = raidkit(&["scrub", "--wait", "--json", "--control", &ctl]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|_| {
        panic!(
            "scrub printed no JSON: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    });
    (o.status.code(), v)
}

/// Write `data` at the start of the array through nbdcopy.
fn write_all(dir: &Path, s: &Served, data: &[u8]) {
    let src = dir.join("src.bin");
    std::fs::write(&src, data).unwrap();
    tool("nbdcopy", &[src.to_str().unwrap(), &s.uri]);
}

/// The first `n` bytes of the array, read through nbdcopy.
fn read_back(dir: &Path, s: &Served, n: usize) -> Vec<u8> {
    let back = dir.join("back.bin");
    let _ = std::fs::remove_file(&back);
    tool("nbdcopy", &[&s.uri, back.to_str().unwrap()]);
    let mut got = std::fs::read(&back).unwrap();
    got.truncate(n);
    got
}

/// `len` bytes at `off` of the export, read with `qemu-io -v` (which
/// dumps lines of "offset:  16 hex bytes  ascii").
fn qemu_read(uri: &str, off: u64, len: u64) -> Vec<u8> {
    let c = format!("read -v {off} {len}");
    let out = tool("qemu-io", &["-f", "raw", "-c", &c, uri]);
    let mut got = Vec::with_capacity(len as usize);
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((_, rest)) = line.split_once(':') else {
            continue;
        };
        got.extend(
            rest.split_whitespace()
                .take(16)
                .take_while(|t| t.len() == 2)
                .filter_map(|t| u8::from_str_radix(t, 16).ok()),
        );
    }
    assert_eq!(got.len() as u64, len, "qemu-io read {off}+{len}");
    got
}

/// A new array (checksums on, 8 MiB members) with `DATA` random bytes
/// written at its start through NBD, stopped: (its directory, members, data).
fn array_with_data(level: &str, n: usize, seed: u64) -> (tempfile::TempDir, Vec<String>, Vec<u8>) {
    let dir = tmp();
    let ms = members(dir.path(), n);
    create(level, &ms, "8M");
    let data = random(seed, DATA);
    let mut s = Served::start(dir.path(), &ms, &[]);
    write_all(dir.path(), &s, &data);
    assert_eq!(s.stop().code(), Some(0), "{}", s.log());
    (dir, ms, data)
}

/// kill -9 under writes, with the bitmap policy: at the restart the
/// regions being written are open (a block there that disagrees with its
/// checksum may be torn by the crash, or rotten) until the background
/// resync has passed. Rot there must be put back from redundancy, by the
/// reads and by the resync, never taken as it is.
#[test]
fn rot_in_the_regions_a_crash_left_open_is_healed_not_adopted() {
    const PIECE: usize = 64 << 10;
    // (level, members, data chunks per chunk row)
    for (level, n, k) in [("5", 4, 3), ("6", 5, 3), ("1", 2, 1), ("10", 4, 2)] {
        let dir = tmp();
        let ms = members(dir.path(), n);
        ok(&args(
            &[
                "create",
                "--level",
                level,
                "--size",
                "8M",
                "--chunk",
                "64K",
                "--consistency-policy",
                "bitmap",
            ],
            &ms,
        ));
        let data = random(40 + n as u64, DATA);
        let mut s = Served::start(dir.path(), &ms, &[]);
        let src = dir.path().join("src.bin");
        std::fs::write(&src, &data).unwrap();
        // Flushed: data and checksums durable.
        tool("nbdcopy", &["--flush", src.to_str().unwrap(), &s.uri]);
        // A writer of the first 4 KiB of every 64 KiB piece of the data,
        // round and round, when the server is killed.
        let mut writer = Guarded::spawn(
            std::process::Command::new("fio")
                .args([
                    "--name=w",
                    "--ioengine=nbd",
                    &format!("--uri={}", s.uri),
                    "--rw=write:60k",
                    "--bs=4k",
                    "--iodepth=8",
                    &format!("--size={DATA}"),
                    "--time_based",
                    "--runtime=120",
                    "--output=/dev/null",
                ])
                .stderr(std::process::Stdio::null()),
        );
        let ctl = s.control.display().to_string();
        wait_for("the writer", 30, || {
            let st: Value =
                serde_json::from_slice(&ok(&["status", "--control", &ctl, "--json"]).stdout)
                    .unwrap();
            st["io"]["writes"].as_u64().unwrap_or(0) > 2000
        });
        s.kill9();
        writer.kill();
        // Rot in blocks the writer never touched: one per chunk row, on
        // member `row % n` (mostly data blocks, one copy of a mirror's),
        // block 1 + row % 15 of it.
        let off = data_offset(&ms[0]);
        let rows = DATA / PIECE / k;
        let flips: Vec<(usize, u64)> = (0..rows)
            .map(|row| {
                let i = row % n;
                let at = off + (row * PIECE + (1 + row % 15) * 4096 + 8) as u64;
                flip(&ms[i], at);
                (i, at)
            })
            .collect();
        let stable = |got: &[u8]| -> Vec<usize> {
            (0..DATA / PIECE)
                .filter(|&k| {
                    let r = k * PIECE + 4096..(k + 1) * PIECE;
                    got[r.clone()] != data[r]
                })
                .collect()
        };
        let mut s = Served::start(dir.path(), &ms, &[]);
        let got = read_back(dir.path(), &s, DATA);
        let bad = stable(&got);
        let blocks: Vec<(usize, usize)> = bad
            .iter()
            .flat_map(|&k| {
                let got = &got;
                let data = &data;
                (1..PIECE / 4096).filter_map(move |b| {
                    let r = k * PIECE + b * 4096..k * PIECE + (b + 1) * 4096;
                    (got[r.clone()] != data[r]).then_some((k, b))
                })
            })
            .collect();
        assert!(
            bad.is_empty(),
            "RAID-{level}: rot served from (64 KiB piece, 4 KiB block) {blocks:?} (flipped: {flips:?}); log: {}",
            s.log()
        );
        // Not counted: in the window torn and rotten cannot be told apart.
        let errs = checksum_errors(&status(&s));
        assert_eq!(errs.iter().sum::<u64>(), 0, "RAID-{level}: {errs:?}");
        wait_for("the resync", 60, || {
            let st = status(&s);
            st["last_recovery"]["kind"] == "parity-resync" && st["recovery"].is_null()
        });
        assert_eq!(status(&s)["last_recovery"]["result"], "done");
        assert!(
            s.log().contains("put back"),
            "RAID-{level}: the resync said nothing: {}",
            s.log()
        );
        // The resync wrote the blocks back: reads now, outside the window,
        // find nothing to count.
        let bad = stable(&read_back(dir.path(), &s, DATA));
        assert!(bad.is_empty(), "RAID-{level}: after the resync: {bad:?}");
        let errs = checksum_errors(&status(&s));
        assert_eq!(
            errs.iter().sum::<u64>(),
            0,
            "RAID-{level}: rot left: {errs:?}"
        );
        assert_eq!(s.stop().code(), Some(0), "{}", s.log());
        let o = ok(&args(&["check", "--json"], &ms));
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["mismatches"], 0, "RAID-{level}: {v}");
    }
}

#[test]
fn rotten_blocks_are_healed_on_read_and_by_scrub_at_every_redundant_level() {
    for (level, n) in [("1", 2), ("10", 4), ("5", 4), ("6", 5)] {
        let (dir, ms, data) = array_with_data(level, n, n as u64);

        // Six flipped blocks on random members at random offsets, each in
        // another chunk row (so never two in one stripe), all in the rows
        // the data filled (at least 16 on every level here): data blocks
        // and parity blocks (RAID-5/6), either copy (RAID-1/10).
        let off = data_offset(&ms[0]);
        let mut rng = {
            use rand::SeedableRng;
            rand::rngs::StdRng::seed_from_u64(100 + n as u64)
        };
        let mut rows: Vec<u64> = (0..16).collect();
        rows.shuffle(&mut rng);
        let flips: Vec<(usize, u64, [u8; 4])> = rows[..6]
            .iter()
            .map(|&row| {
                let i = rng.gen_range(0..n);
                let at = off + row * (64 << 10) + rng.gen_range(0..(64 << 10) / 4) * 4;
                (i, at, flip(&ms[i], at))
            })
            .collect();
        eprintln!(
            "RAID-{level}: flipped (member, offset): {:?}",
            flips.iter().map(|f| (f.0, f.1)).collect::<Vec<_>>()
        );

        let mut s = Served::start(dir.path(), &ms, &[]);
        assert!(
            read_back(dir.path(), &s, DATA) == data,
            "RAID-{level}: data read back differs"
        );
        let errs = checksum_errors(&status(&s));
        // Parity levels have one copy of each data block, which the reads
        // must have met; a mirror reads either copy, so the scrub may be
        // what meets them.
        assert!(
            errs.iter().sum::<u64>() > 0 || matches!(level, "1" | "10"),
            "RAID-{level}: no checksum error counted: {errs:?}"
        );
        let (code, first) = scrub(&s);
        assert_eq!(code, Some(0), "RAID-{level}: {first}");
        assert_eq!(first["result"], "done", "RAID-{level}: {first}");
        assert_eq!(first["unrepaired"], 0, "RAID-{level}: {first}");
        // What the reads healed, the scrub did not need to: together they
        // account for every flipped block, each named by its member.
        let healed_by_reads = errs.iter().sum::<u64>();
        let repaired = first["repaired"].as_u64().unwrap();
        assert!(
            healed_by_reads + repaired >= flips.len() as u64,
            "RAID-{level}: {healed_by_reads} healed by reads, {repaired} by the scrub, {} flipped: {first}",
            flips.len()
        );
        for f in first["mismatches"].as_array().unwrap() {
            assert_eq!(f["kind"], "checksum", "RAID-{level}: {f}");
            assert_eq!(f["action"], "repaired", "RAID-{level}: {f}");
            let role = f["role"].as_u64().unwrap() as usize;
            let at = f["member_offset"].as_u64().unwrap();
            assert!(
                flips
                    .iter()
                    .any(|&(i, o, _)| i == role && o / 4096 * 4096 == at),
                "RAID-{level}: a finding nothing was planted at: {f}"
            );
        }
        let (code, second) = scrub(&s);
        assert_eq!(code, Some(0), "RAID-{level}: {second}");
        assert_eq!(second["repaired"], 0, "RAID-{level}: {second}");
        assert_eq!(
            second["mismatches"].as_array().unwrap().len(),
            0,
            "RAID-{level}: {second}"
        );
        assert_eq!(s.stop().code(), Some(0), "{}", s.log());
        // Every flipped block holds its old bytes again.
        for (i, at, was) in &flips {
            assert_eq!(
                bytes_at(&ms[*i], *at),
                *was,
                "RAID-{level}: member {i} at {at} not repaired"
            );
        }
    }
}

#[test]
fn damage_beyond_redundancy_is_an_io_error_never_wrong_data() {
    // RAID-5: two members rotten in one stripe. RAID-0: any rot.
    for (level, n, rotten) in [("5", 4, &[0usize, 1][..]), ("0", 2, &[0][..])] {
        let (dir, ms, data) = array_with_data(level, n, 7);
        // Chunk row 1, 4 KiB into the chunk, of each rotten member.
        let off = data_offset(&ms[0]);
        for &i in rotten {
            flip(&ms[i], off + (64 << 10) + 4096);
        }
        let row = 64u64 << 10;
        let width = row * (n as u64 - u64::from(level == "5"));
        let s = Served::start(dir.path(), &ms, &[]);
        // The row's range fails; reads around it give the data written.
        let out = try_tool(
            "qemu-io",
            &["-f", "raw", "-c", &format!("read {width} {width}"), &s.uri],
        );
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            text.contains("Input/output error"),
            "RAID-{level}: the rotten range was read: {text}"
        );
        let check = |o: u64, len: u64| {
            let (a, b) = (o as usize, (o + len) as usize);
            assert!(
                qemu_read(&s.uri, o, len) == data[a..b],
                "RAID-{level}: read at {o} differs"
            );
        };
        check(0, 4096);
        check(2 * width, 4096);
        let log = s.log();
        assert!(
            log.lines().any(|l| l.contains("read failed")
                && l.contains(&format!("offset={width}"))
                && l.contains("checksum")),
            "RAID-{level}: the log does not name the range and why: {log}"
        );
        drop(s);
    }
}

#[test]
fn a_member_that_rots_silently_is_read_around_and_named() {
    // fault:...?corrupt-at=OFF: reads of that member's block there come
    // back with flipped bits and no error, as rot does, every time. Row 1
    // of member 1 holds data on RAID-5 and RAID-6 here (the read meets
    // it); a mirror's read may take the other copy, but a scrub reads
    // both.
    for (level, n) in [("1", 2), ("10", 4), ("5", 4), ("6", 5)] {
        let (dir, ms, data) = array_with_data(level, n, 11);
        let at = data_offset(&ms[1]) + (64 << 10) + 512;
        let mut served = ms.clone();
        served[1] = format!("fault:{}?corrupt-at={at}", ms[1]);
        let mut s = Served::start(dir.path(), &served, &[]);
        assert!(
            read_back(dir.path(), &s, DATA) == data,
            "RAID-{level}: data differs"
        );
        let errs = checksum_errors(&status(&s));
        assert_eq!(errs.iter().sum::<u64>(), errs[1], "RAID-{level}: {errs:?}");
        if matches!(level, "5" | "6") {
            assert!(
                errs[1] > 0,
                "RAID-{level}: member 1's errors not counted: {errs:?}"
            );
        }
        // Rot that a rewrite cures: either a read met it (counted, healed)
        // or the scrub names it, exactly once in all.
        let ctl = s.control.display().to_string();
        let o = raidkit(&[
            "scrub",
            "--check-only",
            "--wait",
            "--json",
            "--control",
            &ctl,
        ]);
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        let found = v["mismatches"].as_array().unwrap();
        assert_eq!(
            errs[1] + found.len() as u64,
            1,
            "RAID-{level}: {errs:?} {v}"
        );
        assert_eq!(
            o.status.code(),
            Some(found.len() as i32),
            "RAID-{level}: {v}"
        );
        if let Some(f) = found.first() {
            assert_eq!(f["role"], 1, "RAID-{level}: {v}");
            assert_eq!(f["member_offset"], at / 4096 * 4096, "RAID-{level}: {v}");
            assert_eq!(f["kind"], "checksum", "RAID-{level}: {v}");
            assert_eq!(f["action"], "reported", "RAID-{level}: {v}");
        }
        assert_eq!(s.stop().code(), Some(0), "{}", s.log());
    }
}

#[test]
fn a_rebuild_reads_around_rotten_blocks_and_never_writes_wrong_data() {
    // A member replaced while another has a rotten block in a stripe the
    // rebuild needs: RAID-6 rebuilds it from what is left and a three-way
    // mirror copies that block from the other copy (no loss);
    // RAID-5 cannot, and the new member's block there reads as an error,
    // never as the zeroes written in its place. The rotten member is not
    // failed for one bad block, and the rebuild finishes.
    for (level, n) in [("6", 5), ("1", 3), ("5", 4)] {
        let (dir, ms, data) = array_with_data(level, n, 13);
        // Member 0 rots in chunk row 1 (data on both levels), 4 KiB in.
        let off = data_offset(&ms[0]);
        flip(&ms[0], off + (64 << 10) + 4096 + 7);
        if level != "5" {
            // And member 1 in the next block: whichever copy or source the
            // rebuild reads first has a bad block to be read around.
            flip(&ms[1], off + (64 << 10) + 8192 + 7);
        }
        // The last member is replaced by an empty file.
        let last = ms[n - 1].clone();
        std::fs::remove_file(&last).unwrap();
        let mut s = Served::start(dir.path(), &ms[..n - 1], &["--run"]);
        let ctl = s.control.display().to_string();
        ok(&["add", "--control", &ctl, &last]);
        ok(&["wait", "--timeout", "120", "--control", &ctl]);
        let st = status(&s);
        assert_eq!(st["state"], "optimal", "RAID-{level}: {st}");
        let row = 64u64 << 10;
        let width = row * (n as u64 - if level == "6" { 2 } else { 1 });
        if level != "5" {
            assert!(
                read_back(dir.path(), &s, DATA) == data,
                "RAID-{level}: data differs after the rebuild"
            );
        } else {
            // Stripe 1 of RAID-5 on 4: P on member 2, data on members 3,
            // 0, 1 (array bytes [width, 2 width)). In the column of the
            // rotten block two blocks are lost: the rebuilt member's (it
            // could not be made) and the rotten one (nothing to rebuild it
            // from): they read as errors; everything else as written.
            let lost = [width + 4096, width + row + 4096];
            for at in lost {
                let c = format!("read {at} 4096");
                let out = try_tool("qemu-io", &["-f", "raw", "-c", &c, &s.uri]);
                let text = String::from_utf8_lossy(&out.stdout).to_string()
                    + &String::from_utf8_lossy(&out.stderr);
                assert!(
                    text.contains("Input/output error"),
                    "RAID-5: a block nothing could rebuild was read at {at}: {text}"
                );
            }
            let mut from = 0;
            for to in lost.into_iter().chain([DATA as u64]) {
                assert!(
                    qemu_read(&s.uri, from, to - from) == data[from as usize..to as usize],
                    "RAID-5: data in [{from}, {to}) differs"
                );
                from = to + 4096;
            }
            // Written again, a lost block holds what was written: one at a
            // time (the other still lost in its column), each write a
            // single 4 KiB block, and the other one still an error until
            // it is written too. Nothing around them changes.
            let io_error = |at: u64, len: u64| {
                let c = format!("read {at} {len}");
                let out = try_tool("qemu-io", &["-f", "raw", "-c", &c, &s.uri]);
                String::from_utf8_lossy(&out.stderr).contains("Input/output error")
                    || String::from_utf8_lossy(&out.stdout).contains("Input/output error")
            };
            // The rotten block first (the rebuilt member's, which holds
            // zeroes, still lost), then that one.
            let order = [lost[1], lost[0]];
            for (i, at) in order.into_iter().enumerate() {
                let pattern = 0x5a + i as u8;
                let w = format!("write -P {pattern} {at} 4096");
                let out = try_tool("qemu-io", &["-f", "raw", "-c", &w, &s.uri]);
                assert!(
                    out.status.success() && !String::from_utf8_lossy(&out.stdout).contains("error"),
                    "RAID-5: writing the lost block at {at} failed: {}{}\n{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr),
                    s.log()
                );
                assert_eq!(
                    qemu_read(&s.uri, at, 4096),
                    vec![pattern; 4096],
                    "RAID-5 at {at}"
                );
                if i == 0 {
                    // Part of a block too: what parity rebuilds there
                    // cannot be checked alone, so it is checked whole.
                    for (at, len) in [(order[1] + 1024, 512), (order[1], 512)] {
                        assert!(io_error(at, len), "RAID-5: {len} bytes at {at} were read");
                    }
                    assert!(
                        io_error(order[1], 4096),
                        "RAID-5: the other lost block was read: {:?} {:?}\n{}",
                        &qemu_read(&s.uri, order[1], 4096)[..16],
                        &data[order[1] as usize..order[1] as usize + 16],
                        s.log()
                    );
                }
            }
            let mut expect = data.clone();
            for (i, at) in order.into_iter().enumerate() {
                expect[at as usize..at as usize + 4096].fill(0x5a + i as u8);
            }
            assert!(
                read_back(dir.path(), &s, DATA) == expect,
                "RAID-5: data differs after the lost blocks were written"
            );
            // The stripe's parity agrees with what is there now: a scrub
            // finds nothing to repair.
            let (code, last) = scrub(&s);
            assert_eq!(code, Some(0), "RAID-5: scrub after the writes: {last}");
            assert_eq!(last["repaired"], 0, "{last}");
            assert_eq!(last["unrepaired"], 0, "{last}");
        }
        let members = st["members"].as_array().unwrap();
        assert!(
            members.iter().all(|m| m["state"] == "active"),
            "RAID-{level}: a member was failed: {st}"
        );
        assert_eq!(s.stop().code(), Some(0), "{}", s.log());
    }
}

#[test]
fn concurrent_writes_of_one_block_leave_it_agreeing_with_its_checksum() {
    // fio at queue depth 32 over a small RAID-0 (no stripe lock orders
    // its writes): 4 KiB random writes that often hit a block another is
    // still writing. Whichever lands last, its checksum must be the one
    // recorded: afterwards every block reads back (an I/O error here is a
    // block whose checksum is of the other write).
    // On the machine's disk, with direct I/O (where it was found: a write
    // lands and its call returns a while later).
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let ms = members(dir.path(), 2);
    create("0", &ms, "2M");
    let s = Served::start(dir.path(), &ms, &["--io", "direct"]);
    let mut fio = Guarded::spawn(
        std::process::Command::new("fio")
            .args([
                "--name=w",
                "--ioengine=nbd",
                &format!("--uri={}", s.uri),
                "--rw=randwrite",
                "--bs=4k",
                "--iodepth=32",
                "--norandommap",
                "--randrepeat=0",
                "--size=256k",
                "--time_based",
                "--runtime=3",
                "--output=/dev/null",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null()),
    );
    assert!(fio
        .wait_within(std::time::Duration::from_secs(60))
        .success());
    let back = dir.path().join("back.bin");
    tool("nbdcopy", &[&s.uri, back.to_str().unwrap()]);
    let errs = checksum_errors(&status(&s));
    assert_eq!(errs, vec![0, 0], "blocks disagree with their checksums");
}

#[test]
fn writes_placed_straight_into_member_files_record_the_checksums_of_their_data() {
    // Large writes to cached pages are received from the socket straight
    // into the member files; on a checksummed array the checksums are then
    // taken from what landed there. The first pass writes sparse members
    // (the ordinary way, nothing cached), the second finds their pages
    // cached: each of its requests (nbdcopy's 256 KiB, one connection, so
    // in order) is a whole chunk row or stripe and goes in place. Then one
    // block of it is flipped before anything reads it (a first read would
    // seal a block that had no checksum): it alone is caught, and every
    // other block reads back as written without a checksum error.
    for (level, n) in [("0", 3), ("5", 5), ("6", 6)] {
        let dir = tmp();
        let ms = members(dir.path(), n);
        create(level, &ms, "16M");
        let mut s = Served::start(dir.path(), &ms, &[]);
        let io = |s: &Served, what: &str| status(s)["io"][what].as_u64().unwrap();
        let src = dir.path().join("src.bin");
        let mut data = Vec::new();
        for seed in [1, 2] {
            data = random(seed, 8 << 20);
            std::fs::write(&src, &data).unwrap();
            let (w0, m0) = (io(&s, "writes"), io(&s, "mapped_writes"));
            tool(
                "nbdcopy",
                &["--connections=1", src.to_str().unwrap(), &s.uri],
            );
            let (w, m) = (io(&s, "writes") - w0, io(&s, "mapped_writes") - m0);
            if seed == 1 {
                assert_eq!(m, 0, "RAID-{level}: sparse members written in place");
            } else {
                assert_eq!(m, w, "RAID-{level}: {m} of {w} writes in place");
            }
        }
        assert_eq!(s.stop().code(), Some(0), "{}", s.log());
        // Offline, every block (parity too, computed in place) agrees with
        // its checksum, and the parity with the data.
        let o = raidkit(&args(&["check", "--json"], &ms));
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        let findings = v["findings"].as_array().unwrap();
        assert!(
            findings.is_empty() && v["mismatches"] == 0,
            "RAID-{level}: {} findings, the first {}; {} mismatches",
            findings.len(),
            findings.first().unwrap_or(&Value::Null),
            v["mismatches"]
        );
        // The member holding the array's first chunk (md's left-symmetric
        // RAID-6 puts stripe 0's Q on member 0 and its first data chunk on
        // member 1).
        let m = usize::from(level == "6");
        flip(&ms[m], data_offset(&ms[m]) + 3 * 4096 + 100);
        let s = Served::start(dir.path(), &ms, &[]);
        if level == "0" {
            // No redundancy: the chunk with the flipped block fails, the
            // rest reads as written.
            let out = try_tool("qemu-io", &["-f", "raw", "-c", "read 0 65536", &s.uri]);
            let text = String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr);
            assert!(
                text.contains("Input/output error"),
                "RAID-0: the flipped block was read: {text}"
            );
            assert!(
                qemu_read(&s.uri, 65536, 1 << 20) == data[65536..(1 << 20) + 65536],
                "RAID-0: read back differs"
            );
        } else {
            assert!(
                read_back(dir.path(), &s, data.len()) == data,
                "RAID-{level}: read back differs"
            );
        }
        let mut want = vec![0; n];
        want[m] = 1;
        assert_eq!(
            checksum_errors(&status(&s)),
            want,
            "RAID-{level}: blocks written in place and their checksums"
        );
        drop(s);
    }
}

/// `scrub --wait` with a scrub already running (started by hand, by a
/// timer, or resumed at a start) follows it to its end and reports it
/// (it failed: "a scrub is already running").
#[test]
fn scrub_wait_follows_a_scrub_already_running() {
    let dir = tmp();
    let ms = members(dir.path(), 3);
    create("5", &ms, "32M");
    let mut s = Served::start(
        dir.path(),
        &ms,
        &["--rebuild-min", "8M", "--rebuild-max", "8M"],
    );
    let ctl = s.control.display().to_string();
    ok(&["scrub", "--control", &ctl]);
    assert!(status(&s)["scrub"].is_object(), "no scrub running");
    let (code, last) = scrub(&s);
    assert_eq!(code, Some(0), "{last}");
    assert_eq!(last["result"], "done", "{last}");
    assert_eq!(last["run"], 1, "{last}");
    assert!(status(&s)["scrub"].is_null());
    assert_eq!(s.stop().code(), Some(0), "{}", s.log());
}

/// A script tells "found something wrong" (exit 1) from "could not tell"
/// (exit 2): a scrub stopped before its end, or a check of an array with a
/// member missing, verified nothing; both exited as a clean array does
/// (scrub, 0) or as a damaged one does (check, 1).
#[test]
fn check_and_scrub_tell_an_unfinished_run_from_a_finding() {
    let dir = tmp();
    let ms = members(dir.path(), 3);
    create("5", &ms, "32M");
    let mut s = Served::start(
        dir.path(),
        &ms,
        &["--rebuild-min", "1M", "--rebuild-max", "1M"],
    );
    let ctl = s.control.display().to_string();
    let waiter = Guarded::spawn(
        Command::new(BIN)
            .args(["scrub", "--wait", "--json", "--control", &ctl])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    let t = std::time::Instant::now();
    while status(&s)["scrub"].is_null() {
        assert!(t.elapsed().as_secs() < 30, "no scrub started");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    ok(&["scrub", "--stop", "--control", &ctl]);
    let o = waiter.output_within(std::time::Duration::from_secs(60));
    let last: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    assert_eq!(last["result"], "stopped", "{last}");
    assert_eq!(
        o.status.code(),
        Some(2),
        "a stopped scrub: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    // A scrub run to its end still exits 0.
    let (code, last) = scrub(&s);
    assert_eq!((code, &last["result"]), (Some(0), &Value::from("done")));
    assert_eq!(s.stop().code(), Some(0), "{}", s.log());

    // Offline: a member missing cannot be checked (2); rot is a finding (1).
    let o = raidkit(&args(&["check"], &ms[..2]));
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    ok(&args(&["check"], &ms));
    flip(&ms[1], data_offset(&ms[1]) + 8192);
    let o = raidkit(&args(&["check"], &ms));
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The case of a tester's report, as it was run: RAID-5 of four 64 MiB
/// members (default chunk), 16 bytes of one member rotten, another member
/// replaced by an empty one; the rebuild loses the two blocks of that
/// column. After a write of one of them, a 512-byte read of the other was
/// served from parity made over it (0xff: its zeroes complemented), the
/// rebuilt member failed, and the bytes stayed. It must stay an I/O error.
#[test]
fn part_of_a_lost_block_is_never_served_from_parity() {
    let dir = tmp();
    let t = dir.path();
    let ms = members(t, 4);
    ok(&args(&["create", "--level", "5", "--size", "64M"], &ms));
    let data = random(29, 60 << 20);
    let mut s = Served::start(t, &ms, &[]);
    write_all(t, &s, &data);
    assert_eq!(s.stop().code(), Some(0), "{}", s.log());
    let off = data_offset(&ms[1]);
    for i in 0..4 {
        flip(&ms[1], off + 4202496 + 100 + 4 * i);
    }
    std::fs::remove_file(&ms[2]).unwrap();
    let up: Vec<String> = [0, 1, 3].iter().map(|&i| ms[i].clone()).collect();
    let mut s = Served::start(t, &up, &["--run"]);
    let ctl = s.control.display().to_string();
    ok(&["add", "--control", &ctl, &ms[2]]);
    ok(&["wait", "--timeout", "120", "--control", &ctl]);
    let (rotten, rebuilt) = (13115392u64, 13639680u64);
    let eio = |c: &str| {
        let out = try_tool("qemu-io", &["-f", "raw", "-c", c, &s.uri]);
        String::from_utf8_lossy(&out.stdout).contains("Input/output error")
            || String::from_utf8_lossy(&out.stderr).contains("Input/output error")
    };
    assert!(
        eio(&format!("read {rotten} 4096")),
        "the rotten block was read"
    );
    assert!(
        eio(&format!("read {rebuilt} 4096")),
        "the lost block was read"
    );
    let w = format!("write -P 90 {rotten} 4096");
    tool("qemu-io", &["-f", "raw", "-c", &w, &s.uri]);
    for (at, len) in [(rebuilt, 512), (rebuilt + 1536, 512), (rebuilt, 4096)] {
        assert!(
            eio(&format!("read {at} {len}")),
            "{len} bytes at {at} of a lost block were read: {:?}",
            &qemu_read(&s.uri, at, 16)
        );
    }
    let st = status(&s);
    assert!(
        st["members"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["state"] == "active"),
        "a member was failed: {st}"
    );
    assert_eq!(s.stop().code(), Some(0), "{}", s.log());
}

/// A member that joins with another size (a larger disk in place of a
/// failed one) has its checksum area where its own layout puts it; its
/// superblock must keep that place, or at the next start its checksums
/// are read from bytes that hold none, and a rotten block on it is served
/// as it is. Here it is the only copy left: its rot must be an I/O error.
#[test]
fn a_larger_member_keeps_its_own_checksum_area_across_a_restart() {
    let dir = tmp();
    let t = dir.path();
    let ms = members(t, 2);
    for m in &ms {
        std::fs::File::create(m).unwrap().set_len(32 << 20).unwrap();
    }
    ok(&args(&["create", "--level", "1"], &ms));
    let data = random(41, DATA);
    let mut s = Served::start(t, &ms, &[]);
    write_all(t, &s, &data);
    let ctl = s.control.display().to_string();
    ok(&["fail", "--control", &ctl, &ms[0]]);
    ok(&["remove", "--control", &ctl, &ms[0]]);
    let big = t.join("big.img").display().to_string();
    std::fs::File::create(&big)
        .unwrap()
        .set_len(256 << 20)
        .unwrap();
    ok(&["add", "--control", &ctl, &big]);
    ok(&["wait", "--timeout", "120", "--control", &ctl]);
    assert_eq!(s.stop().code(), Some(0), "{}", s.log());
    let now = vec![big.clone(), ms[1].clone()];
    let off = data_offset(&big);
    flip(&big, off + 3 * 4096 + 5);
    let mut s = Served::start(t, &now, &[]);
    let ctl = s.control.display().to_string();
    ok(&["fail", "--control", &ctl, &ms[1]]);
    let c = format!("read -v {} 4096", 3 * 4096);
    let out = try_tool("qemu-io", &["-f", "raw", "-c", &c, &s.uri]);
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    if !text.contains("Input/output error") {
        assert!(
            qemu_read(&s.uri, 3 * 4096, 4096) == data[3 * 4096..4 * 4096],
            "a rotten block of the member that joined larger was served"
        );
    }
    assert_eq!(
        checksum_errors(&status(&s)).iter().sum::<u64>(),
        1,
        "{}",
        status(&s)
    );
    assert_eq!(s.stop().code(), Some(0), "{}", s.log());
}

/// The last scrub's outcome outlives the server: after a restart,
/// `status` still says when the array was last verified and what was
/// found (as `zpool status` keeps "scan: scrub repaired ..."), with run 0
/// and the counts; the next scrub of the new run is run 1.
#[test]
fn the_last_scrub_is_remembered_across_a_restart() {
    let (dir, ms, _) = array_with_data("5", 3, 11);
    flip(&ms[1], data_offset(&ms[1]) + 4096 + 7);
    let mut s = Served::start(dir.path(), &ms, &[]);
    let (code, last) = scrub(&s);
    assert_eq!(code, Some(0), "{last:#}");
    assert_eq!(last["repaired"], 1, "{last:#}");
    assert_eq!(s.stop().code(), Some(0), "{}", s.log());

    let mut s = Served::start(dir.path(), &ms, &[]);
    let st = status(&s);
    let kept = &st["last_scrub"];
    assert_eq!(kept["run"], 0, "{st:#}");
    assert_eq!(kept["result"], "done", "{st:#}");
    assert_eq!(kept["repaired"], 1, "{st:#}");
    assert_eq!(kept["found"], 1, "{st:#}");
    assert_eq!(kept["ended"], last["ended"], "{st:#}");
    assert_eq!(kept["bytes"], last["bytes"], "{st:#}");
    let ctl = s.control.display().to_string();
    let human = String::from_utf8_lossy(&ok(&["status", "--control", &ctl]).stdout).to_string();
    assert!(human.contains("last scrub: done"), "{human}");
    let (code, next) = scrub(&s);
    assert_eq!((code, &next["run"]), (Some(0), &Value::from(1)), "{next:#}");
    assert_eq!(next["found"], 0, "{next:#}");
    assert_eq!(s.stop().code(), Some(0), "{}", s.log());
}
