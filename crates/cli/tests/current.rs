//! Never serve what is not known to be current: an old copy of a member,
//! an initial sync cut short, a member half rebuilt, a start with a member
//! forgotten, a member that shrinks, a process out of threads. Each test
//! here failed on the code before these were handled.

mod common;

use common::*;
use rand::{Rng, RngCore, SeedableRng};
use serde_json::Value;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A child process killed (and reaped) when dropped, so that a failing
/// test leaves nothing running.
struct Reaped(Option<Child>);

impl Reaped {
    fn spawn(cmd: &mut Command) -> Reaped {
        Reaped(Some(cmd.spawn().expect("spawn")))
    }
    fn id(&self) -> u32 {
        self.0.as_ref().expect("running").id()
    }
    fn kill9(&mut self) -> Option<std::process::ExitStatus> {
        let mut c = self.0.take()?;
        let _ = c.kill();
        c.wait().ok()
    }
    /// Wait at most `secs` (taking its output as it comes); kill it and
    /// panic if it takes longer.
    fn wait(&mut self, secs: u64, what: &str) -> Output {
        let c = self.0.take().expect("running");
        let pid = c.id().to_string();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(c.wait_with_output());
        });
        match rx.recv_timeout(Duration::from_secs(secs)) {
            Ok(o) => o.unwrap(),
            Err(_) => {
                let _ = Command::new("kill").args(["-9", &pid]).status();
                panic!("{what} did not finish in {secs} s");
            }
        }
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Run raidkit with a deadline (a refusal that hangs fails the test).
fn raidkit_t(a: &[&str], secs: u64) -> Output {
    Reaped::spawn(
        Command::new(BIN)
            .args(a)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )
    .wait(secs, &format!("raidkit {a:?}"))
}

fn detail(ms: &[String]) -> Value {
    serde_json::from_slice(&ok(&args(&["detail", "--json"], ms)).stdout).unwrap()
}

fn digest(ms: &[String]) -> Vec<Vec<u8>> {
    ms.iter().map(|m| std::fs::read(m).unwrap()).collect()
}

fn read_array(ms: &[&str], offset: u64, len: u64) -> Output {
    let (o, l) = (offset.to_string(), len.to_string());
    let mut a = vec!["read", "--offset", &o, "--length", &l];
    a.extend_from_slice(ms);
    raidkit_t(&a, 60)
}

fn write_array(dir: &Path, ms: &[String], offset: u64, data: &[u8], extra: &[&str]) {
    let input = dir.join("in.bin");
    std::fs::write(&input, data).unwrap();
    let (o, i) = (offset.to_string(), input.display().to_string());
    let mut a = vec!["write", "--offset", &o, "--in", &i];
    a.extend_from_slice(extra);
    ok(&args(&a, ms));
}

fn status(ctl: &Path) -> Value {
    let c = ctl.display().to_string();
    serde_json::from_slice(&ok(&["status", "--control", &c, "--json"]).stdout).unwrap()
}

/// Wait until the server has no recovery running or pending.
fn settle(s: &Served) {
    let c = s.control.display().to_string();
    let o = raidkit_t(&["wait", "--control", &c, "--timeout", "120"], 150);
    assert!(
        o.status.success(),
        "wait: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn mismatches(ms: &[String]) -> u64 {
    let o = raidkit_t(&args(&["check", "--json"], ms), 120);
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|_| panic!("check: {}", String::from_utf8_lossy(&o.stderr)));
    v["mismatches"].as_u64().unwrap()
}

