//! `raidkit grow` against the real server: clients (fio verifying its own
//! writes all along, nbdcopy, nbdinfo) work through the whole reshape, the
//! new size is exported when it ends, a member failed in the middle of it
//! is survived, the chunk changes in place, and every change that is not
//! supported is refused with nothing changed.

mod common;

use common::*;
use std::path::Path;
use std::process::Command;

/// fio over NBD writing `[offset, offset + size)` with crc32c in every
/// block, checking blocks it wrote while it writes (verify_backlog) and all
/// of them at the end: for `seconds` if given, else one pass over every
/// block.
fn fio(uri: &str, offset: &str, size: &str, seconds: Option<u64>) -> Command {
    let mut c = Command::new("timeout");
    c.args([
        "240",
        "fio",
        "--name=grow",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--rw=randwrite",
        "--bs=16k",
        "--iodepth=8",
        &format!("--offset={offset}"),
        &format!("--size={size}"),
        "--verify=crc32c",
        "--verify_backlog=256",
        "--verify_fatal=1",
        "--verify_state_save=0",
        "--randseed=9",
    ]);
    if let Some(s) = seconds {
        c.args(["--time_based", &format!("--runtime={s}")]);
    }
    c
}

/// One pass of fio's blocks over the region, run to its end. A later
/// `verify_only` reads every block of the region (its dry run is one whole
/// pass), while a writer bounded by time may not reach them all on a busy
/// machine: the blocks it left would hold no fio header.
fn fill(uri: &str, offset: &str, size: &str) {
    let o = output_within(&mut fio(uri, offset, size, None), DEADLINE);
    assert!(
        o.status.success(),
        "fio's filling pass failed: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// fio reads the region back, read only: every block holds what fio last
/// wrote there (`why` tells the failure's circumstances; fio names the
/// block that failed, and why, on stderr).
fn verify(uri: &str, offset: &str, size: &str, why: impl Fn() -> String) {
    let v = output_within(
        fio(uri, offset, size, Some(2)).args(["--rw=randread", "--verify_only"]),
        DEADLINE,
    );
    assert!(
        v.status.success(),
        "{}: {}\n{}",
        why(),
        String::from_utf8_lossy(&v.stdout),
        String::from_utf8_lossy(&v.stderr)
    );
}

fn export_size(uri: &str) -> u64 {
    let o = tool("nbdinfo", &["--size", uri]);
    String::from_utf8_lossy(&o.stdout).trim().parse().unwrap()
}

/// `len` bytes of xorshift from `seed` (not 0).
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = seed;
    (0..len)
        .map(|_| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng as u8
        })
        .collect()
}

fn random_file(path: &Path, len: usize) {
    std::fs::write(path, noise(0x9e37_79b9_7f4a_7c15, len)).unwrap();
}

