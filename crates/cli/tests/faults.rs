//! Member faults against the real server, with real clients: fio verifying
//! while members fail, spares rebuild and new members are added; kill -9 in
//! the middle of a rebuild; re-add by bitmap; members that return read
//! errors, vanish or stall; an array that fails safe and comes back by force.

mod common;

use common::*;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn status(s: &Served) -> Value {
    let ctl = s.control.display().to_string();
    serde_json::from_slice(&ok(&["status", "--control", &ctl, "--json"]).stdout).unwrap()
}

fn ctl(s: &Served, cmd: &[&str]) -> std::process::Output {
    let c = s.control.display().to_string();
    let mut a: Vec<&str> = cmd.to_vec();
    a.extend(["--control", &c]);
    ok(&a)
}

fn member_state(st: &Value, role: u64) -> String {
    st["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == role && m["state"] != "faulty")
        .map(|m| m["state"].as_str().unwrap().to_string())
        .unwrap_or_default()
}

/// The entry of the member in `role` (the first listed for it).
fn member(st: &Value, role: u64) -> Value {
    st["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == role)
        .unwrap_or_else(|| panic!("no member in role {role}: {st}"))
        .clone()
}

fn blank(dir: &Path, name: &str, size: u64) -> String {
    let p = dir.join(name);
    std::fs::File::create(&p).unwrap().set_len(size).unwrap();
    p.display().to_string()
}

fn check_offline(ms: &[String]) {
    let o = ok(&args(&["check", "--json"], ms));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["mismatches"], 0, "{v}");
    assert!(v["checked"].as_u64().unwrap() > 0);
    // Every stripe was checked: as many as a member's data area holds
    // chunks (whether `check` can fail at all is shown in cli.rs).
    let e: Value = serde_json::from_slice(&ok(&["examine", "--json", &ms[0]]).stdout).unwrap();
    let stripes = e["data_size"].as_u64().unwrap() / e["chunk"].as_u64().unwrap();
    assert_eq!(v["checked"], stripes, "{v}");
}

#[test]
fn fio_verifies_on_raid6_through_fail_spare_fail_add() {
    let dir = tmp();
    let ms = members(dir.path(), 5);
    let spare = dir.path().join("spare.img").display().to_string();
    ok(&args(
        &[
            "create",
            "--level",
            "6",
            "--size",
            "40M",
            "--chunk",
            "64K",
            "--spare",
            &spare,
            "--bitmap-region",
            "1M",
        ],
        &ms,
    ));
    let mut all = ms.clone();
    all.push(spare.clone());
    let mut s = Served::start(dir.path(), &all, &["--rebuild-min", "0"]);
    assert_eq!(member_state(&status(&s), 0), "active");
    let out = dir.path().join("fio.json");
    // Four connections writing at a bounded rate, so that the faults below
    // land while they run; every block is verified (as it goes and at the end).
    let mut fio = Guarded::spawn(
        Command::new("fio")
            .args([
                "--name=faults",
                "--ioengine=nbd",
                &format!("--uri={}", s.uri),
                "--rw=randwrite",
                "--bsrange=4k-64k",
                "--iodepth=8",
                "--numjobs=4",
                "--size=16M",
                "--offset_increment=16M",
                "--rate=3m",
                "--verify=crc32c",
                "--verify_backlog=256",
                "--do_verify=1",
                "--verify_fatal=1",
                // No verify state file left in the working directory.
                "--verify_state_save=0",
                "--group_reporting",
                "--output-format=json",
                &format!("--output={}", out.display()),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    );
    std::thread::sleep(Duration::from_secs(1));

    // First failure: the hot spare takes over and is rebuilt.
    ctl(&s, &["fail", &ms[1]]);
    let st = status(&s);
    assert_eq!(member_state(&st, 1), "rebuilding", "{st}");
    assert!(
        st["state"] == "rebuilding" || st["state"] == "optimal",
        "{st}"
    );
    ctl(&s, &["wait", "--timeout", "120"]);
    let st = status(&s);
    assert_eq!(st["state"], "optimal", "{st}");
    assert_eq!(st["last_recovery"]["kind"], "rebuild");
    assert_eq!(st["last_recovery"]["result"], "done");
    assert_eq!(st["members"][1]["path"], spare.as_str());

    // Second failure: no spare left; a new member is added and rebuilt.
    ctl(&s, &["fail", "3"]);
    assert_eq!(status(&s)["state"], "degraded");
    ctl(&s, &["remove", &ms[3]]);
    let fresh = blank(dir.path(), "new.img", 40 << 20);
    ctl(&s, &["add", &fresh]);
    assert!(
        fio.try_wait().is_none(),
        "fio finished before the faults: the test did not overlap them"
    );
    ctl(&s, &["wait", "--timeout", "120"]);
    let st = status(&s);
    assert_eq!(st["state"], "optimal", "{st}");
    assert_eq!(st["members"][3]["path"], fresh.as_str());
    assert_eq!(st["last_recovery"]["result"], "done");

    let fio_out = fio.output_within(Duration::from_secs(300));
    assert!(
        fio_out.status.success(),
        "fio failed: {}",
        String::from_utf8_lossy(&fio_out.stderr)
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let job = &v["jobs"][0];
    assert_eq!(job["error"], 0, "fio reported an error");
    assert!(job["write"]["io_bytes"].as_u64().unwrap() >= 64 << 20);
    assert!(job["read"]["io_bytes"].as_u64().unwrap() >= 64 << 20);
    assert_eq!(status(&s)["io"]["errors"], 0);
    assert_eq!(s.stop().code(), Some(0), "{}", s.log());

    // Every member agrees with the data (P and Q recomputed independently).
    let now = vec![ms[0].clone(), spare, ms[2].clone(), fresh, ms[4].clone()];
    check_offline(&now);
}

/// Create a `level` array over `ms` (64 MiB members) and write `mib` MiB
/// of a pattern (`shift` varies it) offline; returns the pattern.
fn created_with_pattern(dir: &Path, ms: &[String], level: &str, mib: u32, shift: u32) -> Vec<u8> {
    create(level, ms, "64M");
    let data: Vec<u8> = (0..mib << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> shift) as u8)
        .collect();
    let input = dir.join("in.bin");
    std::fs::write(&input, &data).unwrap();
    ok(&args(
        &["write", "--offset", "0", "--in", input.to_str().unwrap()],
        ms,
    ));
    data
}

/// A `level` array of `n` members holding a pattern (see
/// `created_with_pattern`), served with a slow rebuild (8 MiB/s, so that
/// it is surely in the middle when a test acts), and member `role`
/// swapped for a blank one named `name`: its members, the pattern, the
/// server and the new member.
fn slowly_rebuilding(
    dir: &Path,
    level: &str,
    n: usize,
    (mib, shift): (u32, u32),
    role: usize,
    name: &str,
) -> (Vec<String>, Vec<u8>, Served, String) {
    let ms = members(dir, n);
    let data = created_with_pattern(dir, &ms, level, mib, shift);
    let log = dir.join("events.jsonl").display().to_string();
    let slow = [
        "--rebuild-min",
        "8M",
        "--rebuild-max",
        "8M",
        "--events-log",
        &log,
    ];
    let s = Served::start(dir, &ms, &slow);
    let fresh = swap_for_blank(&s, dir, &ms[role], name);
    (ms, data, s, fresh)
}

/// Lift the rebuild's ceiling, wait for the array to be whole, and
/// return its status.
fn unthrottled_to_the_end(s: &Served) -> Value {
    ctl(s, &["speed", "--rebuild-max", "0"]);
    ctl(s, &["wait", "--timeout", "120"]);
    let st = status(s);
    assert_eq!(st["state"], "optimal", "{st}");
    st
}

/// Fail and remove `old` from the array `s` serves, and add a blank
/// 64 MiB member `name` (in `dir`) in its place; returns its path.
fn swap_for_blank(s: &Served, dir: &Path, old: &str, name: &str) -> String {
    ctl(s, &["fail", old]);
    ctl(s, &["remove", old]);
    let fresh = blank(dir, name, 64 << 20);
    ctl(s, &["add", &fresh]);
    fresh
}

#[test]
fn kill9_mid_rebuild_resumes_from_the_checkpoint() {
    let dir = tmp();
    let (ms, data, mut s, fresh) = slowly_rebuilding(dir.path(), "5", 4, (40, 13), 2, "new.img");
    // The throttle can be changed at run time (a ceiling set alone below
    // the floor brings the floor down with it).
    let c = s.control.display().to_string();
    let sp: Value = serde_json::from_slice(
        &ok(&["speed", "--rebuild-max", "6M", "--json", "--control", &c]).stdout,
    )
    .unwrap();
    assert_eq!(sp["rebuild_max"], 6 << 20);
    assert_eq!(sp["rebuild_min"], 6 << 20);
    assert_eq!(status(&s)["rebuild_speed"]["max"], 6 << 20);
    wait_for("the rebuild to pass 20 MiB", 60, || {
        status(&s)["recovery"]["bytes_done"].as_u64().unwrap_or(0) >= 20 << 20
    });
    s.kill9();
    let e: Value = serde_json::from_slice(&ok(&["examine", "--json", &fresh]).stdout).unwrap();
    let checkpoint = e["recovery_offset"]
        .as_u64()
        .expect("a checkpoint on the member");
    assert!(checkpoint >= 8 << 20, "checkpoint {checkpoint}");

    let mut now = ms.clone();
    now[2] = fresh.clone();
    // Resumed slowly at first: its progress counts what the run before it
    // did (the whole member, as /proc/mdstat), with this run's time and rate.
    let mut s = Served::start(
        dir.path(),
        &now,
        &["--rebuild-min", "0", "--rebuild-max", "4M"],
    );
    let data_size = e["data_size"].as_u64().unwrap();
    wait_for("the resumed rebuild to make progress", 60, || {
        status(&s)["recovery"]["bytes_done"].as_u64().unwrap_or(0) >= 1 << 20
    });
    let r = &status(&s)["recovery"];
    let before = r["bytes_before"].as_u64().unwrap();
    assert_eq!(before, r["resumed_from"].as_u64().unwrap(), "{r}");
    assert!(before >= checkpoint, "{r}");
    let done = r["bytes_done"].as_u64().unwrap();
    let progress = r["progress"].as_f64().unwrap();
    let want = (before + done) as f64 / data_size as f64;
    assert!(
        (progress - want).abs() < 0.01 && progress > checkpoint as f64 / data_size as f64,
        "progress {progress}, expected {want}: {r}"
    );
    assert_eq!(
        r["bytes_total"].as_u64().unwrap(),
        data_size - before,
        "{r}"
    );
    assert!(r["seconds"].as_f64().unwrap() > 0.0, "{r}");
    let rate = r["rate"].as_f64().unwrap();
    assert!(rate > 0.0 && rate < 64.0 * 1048576.0, "{r}");
    let st = unthrottled_to_the_end(&s);
    let last = &st["last_recovery"];
    assert_eq!(last["result"], "done", "{st}");
    let from = last["resumed_from"].as_u64().unwrap();
    assert!(
        from >= checkpoint,
        "resumed from {from}, checkpoint {checkpoint}"
    );
    assert_eq!(last["bytes"].as_u64().unwrap(), data_size - from, "{st}");
    assert_eq!(s.stop().code(), Some(0));
    check_offline(&now);
    let back = ok(&args(
        &["read", "--offset", "0", "--length", &data.len().to_string()],
        &now,
    ))
    .stdout;
    assert!(back == data, "data differs after the resumed rebuild");
}

/// RAID-6: a member added while another is being rebuilt joins that
/// rebuild: one pass from there on builds both, the first keeping what it
/// already holds. After a kill -9 the next start takes both up again in
/// one pass, and the status names both.
#[test]
fn raid6_rebuilds_a_member_added_mid_rebuild_in_the_same_pass_and_after_a_crash() {
    let dir = tmp();
    let (ms, data, mut s, new1) = slowly_rebuilding(dir.path(), "6", 5, (60, 11), 1, "new1.img");
    // Past its first checkpoint (every 2 s).
    wait_for("the first rebuild to pass 24 MiB", 60, || {
        status(&s)["recovery"]["bytes_done"].as_u64().unwrap_or(0) >= 24 << 20
    });
    let new3 = swap_for_blank(&s, dir.path(), &ms[3], "new3.img");
    wait_for("the rebuild to take the new member in", 30, || {
        let r = &status(&s)["recovery"];
        r["role"] == 1 && r["with"][0]["role"] == 3
    });
    assert_eq!(status(&s)["recovery"]["resumed_from"], 0);
    // The events: the pass taken up again names the newcomer, and no
    // RebuildFinished says the rebuild ended when it had not.
    let events: Vec<Value> = std::fs::read_to_string(dir.path().join("events.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let named = |e: &Value, name: &str| e["event"] == name;
    assert!(
        events
            .iter()
            .any(|e| named(e, "RebuildStarted") && e["data"]["with"][0]["role"] == 3),
        "{events:?}"
    );
    assert!(
        !events.iter().any(|e| named(e, "RebuildFinished")),
        "{events:?}"
    );
    s.kill9();
    let e: Value = serde_json::from_slice(&ok(&["examine", "--json", &new1]).stdout).unwrap();
    let checkpoint = e["recovery_offset"].as_u64().expect("a checkpoint");
    assert!(checkpoint >= 8 << 20, "checkpoint {checkpoint} {e}");
    // Rot on a source below the first member's checkpoint: the pass has
    // only two sources left there, and cannot rebuild the second member's
    // block. The first member already holds its block of that stripe and
    // keeps it (were it rebuilt too, it would be lost as well), so the
    // stripe has three good blocks and only one lost: the rot is healed.
    // Stripe 68 (64 KiB chunks): data on roles 0, 3 and 4, P on role 1
    // (the first member's), Q on role 2.
    let rot_at = e["data_offset"].as_u64().unwrap() + 68 * (64 << 10) + 100;
    {
        use std::io::{Read, Seek, SeekFrom, Write};
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&ms[0])
            .unwrap();
        let mut b = [0u8; 8];
        f.seek(SeekFrom::Start(rot_at)).unwrap();
        f.read_exact(&mut b).unwrap();
        b.iter_mut().for_each(|x| *x ^= 0x5a);
        f.seek(SeekFrom::Start(rot_at)).unwrap();
        f.write_all(&b).unwrap();
    }

    let now = vec![
        ms[0].clone(),
        new1.clone(),
        ms[2].clone(),
        new3.clone(),
        ms[4].clone(),
    ];
    let mut s = Served::start(
        dir.path(),
        &now,
        &["--rebuild-min", "0", "--rebuild-max", "8M"],
    );
    wait_for("the rebuild to start again", 60, || {
        status(&s)["recovery"]["kind"] == "rebuild"
    });
    let r = status(&s)["recovery"].clone();
    assert_eq!(r["role"], 1, "{r}");
    assert_eq!(r["with"][0]["role"], 3, "{r}");
    assert!(
        r["with"][0]["member"]
            .as_str()
            .unwrap()
            .ends_with("new3.img"),
        "{r}"
    );
    // The pass starts where the member furthest behind is: the beginning.
    assert_eq!(r["resumed_from"], 0, "{r}");
    let text = String::from_utf8(ctl(&s, &["status"]).stdout).unwrap();
    assert!(text.contains("with role 3 onto"), "{text}");
    let st = unthrottled_to_the_end(&s);
    assert_eq!(st["last_recovery"]["result"], "done", "{st}");
    assert_eq!(st["last_recovery"]["with"][0]["role"], 3, "{st}");
    // A scrub heals the rot; the second member's block the pass could not
    // rebuild stays an error until written (nothing verifies what parity
    // would make of it), and is named.
    let c = s.control.display().to_string();
    let o = raidkit(&["scrub", "--wait", "--control", &c]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let last = status(&s)["last_scrub"].clone();
    assert_eq!(
        (last["repaired"].as_u64(), last["unrepaired"].as_u64()),
        (Some(1), Some(1)),
        "{last}"
    );
    let m = last["mismatches"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["action"] == "unrepaired")
        .unwrap()
        .clone();
    assert_eq!(m["role"], 3, "{last}");
    assert_eq!(s.stop().code(), Some(0));
    // Written again, the lost block is whole, and so is the array.
    let at = m["array_offset"].as_u64().unwrap() as usize;
    let block = dir.path().join("block.bin");
    std::fs::write(&block, &data[at..at + 4096]).unwrap();
    ok(&args(
        &[
            "write",
            "--offset",
            &at.to_string(),
            "--in",
            block.to_str().unwrap(),
        ],
        &now,
    ));
    check_offline(&now);
    let back = ok(&args(
        &["read", "--offset", "0", "--length", &data.len().to_string()],
        &now,
    ))
    .stdout;
    assert!(
        back == data,
        "data differs after the rebuild of two members"
    );
}

#[test]
fn readd_after_a_short_absence_resyncs_only_dirty_regions() {
    let dir = tmp();
    let ms = members(dir.path(), 4);
    ok(&args(
        &[
            "create",
            "--level",
            "5",
            "--size",
            "64M",
            "--chunk",
            "64K",
            "--bitmap-region",
            "1M",
        ],
        &ms,
    ));
    let mut s = Served::start(dir.path(), &ms, &[]);
    tool(
        "qemu-io",
        &["-f", "raw", "-c", "write -P 0x11 0 96M", &s.uri],
    );
    // The bitmap forgets regions once every member has them.
    wait_for("the bitmap to clear", 30, || {
        status(&s)["bitmap"]["dirty_regions"] == 0
    });
    ctl(&s, &["fail", &ms[2]]);
    ctl(&s, &["remove", &ms[2]]);
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "write -P 0x22 5M 64k",
            "-c",
            "write -P 0x33 70M 8k",
            &s.uri,
        ],
    );
    let st = status(&s);
    assert_eq!(st["state"], "degraded");
    let dirty = st["bitmap"]["dirty_regions"].as_u64().unwrap();
    assert!((1..=4).contains(&dirty), "{st}");
    let o = ctl(&s, &["add", &ms[2]]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("resync"));
    ctl(&s, &["wait", "--timeout", "60"]);
    let st = status(&s);
    assert_eq!(st["state"], "optimal", "{st}");
    let last = &st["last_recovery"];
    assert_eq!(last["kind"], "resync");
    let bytes = last["bytes"].as_u64().unwrap();
    let member_data = 63u64 << 20;
    assert!(
        bytes > 0 && bytes <= dirty << 20,
        "resynced {bytes} bytes of a {member_data}-byte member"
    );
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "read -P 0x11 0 5M",
            "-c",
            "read -P 0x22 5M 64k",
            "-c",
            "read -P 0x33 70M 8k",
            "-c",
            "read -P 0x11 80M 16M",
            &s.uri,
        ],
    );
    assert_eq!(s.stop().code(), Some(0));
    check_offline(&ms);
}

#[test]
fn read_errors_vanishing_and_stalling_members_are_failed_and_data_stays_right() {
    let dir = tmp();
    let ms = members(dir.path(), 6);
    create("6", &ms, "32M");
    let mut s = Served::start(dir.path(), &ms, &[]);
    tool(
        "qemu-io",
        &["-f", "raw", "-c", "write -P 0x5a 0 100M", &s.uri],
    );
    assert_eq!(s.stop().code(), Some(0));
    // Member 1 fails reads at two places; member 3 vanishes after some
    // operations (mid-request); member 4 stalls beyond the member timeout.
    let faulty = vec![
        ms[0].clone(),
        format!("fault:{}?read-error-at=3M,9M", ms[1]),
        ms[2].clone(),
        format!("fault:{}?vanish-after=60", ms[3]),
        ms[4].clone(),
        ms[5].clone(),
    ];
    let mut s = Served::start(dir.path(), &faulty, &[]);
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "read -P 0x5a 0 100M",
            "-c",
            "write -P 0x6b 10M 30M",
            "-c",
            "read -P 0x6b 10M 30M",
            "-c",
            "read -P 0x5a 40M 60M",
            &s.uri,
        ],
    );
    let st = status(&s);
    assert_eq!(st["state"], "degraded", "{st}");
    let faulty_roles: Vec<u64> = st["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["state"] == "faulty")
        .map(|m| m["role"].as_u64().unwrap())
        .collect();
    assert_eq!(faulty_roles, vec![1, 3], "{st}");
    assert_eq!(st["io"]["errors"], 0, "{st}");
    assert_eq!(s.stop().code(), Some(0));

    // With the plain files back, the two stale members are resynced.
    let mut s = Served::start(dir.path(), &ms, &["--rebuild-min", "0"]);
    ctl(&s, &["wait", "--timeout", "60"]);
    assert_eq!(status(&s)["state"], "optimal");
    assert_eq!(s.stop().code(), Some(0));
    check_offline(&ms);

    // A member that answers too slowly is failed too (timeout 0.3 s, 1 s delay).
    let slow = vec![
        ms[0].clone(),
        ms[1].clone(),
        ms[2].clone(),
        ms[3].clone(),
        format!("fault:{}?delay=1s", ms[4]),
        ms[5].clone(),
    ];
    let mut s = Served::start(dir.path(), &slow, &["--member-timeout", "0.3"]);
    tool(
        "qemu-io",
        &["-f", "raw", "-c", "read -P 0x6b 10M 1M", &s.uri],
    );
    wait_for("the slow member to be failed", 30, || {
        member_state(&status(&s), 4).is_empty()
    });
    let st = status(&s);
    let m4 = st["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == 4)
        .unwrap()
        .clone();
    assert_eq!(m4["state"], "faulty");
    assert!(m4["reason"].as_str().unwrap().contains("timeout"), "{m4}");
    tool(
        "qemu-io",
        &["-f", "raw", "-c", "read -P 0x5a 40M 60M", &s.uri],
    );
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn a_failed_array_fails_safe_and_force_brings_it_back() {
    let dir = tmp();
    let ms = members(dir.path(), 4);
    create("5", &ms, "32M");
    let mut s = Served::start(dir.path(), &ms, &[]);
    tool(
        "qemu-io",
        &["-f", "raw", "-c", "write -P 0x42 0 60M", &s.uri],
    );
    ctl(&s, &["fail", &ms[0]]);
    // A second failure would stop the array: refused without --force.
    let c = s.control.display().to_string();
    let o = raidkit_refused(&["fail", &ms[3], "--control", &c]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--force"));
    ctl(&s, &["fail", &ms[3], "--force"]);
    assert_eq!(status(&s)["state"], "failed");
    // Requests get errors, never wrong data. (qemu-io's "Pattern
    // verification failed" is wrong data returned as a success: never an
    // error here.)
    let o = try_tool(
        "qemu-io",
        &["-f", "raw", "-c", "read -P 0x42 0 64k", &s.uri],
    );
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(
        !text.contains("Pattern verification failed"),
        "a failed array returned wrong data: {text}"
    );
    assert!(
        !o.status.success(),
        "a read of a failed array succeeded: {text}"
    );
    // The same read with libnbd: the request gets EIO, no data at all.
    let o = tool(
        "/usr/bin/python3",
        &[
            "-c",
            "import errno, nbd, sys\n\
             h = nbd.NBD()\n\
             h.connect_uri(sys.argv[1])\n\
             try:\n    d = h.pread(65536, 0)\n    print('data', d == bytes([0x42]) * 65536)\n\
             except nbd.Error as e:\n    \
             n = e.errno if isinstance(e.errno, int) else getattr(errno, e.errno)\n    \
             print('errno', n)\n",
            &s.uri,
        ],
    );
    let said = String::from_utf8_lossy(&o.stdout);
    assert_eq!(said.trim(), "errno 5", "a read of a failed array: {said}");
    // Stopping says the array failed.
    assert_ne!(s.stop().code(), Some(0));
    let before: Vec<Vec<u8>> = ms.iter().map(|m| std::fs::read(m).unwrap()).collect();
    let o = raidkit_refused(&args(&["serve", "--listen", "127.0.0.1:0"], &ms));
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("cannot run") && err.contains("--force"),
        "{err}"
    );
    for (m, b) in ms.iter().zip(&before) {
        assert!(std::fs::read(m).unwrap() == *b, "{m} was written");
    }
    // --force: the member failed last comes back as in sync; the other is rebuilt.
    let mut s = Served::start(dir.path(), &ms, &["--force", "--rebuild-min", "0"]);
    ctl(&s, &["wait", "--timeout", "60"]);
    let st = status(&s);
    assert_eq!(st["state"], "optimal", "{st}");
    tool(
        "qemu-io",
        &["-f", "raw", "-c", "read -P 0x42 0 60M", &s.uri],
    );
    assert_eq!(s.stop().code(), Some(0));
    check_offline(&ms);
}

/// One 4 KiB write through libnbd, then, the moment its reply is in,
/// kill -9 of the server (nothing more can be written after the reply).
/// Returns whether the write succeeded.
fn write_then_kill9(s: &mut Served, offset: u64) -> bool {
    // The server is killed by the script itself, right after the reply.
    let o = tool(
        "/usr/bin/python3",
        &[
            "-c",
            "import nbd, os, signal, sys\n\
             h = nbd.NBD()\n\
             h.connect_uri(sys.argv[1])\n\
             try:\n    h.pwrite(b'\\x77' * 4096, int(sys.argv[3])); ok = True\n\
             except nbd.Error:\n    ok = False\n\
             os.kill(int(sys.argv[2]), signal.SIGKILL)\n\
             print('ok' if ok else 'error')\n",
            &s.uri,
            &s.pid().to_string(),
            &offset.to_string(),
        ],
    );
    s.kill9(); // reaps it
    String::from_utf8_lossy(&o.stdout).trim() == "ok"
}

#[test]
fn a_write_error_fails_the_member_durably_before_the_request_completes() {
    // The start writes each member's superblock (two writes: the start
    // event). Member 1 then fails its first write of the request, or its
    // fourth (the superblocks it was marked dirty with went through, a later
    // write of the request did not). Either way the others' superblocks
    // record it before the reply: a kill -9 right after the reply finds it
    // recorded on disk.
    for after in [2, 5] {
        let dir = tmp();
        let ms = members(dir.path(), 4);
        create("5", &ms, "16M");
        let d = |ms: &[String]| -> Value {
            serde_json::from_slice(&ok(&args(&["detail", "--json"], ms)).stdout).unwrap()
        };
        let e0: Value = serde_json::from_slice(&ok(&["examine", "--json", &ms[0]]).stdout).unwrap();
        let mut faulty = ms.clone();
        faulty[1] = format!("fault:{}?fail-writes-after={after}", ms[1]);
        let mut s = Served::start(dir.path(), &faulty, &[]);
        assert_eq!(member_state(&status(&s), 1), "active");
        assert!(
            write_then_kill9(&mut s, 64 << 10),
            "fail-writes-after={after}: the write failed"
        );
        let v = d(&ms);
        assert_eq!(v["state"], "degraded", "fail-writes-after={after}: {v}");
        assert_ne!(v["members"][1]["state"], "active", "{v}");
        assert_eq!(v["members"][0]["state"], "active", "{v}");
        let e: Value = serde_json::from_slice(&ok(&["examine", "--json", &ms[0]]).stdout).unwrap();
        assert!(e["events"].as_u64() > e0["events"].as_u64(), "{e}");
        // And the data written is there (degraded: member 1 left out).
        let o = ok(&args(
            &["read", "--offset", "65536", "--length", "4096"],
            &[ms[0].clone(), ms[2].clone(), ms[3].clone()],
        ));
        assert!(
            o.stdout.iter().all(|&b| b == 0x77),
            "fail-writes-after={after}"
        );
    }
}

/// A member that fails a superblock write (here the one that marks the
/// array dirty before the first write) has it counted among its write
/// errors, as a data write's.
#[test]
fn a_failed_superblock_write_counts_as_a_write_error() {
    let dir = tmp();
    let ms = members(dir.path(), 4);
    create("5", &ms, "16M");
    let mut faulty = ms.clone();
    faulty[1] = format!("fault:{}?fail-writes-after=2", ms[1]);
    let mut s = Served::start(dir.path(), &faulty, &[]);
    qemu_cmd(&s.uri, "write -P 0x77 64k 4k");
    let st = status(&s);
    let m1 = st["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["path"].as_str().is_some_and(|p| p.ends_with("d1.img")))
        .cloned()
        .unwrap_or_default();
    assert_eq!(m1["state"], "faulty", "{st}");
    assert!(
        m1["reason"].as_str().unwrap_or("").contains("superblock"),
        "{m1}"
    );
    assert!(m1["errors"]["write"].as_u64() >= Some(1), "{m1}");
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn an_unreadable_journal_refuses_to_start() {
    let dir = tmp();
    let ms = members(dir.path(), 4);
    create("5", &ms, "16M");
    let e: Value = serde_json::from_slice(&ok(&["examine", "--json", &ms[0]]).stdout).unwrap();
    let data_offset = e["data_offset"].as_u64().unwrap();
    // A write, then kill -9: the array is dirty and its journal must be
    // read at the next start.
    let mut s = Served::start(dir.path(), &ms, &[]);
    assert!(write_then_kill9(&mut s, 0));
    let e: Value = serde_json::from_slice(&ok(&["examine", "--json", &ms[0]]).stdout).unwrap();
    assert_eq!(e["state"], "dirty");
    // Read errors in the journal area (past the superblocks and bitmap,
    // before the checksums and the data) of every member: refused,
    // nothing written.
    let journal_end =
        e["journal"]["offset"].as_u64().unwrap() + e["journal"]["size"].as_u64().unwrap();
    assert!(journal_end <= data_offset);
    let bad = |m: &String| format!("fault:{m}?read-error-at={}", journal_end - 4096);
    let all_bad: Vec<String> = ms.iter().map(bad).collect();
    let before: Vec<Vec<u8>> = ms.iter().map(|m| std::fs::read(m).unwrap()).collect();
    let ctl = dir.path().join("refused.ctl").display().to_string();
    let o = raidkit_refused(&args(
        &["serve", "--listen", "127.0.0.1:0", "--control", &ctl],
        &all_bad,
    ));
    assert_eq!(
        o.status.code(),
        Some(1),
        "served with no journal readable: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    for (m, b) in ms.iter().zip(&before) {
        assert!(std::fs::read(m).unwrap() == *b, "{m} was written");
    }
    // One member's journal readable: it starts (the record is there), and
    // the data written before the kill reads back.
    let mut one_good = all_bad.clone();
    one_good[2] = ms[2].clone();
    let mut s = Served::start(dir.path(), &one_good, &[]);
    let o = tool("qemu-io", &["-f", "raw", "-c", "read -P 0x77 0 4k", &s.uri]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(!text.contains("Pattern verification failed"), "{text}");
    s.kill9();
}

/// Members slow to write (they wait like disks: `serve` writes a
/// sequential writer's requests behind it).
fn slow_members(ms: &[String], delay: &str) -> Vec<String> {
    ms.iter()
        .map(|m| format!("fault:{m}?write-delay={delay}"))
        .collect()
}

/// The bytes of the `i`th 256 KiB block the writers below write.
fn block_pattern(i: u64) -> Vec<u8> {
    (0..256u64 << 10)
        .map(|j| (j / 512 * 13 + i * 101 + j % 7) as u8)
        .collect()
}

const BLOCK_PATTERN_PY: &str = "def block(i):\n    \
     return bytes(((j // 512) * 13 + i * 101 + j % 7) % 256 for j in range(262144))\n";

#[test]
fn writes_answered_early_are_read_back_and_land_before_a_clean_stop() {
    // One writer at queue depth 1, in sequence, on slow disks: its writes
    // are answered once copied and written behind it. Every read sees
    // them at once, and SIGTERM sent right after the last reply (no flush)
    // still finds every one on the members once the server has stopped.
    // The last four are not read back before the stop, so they are still
    // behind then.
    // No journal (the journal's close lets its updates finish, which would
    // hide a missing drain), and only the data area slow (the metadata
    // writes of the close are quick): the writes behind at the SIGTERM land
    // before the clean mark only because the stop waits for them.
    let dir = tmp();
    let ms = members(dir.path(), 4);
    ok(&args(
        &[
            "create",
            "--level",
            "5",
            "--size",
            "32M",
            "--chunk",
            "64K",
            "--consistency-policy",
            "none",
        ],
        &ms,
    ));
    let e: Value = serde_json::from_slice(&ok(&["examine", "--json", &ms[0]]).stdout).unwrap();
    let data_offset = e["data_offset"].as_u64().unwrap();
    let slow: Vec<String> = ms
        .iter()
        .map(|m| format!("fault:{m}?write-delay=2s&write-delay-from={data_offset}"))
        .collect();
    let mut s = Served::start(dir.path(), &slow, &[]);
    // The status is asked for halfway (its write-behind counts printed at
    // the end): the SIGTERM still comes right after the last reply.
    let script = format!(
        "import json, nbd, os, signal, subprocess, sys\n{BLOCK_PATTERN_PY}\
         h = nbd.NBD()\n\
         h.connect_uri(sys.argv[1])\n\
         for i in range(16):\n    \
             h.pwrite(block(i), i * 262144)\n    \
             if i % 4 == 3 and i < 12:\n        \
                 assert h.pread(262144, i * 262144) == block(i), f'read of {{i}} right after its write'\n    \
             if i == 7:\n        \
                 st = subprocess.run([sys.argv[3], 'status', '--control', sys.argv[4], '--json'],\n            \
                     capture_output=True, timeout=30, check=True)\n\
         os.kill(int(sys.argv[2]), signal.SIGTERM)\n\
         print(json.dumps(json.loads(st.stdout)['write_behind']))\n\
         print('written')\n"
    );
    let ctl = s.control.display().to_string();
    let o = tool(
        "/usr/bin/python3",
        &["-c", &script, &s.uri, &s.pid().to_string(), BIN, &ctl],
    );
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let (counts, said) = out.trim().split_once('\n').unwrap_or(("", &out));
    assert_eq!(said, "written", "{out}");
    // Writes of 256 KiB in sequence: the first two begin the row, writes
    // 2-7 had been answered early when asked (each is counted as it is
    // answered, so whatever is still pending).
    let wb: Value = serde_json::from_str(counts).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(wb["writes"], 6, "{wb}");
    assert_eq!(wb["bytes"], 6 * 262144, "{wb}");
    assert_eq!(wb["failed"], false, "{wb}");
    assert_eq!(s.stop().code(), Some(0), "{}", s.log());
    let o = ok(&args(
        &[
            "read",
            "--offset",
            "0",
            "--length",
            &(16u64 << 18).to_string(),
        ],
        &ms,
    ));
    for i in 0..16u64 {
        let got = &o.stdout[(i as usize) << 18..((i as usize) + 1) << 18];
        assert!(
            got == block_pattern(i).as_slice(),
            "block {i} lost at the stop"
        );
    }
    check_offline(&ms);
}

#[test]
fn fua_writes_are_never_answered_early() {
    // A sequential writer at queue depth 1 on slow disks gets write-behind;
    // a write with FUA must be durable before its answer, so it is neither
    // answered early nor counted among the writes that were.
    let dir = tmp();
    let ms = members(dir.path(), 2);
    ok(&args(
        &["create", "--level", "0", "--size", "16M", "--chunk", "64K"],
        &ms,
    ));
    let s = Served::start(dir.path(), &slow_members(&ms, "20ms"), &[]);
    let script = format!(
        "import nbd, sys\n{BLOCK_PATTERN_PY}\
         h = nbd.NBD()\n\
         h.connect_uri(sys.argv[1])\n\
         first = int(sys.argv[2])\n\
         flags = nbd.CMD_FLAG_FUA if sys.argv[3] == 'fua' else 0\n\
         for i in range(first, first + 16):\n    \
             h.pwrite(block(i), i * 262144, flags)\n\
         h.flush()\n"
    );
    tool("/usr/bin/python3", &["-c", &script, &s.uri, "0", "fua"]);
    let wb = status(&s)["write_behind"].clone();
    assert_eq!(
        wb["writes"], 0,
        "FUA writes counted as answered early: {wb}"
    );
    // The same writer without FUA is written behind: the count can rise.
    tool("/usr/bin/python3", &["-c", &script, &s.uri, "16", "plain"]);
    let wb = status(&s)["write_behind"].clone();
    assert!(wb["writes"].as_u64().unwrap() >= 1, "{wb}");
    let o = tool(
        "/usr/bin/python3",
        &[
            "-c",
            &format!(
                "import nbd, sys\n{BLOCK_PATTERN_PY}\
                 h = nbd.NBD()\n\
                 h.connect_uri(sys.argv[1])\n\
                 print(all(h.pread(262144, i * 262144) == block(i) for i in range(32)))\n"
            ),
            &s.uri,
        ],
    );
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "True");
}

#[test]
fn a_write_answered_early_that_fails_is_never_taken_as_flushed() {
    // RAID-0 on slow disks, one of which fails its writes after a while:
    // one writer at queue depth 1, in sequence, flushing every 2 writes.
    // The error reaches the client no later than its next flush; a flush
    // that succeeds covers writes that all read back.
    let dir = tmp();
    let ms = members(dir.path(), 2);
    ok(&args(
        &["create", "--level", "0", "--size", "16M", "--chunk", "64K"],
        &ms,
    ));
    let mut slow = slow_members(&ms, "200ms");
    // Its own delay again: one `fault:` per member.
    slow[1] = format!("fault:{}?write-delay=200ms&fail-writes-after=24", ms[1]);
    let s = Served::start(dir.path(), &slow, &["--http", "127.0.0.1:0"]);
    let script = format!(
        "import nbd, sys\n{BLOCK_PATTERN_PY}\
         h = nbd.NBD()\n\
         h.connect_uri(sys.argv[1])\n\
         flushed = 0\n\
         try:\n    \
             for i in range(48):\n        \
                 h.pwrite(block(i), i * 262144)\n        \
                 if i % 2 == 1:\n            \
                     h.flush()\n            \
                     flushed = i + 1\n\
         except nbd.Error as e:\n    \
             print('error after', flushed)\n\
         else:\n    \
             print('no error', flushed)\n"
    );
    let o = tool("/usr/bin/python3", &["-c", &script, &s.uri]);
    let said = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let flushed: u64 = said
        .strip_prefix("error after ")
        .unwrap_or_else(|| panic!("the failing member's writes went unreported: {said}"))
        .parse()
        .unwrap();
    assert!(flushed >= 8, "the first flushes already failed: {said}");
    let st = status(&s);
    let wb = &st["write_behind"];
    assert!(wb["writes"].as_u64().unwrap() >= 1, "{wb}");
    assert_eq!(wb["failed"], true, "{wb}");
    // An operator reading `raidkit status` is told.
    let said = String::from_utf8_lossy(&ctl(&s, &["status"]).stdout).to_string();
    let line = said
        .lines()
        .find(|l| l.starts_with("write-behind: "))
        .unwrap_or_else(|| panic!("no write-behind line: {said}"));
    assert!(line.contains("FAILED"), "{line}");
    // The same in the metrics.
    let line = s.line_with("status page ");
    let base = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap();
    let m = scrape(base);
    let key = |n: &str| format!("{n}{{array=\"{}\"}}", st["array"]["name"].as_str().unwrap());
    assert_eq!(metric(&m, &key("raidkit_write_behind_failed")), 1.0);
    assert_eq!(
        metric(&m, &key("raidkit_write_behind_writes_total")),
        wb["writes"].as_u64().unwrap() as f64
    );
    // Every block written before the last successful flush is on the
    // members (the array is failed now: read from the member files, 64 KiB
    // chunks taking turns from the data offset on).
    drop(s);
    let e: Value = serde_json::from_slice(&ok(&["examine", "--json", &ms[0]]).stdout).unwrap();
    let data_offset = e["data_offset"].as_u64().unwrap() as usize;
    let files: Vec<Vec<u8>> = ms.iter().map(|m| std::fs::read(m).unwrap()).collect();
    let chunk = 64usize << 10;
    for i in 0..flushed {
        let want = block_pattern(i);
        for (k, piece) in want.chunks(chunk).enumerate() {
            let c = (i as usize) * 4 + k;
            let at = data_offset + (c / 2) * chunk;
            assert!(
                &files[c % 2][at..at + chunk] == piece,
                "flushed block {i} (chunk {c}) is not on member {}",
                c % 2
            );
        }
    }
}

#[test]
fn a_member_whose_writes_hang_hangs_neither_the_array_nor_its_status() {
    // A disk stuck in its own retries: every write to member 1 takes a
    // minute. Starting writes the superblocks; the write to member 1 is
    // given up after the member timeout and the member failed, so the
    // array starts degraded and serves (it used to wait for the disk, with
    // the metadata lock held, which also stopped the stall watch).
    let dir = tmp();
    let ms = members(dir.path(), 4);
    create("5", &ms, "32M");
    let mut hung = ms.clone();
    hung[1] = format!("fault:{}?write-delay=60s", ms[1]);
    let t = Instant::now();
    let mut s = Served::start(dir.path(), &hung, &["--member-timeout", "2"]);
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    let st = status(&s);
    assert_eq!(st["state"], "degraded", "{st}");
    let m1 = member(&st, 1);
    assert_eq!(m1["state"], "faulty", "{m1}");
    let why = m1["reason"].as_str().unwrap();
    assert!(
        why.contains("superblock") && why.contains("member timeout"),
        "{m1}"
    );
    assert_eq!(m1["errors"]["timeout"], 1, "{m1}");
    // Its abandoned write still holds the file: adding it back is refused,
    // saying why (it said "in use by raidkit" naming this very server).
    ctl(&s, &["remove", &ms[1]]);
    let c = s.control.display().to_string();
    let o = raidkit(&["add", "--control", &c, &ms[1]]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("still held by this server"), "{err}");
    let o = tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "write -P 0x3c 0 4M",
            "-c",
            "read -P 0x3c 0 4M",
            &s.uri,
        ],
    );
    assert!(!String::from_utf8_lossy(&o.stdout).contains("verification failed"));
    assert_eq!(s.stop().code(), Some(0));

    // A disk slow but within the timeout (4 s a write): the first client
    // write marks the array dirty, a superblock write that waits on it.
    // Meanwhile `status` answers at once, from what was last written.
    let sub = dir.path().join("slow");
    std::fs::create_dir(&sub).unwrap();
    let ms = members(&sub, 4);
    create("5", &ms, "32M");
    let mut slow = ms.clone();
    slow[1] = format!("fault:{}?write-delay=4s", ms[1]);
    let mut s = Served::start(&sub, &slow, &[]);
    let mut writer = Guarded::spawn(
        Command::new("qemu-io")
            .args(["-f", "raw", "-c", "write -P 0x11 0 64k", &s.uri])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    std::thread::sleep(Duration::from_millis(500));
    let t = Instant::now();
    let st = status(&s);
    let took = t.elapsed();
    assert!(
        writer.try_wait().is_none(),
        "the write did not wait on the slow member"
    );
    assert!(took < Duration::from_secs(1), "status took {took:?}");
    assert_eq!(st["members"][1]["state"], "active", "{st}");
    writer.kill();
    s.kill9();
}

#[test]
fn a_member_that_hangs_while_idle_is_failed_by_the_stall_watch() {
    // A mirror whose second disk hangs (every operation waits ten
    // minutes, no error) a few seconds after the start, while the bitmap
    // has bits set: the housekeeping's flush is the first to wait on it.
    // The stall watch, on a thread of its own, fails the member past the
    // member timeout (it ran on the thread the flush held, and never
    // again); the array serves degraded.
    let dir = tmp();
    let ms = members(dir.path(), 2);
    ok(&args(
        &[
            "create",
            "--level",
            "1",
            "--size",
            "16M",
            "--consistency-policy",
            "bitmap",
        ],
        &ms,
    ));
    let hung = [ms[0].clone(), format!("fault:{}?hang-after=8s", ms[1])];
    let t = Instant::now();
    let mut s = Served::start(dir.path(), &hung, &["--member-timeout", "3"]);
    let write = |at: &str| qemu_cmd(&s.uri, &format!("write -P 0x21 {at} 64k"));
    write("0");
    std::thread::sleep(Duration::from_secs(6).saturating_sub(t.elapsed()));
    write("1M");
    wait_for("the hung member to be failed", 40, || {
        member_state(&status(&s), 1).is_empty()
    });
    let st = status(&s);
    assert_eq!(st["state"], "degraded", "{st}");
    let m1 = member(&st, 1);
    assert!(
        m1["reason"].as_str().unwrap().contains("member timeout"),
        "{m1}"
    );
    let o = qemu_cmd(&s.uri, "read -P 0x21 1M 64k");
    assert!(!String::from_utf8_lossy(&o.stdout).contains("verification failed"));
    s.kill9();
}

#[test]
fn one_operation_that_never_ends_fails_its_member_while_others_complete() {
    // A disk that retries one sector in its firmware and answers its other
    // commands meanwhile: a write there never ends, writes elsewhere on
    // the same disk complete. The stall watch used to look only for a
    // member on which nothing completed, so this one stayed in service.
    let dir = tmp();
    let ms = members(dir.path(), 2);
    create("1", &ms, "16M");
    let e: Value = serde_json::from_slice(&ok(&["examine", "--json", &ms[1]]).stdout).unwrap();
    let at = e["data_offset"].as_u64().unwrap() + (4 << 20);
    let hung = [ms[0].clone(), format!("fault:{}?hang-at={at}", ms[1])];
    let mut s = Served::start(dir.path(), &hung, &["--member-timeout", "2"]);
    let write = |at: &str| qemu_cmd(&s.uri, &format!("write -P 0x5d {at} 64k"));
    write("0");
    // Never answered while the member is in service: killed at the end.
    let _stuck = Guarded::spawn(
        Command::new("qemu-io")
            .args(["-f", "raw", "-c", "write -P 0x77 4M 4k", &s.uri])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    // Writes elsewhere keep completing on the member, past the timeout.
    let t = Instant::now();
    let mut writes = 0;
    while !member_state(&status(&s), 1).is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the member with a stuck operation is still in service after {writes} writes completed on it: {}",
            status(&s)
        );
        write(&format!("{}k", 64 * (writes % 32)));
        writes += 1;
    }
    let st = status(&s);
    assert_eq!(st["state"], "degraded", "{st}");
    let m1 = member(&st, 1);
    assert!(
        m1["reason"].as_str().unwrap().contains("outstanding"),
        "{m1}"
    );
    // The array serves on.
    write("1M");
    s.kill9();
}

#[test]
fn the_resync_a_crash_left_runs_once_a_forced_degraded_start_is_whole_again() {
    // A bitmap RAID-5 crashes while degraded; it is started with --force
    // without its missing member, which is then added back (a resync of
    // what it missed). The parity resync of the regions the crash left
    // marked could not run degraded and was given up: `wait` and `status`
    // said all was done, and the stop left the array dirty.
    let dir = tmp();
    let ms = members(dir.path(), 3);
    ok(&args(
        &[
            "create",
            "--level",
            "5",
            "--size",
            "32M",
            "--chunk",
            "64K",
            "--consistency-policy",
            "bitmap",
        ],
        &ms,
    ));
    let mut s = Served::start(dir.path(), &ms, &[]);
    ctl(&s, &["fail", &ms[1]]);
    tool(
        "qemu-io",
        &["-f", "raw", "-c", "write -P 0x3e 0 8M", &s.uri],
    );
    s.kill9();
    let s = Served::start(dir.path(), &[ms[0].clone(), ms[2].clone()], &["--force"]);
    assert_eq!(status(&s)["state"], "degraded");
    ctl(&s, &["add", &ms[1]]);
    ctl(&s, &["wait", "--timeout", "60"]);
    let st = status(&s);
    assert_eq!(
        (&st["state"], &st["recovery_pending"]),
        (&Value::from("optimal"), &Value::from(false)),
        "{st}"
    );
    assert_eq!(st["last_recovery"]["kind"], "parity-resync", "{st}");
    let c = s.control.display().to_string();
    let out: Value =
        serde_json::from_slice(&ok(&["stop", "--json", "--control", &c]).stdout).unwrap();
    assert_eq!(out["clean"], true, "{out}");
    drop(s);
    check_offline(&ms);
}

#[test]
fn a_replacement_that_stalls_is_written_no_more_once_failed() {
    // `replace` onto a disk whose data writes take 10 s: the stall watch
    // fails it after the member timeout, and the replace stops there. It
    // used to go on sending the failed disk the writes it had queued, each
    // another 10 s (and another timeout counted), for half a minute.
    let dir = tmp();
    let ms = members(dir.path(), 6);
    create("6", &ms[..5], "32M");
    let mut s = Served::start(
        dir.path(),
        &ms[..5],
        &[
            "--member-timeout",
            "3",
            "--rebuild-min",
            "8M",
            "--rebuild-max",
            "8M",
        ],
    );
    let ctl = s.control.display().to_string();
    std::fs::File::create(&ms[5])
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let slow = format!("fault:{}?write-delay=10s&write-delay-from=1M", ms[5]);
    ok(&["replace", "--control", &ctl, &ms[0], "--with", &slow]);
    wait_for("the replace to end", 60, || {
        status(&s)["last_recovery"]["kind"] == "replace"
    });
    let st = status(&s);
    assert_eq!(st["state"], "optimal", "{st}");
    let t = st["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["path"] == ms[5].as_str())
        .unwrap_or_else(|| panic!("{st}"))
        .clone();
    assert_eq!(t["state"], "faulty", "{t}");
    let timeouts = t["errors"]["timeout"].as_u64().unwrap();
    assert!(
        timeouts <= 2,
        "{timeouts} writes timed out on the failed target: {t}"
    );
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn a_member_failed_because_it_hung_does_not_hold_the_stop() {
    // The second disk of a mirror hangs (every operation waits ten
    // minutes) three seconds after the start and is failed for it. The
    // stop closes members out of service for at most the member timeout:
    // it used to flush the hung one too, and wait with it.
    let dir = tmp();
    let ms = members(dir.path(), 2);
    create("1", &ms, "16M");
    let hung = [ms[0].clone(), format!("fault:{}?hang-after=3s", ms[1])];
    let mut s = Served::start(dir.path(), &hung, &["--member-timeout", "2"]);
    std::thread::sleep(Duration::from_secs(4));
    qemu_cmd(&s.uri, "write -P 0x44 0 1M");
    wait_for("the hung member to be failed", 30, || {
        member_state(&status(&s), 1).is_empty()
    });
    // (Served::stop gives up after 60 s.)
    assert_eq!(s.stop().code(), Some(0), "{}", s.log());
    // The data is there, the failed member stale and resynced.
    let mut s = Served::start(dir.path(), &ms, &[]);
    let o = qemu_cmd(&s.uri, "read -P 0x44 0 1M");
    assert!(!String::from_utf8_lossy(&o.stdout).contains("verification failed"));
    assert_eq!(s.stop().code(), Some(0));
}

/// Many requests in flight when a mirror's disk hangs (every operation
/// waits ten minutes): the disk is failed for it, but the requests that
/// wait on its operations never end. The stop gives up on them after the
/// member timeout (and a margin) instead of waiting for ever, and leaves
/// the array dirty: the next start resyncs it, and it is whole.
#[test]
fn requests_held_by_a_member_that_hangs_do_not_hold_the_stop() {
    let dir = tmp();
    let ms = members(dir.path(), 3);
    create("1", &ms, "64M");
    let hung = [
        ms[0].clone(),
        format!("fault:{}?hang-after=3s", ms[1]),
        ms[2].clone(),
    ];
    let s = Served::start(dir.path(), &hung, &["--member-timeout", "2"]);
    // A client with 16 writes in flight, killed once the disk has hung
    // (its requests then wait on the hung operations).
    let _ = Command::new("timeout")
        .args(["-s", "KILL", "10", "fio", "--name=j", "--ioengine=nbd"])
        .arg(format!("--uri={}", s.uri))
        .args([
            "--rw=randwrite",
            "--bs=4k-64k",
            "--iodepth=16",
            "--size=32m",
        ])
        .args(["--time_based", "--runtime=8", "--output=/dev/null"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    assert!(member_state(&status(&s), 1).is_empty(), "{}", status(&s));
    let t = Instant::now();
    stopped_dirty(&s.control);
    assert!(t.elapsed() < Duration::from_secs(40), "{:?}", t.elapsed());
    drop(s);
    let mut s = Served::start(dir.path(), &ms, &[]);
    ctl(&s, &["wait", "--timeout", "60"]);
    assert_eq!(status(&s)["state"], "optimal");
    assert_eq!(s.stop().code(), Some(0));
    check_offline(&ms);
}

/// A member being rebuilt, failed and removed, then added straight back:
/// the rebuild lets go of it when its batch ends, a moment after the
/// remove; the add waits for that instead of being refused as a member
/// "still held by this server" (a hung device, it said). And a hard link
/// of a member in service is that member: refused as already in the array.
#[test]
fn a_member_failed_and_removed_mid_rebuild_is_added_straight_back() {
    let dir = tmp();
    let ms = members(dir.path(), 3);
    create("5", &ms, "32M");
    let s = Served::start(
        dir.path(),
        &ms,
        &["--rebuild-min", "1M", "--rebuild-max", "1M"],
    );
    ctl(&s, &["fail", &ms[0]]);
    ctl(&s, &["remove", &ms[0]]);
    let new = dir.path().join("new.img").display().to_string();
    ctl(&s, &["add", &new]);
    assert_eq!(member_state(&status(&s), 0), "rebuilding");
    for round in 0..3 {
        ctl(&s, &["fail", &new]);
        ctl(&s, &["remove", &new]);
        ctl(&s, &["add", &new]);
        let st = status(&s);
        assert_eq!(member_state(&st, 0), "rebuilding", "round {round}: {st}");
    }
    let link = dir.path().join("link.img");
    std::fs::hard_link(&ms[1], &link).unwrap();
    let c = s.control.display().to_string();
    let o = raidkit(&["add", "--control", &c, &link.display().to_string()]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("already in the array"), "{err}");
}