#[test]
fn an_old_copy_of_a_member_is_stale_and_resynced() {
    let dir = tmp();
    let ms = members(dir.path(), 4);
    create("5", &ms, "32M");
    let old = dir.path().join("d2.old");
    std::fs::copy(&ms[2], &old).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(21);
    let mut data = vec![0u8; 8 << 20];
    rng.fill_bytes(&mut data);
    // Written by a server (through NBD) and by the offline writer.
    let mut s = Served::start(dir.path(), &ms, &[]);
    let f = dir.path().join("half.bin");
    std::fs::write(&f, &data[..4 << 20]).unwrap();
    tool(
        "timeout",
        &["60", "nbdcopy", &f.display().to_string(), &s.uri],
    );
    assert!(s.stop().success());
    write_array(dir.path(), &ms, 4 << 20, &data[4 << 20..], &[]);
    std::fs::copy(&old, &ms[2]).unwrap();

    let d = detail(&ms);
    assert_eq!(d["state"], "degraded", "{d}");
    assert_eq!(d["members"][2]["state"], "stale", "{d}");
    // Offline reads never use it: with another member away they fail
    // rather than mix old data in.
    let without3 = [ms[0].as_str(), ms[1].as_str(), ms[2].as_str()];
    let o = read_array(&without3, 0, 8 << 20);
    assert!(
        !o.status.success() || o.stdout == data,
        "old data was returned"
    );
    let all: Vec<&str> = ms.iter().map(|s| s.as_str()).collect();
    assert_eq!(read_array(&all, 0, 8 << 20).stdout, data);

    // A server takes it back and resyncs it; then every member is current.
    let mut s = Served::start(dir.path(), &ms, &[]);
    settle(&s);
    assert!(s.stop().success(), "{}", s.log());
    let d = detail(&ms);
    assert_eq!(d["state"], "optimal", "{d}");
    assert_eq!(mismatches(&ms), 0);
    let without1 = [ms[0].as_str(), ms[2].as_str(), ms[3].as_str()];
    assert_eq!(read_array(&without1, 0, 8 << 20).stdout, data);
}

#[test]
fn a_member_one_update_behind_is_current_but_two_are_not() {
    // A crash in the middle of a superblock update leaves members one
    // event behind: they must not be taken for stale. A copy from before
    // a start and a write is two or more behind, and stale.
    let dir = tmp();
    let ms = members(dir.path(), 5);
    create("6", &ms, "16M");
    let copies: Vec<Vec<u8>> = digest(&ms);
    write_array(dir.path(), &ms, 0, &[7u8; 65536], &[]);
    let after = detail(&ms)["events"].as_u64().unwrap();
    assert!(
        after >= 4,
        "start, dirty and clean each raise the events: {after}"
    );
    // Put the superblocks of the first copy back on three members: behind.
    for i in 0..3 {
        let mut now = std::fs::read(&ms[i]).unwrap();
        now[..16384].copy_from_slice(&copies[i][..16384]);
        std::fs::write(&ms[i], &now).unwrap();
    }
    let d = detail(&ms);
    assert_eq!(d["members"][0]["state"], "stale", "{d}");
    assert_eq!(d["state"], "failed", "{d}");
}

/// Random bytes in four member files (the initial sync must make them
/// consistent).
fn random_members(dir: &Path, n: usize, size: usize, seed: u64) -> Vec<String> {
    let ms = members(dir, n);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut buf = vec![0u8; size];
    for m in &ms {
        rng.fill_bytes(&mut buf);
        std::fs::write(m, &buf).unwrap();
    }
    ms
}