/// `grow --level LEVEL --add MEMBER`: the reply says the level, the
/// member count and the new size.
fn grow_level(ctl: &str, level: &str, member: &str, members: u64, new_size: Option<u64>) {
    let out = ok(&[
        "grow",
        "--json",
        "--control",
        ctl,
        "--level",
        level,
        "--add",
        member,
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["level"], format!("raid{level}"), "{v}");
    assert_eq!(v["members"], members, "{v}");
    assert_eq!(v["new_size"].as_u64(), new_size, "{v}");
}

/// Member files (`used` of `all`) of a new `level` array of `size` each,
/// served with the rebuild throttled to `rate`, its first `data` bytes
/// random ones kept in the file returned.
fn served_with_data(
    dir: &Path,
    level: &str,
    (used, all): (usize, usize),
    size: &str,
    rate: &str,
    data: usize,
) -> (Vec<String>, Served, std::path::PathBuf) {
    let ms = members(dir, all);
    create(level, &ms[..used], size);
    let s = Served::start(
        dir,
        &ms[..used],
        &["--rebuild-min", rate, "--rebuild-max", rate],
    );
    let file = dir.join("data");
    random_file(&file, data);
    tool("nbdcopy", &[&file.display().to_string(), &s.uri, "--flush"]);
    (ms, s, file)
}

#[test]
fn grow_while_fio_verifies_and_the_new_size_comes_at_the_end() {
    let dir = tmp();
    // Known data in the first 64 MiB, fio's own in the 32 MiB after.
    let (ms, mut s, file) = served_with_data(dir.path(), "5", (4, 5), "48M", "16M", 64 << 20);
    let ctl = s.control.display().to_string();
    let before = export_size(&s.uri);
    fill(&s.uri, "64m", "32m");
    let mut writer = Guarded::spawn(&mut fio(&s.uri, "64m", "32m", Some(12)));
    std::thread::sleep(std::time::Duration::from_millis(500));
    let out = ok(&["grow", "--json", "--control", &ctl, "--add", &ms[4]]);
    let grown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(grown["members"], 5);
    assert_eq!(grown["size"].as_u64(), Some(before));
    let after = grown["new_size"].as_u64().unwrap();
    assert!(after > before);
    // While it runs: the process is a reshape, both sizes are shown, and
    // new connections still see the old size.
    let st = s.status();
    assert_eq!(st["recovery"]["kind"], "reshape", "{st}");
    assert_eq!(st["state"], "reshaping");
    assert_eq!(st["reshape"]["new_size"].as_u64(), Some(after));
    assert_eq!(st["array"]["size"].as_u64(), Some(before));
    assert_eq!(export_size(&s.uri), before);
    let human = String::from_utf8_lossy(&ok(&["status", "--control", &ctl]).stdout).to_string();
    assert!(human.contains("reshape: growing to 5 members"), "{human}");
    // One member tells it too (it said nothing of a reshape).
    let e: serde_json::Value =
        serde_json::from_slice(&ok(&["examine", "--json", &ms[0]]).stdout).unwrap();
    assert_eq!(
        (&e["raid_disks"], &e["reshape"]["old_raid_disks"]),
        (&5.into(), &4.into()),
        "{e}"
    );
    let human = String::from_utf8_lossy(&ok(&["examine", &ms[0]]).stdout).to_string();
    assert!(human.contains("Reshape : from 4 to 5 members"), "{human}");
    // Another grow, an add into a role, a replace: refused meanwhile.
    fails(
        &[
            "grow",
            "--control",
            &ctl,
            "--add",
            &dir.path().join("x.img").display().to_string(),
        ],
        "already in progress",
    );
    fails(
        &[
            "replace",
            "--control",
            &ctl,
            &ms[0],
            "--with",
            &dir.path().join("y.img").display().to_string(),
        ],
        "reshape is in progress",
    );
    // A scrub too, and said so (it spoke of a rebuild or resync).
    fails(&["scrub", "--control", &ctl], "a reshape is in progress");
    let w = writer.wait_within(std::time::Duration::from_secs(120));
    assert!(
        w.success(),
        "fio failed its verification during the reshape"
    );
    ok(&["wait", "--control", &ctl]);
    let st = s.status();
    assert!(st["reshape"].is_null(), "{st}");
    assert_eq!(st["last_recovery"]["kind"], "reshape", "{st}");
    let e: serde_json::Value =
        serde_json::from_slice(&ok(&["examine", "--json", &ms[0]]).stdout).unwrap();
    assert!(e["reshape"].is_null(), "{e}");
    assert_eq!(st["last_recovery"]["result"], "done", "{st}");
    assert_eq!(st["array"]["size"].as_u64(), Some(after));
    assert_eq!(export_size(&s.uri), after);
    // fio checks its region once more, read only, after the reshape.
    verify(&s.uri, "64m", "32m", || "after the reshape".into());
    // Data written before the grow is intact; the new space reads back
    // zeroes.
    let back = dir.path().join("back");
    tool("nbdcopy", &[&s.uri, &back.display().to_string()]);
    let got = std::fs::read(&back).unwrap();
    assert_eq!(got.len() as u64, after);
    assert!(
        got[..64 << 20] == std::fs::read(&file).unwrap()[..],
        "data written before the grow changed"
    );
    assert!(got[before as usize..].iter().all(|&b| b == 0));
    assert!(s.stop().success());
    ok(&args(&["check"], &ms));
    let d: serde_json::Value =
        serde_json::from_slice(&ok(&args(&["detail", "--json"], &ms)).stdout).unwrap();
    assert_eq!(
        d["size"].as_u64().or(d["array"]["size"].as_u64()),
        Some(after),
        "{d}"
    );
}

#[test]
fn a_member_failed_during_a_reshape_is_survived() {
    let dir = tmp();
    let ms = members(dir.path(), 6);
    create("6", &ms[..4], "32M");
    let mut s = Served::start(
        dir.path(),
        &ms[..4],
        &["--rebuild-min", "8M", "--rebuild-max", "8M"],
    );
    let ctl = s.control.display().to_string();
    let file = dir.path().join("data");
    random_file(&file, 48 << 20);
    tool("nbdcopy", &[&file.display().to_string(), &s.uri, "--flush"]);
    ok(&["grow", "--control", &ctl, "--add", &ms[4]]);
    wait_for("the reshape to move some data", 30, || {
        s.status()["recovery"]["bytes_done"].as_u64().unwrap_or(0) > 8 << 20
    });
    // A member of the old ones fails: the reshape goes on degraded; a
    // member added meanwhile waits as a spare and is rebuilt after it.
    ok(&["fail", "--control", &ctl, &ms[1]]);
    let added = ok(&["add", "--json", "--control", &ctl, &ms[5]]);
    let added: serde_json::Value = serde_json::from_slice(&added.stdout).unwrap();
    assert_eq!(added["as"], "spare", "{added}");
    assert_eq!(s.status()["recovery"]["kind"], "reshape");
    ok(&[
        "speed",
        "--control",
        &ctl,
        "--rebuild-min",
        "0",
        "--rebuild-max",
        "0",
    ]);
    wait_for("the reshape and the rebuild after it", 120, || {
        let st = s.status();
        st["state"] == "optimal" && st["reshape"].is_null()
    });
    let back = dir.path().join("back");
    tool("nbdcopy", &[&s.uri, &back.display().to_string()]);
    assert!(std::fs::read(&back).unwrap()[..48 << 20] == std::fs::read(&file).unwrap()[..]);
    assert!(s.stop().success());
    let now: Vec<String> = ms
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 1)
        .map(|(_, m)| m.clone())
        .collect();
    ok(&args(&["check"], &now));
}

