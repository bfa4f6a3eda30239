//! raidkit on real block devices: loop devices with direct I/O over files
//! on the machine's disk (/var/tmp, not a RAM disk), as a user builds an
//! array from disks. Every level is created and served with `--io direct`,
//! written and verified by fio (nbd engine, 4 jobs); the redundant levels
//! lose a member, rebuild onto a spare, and then serve the same data with
//! other members failed, so that the rebuilt member's contents are what the
//! clients read; `raidkit check` is clean at the end. qemu-io writes and
//! reads at odd byte offsets and lengths (compared again offline with
//! `raidkit read`), the server's descriptors on the devices are checked for
//! O_DIRECT in /proc, and a device holding a mounted ext4 is refused.
//! The kill -9 torture (scripts/torture.py) runs on loop devices too.
//!
//! Needs root, losetup, fio, qemu-io and e2fsprogs (`scripts/deps.sh`
//! installs them). Without them the tests fail, naming what is missing,
//! unless RAIDKIT_SKIP_LOOP=1 says to skip them.

mod common;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// Each member's backing file: small, so a level's whole cycle (initial
/// sync, fio, rebuild, check) takes seconds even in a debug build.
const MEMBER: u64 = 64 << 20;

/// How long one external command run under `timeout` may take.
const TOOL_SECS: &str = "120";

const O_DIRECT_OCTAL: u32 = 0o40000;

/// Where the executable `name` is: on PATH, or in /usr/sbin or /sbin, which
/// a PATH set up for a user may lack (losetup, mkfs.ext4 live there).
fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Whether loop devices can be had here. When they cannot, the test fails
/// naming what is missing (CI installs it all), unless RAIDKIT_SKIP_LOOP=1.
fn loop_devices_available() -> bool {
    let mut missing = Vec::new();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        missing.push("root".to_string());
    }
    for t in [
        "timeout",
        "losetup",
        "fio",
        "qemu-io",
        "mkfs.ext4",
        "mount",
        "umount",
    ] {
        if which(t).is_none() {
            missing.push(t.to_string());
        }
    }
    if missing.is_empty() {
        return true;
    }
    if std::env::var("RAIDKIT_SKIP_LOOP").as_deref() == Ok("1") {
        eprintln!(
            "skipped (RAIDKIT_SKIP_LOOP=1): needs {}",
            missing.join(", ")
        );
        return false;
    }
    panic!(
        "loop-device tests need {} (scripts/deps.sh installs the tools); \
         set RAIDKIT_SKIP_LOOP=1 to skip them",
        missing.join(", ")
    );
}

/// Run `cmd args` under `timeout` (the command itself is bounded, not only
/// our wait for it), panicking with its output if it fails.
fn timed(cmd: &str, a: &[&str]) -> Output {
    let exe = which(cmd).map(|p| p.display().to_string());
    let mut full = vec!["-k", "10", TOOL_SECS, exe.as_deref().unwrap_or(cmd)];
    full.extend_from_slice(a);
    tool("timeout", &full)
}

/// Backing files in a directory of /var/tmp, the loop devices attached to
/// them and the mounts made on them. Dropped even when the test panics:
/// unmounts, detaches the devices, then removes the files. Servers and
/// clients are the test's own locals, declared after the rig, so they are
/// dropped (killed by their own PID) before it lets go of the devices.
struct Rig {
    loops: Vec<String>,
    mounts: Vec<PathBuf>,
    dir: tempfile::TempDir,
}