#[test]
fn a_create_killed_during_its_initial_sync_is_resumed_and_finished() {
    for (level, n) in [("5", 4), ("1", 2), ("6", 5)] {
        let dir = tmp();
        // How long an uncut create takes, to cut inside it.
        let ms = random_members(dir.path(), n, 16 << 20, 1);
        let t = Instant::now();
        ok(&args(
            &[
                "create", "--level", level, "--chunk", "64K", "--force", "--name", "c",
            ],
            &ms,
        ));
        let full = t.elapsed();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let (mut mid_sync, cuts) = (0, 10);
        for cut in 0..cuts {
            let ms = random_members(dir.path(), n, 16 << 20, cut + 2);
            let mut c = Reaped::spawn(
                Command::new(BIN)
                    .args(args(
                        &[
                            "create", "--level", level, "--chunk", "64K", "--force", "--name", "c",
                        ],
                        &ms,
                    ))
                    .stdout(Stdio::null())
                    .stderr(Stdio::null()),
            );
            std::thread::sleep(full.mul_f64(rng.gen_range(0.05..0.95)));
            c.kill9();
            let d = raidkit_t(&args(&["detail", "--json"], &ms), 30);
            if !d.status.success() {
                continue; // cut before the superblocks were written
            }
            let d: Value = serde_json::from_slice(&d.stdout).unwrap();
            if d["resync_offset"].is_null() {
                continue; // cut after the sync finished
            }
            mid_sync += 1;
            // Offline writes before the resync: parity from all the data.
            let mut data = vec![0u8; 1 << 20];
            rng.fill_bytes(&mut data);
            let at = rng.gen_range(0..7u64) << 20;
            write_array(dir.path(), &ms, at, &data, &[]);
            let all: Vec<&str> = ms.iter().map(|s| s.as_str()).collect();
            for gone in 0..n {
                let some: Vec<&str> = (0..n).filter(|&i| i != gone).map(|i| all[i]).collect();
                let o = read_array(&some, at, 1 << 20);
                // Refused (not yet synced) or right, never wrong.
                assert!(
                    !o.status.success() || o.stdout == data,
                    "RAID-{level} cut {cut}: wrong data without member {gone}"
                );
            }
            let mut s = Served::start(dir.path(), &ms, &[]);
            settle(&s);
            assert!(s.stop().success(), "{}", s.log());
            let d = detail(&ms);
            assert!(d["resync_offset"].is_null(), "RAID-{level}: {d}");
            assert_eq!(mismatches(&ms), 0, "RAID-{level} cut {cut}");
            let whole = read_array(&all, 0, 8 << 20).stdout;
            assert_eq!(whole.len(), 8 << 20);
            assert_eq!(read_array(&all, at, 1 << 20).stdout, data);
            for gone in 0..n {
                let some: Vec<&str> = (0..n).filter(|&i| i != gone).map(|i| all[i]).collect();
                let o = read_array(&some, 0, 8 << 20);
                assert!(o.status.success(), "RAID-{level} without {gone}");
                assert_eq!(
                    o.stdout, whole,
                    "RAID-{level} cut {cut} without member {gone}"
                );
            }
        }
        assert!(
            mid_sync >= 3,
            "RAID-{level}: only {mid_sync} of {cuts} cuts landed in the sync"
        );
    }
}