#[test]
fn grow_refuses_what_it_cannot_do_and_changes_nothing() {
    let dir = tmp();
    let ms = members(dir.path(), 3);
    create("1", &ms[..2], "16M");
    let s = Served::start(dir.path(), &ms[..2], &[]);
    let ctl = s.control.display().to_string();
    let before = s.status();
    fails(
        &["grow", "--control", &ctl, "--add", &ms[2]],
        "RAID-1 gains copies",
    );
    fails(
        &["grow", "--control", &ctl, "--chunk", "128K"],
        "no chunk to change",
    );
    // The members have not grown; and `max` is the one size there is.
    fails(&["grow", "--control", &ctl, "--size", "max"], "no room");
    // Grown past what the checksum area made at create has entries for.
    set_lengths(&ms[..2], 128 << 20);
    fails(
        &["grow", "--control", &ctl, "--size", "max"],
        "checksum area",
    );
    fails(&["grow", "--control", &ctl, "--size", "20M"], "takes `max`");
    fails(
        &["grow", "--control", &ctl, "--size", "max", "--add", &ms[2]],
        "a change of its own",
    );
    fails(
        &["grow", "--control", &ctl, "--level", "6"],
        "not supported",
    );
    fails(
        &["grow", "--control", &ctl, "--level", "1"],
        "already raid1",
    );
    fails(&["grow", "--control", &ctl], "--add");
    let after = s.status();
    assert_eq!(before["array"], after["array"]);
    assert_eq!(after["members"].as_array().unwrap().len(), 2);
    // The member file grow created for the refused add is gone again.
    assert!(!Path::new(&ms[2]).exists());
    // The refused `--size max` used none of the room it looked at: the
    // files cut back to their size at create, the array goes on (members
    // that had taken the 128 MiB as theirs found their files "shrunk" at
    // the next write or flush and were failed, both).
    set_lengths(&ms[..2], 16 << 20);
    let data = dir.path().join("data");
    random_file(&data, 1 << 20);
    tool("nbdcopy", &[&data.display().to_string(), &s.uri]);
    let st = s.status();
    let members = st["members"].as_array().unwrap();
    assert!(
        members.len() == 2 && members.iter().all(|m| m["state"] == "active"),
        "{st}"
    );
    let back = dir.path().join("back");
    tool("nbdcopy", &[&s.uri, &back.display().to_string()]);
    assert!(std::fs::read(&back).unwrap()[..1 << 20] == std::fs::read(&data).unwrap()[..]);
}

