//! kill -9 torture against the real server (scripts/torture.py, with
//! libnbd): acknowledged and flushed writes survive every kill, with and
//! without a member missing at the restart, with old member copies put
//! back, and after a create killed during its initial sync; and the
//! checker does see a loss when one is made on purpose.

mod common;

use common::*;
use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn kill9_torture_loses_nothing_flushed() {
    for (level, seed) in [("5", "3"), ("6", "4")] {
        let (code, out) = torture(&["--cycles", "6", "--level", level, "--seed", seed]);
        // Each cycle writes for 0.2-1.5 s; about 10000 blocks a second are
        // acknowledged on this machine: the bounds are far below that.
        assert_torture_clean(code, &out, &format!("RAID-{level}"), 6, 1000);
    }
}

#[test]
fn kill9_torture_with_old_member_copies_put_back_loses_nothing() {
    // Old copies of members (taken two cycles earlier) put back in their
    // place: each is known to be behind, never served, and resynced.
    let (code, out) = torture(&["--cycles", "8", "--old-copy", "--seed", "5"]);
    assert_eq!(code, Some(0), "{out}");
    let (cycles, acked, losses) = summary(&out).unwrap_or_else(|| panic!("{out}"));
    assert_eq!((cycles, losses), (8, 0), "{out}");
    assert!(acked >= 1000, "only {acked} blocks acknowledged:\n{out}");
    assert!(out.contains("put back"), "no old copy was put back:\n{out}");
}

#[test]
fn kill9_torture_after_create_was_killed_during_its_initial_sync() {
    // Members full of random bytes, create killed in its sync: the servers
    // resume it; once done `raidkit check` finds every stripe consistent
    // and a member left out is rebuilt right from parity.
    for (level, seed) in [("5", "7"), ("6", "8")] {
        let (code, out) = torture(&[
            "--cycles",
            "4",
            "--sync-cut",
            "--level",
            level,
            "--seed",
            seed,
        ]);
        assert_eq!(code, Some(0), "RAID-{level}:\n{out}");
        let (cycles, _, losses) = summary(&out).unwrap_or_else(|| panic!("{out}"));
        assert_eq!((cycles, losses), (4, 0), "{out}");
        assert!(
            out.contains("create killed during its initial sync"),
            "{out}"
        );
        assert!(out.contains("after the sync: check clean"), "{out}");
    }
}

#[test]
fn kill9_torture_sees_a_planted_loss() {
    // The scribbled blocks must be reported as lost (exit 1, with the count
    // in the summary), not as any other failure (exit 2).
    let (code, out) = torture(&["--cycles", "2", "--sabotage"]);
    assert_eq!(code, Some(1), "a scribbled block went unnoticed:\n{out}");
    let (_, acked, losses) = summary(&out).unwrap_or_else(|| panic!("{out}"));
    assert!(losses >= 1, "{out}");
    assert!(acked > 0, "{out}");
    assert!(!out.contains("error:"), "{out}");
}

#[test]
fn torture_script_fails_when_the_server_refuses_writes() {
    // A read-only server refuses every write (EPERM): the script must fail
    // as an error (exit 2), never report the run as passed or as losses.
    let (code, out) = torture(&["--cycles", "1", "--serve-arg=--read-only"]);
    assert_eq!(code, Some(2), "{out}");
    assert!(summary(&out).is_none(), "{out}");
}