#[test]
fn detail_after_a_killed_rebuild_says_rebuilding() {
    let dir = tmp();
    let ms = members(dir.path(), 4);
    create("5", &ms, "64M");
    let mut s = Served::start(
        dir.path(),
        &ms[..3],
        &["--run", "--rebuild-min", "4M", "--rebuild-max", "4M"],
    );
    let ctl = s.control.display().to_string();
    // The fourth member came back blank: added as new, rebuilt slowly.
    std::fs::File::create(&ms[3])
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    ok(&["add", "--control", &ctl, &ms[3]]);
    wait_for("a rebuild checkpoint", 30, || {
        status(&s.control)["recovery"]["bytes_done"]
            .as_u64()
            .unwrap_or(0)
            > 12 << 20
    });
    s.kill9();
    let d = detail(&ms);
    assert_eq!(d["state"], "degraded", "{d}");
    let m = d["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["path"] == ms[3].as_str())
        .unwrap_or_else(|| panic!("{d}"))
        .clone();
    assert_eq!(m["state"], "rebuilding", "{d}");
    assert!(m["recovery_offset"].as_u64().unwrap() > 0, "{d}");
    // scan says so too (it listed the array as complete, nothing more).
    let dir_s = dir.path().display().to_string();
    let sc: Value = serde_json::from_slice(&ok(&["scan", "--json", &dir_s]).stdout).unwrap();
    let m = sc["arrays"][0]["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["path"] == ms[3].as_str())
        .unwrap_or_else(|| panic!("{sc}"))
        .clone();
    assert!(m["recovery_offset"].as_u64().unwrap_or(0) > 0, "{sc}");
    let text = String::from_utf8(ok(&["scan", &dir_s]).stdout).unwrap();
    assert!(text.contains("REBUILDING"), "{text}");
}

#[test]
fn a_degraded_start_needs_run() {
    let dir = tmp();
    let ms = members(dir.path(), 5);
    create("6", &ms, "16M");
    let before = digest(&ms);
    let four = &ms[..4];
    let o = raidkit_t(&args(&["serve", "--listen", "127.0.0.1:0"], four), 30);
    assert_eq!(o.status.code(), Some(1));
    let o = raidkit_t(
        &args(&["write", "--offset", "0", "--in", "/dev/null"], four),
        30,
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        digest(&ms) == before,
        "a refused start wrote to the members"
    );
    // With --run it starts; then it knows it is degraded and needs no --run.
    let mut s = Served::start(dir.path(), four, &["--run"]);
    tool(
        "timeout",
        &[
            "30",
            "qemu-io",
            "-f",
            "raw",
            "-c",
            "write -P 5 0 64k",
            &s.uri,
        ],
    );
    assert!(s.stop().success());
    let mut s = Served::start(dir.path(), four, &[]);
    assert!(s.stop().success());
    // `missing` at create is an absent member: degraded from the start.
    let dir = tmp();
    let ms = members(dir.path(), 3);
    let mut a = args(
        &["create", "--level", "5", "--size", "16M", "--name", "m"],
        &ms,
    );
    a[8] = "missing";
    ok(&a);
    assert!(!dir.path().join("missing").exists());
    let present = [ms[0].clone(), ms[2].clone()];
    let d = detail(&present);
    assert_eq!(d["state"], "degraded", "{d}");
    let mut s = Served::start(dir.path(), &present, &[]);
    assert!(s.stop().success());
}

/// The member a finished `replace` retired still says it holds its role,
/// at an older event count. Given in place of its replacement it does not
/// stand for it: the start needs --run as for any member missing, nothing
/// written when refused. Given with it, it is left out and start-up says so.
#[test]
fn a_member_a_replace_retired_does_not_stand_for_its_replacement() {
    let dir = tmp();
    let t = dir.path();
    let ms = members(t, 4);
    create("5", &ms, "16M");
    let rep = t.join("r.img").display().to_string();
    std::fs::File::create(&rep)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let mut s = Served::start(t, &ms, &[]);
    let ctl = s.control.display().to_string();
    tool(
        "timeout",
        &[
            "30",
            "qemu-io",
            "-f",
            "raw",
            "-c",
            "write -P 0x2d 0 40M",
            &s.uri,
        ],
    );
    ok(&["replace", "--control", &ctl, &ms[1], "--with", &rep]);
    ok(&["wait", "--control", &ctl, "--timeout", "60"]);
    assert_eq!(status(&s.control)["state"], "optimal");
    assert!(s.stop().success(), "{}", s.log());

    let before = digest(&ms);
    let o = raidkit_t(&args(&["serve", "--listen", "127.0.0.1:0"], &ms), 30);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        digest(&ms) == before,
        "a refused start wrote to the members"
    );

    let mut all = ms.clone();
    all.push(rep.clone());
    let mut s = Served::start(t, &all, &[]);
    assert_eq!(status(&s.control)["state"], "optimal");
    let log = s.log();
    assert!(
        log.lines()
            .any(|l| l.contains(&ms[1]) && l.contains("not used")),
        "{log}"
    );
    // Nor is it listed among the members the start-up names.
    s.line_with(&format!("member {}: ", ms[0]));
    let out = s.out.lock().unwrap().clone();
    assert!(
        !out.iter()
            .any(|l| l.contains(&format!("member {}: ", ms[1]))),
        "{out:?}"
    );
    tool(
        "timeout",
        &[
            "30",
            "qemu-io",
            "-f",
            "raw",
            "-c",
            "read -P 0x2d 0 40M",
            &s.uri,
        ],
    );
    assert!(s.stop().success());
}

#[test]
fn check_refuses_members_a_server_holds_and_special_files_are_refused() {
    let dir = tmp();
    let ms = members(dir.path(), 3);
    create("5", &ms, "16M");
    let mut s = Served::start(dir.path(), &ms, &[]);
    let o = raidkit_t(&args(&["check"], &ms), 30);
    // Could not check: 2 (1 would say that redundancy disagrees).
    assert_eq!(o.status.code(), Some(2));
    // Named: the server, its array and its PID.
    let err = String::from_utf8_lossy(&o.stderr);
    let name = detail(&ms)["name"].as_str().unwrap().to_string();
    assert!(
        err.contains(&format!(
            "is in use by the raidkit server of array '{name}' (PID {})",
            s.pid()
        )),
        "{err}"
    );
    assert!(s.stop().success());
    assert_eq!(mismatches(&ms), 0);
    // A FIFO, a character device, a directory: refused without blocking.
    let fifo = dir.path().join("fifo");
    tool("mkfifo", &[&fifo.display().to_string()]);
    let f = fifo.display().to_string();
    for cmd in [
        vec!["examine", f.as_str()],
        vec!["detail", f.as_str()],
        vec!["serve", "--listen", "127.0.0.1:0", f.as_str()],
        vec!["examine", "/dev/zero"],
        vec![
            "create",
            "--level",
            "1",
            "--force",
            f.as_str(),
            ms[0].as_str(),
        ],
    ] {
        let o = raidkit_t(&cmd, 20);
        assert_eq!(o.status.code(), Some(1), "{cmd:?}");
    }
}

/// A server started by a shell that first puts itself in cgroup `cg`.
fn serve_in_cgroup(dir: &Path, cg: &Path, ms: &[String]) -> (Reaped, String, String) {
    let ctl = dir.join("ctl").display().to_string();
    let script = format!(
        "echo $$ > {}/cgroup.procs && exec {BIN} \"$@\"",
        cg.display()
    );
    let mut a = vec![
        "-c",
        &script,
        "sh",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--control",
        &ctl,
    ];
    a.extend(ms.iter().map(|s| s.as_str()));
    let mut c = Command::new("sh")
        .args(&a)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("serve.log")).unwrap())
        .spawn()
        .unwrap();
    let out = c.stdout.take().unwrap();
    let served = Reaped(Some(c));
    use std::io::BufRead;
    let mut addr = String::new();
    for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
        if let Some(i) = line.find("nbd://") {
            addr = line[i + 6..].split('/').next().unwrap().to_string();
            break;
        }
    }
    assert!(!addr.is_empty(), "server did not start");
    (served, addr, ctl)
}