impl Rig {
    fn new() -> Option<Rig> {
        if !loop_devices_available() {
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("raidkit-realdisk-")
            .tempdir_in("/var/tmp")
            .unwrap();
        Some(Rig {
            loops: Vec::new(),
            mounts: Vec::new(),
            dir,
        })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `n` loop devices with direct I/O over fresh (sparse, zero) files.
    fn attach(&mut self, n: usize) -> Vec<String> {
        (0..n)
            .map(|_| {
                let i = self.loops.len();
                let f = self.path().join(format!("backing{i}.img"));
                std::fs::File::create(&f).unwrap().set_len(MEMBER).unwrap();
                let o = timed(
                    "losetup",
                    &["--direct-io=on", "-f", "--show", f.to_str().unwrap()],
                );
                let dev = String::from_utf8_lossy(&o.stdout).trim().to_string();
                assert!(dev.starts_with("/dev/loop"), "losetup printed {dev:?}");
                self.loops.push(dev.clone());
                // The kernel may fall back to buffered I/O for a backing
                // file system without O_DIRECT; then this would not test
                // what it says.
                let base = dev.trim_start_matches("/dev/");
                let dio = std::fs::read_to_string(format!("/sys/block/{base}/loop/dio"))
                    .unwrap_or_default();
                assert_eq!(dio.trim(), "1", "{dev}: direct I/O not on");
                dev
            })
            .collect()
    }

    /// A second loop device over the backing file of `dev` (one of
    /// `attach`'s): another path to the same disk, as multipath gives.
    fn alias(&mut self, dev: &str) -> String {
        let i = self
            .loops
            .iter()
            .position(|d| d == dev)
            .expect("attached here");
        let f = self.path().join(format!("backing{i}.img"));
        let o = timed(
            "losetup",
            &["--direct-io=on", "-f", "--show", f.to_str().unwrap()],
        );
        let alias = String::from_utf8_lossy(&o.stdout).trim().to_string();
        assert!(alias.starts_with("/dev/loop"), "losetup printed {alias:?}");
        self.loops.push(alias.clone());
        alias
    }

    /// Mount `dev` on a fresh directory under the rig's.
    fn mount_with(&mut self, dev: &str, opts: &[&str]) -> PathBuf {
        let m = self.path().join(format!("mnt{}", self.mounts.len()));
        std::fs::create_dir(&m).unwrap();
        let mut a: Vec<&str> = opts.to_vec();
        a.extend([dev, m.to_str().unwrap()]);
        timed("mount", &a);
        self.mounts.push(m.clone());
        m
    }

    fn umount(&mut self, m: &Path) {
        timed("umount", &[m.to_str().unwrap()]);
        self.mounts.retain(|x| x != m);
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        // Never panics: this also runs while a failed test unwinds.
        let exe = |n: &str| which(n).map_or(n.to_string(), |p| p.display().to_string());
        for m in self.mounts.drain(..).rev() {
            cleanup(
                &exe("umount"),
                &[m.to_str().unwrap()],
                Duration::from_secs(30),
            );
        }
        for d in self.loops.drain(..) {
            cleanup(&exe("losetup"), &["-d", &d], Duration::from_secs(30));
        }
        // The files go with `dir`, dropped after this.
    }
}

/// Every descriptor `pid` has open on each of `devs` carries O_DIRECT
/// (fdinfo's flags, octal), and each device has at least one.
fn assert_direct_fds(pid: u32, devs: &[String]) {
    for dev in devs {
        let mut seen = 0;
        for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .flatten()
        {
            if std::fs::read_link(e.path()).ok().as_deref() != Some(Path::new(dev)) {
                continue;
            }
            let fd = e.file_name().to_string_lossy().to_string();
            let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).unwrap();
            let flags = info.lines().find_map(|l| l.strip_prefix("flags:")).unwrap();
            let flags = u32::from_str_radix(flags.trim(), 8).unwrap();
            assert_eq!(
                flags & O_DIRECT_OCTAL,
                O_DIRECT_OCTAL,
                "server fd {fd} on {dev}: flags {flags:o} lack O_DIRECT"
            );
            seen += 1;
        }
        assert!(seen > 0, "the server holds no descriptor on {dev}");
    }
}

/// A part of the array that 4 fio jobs write and verify, each its own
/// `per_job` bytes from `offset` on.
#[derive(Clone, Copy)]
struct Region {
    name: &'static str,
    offset: u64,
    per_job: u64,
}

/// Written (and verified) with the array whole.
const A: Region = Region {
    name: "whole",
    offset: 0,
    per_job: 6 << 20,
};
/// Written (and verified) with a member failed, before the rebuild.
const B: Region = Region {
    name: "degraded",
    offset: 24 << 20,
    per_job: 4 << 20,
};

/// fio through the nbd engine, 4 jobs (4 connections) at queue depth 16,
/// random writes of 4-128 KiB with crc32c headers: written and read back
/// (`verify_only` false), or only read back and checked against what the
/// same job wrote before (true). Fails on any error or mismatch.
fn fio(dir: &Path, uri: &str, r: Region, verify_only: bool) {
    let out = dir.join(format!("fio-{}.json", r.name));
    let _ = std::fs::remove_file(&out);
    let mut a = vec![
        format!("--name={}", r.name),
        "--ioengine=nbd".into(),
        format!("--uri={uri}"),
        "--rw=randwrite".into(),
        "--bsrange=4k-128k".into(),
        "--iodepth=16".into(),
        "--numjobs=4".into(),
        format!("--offset={}", r.offset),
        format!("--size={}", r.per_job),
        format!("--offset_increment={}", r.per_job),
        "--verify=crc32c".into(),
        "--do_verify=1".into(),
        "--verify_fatal=1".into(),
        // No verify state file left in the working directory.
        "--verify_state_save=0".into(),
        "--group_reporting".into(),
        "--output-format=json".into(),
        format!("--output={}", out.display()),
    ];
    if verify_only {
        a.push("--verify_only".into());
    }
    let a: Vec<&str> = a.iter().map(|s| s.as_str()).collect();
    let o = timed("fio", &a);
    let text = std::fs::read_to_string(&out).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "fio output: {e}: {text} {}",
            String::from_utf8_lossy(&o.stderr)
        )
    });
    let job = &v["jobs"][0];
    // fio exits 0 after a verify mismatch in some modes: its JSON says.
    assert_eq!(
        job["error"],
        0,
        "fio {} (verify_only {verify_only}) reported an error: {}",
        r.name,
        String::from_utf8_lossy(&o.stderr)
    );
    let total = 4 * r.per_job;
    let read = job["read"]["io_bytes"].as_u64().unwrap();
    assert!(read >= total, "{}: verify read {read} of {total}", r.name);
    if !verify_only {
        let written = job["write"]["io_bytes"].as_u64().unwrap();
        assert!(written >= total, "{}: wrote {written} of {total}", r.name);
    }
}