/// kill -9 while whole stripes are being received straight into the
/// members' mappings (data first, then parity): at the next start the
/// logged intents have the parity of the interrupted stripes recomputed,
/// and the array is consistent. (Arrays without checksums: with them every
/// block goes through the checksummed path, which `kill9_torture_*` cover.)
#[test]
fn kill9_during_mapped_parity_writes_leaves_a_consistent_array() {
    for (level, n) in [("5", 4), ("6", 5)] {
        let dir = tmp();
        let ms = members(dir.path(), n);
        create_plain(level, &ms, "16M");
        let uri_of = |s: &Served| s.uri.clone();
        // A first pass puts every page in the page cache (only cached pages
        // are written through the mappings).
        let mut s = Served::start(dir.path(), &ms, &[]);
        let fio = |uri: &str, loops: &str| {
            Guarded::spawn(
                Command::new("fio")
                    .args([
                        "--name=w",
                        "--ioengine=nbd",
                        &format!("--uri={uri}"),
                        "--rw=write",
                        "--bs=1M",
                        "--iodepth=32",
                        "--size=40M",
                        &format!("--loops={loops}"),
                        "--output=/dev/null",
                    ])
                    .stderr(Stdio::null()),
            )
        };
        assert!(fio(&uri_of(&s), "1")
            .wait_within(Duration::from_secs(120))
            .success());
        let mut writer = fio(&uri_of(&s), "1000");
        let ctl = s.control.display().to_string();
        wait_for("mapped writes", 30, || {
            let st: serde_json::Value =
                serde_json::from_slice(&ok(&["status", "--control", &ctl, "--json"]).stdout)
                    .unwrap();
            st["io"]["mapped_writes"].as_u64().unwrap() > 100
        });
        s.kill9();
        writer.kill();
        // The restart replays the journal; a clean stop then leaves the
        // array clean for the offline check.
        let mut s = Served::start(dir.path(), &ms, &[]);
        assert_eq!(s.stop().code(), Some(0), "{}", s.log());
        let o = ok(&args(&["check", "--json"], &ms));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["mismatches"], 0, "RAID-{level}: {v}");
        assert!(v["checked"].as_u64().unwrap() > 0);
    }
}

#[test]
fn kill9_torture_during_a_reshape_loses_nothing_flushed() {
    // The array grown by a member in the first cycle, its reshape slowed
    // so that most kills land while data moves; at the end it has its new
    // member and size, and `raidkit check` finds every stripe consistent.
    let (code, out) = torture(&["--cycles", "10", "--grow", "--seed", "11"]);
    assert_eq!(code, Some(0), "{out}");
    let (cycles, acked, losses) = summary(&out).unwrap_or_else(|| panic!("{out}"));
    assert_eq!((cycles, losses), (10, 0), "{out}");
    assert!(acked >= 1000, "only {acked} blocks acknowledged:\n{out}");
    let during = out.matches("during the reshape").count();
    assert!(
        during >= 4,
        "only {during} kills during the reshape:\n{out}"
    );
    assert!(out.contains("after the reshape: 5 members"), "{out}");
    assert!(out.contains("after the reshape: check clean"), "{out}");
}

#[test]
fn kill9_torture_during_a_change_of_chunk_loses_nothing_flushed() {
    // The chunk changed from 64K to 16K in the first cycle, slowly, so
    // that the kills land in its batches; at the end every member holds
    // the new placement and `raidkit check` finds every stripe consistent.
    let (code, out) = torture(&["--cycles", "8", "--chunk", "16K", "--seed", "12"]);
    assert_eq!(code, Some(0), "{out}");
    let (cycles, acked, losses) = summary(&out).unwrap_or_else(|| panic!("{out}"));
    assert_eq!((cycles, losses), (8, 0), "{out}");
    assert!(acked >= 1000, "only {acked} blocks acknowledged:\n{out}");
    let during = out.matches("during the reshape").count();
    assert!(
        during >= 4,
        "only {during} kills during the reshape:\n{out}"
    );
    assert!(out.contains("after the reshape: chunk 16384"), "{out}");
    assert!(out.contains("after the reshape: 4 members"), "{out}");
    assert!(out.contains("after the reshape: check clean"), "{out}");
}