/// An NBD connection through its handshake (fixed newstyle, NBD_OPT_EXPORT_NAME).
fn nbd_connect(addr: &str) -> Option<std::net::TcpStream> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).ok()?;
    s.write_all(&3u32.to_be_bytes()).ok()?; // FIXED_NEWSTYLE | NO_ZEROES
    let mut opt = Vec::new();
    opt.extend_from_slice(&0x4948_4156_454F_5054u64.to_be_bytes());
    opt.extend_from_slice(&1u32.to_be_bytes()); // EXPORT_NAME
    opt.extend_from_slice(&0u32.to_be_bytes());
    s.write_all(&opt).ok()?;
    let mut info = [0u8; 10];
    s.read_exact(&mut info).ok()?;
    Some(s)
}

/// One 4 KiB NBD write; Some(error code) if a reply came.
fn nbd_write(s: &mut std::net::TcpStream, offset: u64, byte: u8) -> Option<u32> {
    use std::io::{Read, Write};
    let mut req = Vec::new();
    req.extend_from_slice(&0x2560_9513u32.to_be_bytes());
    req.extend_from_slice(&0u16.to_be_bytes());
    req.extend_from_slice(&1u16.to_be_bytes()); // WRITE
    req.extend_from_slice(&7u64.to_be_bytes());
    req.extend_from_slice(&offset.to_be_bytes());
    req.extend_from_slice(&4096u32.to_be_bytes());
    req.extend_from_slice(&[byte; 4096]);
    s.write_all(&req).ok()?;
    let mut rep = [0u8; 16];
    s.read_exact(&mut rep).ok()?;
    Some(u32::from_be_bytes(rep[4..8].try_into().unwrap()))
}

/// Stop a server by its PID (SIGTERM); it must exit 0 within a minute
/// (its log, `serve.log` in `dir`, in the failure).
fn stop_by_pid(server: &mut Reaped, dir: &Path) {
    tool("kill", &["-TERM", &server.id().to_string()]);
    let o = server.wait(60, "the server's stop");
    assert!(
        o.status.success(),
        "{}: {}",
        o.status,
        std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
    );
}