/// What qemu-io writes at odd offsets and lengths: (offset from `base`,
/// length, byte; 0 written as zeroes with `write -z`). Chunks are 64 KiB,
/// so several straddle chunk and sector boundaries.
const PATTERNS: [(u64, u64, u8); 6] = [
    (4097, 1001, 0x11),
    (123_457, 7777, 0x22),
    ((1 << 20) - 3, 70_001, 0x33),
    ((2 << 20) + 511, 1, 0x44),
    ((3 << 20) + 1, 5000, 0),
    ((3 << 20) + 65_535, 131_075, 0x66),
];

/// Where the patterns start: past regions A and B.
const BASE: u64 = 44 << 20;

/// The patterns, plus the array's last 4099 bytes.
fn patterns(size: u64) -> Vec<(u64, u64, u8)> {
    let mut p: Vec<_> = PATTERNS.iter().map(|&(o, l, b)| (BASE + o, l, b)).collect();
    p.push((size - 4099, 4099, 0x77));
    p
}

/// Run qemu-io's commands on `uri` (under `timeout`); panics on a failed
/// command or pattern mismatch.
fn qemu_io(uri: &str, cmds: &[String]) {
    let mut a = vec!["-f", "raw"];
    for c in cmds {
        a.push("-c");
        a.push(c);
    }
    a.push(uri);
    let o = timed("qemu-io", &a);
    let out = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(
        !out.contains("Pattern verification failed") && !out.contains("failed"),
        "{out}"
    );
    let reads = cmds.iter().filter(|c| c.starts_with("read ")).count();
    assert_eq!(out.matches("read ").count(), reads, "{out}");
}

fn qemu_io_write(uri: &str, pats: &[(u64, u64, u8)]) {
    let mut cmds = Vec::new();
    for (i, &(o, l, b)) in pats.iter().enumerate() {
        // Some in flight at once (aio), the rest one at a time.
        cmds.push(match (b, i % 2) {
            (0, _) => format!("write -z {o} {l}"),
            (_, 0) => format!("write -P {b} {o} {l}"),
            _ => format!("aio_write -P {b} {o} {l}"),
        });
    }
    cmds.push("aio_flush".into());
    cmds.push("flush".into());
    qemu_io(uri, &cmds);
}