#[test]
fn a_mirror_and_a_raid4_become_raid5_and_grow_while_fio_verifies() {
    // The classic path: a mirror of two disks, a third bought; and a
    // RAID-4 whose parity disk is its bottleneck, a fourth bought. The
    // level changes in place (no byte moves), then the array grows by the
    // disk, while fio writes and verifies in its second half.
    for (level, n, grown) in [("1", 2, 2), ("4", 3, 3)] {
        let dir = tmp();
        let ms = members(dir.path(), n + 1);
        create(level, &ms[..n], "32M");
        let mut s = Served::start(
            dir.path(),
            &ms[..n],
            &["--rebuild-min", "8M", "--rebuild-max", "8M"],
        );
        let ctl = s.control.display().to_string();
        let before = export_size(&s.uri);
        // Known data in the first half, fio's own in the second.
        let half = before / 2;
        let file = dir.path().join("data");
        random_file(&file, half as usize);
        tool("nbdcopy", &[&file.display().to_string(), &s.uri, "--flush"]);
        let (fio_at, fio_len) = (half.to_string(), (before - half).to_string());
        fill(&s.uri, &fio_at, &fio_len);
        let mut writer = Guarded::spawn(&mut fio(&s.uri, &fio_at, &fio_len, Some(8)));
        std::thread::sleep(std::time::Duration::from_millis(500));
        let after = before / (grown - 1) * grown;
        grow_level(&ctl, "5", &ms[n], n as u64 + 1, Some(after));
        assert_eq!(s.status()["recovery"]["kind"], "reshape", "RAID-{level}");
        assert!(
            writer
                .wait_within(std::time::Duration::from_secs(120))
                .success(),
            "RAID-{level}: fio failed its verification during the change"
        );
        ok(&["wait", "--control", &ctl]);
        let st = s.status();
        assert_eq!(st["array"]["level"], "raid5", "RAID-{level}: {st}");
        assert_eq!(st["array"]["size"].as_u64(), Some(after), "RAID-{level}");
        assert_eq!(st["last_recovery"]["result"], "done", "RAID-{level}: {st}");
        verify(&s.uri, &fio_at, &fio_len, || {
            format!("RAID-{level}: after the change: {}", s.status())
        });
        let back = dir.path().join("back");
        tool("nbdcopy", &[&s.uri, &back.display().to_string()]);
        let got = std::fs::read(&back).unwrap();
        assert!(
            got[..half as usize] == std::fs::read(&file).unwrap()[..],
            "RAID-{level}: data written before the change differs"
        );
        assert!(
            got[before as usize..].iter().all(|&b| b == 0),
            "RAID-{level}: the new space does not read back zeroes"
        );
        assert!(s.stop().success());
        ok(&args(&["check"], &ms));
        let d: serde_json::Value =
            serde_json::from_slice(&ok(&args(&["detail", "--json"], &ms)).stdout).unwrap();
        assert_eq!(d["level"], "raid5", "RAID-{level}: {d}");
        assert_eq!(d["raid_disks"], n + 1, "RAID-{level}: {d}");
    }
}

#[test]
fn a_raid5_becomes_a_raid6_with_one_new_disk_while_fio_verifies() {
    // A RAID-5 of three, a fourth disk bought for a second parity: no
    // byte of the old members moves (md's "-6" layout, Q on the new
    // disk), Q is built while fio writes and verifies, and the array then
    // survives losing any two.
    let dir = tmp();
    let (ms, mut s, file) = served_with_data(dir.path(), "5", (3, 5), "32M", "8M", 32 << 20);
    let ctl = s.control.display().to_string();
    let size = export_size(&s.uri);
    // Two new members: refused, nothing changes, no file left behind.
    fails(
        &[
            "grow",
            "--control",
            &ctl,
            "--level",
            "6",
            "--add",
            &ms[3],
            "--add",
            &ms[4],
        ],
        "exactly one new member",
    );
    assert_eq!(s.status()["array"]["level"], "raid5");
    assert!(!Path::new(&ms[3]).exists() && !Path::new(&ms[4]).exists());
    fill(&s.uri, "32m", "24m");
    let mut writer = Guarded::spawn(&mut fio(&s.uri, "32m", "24m", Some(8)));
    std::thread::sleep(std::time::Duration::from_millis(500));
    grow_level(&ctl, "6", &ms[3], 4, Some(size));
    let st = s.status();
    assert_eq!(st["array"]["layout"], "left-symmetric-6", "{st}");
    assert_eq!(st["recovery"]["kind"], "rebuild", "{st}");
    let w = writer.wait_within(std::time::Duration::from_secs(120));
    assert!(w.success(), "fio failed its verification while Q was built");
    ok(&[
        "speed",
        "--control",
        &ctl,
        "--rebuild-min",
        "0",
        "--rebuild-max",
        "0",
    ]);
    ok(&["wait", "--control", &ctl]);
    assert_eq!(s.status()["state"], "optimal");
    assert_eq!(export_size(&s.uri), size);
    verify(&s.uri, "32m", "24m", || "after Q was built".into());
    assert!(s.stop().success());
    ok(&args(&["check"], &ms[..4]));
    let d: serde_json::Value =
        serde_json::from_slice(&ok(&args(&["detail", "--json"], &ms[..4])).stdout).unwrap();
    assert_eq!(d["level"], "raid6", "{d}");
    assert_eq!(d["raid_disks"], 4, "{d}");
    // Any two gone (here an old member and the new one): every byte of
    // the data written before reads back.
    let two_left = [ms[0].clone(), ms[2].clone()];
    let back = dir.path().join("back");
    ok(&args(
        &[
            "read",
            "-o",
            "0",
            "-n",
            "32M",
            "--out",
            &back.display().to_string(),
        ],
        &two_left,
    ));
    assert!(std::fs::read(&back).unwrap() == std::fs::read(&file).unwrap());
}