/// Mirrors with the bitmap policy, killed under random writes: the
/// resync of the marked regions at the restart goes on when a member is
/// failed in the middle of it (it stopped there, and copies that
/// disagreed were served as an optimal array), and killed again, the
/// dirty, degraded mirror starts without --force (it has no parity, so no
/// write hole). At the end every copy agrees.
#[test]
fn a_mirror_resync_goes_on_when_a_member_is_lost() {
    for (level, n) in [("1", 3), ("10", 4)] {
        let dir = tmp();
        let ms = members(dir.path(), n);
        ok(&args(
            &[
                "create",
                "--level",
                level,
                "--size",
                "64M",
                "--consistency-policy",
                "bitmap",
            ],
            &ms,
        ));
        let mut s = Served::start(dir.path(), &ms, &[]);
        let mut writer = random_writer(&s.uri, "--bsrange=4k-256k", "--iodepth=32");
        std::thread::sleep(Duration::from_secs(3));
        s.kill9();
        writer.kill();
        let slow = ["--rebuild-min", "1M", "--rebuild-max", "1M"];
        let mut s = Served::start(dir.path(), &ms, &slow);
        let ctl = s.control.display().to_string();
        let st = s.status();
        assert_eq!(
            st["recovery"]["kind"], "parity-resync",
            "RAID-{level}: {st}"
        );
        ok(&["fail", "--control", &ctl, &ms[0]]);
        std::thread::sleep(Duration::from_millis(500));
        let st = s.status();
        assert_eq!(
            st["recovery"]["kind"], "parity-resync",
            "RAID-{level}: the resync stopped when a member was failed: {st}"
        );
        s.kill9();
        // Dirty and degraded (the failed member is behind): served all the
        // same, the failed member taken back and rebuilt. Stopped before
        // the resync is done, the array is left dirty, and `stop` says so
        // (without failing).
        let s = Served::start(dir.path(), &ms, &slow);
        stopped_dirty(&s.control);
        drop(s);
        let mut s = Served::start(dir.path(), &ms, &[]);
        let ctl = s.control.display().to_string();
        ok(&["wait", "--timeout", "120", "--control", &ctl]);
        let st = s.status();
        assert_eq!(st["state"], "optimal", "RAID-{level}: {st}");
        assert_eq!(s.stop().code(), Some(0), "{}", s.log());
        let o = ok(&args(&["check", "--json"], &ms));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["mismatches"], 0, "RAID-{level}: copies disagree: {v}");
    }
}

/// kill -9 under random writes while a RAID-1 member is being replaced:
/// blocks written at the crash may differ between the member and its
/// replacement, whose checksums for them were in memory only. The
/// restart copies the replacement anew, so that at the end it agrees with
/// the other copy block for block (it resumed at its checkpoint, and the
/// resync, which makes the roles' copies agree, never looked at it).
#[test]
fn a_replacement_cut_by_a_crash_under_writes_agrees_with_its_copies() {
    let dir = tmp();
    let t = dir.path();
    let ms = members(t, 2);
    for m in &ms {
        std::fs::File::create(m).unwrap().set_len(64 << 20).unwrap();
    }
    ok(&args(&["create", "--level", "1"], &ms));
    let new = t.join("new.img").display().to_string();
    std::fs::File::create(&new)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let mut s = Served::start(t, &ms, &["--rebuild-min", "4M", "--rebuild-max", "4M"]);
    let ctl = s.control.display().to_string();
    ok(&["replace", "--control", &ctl, &ms[0], "--with", &new]);
    wait_for("a replacement checkpoint", 30, || {
        let e: serde_json::Value =
            serde_json::from_slice(&ok(&["examine", "--json", &new]).stdout).unwrap();
        e["recovery_offset"].as_u64().unwrap_or(0) >= 8 << 20
    });
    let mut writer = random_writer(&s.uri, "--bs=4k", "--iodepth=16");
    std::thread::sleep(Duration::from_millis(1500));
    s.kill9();
    writer.kill();
    let all = vec![ms[0].clone(), ms[1].clone(), new.clone()];
    let mut s = Served::start(t, &all, &[]);
    let ctl = s.control.display().to_string();
    wait_for("the replacement to finish", 120, || {
        let st = s.status();
        st["state"] == "optimal"
            && st["members"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["path"] == new.as_str() && m["state"] == "active")
    });
    ok(&["wait", "--timeout", "120", "--control", &ctl]);
    assert_eq!(s.stop().code(), Some(0), "{}", s.log());
    let o = ok(&args(&["check", "--json"], &[ms[1].clone(), new.clone()]));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["mismatches"], 0, "{v}");
}

/// fio writing at random over the first 60 MiB of `uri` (block sizes and
/// depth as given) for at most a minute; killed by its own PID.
fn random_writer(uri: &str, bs: &str, depth: &str) -> Guarded {
    Guarded::spawn(
        Command::new("fio")
            .args([
                "--name=w",
                "--ioengine=nbd",
                &format!("--uri={uri}"),
                "--rw=randwrite",
                bs,
                depth,
                "--size=60M",
                "--time_based",
                "--runtime=60",
                "--output=/dev/null",
            ])
            .stderr(Stdio::null()),
    )
}