fn qemu_io_read(uri: &str, pats: &[(u64, u64, u8)]) {
    let cmds: Vec<String> = pats
        .iter()
        .map(|&(o, l, b)| format!("read -P {b} {o} {l}"))
        .collect();
    qemu_io(uri, &cmds);
}

/// The patterns read offline with `raidkit read` (another path than the
/// server's) are the bytes qemu-io wrote.
fn read_offline(ms: &[String], pats: &[(u64, u64, u8)]) {
    for &(o, l, b) in pats {
        let (os, ls) = (o.to_string(), l.to_string());
        let got = ok(&args(&["read", "--offset", &os, "--length", &ls], ms)).stdout;
        assert_eq!(got.len() as u64, l, "raidkit read at {o}");
        assert!(
            got.iter().all(|&x| x == b),
            "raidkit read at {o}+{l}: not all {b:#x}"
        );
    }
}

fn detail(ms: &[String]) -> Value {
    serde_json::from_slice(&ok(&args(&["detail", "--json"], ms)).stdout).unwrap()
}

/// Which roles to fail once role 0 has been rebuilt onto the spare, so that
/// the data can only be read with the rebuilt member's help: its mirror
/// partner (RAID-1, RAID-10 n2: roles 0 and 1 hold the same chunks), one
/// other member (RAID-4/5), two (RAID-6).
fn then_fail(level: &str) -> &'static [usize] {
    match level {
        "6" => &[1, 2],
        _ => &[1],
    }
}

/// One level's whole cycle on `n` loop devices (and a spare).
fn cycle(level: &str, n: usize, redundant: bool) {
    cycle_with(level, None, n, redundant);
}