/// Make 16 MiB member files 40 MiB long, the new part holding what a
/// bigger disk holds where it was never written: not zeroes, and not
/// consistent parity.
/// Make each member file `len` bytes long (grown with a hole, or cut).
fn set_lengths(ms: &[String], len: u64) {
    for m in ms {
        std::fs::OpenOptions::new()
            .write(true)
            .open(m)
            .unwrap()
            .set_len(len)
            .unwrap();
    }
}

fn grow_members(ms: &[String]) {
    use std::os::unix::fs::FileExt;
    for (i, m) in ms.iter().enumerate() {
        let junk = noise(0x2545_f491_4f6c_dd1d ^ i as u64, 24 << 20);
        let f = std::fs::OpenOptions::new().write(true).open(m).unwrap();
        f.write_all_at(&junk, 16 << 20).unwrap();
    }
}

#[test]
fn members_that_grew_are_used_online_with_size_max_while_fio_verifies() {
    // Each level that can: the member files are made longer under the
    // running server, `grow --size max` takes the room at once (no data
    // moves), new connections see the new size, fio keeps verifying in
    // the old space meanwhile and then writes and verifies the new space
    // while its redundancy is made consistent in the background; data
    // written before is intact, and offline the array checks clean and
    // keeps its size.
    for (level, n) in [("0", 3), ("1", 2), ("5", 4), ("6", 5), ("10", 4)] {
        let dir = tmp();
        let (ms, mut s, file) = served_with_data(dir.path(), level, (n, n), "16M", "16M", 4 << 20);
        let ctl = s.control.display().to_string();
        let before = export_size(&s.uri);
        if level == "5" {
            // A spare that did not grow could never take a role of the
            // grown array: refused until it is removed.
            let spare = dir.path().join("spare.img").display().to_string();
            ok(&["add", "--control", &ctl, &spare]);
            grow_members(&ms);
            fails(&["grow", "--control", &ctl, "--size", "max"], "spare");
            assert_eq!(export_size(&s.uri), before);
            ok(&["remove", "--control", &ctl, &spare]);
        }
        grow_members(&ms);
        let old_space = (before - (4 << 20)).to_string();
        let mut writer = Guarded::spawn(&mut fio(&s.uri, "4m", &old_space, Some(6)));
        std::thread::sleep(std::time::Duration::from_millis(500));
        let out = ok(&["grow", "--json", "--control", &ctl, "--size", "max"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["size"].as_u64(), Some(before), "RAID-{level}: {v}");
        assert_eq!(v["members"], n, "RAID-{level}: {v}");
        let after = v["new_size"].as_u64().unwrap();
        assert!(after > before * 2, "RAID-{level}: {before} -> {after}");
        assert_eq!(export_size(&s.uri), after, "RAID-{level}");
        // fio writes the first half of the new space, every block once;
        // the rest keeps what the disks held, which the resync must make
        // consistent.
        let new_space = ((after - before) / 2).to_string();
        let mut grower = Guarded::spawn(&mut fio(&s.uri, &before.to_string(), &new_space, None));
        assert!(
            writer
                .wait_within(std::time::Duration::from_secs(120))
                .success(),
            "RAID-{level}: fio failed its verification in the old space"
        );
        assert!(
            grower
                .wait_within(std::time::Duration::from_secs(120))
                .success(),
            "RAID-{level}: fio failed its verification in the new space"
        );
        ok(&["wait", "--control", &ctl]);
        let st = s.status();
        assert_eq!(st["array"]["size"].as_u64(), Some(after), "RAID-{level}");
        if level != "0" {
            assert_eq!(st["last_recovery"]["result"], "done", "RAID-{level}: {st}");
        }
        let new_space_holds_fio_blocks = |s: &Served| {
            verify(&s.uri, &before.to_string(), &new_space, || {
                format!("RAID-{level}: {}", s.status())
            })
        };
        new_space_holds_fio_blocks(&s);
        let back = dir.path().join("back");
        tool("nbdcopy", &[&s.uri, &back.display().to_string()]);
        assert!(
            std::fs::read(&back).unwrap()[..4 << 20] == std::fs::read(&file).unwrap()[..],
            "RAID-{level}: data written before the grow changed"
        );
        assert!(s.stop().success());
        let c: serde_json::Value =
            serde_json::from_slice(&ok(&args(&["check", "--json"], &ms)).stdout).unwrap();
        assert!(
            c["findings"].as_array().is_some_and(|f| f.is_empty()) && c["mismatches"] == 0,
            "RAID-{level}: {c}"
        );
        // A restart assembles the grown array, the new space's data kept.
        let s = Served::start(dir.path(), &ms, &[]);
        assert_eq!(export_size(&s.uri), after, "RAID-{level}");
        new_space_holds_fio_blocks(&s);
        drop(s);
    }
}

#[test]
fn the_chunk_changes_while_fio_verifies_and_a_member_fails_midway() {
    for (level, policy, from, to, fail) in [
        ("5", "journal", "512K", "64K", true),
        ("6", "bitmap", "64K", "256K", true),
        ("0", "none", "128K", "32K", false),
    ] {
        let dir = tmp();
        let all = members(dir.path(), 6);
        let (ms, spare) = (&all[..5], &all[5]);
        ok(&args(
            &[
                "create",
                "--level",
                level,
                "--chunk",
                from,
                "--consistency-policy",
                policy,
                "--size",
                "48M",
            ],
            ms,
        ));
        let mut s = Served::start(
            dir.path(),
            ms,
            &["--rebuild-min", "24M", "--rebuild-max", "24M"],
        );
        let ctl = s.control.display().to_string();
        let size = export_size(&s.uri);
        // Known data in the first half, fio's own in the second.
        let half = (size / 2) as usize;
        let file = dir.path().join("data");
        random_file(&file, half);
        tool("nbdcopy", &[&file.display().to_string(), &s.uri, "--flush"]);
        let (fio_at, fio_len) = (half.to_string(), ((size as usize - half) / 2).to_string());
        fill(&s.uri, &fio_at, &fio_len);
        let mut writer = Guarded::spawn(&mut fio(&s.uri, &fio_at, &fio_len, Some(8)));
        std::thread::sleep(std::time::Duration::from_millis(500));
        let out = ok(&["grow", "--json", "--control", &ctl, "--chunk", to]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let want = |c: &str| c.trim_end_matches('K').parse::<u64>().unwrap() << 10;
        assert_eq!(v["chunk"].as_u64(), Some(want(to)), "{v}");
        assert_eq!(v["old_chunk"].as_u64(), Some(want(from)), "{v}");
        assert_eq!(v["new_size"].as_u64(), Some(size), "{v}");
        let st = s.status();
        assert_eq!(st["recovery"]["kind"], "reshape", "{st}");
        let human = String::from_utf8_lossy(&ok(&["status", "--control", &ctl]).stdout).to_string();
        assert!(
            human.contains(&format!(
                "reshape: changing the chunk from {}.00 KiB to {}.00 KiB",
                want(from) >> 10,
                want(to) >> 10
            )),
            "{human}"
        );
        assert_eq!(st["reshape"]["chunk"].as_u64(), Some(want(to)), "{st}");
        fails(
            &["grow", "--control", &ctl, "--chunk", from],
            "already in progress",
        );
        if fail {
            wait_for("the reshape to move some data", 60, || {
                s.status()["recovery"]["bytes_done"].as_u64().unwrap_or(0) > 4 << 20
            });
            ok(&["fail", "--control", &ctl, &ms[2]]);
            let st = s.status();
            assert_eq!(
                st["recovery"]["kind"], "reshape",
                "failed after the change: {st}"
            );
        }
        let w = writer.wait_within(std::time::Duration::from_secs(120));
        assert!(
            w.success(),
            "level {level}: fio failed its verification during the change"
        );
        ok(&["wait", "--control", &ctl, "--timeout", "120"]);
        if fail {
            // A new disk for the failed one: rebuilt in the new chunk.
            ok(&["add", "--control", &ctl, spare]);
            ok(&["wait", "--control", &ctl, "--timeout", "120"]);
            assert_eq!(s.status()["state"], "optimal");
        }
        let st = s.status();
        assert!(st["reshape"].is_null(), "{st}");
        assert_eq!(st["last_recovery"]["result"], "done", "{st}");
        assert_eq!(st["array"]["chunk"].as_u64(), Some(want(to)), "{st}");
        assert_eq!(export_size(&s.uri), size);
        verify(&s.uri, &fio_at, &fio_len, || {
            format!("level {level}: after the change: {}", s.status())
        });
        let back = dir.path().join("back");
        tool("nbdcopy", &[&s.uri, &back.display().to_string()]);
        assert!(
            std::fs::read(&back).unwrap()[..half] == std::fs::read(&file).unwrap()[..],
            "level {level}: data written before the change differs"
        );
        assert!(s.stop().success());
        let left: Vec<String> = all
            .iter()
            .enumerate()
            .filter(|&(i, _)| if fail { i != 2 } else { i != 5 })
            .map(|(_, m)| m.clone())
            .collect();
        ok(&args(&["check"], &left));
        let d: serde_json::Value =
            serde_json::from_slice(&ok(&args(&["detail", "--json"], &left)).stdout).unwrap();
        assert_eq!(
            d["chunk"].as_u64().or(d["array"]["chunk"].as_u64()),
            Some(want(to)),
            "{d}"
        );
    }
}

#[test]
fn a_member_added_after_a_size_max_keeps_its_checksums_out_of_the_journal() {
    // A RAID-5 whose members grew (`--size max`) gets a member as large as
    // they now are: an area sized for all of it is larger than theirs. Carved from the end of its metadata area as on a new array,
    // it reached down into the journal, which lies at the same offsets on
    // every member: partial-stripe writes (journaled) overwrote the new
    // member's checksums, and after a restart its blocks read as rotten.
    let dir = tmp();
    let t = dir.path();
    let ms = members(t, 4);
    ok(&args(
        &["create", "--level", "5", "--chunk", "64K", "--size", "32M"],
        &ms[..3],
    ));
    for m in &ms {
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(m)
            .unwrap()
            .set_len(65 << 20)
            .unwrap();
    }
    let mut s = Served::start(t, &ms[..3], &[]);
    let ctl = s.control.display().to_string();
    ok(&["grow", "--control", &ctl, "--size", "max"]);
    ok(&["wait", "--control", &ctl, "--timeout", "120"]);
    ok(&["grow", "--control", &ctl, "--add", &ms[3]]);
    ok(&["wait", "--control", &ctl, "--timeout", "120"]);
    // Writes of part of a stripe, each a journal record: the journal
    // wraps several times.
    let mut a = vec![
        "60".to_string(),
        "qemu-io".into(),
        "-f".into(),
        "raw".into(),
    ];
    for i in 0..400u64 {
        a.push("-c".into());
        a.push(format!(
            "write -P {} {} 9000",
            i % 251,
            i * (192 << 10) + 512
        ));
    }
    a.push(s.uri.clone());
    tool("timeout", &a.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(s.stop().success(), "{}", s.log());
    let c: serde_json::Value =
        serde_json::from_slice(&ok(&args(&["check", "--json"], &ms)).stdout).unwrap();
    assert!(
        c["findings"].as_array().is_some_and(|f| f.is_empty()) && c["mismatches"] == 0,
        "{c}"
    );
    let area = |m: &str| {
        let e: serde_json::Value =
            serde_json::from_slice(&ok(&["examine", "--json", m]).stdout).unwrap();
        e["checksums"]["offset"]
            .as_u64()
            .unwrap_or_else(|| panic!("{e}"))
    };
    assert!(
        area(&ms[3]) >= area(&ms[0]),
        "{} {}",
        area(&ms[3]),
        area(&ms[0])
    );
}