fn threads_of(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Removes a cgroup directory (once its processes are gone).
struct Cgroup(std::path::PathBuf);

impl Drop for Cgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn a_server_out_of_threads_refuses_connections_but_keeps_serving_and_the_array() {
    let root = Path::new("/sys/fs/cgroup/pids");
    assert!(
        root.join("cgroup.procs").exists(),
        "this test needs the pids cgroup controller (v1) at {}",
        root.display()
    );
    let cg = Cgroup(root.join(format!("raidkit-test-{}", std::process::id())));
    std::fs::create_dir(&cg.0).unwrap();
    let dir = tmp();
    let ms = members(dir.path(), 5);
    create("6", &ms, "16M");
    let (mut server, addr, ctl) = serve_in_cgroup(dir.path(), &cg.0, &ms);
    let pid = server.id();
    let base = threads_of(pid);
    // Room for about four connections of nine threads each.
    std::fs::write(cg.0.join("pids.max"), (base + 40).to_string()).unwrap();
    let mut conns: Vec<_> = (0..60).filter_map(|_| nbd_connect(&addr)).collect();
    assert!(conns.len() >= 2, "no connection got through");
    // Writes on every connection still open (the first write marks the
    // array dirty: superblock writes with no thread to spare).
    let mut acked = 0;
    for (i, c) in conns.iter_mut().enumerate() {
        if let Some(err) = nbd_write(c, i as u64 * 65536, i as u8) {
            assert_eq!(err, 0, "write on connection {i} failed");
            acked += 1;
        }
    }
    assert!(acked >= 2, "only {acked} writes were answered");
    assert!(
        std::fs::metadata(format!("/proc/{pid}")).is_ok(),
        "the server died"
    );
    drop(conns);
    std::fs::write(cg.0.join("pids.max"), "max").unwrap();
    let st = status(Path::new(&ctl));
    assert!(st["connections"]["refused"].as_u64().unwrap() > 0, "{st}");
    assert_eq!(st["state"], "optimal", "{st}");
    stop_by_pid(&mut server, dir.path());
    let d = detail(&ms);
    assert_eq!(d["state"], "optimal", "{d}");
    assert_eq!(d["array_state"], "clean", "{d}");
    assert_eq!(mismatches(&ms), 0);
}

/// A server whose reader of stdout went away before it said where it
/// listens (`raidkit serve ... | grep -m1 listening`) keeps serving: its
/// start-up lines once made it panic on the broken pipe.
#[test]
fn a_server_whose_stdout_was_closed_serves_and_stops_cleanly() {
    let dir = tmp();
    let ms = members(dir.path(), 3);
    create("5", &ms, "16M");
    let ctl = dir.path().join("ctl");
    let c = ctl.display().to_string();
    let mut a = vec!["serve", "--listen", "127.0.0.1:0", "--control", &c];
    a.extend(ms.iter().map(|s| s.as_str()));
    let mut server = Reaped::spawn(
        Command::new(BIN)
            .args(&a)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.path().join("serve.log")).unwrap()),
    );
    // The read end of its stdout closes before it has printed anything.
    drop(server.0.as_mut().unwrap().stdout.take());
    wait_for("the control socket", 30, || ctl.exists());
    let st = status(&ctl);
    assert_eq!(st["state"], "optimal", "{st}");
    let uri = st["endpoints"][0].as_str().unwrap().to_string();
    let o = tool("nbdinfo", &["--size", &uri]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        st["array"]["size"].to_string()
    );
    stop_by_pid(&mut server, dir.path());
}