/// `cycle` with a layout given to create.
fn cycle_with(level: &str, layout: Option<&str>, n: usize, redundant: bool) {
    let Some(mut rig) = Rig::new() else {
        return;
    };
    let devs = rig.attach(n + 1);
    let (ms, spare) = (devs[..n].to_vec(), devs[n].clone());
    let name = format!("rd{level}{}", layout.unwrap_or(""));
    let mut create = vec![
        "create", "--io", "direct", "--level", level, "--chunk", "64K", "--name", &name,
    ];
    if let Some(l) = layout {
        create.extend(["--layout", l]);
    }
    ok(&args(&create, &ms));
    let size = detail(&ms)["size"].as_u64().unwrap();
    assert!(size > BASE + (4 << 20), "{size}");
    let pats = patterns(size);

    let mut s = Served::start(rig.path(), &ms, &["--io", "direct"]);
    let ctl = s.control.display().to_string();
    let admin = |a: &[&str]| {
        let mut v = a.to_vec();
        v.extend(["--control", ctl.as_str()]);
        ok(&v);
    };
    assert_direct_fds(s.pid(), &ms);
    fio(rig.path(), &s.uri, A, false);
    qemu_io_write(&s.uri, &pats);
    qemu_io_read(&s.uri, &pats);

    if redundant {
        admin(&["fail", "0"]);
        fio(rig.path(), &s.uri, B, false);
        admin(&["add", &spare]);
        admin(&["wait", "--timeout", "120"]);
        assert_direct_fds(s.pid(), std::slice::from_ref(&spare));
        // Now read everything through the rebuilt member.
        let others = then_fail(level);
        for r in others {
            admin(&["fail", &r.to_string()]);
        }
        fio(rig.path(), &s.uri, A, true);
        fio(rig.path(), &s.uri, B, true);
        qemu_io_read(&s.uri, &pats);
        // Take them back (only what they missed is resynced), and let go
        // of the member that failed first.
        for &r in others {
            admin(&["remove", &ms[r]]);
            admin(&["add", &ms[r]]);
        }
        admin(&["remove", &ms[0]]);
        admin(&["wait", "--timeout", "120"]);
    }
    let st: Value =
        serde_json::from_slice(&ok(&["status", "--control", &ctl, "--json"]).stdout).unwrap();
    assert_eq!(st["io"]["errors"], 0, "{st}");
    assert_eq!(s.stop().code(), Some(0), "{}", s.log());

    let now: Vec<String> = if redundant {
        std::iter::once(spare.clone())
            .chain(ms[1..].iter().cloned())
            .collect()
    } else {
        ms.clone()
    };
    let d = detail(&now);
    assert_eq!(d["state"], "optimal", "{d}");
    if redundant {
        assert_eq!(d["members"][0]["path"], spare.as_str(), "{d}");
    }
    let o = raidkit(&args(&["check", "--json"], &now));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    assert!(
        o.status.success(),
        "check: {v} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(v["mismatches"], 0, "{v}");
    read_offline(&now, &pats);
}

#[test]
fn linear_on_loop_devices() {
    cycle("linear", 3, false);
}

#[test]
fn raid0_on_loop_devices() {
    cycle("0", 4, false);
}

#[test]
fn raid1_on_loop_devices_rebuilds_onto_a_spare() {
    cycle("1", 2, true);
}

#[test]
fn raid4_on_loop_devices_rebuilds_onto_a_spare() {
    cycle("4", 3, true);
}

#[test]
fn raid5_on_loop_devices_rebuilds_onto_a_spare() {
    cycle("5", 3, true);
}

#[test]
fn raid6_on_loop_devices_rebuilds_onto_a_spare() {
    cycle("6", 4, true);
}

#[test]
fn raid10_on_loop_devices_rebuilds_onto_a_spare() {
    cycle("10", 4, true);
}

#[test]
fn raid10_far_on_loop_devices_rebuilds_onto_a_spare() {
    cycle_with("10", Some("f2"), 4, true);
}

/// The first MiB of a device, read through the page cache (which also
/// holds what anything wrote through it or past it).
fn first_mib(dev: &str) -> Vec<u8> {
    use std::io::Read;
    let mut b = vec![0u8; 1 << 20];
    std::fs::File::open(dev)
        .unwrap()
        .read_exact(&mut b)
        .unwrap();
    b
}

#[test]
fn a_loop_device_holding_a_mounted_ext4_is_refused() {
    let Some(mut rig) = Rig::new() else {
        return;
    };
    let devs = rig.attach(2);
    let (blank, fs) = (devs[0].clone(), devs[1].clone());
    // Inode tables and journal written now, not by a kernel thread while
    // the bytes are being compared.
    timed(
        "mkfs.ext4",
        &["-q", "-E", "lazy_itable_init=0,lazy_journal_init=0", &fs],
    );
    // Read-only: a mounted ext4 updates its own superblock now and then
    // (a journal commit after the mount), which the comparison below would
    // take for raidkit's doing; mounted either way, the device is in use.
    let mnt = rig.mount_with(&fs, &["-o", "ro"]);
    timed("sync", &[]);
    let (blank0, fs0) = (first_mib(&blank), first_mib(&fs));
    assert!(blank0.iter().all(|&b| b == 0));
    assert!(
        fs0.iter().any(|&b| b != 0),
        "no ext4 superblock in the first MiB"
    );
    for io in ["direct", "buffered", "auto"] {
        for force in [false, true] {
            // The mounted device last: no member may be written before
            // every member has been checked.
            let mut a = vec!["create", "--io", io, "--level", "1"];
            if force {
                a.push("--force");
            }
            a.extend([blank.as_str(), fs.as_str()]);
            let o = raidkit_refused(&a);
            assert!(
                !o.status.success(),
                "{a:?} was not refused: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            assert!(first_mib(&fs) == fs0, "{a:?}: the mounted ext4 was written");
            assert!(
                first_mib(&blank) == blank0,
                "{a:?}: the other member was written"
            );
        }
    }
    // Unmounted, the same create goes through and changes those bytes: the
    // comparison above sees a write, and the refusal was the mount's.
    rig.umount(&mnt);
    ok(&[
        "create", "--io", "direct", "--level", "1", "--force", &blank, &fs,
    ]);
    assert!(
        first_mib(&fs) != fs0,
        "create wrote nothing to the first MiB"
    );
}

#[test]
fn an_array_served_is_refused_through_other_paths_to_its_disks() {
    // A second loop device over each backing file: the same disks by other
    // names, which the members' locks do not see. A second server of the
    // array through them was started, and the two wrote diverging copies,
    // each thinking the array clean.
    let Some(mut rig) = Rig::new() else {
        return;
    };
    let devs = rig.attach(2);
    ok(&args(&["create", "--level", "1"], &devs));
    let aliases: Vec<String> = devs.iter().map(|d| rig.alias(d)).collect();
    let mut a = Served::start(rig.path(), &devs, &[]);
    let before: Vec<Vec<u8>> = devs.iter().map(|d| first_mib(d)).collect();
    let ctl = rig.path().join("b.ctl").display().to_string();
    let serve_b = args(
        &["serve", "--listen", "127.0.0.1:0", "--control", &ctl],
        &aliases,
    );
    let write_b = args(&["write", "--offset", "0"], &aliases);
    for cmd in [serve_b.clone(), write_b] {
        // Servers are found by their links in the temp directory, which
        // `Served` puts in the test's own.
        let o = output_within(
            Command::new(BIN)
                .args(&cmd)
                .env("TMPDIR", rig.path())
                .stdin(std::process::Stdio::null()),
            REFUSAL,
        );
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert_eq!(o.status.code(), Some(1), "{cmd:?}: {err}");
        assert!(err.contains(&format!("PID {}", a.pid())), "{cmd:?}: {err}");
    }
    let after: Vec<Vec<u8>> = devs.iter().map(|d| first_mib(d)).collect();
    assert!(before == after, "a refused start wrote to the members");
    // Once the first server has stopped, the other paths serve it.
    assert_eq!(a.stop().code(), Some(0));
    let mut b = Served::start(rig.path(), &aliases, &[]);
    assert_eq!(b.stop().code(), Some(0));
}

#[test]
fn a_raid5_of_loop_devices_grows_into_backing_files_made_longer() {
    // The way a disk grows under a running array: the backing files made
    // longer and the loop devices told (`losetup -c`), the server with
    // direct I/O reads the devices' new size (BLKGETSIZE64) on `grow
    // --size max`. Without checksums (whose area was sized for the
    // devices at create) the array grows as far as the devices do.
    let Some(mut rig) = Rig::new() else {
        return;
    };
    let ms = rig.attach(3);
    ok(&args(
        &[
            "create",
            "--io",
            "direct",
            "--level",
            "5",
            "--chunk",
            "64K",
            "--checksums",
            "off",
        ],
        &ms,
    ));
    let before = detail(&ms)["size"].as_u64().unwrap();
    let mut s = Served::start(rig.path(), &ms, &["--io", "direct"]);
    let ctl = s.control.display().to_string();
    let old = patterns(before);
    qemu_io_write(&s.uri, &old);
    for (i, dev) in ms.iter().enumerate() {
        let f = rig.path().join(format!("backing{i}.img"));
        std::fs::OpenOptions::new()
            .write(true)
            .open(&f)
            .unwrap()
            .set_len(2 * MEMBER)
            .unwrap();
        timed("losetup", &["-c", dev]);
    }
    let v: Value =
        serde_json::from_slice(&ok(&["grow", "--json", "--control", &ctl, "--size", "max"]).stdout)
            .unwrap();
    let after = v["new_size"].as_u64().unwrap();
    assert_eq!(v["size"].as_u64(), Some(before), "{v}");
    // Each member gained 64 MiB; two of the three hold data.
    assert_eq!(after - before, 2 * MEMBER, "{v}");
    ok(&["wait", "--control", &ctl, "--timeout", "120"]);
    // The new space takes data at odd offsets and lengths, up to its
    // last byte; the old patterns are where they were.
    let new: Vec<(u64, u64, u8)> = PATTERNS
        .iter()
        .map(|&(o, l, b)| (before + o, l, b))
        .chain([(after - 4099, 4099, 0x77)])
        .collect();
    qemu_io_write(&s.uri, &new);
    qemu_io_read(&s.uri, &new);
    qemu_io_read(&s.uri, &old);
    assert!(s.stop().success());
    ok(&args(&["check"], &ms));
    assert_eq!(detail(&ms)["size"].as_u64(), Some(after));
    read_offline(&ms, &new);
}

#[test]
fn kill9_torture_on_loop_devices_loses_nothing_flushed() {
    // crash.rs's kill -9 torture with direct-I/O loop devices as the
    // members: the server opens them with O_DIRECT, a journal record's
    // durable write is a device write and a cache flush, and a client's
    // FLUSH flushes the devices. Every write acknowledged and flushed must
    // survive each kill, with a member left out every other restart.
    let Some(mut rig) = Rig::new() else {
        return;
    };
    for (level, n, seed) in [("5", 4, "11"), ("6", 5, "12")] {
        let devs = rig.attach(n).join(",");
        let (code, out) = torture(&[
            "--cycles",
            "6",
            "--level",
            level,
            "--seed",
            seed,
            "--devices",
            &devs,
        ]);
        assert_torture_clean(code, &out, &format!("RAID-{level}"), 6, 500);
    }
    // One writer in sequence, a request at a time: what serve writes
    // behind the client on devices. A flush still covers every write
    // before it (with flushes made no-ops for writes behind, this lost
    // 12534 blocks in 6 cycles).
    let devs = rig.attach(4).join(",");
    let (code, out) = torture(&[
        "--cycles",
        "6",
        "--seed",
        "21",
        "--sequential",
        "--devices",
        &devs,
    ]);
    assert_torture_clean(code, &out, "RAID-5, one writer in sequence", 6, 500);
    // The same check sees a loss on devices: blocks scribbled over through
    // the device after the first kill (an array without checksums, which
    // would heal them) are reported lost, not as any other failure.
    let devs = rig.attach(4).join(",");
    let (code, out) = torture(&["--cycles", "2", "--sabotage", "--devices", &devs]);
    assert_eq!(code, Some(1), "a scribbled block went unnoticed:\n{out}");
    let (_, _, losses) = summary(&out).unwrap_or_else(|| panic!("{out}"));
    assert!(losses >= 1, "{out}");
}

/// A disk failed, removed and added straight back while a client writes:
/// its last requests in flight keep it open a moment after `remove`, and
/// the kernel refuses the exclusive open meanwhile; `add` waits for this
/// process's own hold to go (it failed with "in use ... md, LVM or
/// another program" in most rounds).
#[test]
fn a_disk_removed_under_load_is_added_back_at_once() {
    let Some(mut rig) = Rig::new() else {
        return;
    };
    let ms = rig.attach(4);
    ok(&args(
        &["create", "--io", "direct", "--level", "6", "--chunk", "64K"],
        &ms,
    ));
    let mut s = Served::start(rig.path(), &ms, &["--io", "direct"]);
    let ctl = s.control.display().to_string();
    // fio bounds itself (--runtime) and is killed by its own PID.
    let fio_secs = "--runtime=60";
    let mut writer = Guarded::spawn(
        std::process::Command::new("fio")
            .args([
                "--name=w",
                "--ioengine=nbd",
                &format!("--uri={}", s.uri),
                "--rw=randwrite",
                "--bs=64k",
                "--iodepth=32",
                "--size=60M",
                "--time_based",
                fio_secs,
                "--output=/dev/null",
            ])
            .stderr(std::process::Stdio::null()),
    );
    std::thread::sleep(Duration::from_secs(1));
    for round in 0..6 {
        ok(&["fail", "--control", &ctl, &ms[3]]);
        ok(&["remove", "--control", &ctl, &ms[3]]);
        let o = raidkit(&["add", "--control", &ctl, &ms[3]]);
        assert!(
            o.status.success(),
            "round {round}: add right after remove failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        ok(&["wait", "--timeout", "120", "--control", &ctl]);
    }
    writer.kill();
    assert_eq!(s.stop().code(), Some(0), "{}", s.log());
    let o = raidkit(&args(&["check", "--json"], &ms));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    assert!(o.status.success(), "check: {v}");
    assert_eq!(v["mismatches"], 0, "{v}");
}