#[test]
fn a_member_truncated_under_fio_verify_is_failed_and_fio_sees_no_error() {
    let dir = tmp();
    let ms = members(dir.path(), 4);
    create("5", &ms, "64M");
    let mut s = Served::start(dir.path(), &ms, &[]);
    let mut fio = Reaped::spawn(
        Command::new("fio")
            .args([
                "--name=v",
                "--ioengine=nbd",
                &format!("--uri={}", s.uri),
                "--rw=randwrite",
                "--bs=4k",
                "--iodepth=8",
                "--size=120M",
                "--verify=crc32c",
                "--verify_fatal=1",
                "--verify_state_save=0",
                "--output=/dev/null",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    std::thread::sleep(Duration::from_millis(700));
    tool("truncate", &["-s", "16M", &ms[2]]);
    let o = fio.wait(300, "fio");
    assert!(
        o.status.success(),
        "fio: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let st = status(&s.control);
    assert_eq!(st["state"], "degraded", "{st}");
    let m = st["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["path"] == ms[2].as_str())
        .unwrap_or_else(|| panic!("{st}"))
        .clone();
    assert_eq!(m["state"], "faulty", "{st}");
    assert!(s.stop().success());
}

/// `raidkit replace` cut short by kill -9: the new member says on disk
/// what it replaces and how far it got, so the restart goes on with it
/// from there (it was forgotten, the new member a spare, the order lost);
/// and started without the member it replaces, it takes the role and is
/// rebuilt from where it got. The data reads back as written either way.
#[test]
fn a_replacement_goes_on_after_a_restart() {
    for without_old in [false, true] {
        let dir = tmp();
        let t = dir.path();
        let ms = members(t, 3);
        create("5", &ms, "64M");
        let mut data = vec![0u8; 32 << 20];
        rand::rngs::StdRng::seed_from_u64(7).fill_bytes(&mut data);
        write_array(t, &ms, 0, &data, &[]);
        let rep = t.join("r.img").display().to_string();
        std::fs::File::create(&rep)
            .unwrap()
            .set_len(64 << 20)
            .unwrap();
        let mut s = Served::start(t, &ms, &["--rebuild-min", "4M", "--rebuild-max", "4M"]);
        let ctl = s.control.display().to_string();
        ok(&["replace", "--control", &ctl, &ms[0], "--with", &rep]);
        wait_for("a replacement checkpoint", 30, || {
            let e: Value =
                serde_json::from_slice(&ok(&["examine", "--json", &rep]).stdout).unwrap();
            e["replacing"] == true && e["recovery_offset"].as_u64().unwrap_or(0) >= 8 << 20
        });
        s.kill9();
        let e: Value = serde_json::from_slice(&ok(&["examine", "--json", &rep]).stdout).unwrap();
        assert_eq!(e["role"], 0, "{e}");
        let got = e["recovery_offset"].as_u64().unwrap();
        let mut all: Vec<String> = ms.clone();
        all.push(rep.clone());
        if without_old {
            all.remove(0);
        }
        let d = detail(&all);
        let row = d["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["path"] == rep.as_str())
            .unwrap_or_else(|| panic!("{d}"))
            .clone();
        assert_eq!(
            (row["state"].as_str(), row["role"].as_u64()),
            (Some("rebuilding"), Some(0)),
            "{d}"
        );
        assert_eq!(row["recovery_offset"].as_u64(), Some(got), "{d}");
        // scan: the replacement is one, not the holder of role 0.
        let sc: Value =
            serde_json::from_slice(&ok(&["scan", "--json", &t.display().to_string()]).stdout)
                .unwrap();
        let m = sc["arrays"][0]["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["path"] == rep.as_str())
            .unwrap_or_else(|| panic!("{sc}"))
            .clone();
        assert_eq!(m["replacing"], true, "{sc}");
        let mut s = Served::start(t, &all, &["--run"]);
        let st = status(&s.control);
        let m = st["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["path"] == rep.as_str())
            .unwrap_or_else(|| panic!("{st}"))
            .clone();
        assert_eq!(m["role"], 0, "{st}");
        assert_ne!(m["state"], "spare", "{st}");
        assert!(
            s.log().contains(&format!("from {got} bytes in"))
                || s.log().contains("rebuilt from where it got"),
            "the replacement started over: {}",
            s.log()
        );
        settle(&s);
        let st = status(&s.control);
        assert_eq!(st["state"], "optimal", "{st}");
        let m0 = st["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["role"] == 0)
            .unwrap_or_else(|| panic!("{st}"))
            .clone();
        assert_eq!(m0["path"], rep.as_str(), "{st}");
        assert_eq!(s.stop().code(), Some(0), "{}", s.log());
        // The old member out, the new one's data read back.
        let mut rest: Vec<&str> = ms[1..].iter().map(String::as_str).collect();
        rest.push(&rep);
        let o = read_array(&rest, 0, data.len() as u64);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(o.stdout == data, "data differs after the replacement");
    }
    // A replacement failed by the user is not taken up again at the next
    // start: it comes back a spare.
    let dir = tmp();
    let t = dir.path();
    let ms = members(t, 3);
    create("5", &ms, "64M");
    let rep = t.join("r.img").display().to_string();
    std::fs::File::create(&rep)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let mut s = Served::start(t, &ms, &["--rebuild-min", "4M", "--rebuild-max", "4M"]);
    let ctl = s.control.display().to_string();
    ok(&["replace", "--control", &ctl, &ms[0], "--with", &rep]);
    ok(&["fail", "--control", &ctl, &rep]);
    // Killed before any later update of the superblocks: the failed one is
    // a single update behind, as a crash in the middle of one leaves a
    // member that is current.
    s.kill9();
    let mut all = ms.clone();
    all.push(rep.clone());
    let mut s = Served::start(t, &all, &[]);
    let st = status(&s.control);
    let m = st["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["path"] == rep.as_str())
        .unwrap_or_else(|| panic!("{st}"))
        .clone();
    assert_eq!(m["state"], "spare", "{st}");
    assert_eq!(st["state"], "optimal", "{st}");
    assert_eq!(s.stop().code(), Some(0), "{}", s.log());
}
