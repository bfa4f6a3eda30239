//! Operations: events reach a person. A member failed under load runs the
//! server's --program with Fail then DegradedArray; a rebuild gives
//! RebuildStarted, Rebuild20..80, RebuildFinished and SpareActive in
//! order; the same events are in --events-log and reach `raidkit monitor`;
//! `raidkit monitor --test` goes through the whole path; a program that
//! hangs or fails holds up nothing; a slowed member is reported slow.

mod common;

use common::*;
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// A program that appends its arguments to `out`, one line per event.
fn recorder(dir: &Path, body: &str) -> (PathBuf, PathBuf) {
    let out = dir.join("program.out");
    let prog = dir.join("on-event.sh");
    std::fs::write(
        &prog,
        format!("#!/bin/sh\n{body}\necho \"$@\" >> '{}'\n", out.display()),
    )
    .unwrap();
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
    (prog, out)
}

fn lines(p: &Path) -> Vec<String> {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The event names in a JSON-lines file, in order.
fn logged(p: &Path) -> Vec<Value> {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// Whether `want` appear in `got` in this order (others may come between).
fn in_order(got: &[String], want: &[&str]) -> bool {
    let mut it = got.iter();
    want.iter().all(|w| it.any(|g| g == w))
}

/// Remove the failed member `gone` and add a new blank one of `len` bytes
/// (rebuilt in its role).
fn swap_in(ctl: &str, gone: &str, new: &str, len: u64) {
    ok(&["remove", "--control", ctl, gone]);
    std::fs::File::create(new).unwrap().set_len(len).unwrap();
    ok(&["add", "--control", ctl, new]);
}

/// qemu-io commands on an export (each under a 60 s limit).
fn qemu(uri: &str, cmds: &[&str]) {
    let mut a = vec!["60", "qemu-io", "-f", "raw"];
    for c in cmds {
        a.extend(["-c", c]);
    }
    a.push(uri);
    tool("timeout", &a);
}

fn status(ctl: &str) -> Value {
    serde_json::from_slice(&ok(&["status", "--control", ctl, "--json"]).stdout).unwrap()
}

#[test]
fn a_failure_and_a_rebuild_reach_the_program_the_log_and_monitor() {
    let dir = tmp();
    let ms = members(dir.path(), 5);
    let (four, spare) = (&ms[..4], &ms[4]);
    create("5", four, "48M");
    let (prog, out) = recorder(dir.path(), "");
    let events_log = dir.path().join("events.jsonl");
    let (p, l) = (prog.display().to_string(), events_log.display().to_string());
    let s = Served::start(
        dir.path(),
        four,
        &["--program", &p, "--events-log", &l, "--rebuild-min", "0"],
    );
    let ctl = s.control.display().to_string();
    // A follower from the start.
    let mon_out = dir.path().join("monitor.out");
    let mut monitor = Guarded::spawn(
        Command::new(env!("CARGO_BIN_EXE_raidkit"))
            .args(["monitor", "--json", "--control", &ctl])
            .stdout(Stdio::from(std::fs::File::create(&mon_out).unwrap()))
            .stderr(Stdio::null()),
    );
    // Load: a client writing all along.
    let stop = AtomicBool::new(false);
    /// Stops the load however the scope ends (a failed wait panics in it).
    struct StopOnDrop<'a>(&'a AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    std::thread::scope(|sc| {
        let _stop = StopOnDrop(&stop);
        let load = sc.spawn(|| {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let cmd = format!("write -P {} {} 1M", n % 200 + 1, (n % 40) << 20);
                qemu(&s.uri, &[&cmd]);
                n += 1;
            }
            n
        });
        std::thread::sleep(Duration::from_millis(500));
        ok(&["fail", "--control", &ctl, &four[1]]);
        wait_for("DegradedArray at the program", 20, || {
            lines(&out).iter().any(|x| x.starts_with("DegradedArray"))
        });
        stop.store(true, Ordering::Relaxed);
        assert!(load.join().unwrap() > 0, "the load wrote nothing");
    });
    let names: Vec<String> = lines(&out)
        .iter()
        .map(|x| x.split(' ').next().unwrap().to_string())
        .collect();
    assert!(in_order(&names, &["Fail", "DegradedArray"]), "{names:?}");
    let fail = lines(&out)
        .into_iter()
        .find(|x| x.starts_with("Fail "))
        .unwrap();
    let array = status(&ctl)["array"]["name"].as_str().unwrap().to_string();
    assert_eq!(
        fail,
        format!("Fail {array} {}", four[1]),
        "PATH EVENT ARRAY MEMBER"
    );

    // A rebuild onto a new member.
    swap_in(&ctl, &four[1], spare, 48 << 20);
    ok(&["wait", "--control", &ctl]);
    wait_for("SpareActive at the program", 20, || {
        lines(&out).iter().any(|x| x.starts_with("SpareActive"))
    });
    let names: Vec<String> = lines(&out)
        .iter()
        .map(|x| x.split(' ').next().unwrap().to_string())
        .collect();
    let rebuild = [
        "RebuildStarted",
        "Rebuild20",
        "Rebuild40",
        "Rebuild60",
        "Rebuild80",
        "RebuildFinished",
        "SpareActive",
    ];
    assert!(in_order(&names, &["Fail", "DegradedArray"]), "{names:?}");
    assert!(in_order(&names, &rebuild), "{names:?}");
    for e in rebuild {
        assert_eq!(
            names.iter().filter(|n| *n == e).count(),
            1,
            "{e}: {names:?}"
        );
    }
    assert!(lines(&out)
        .iter()
        .any(|x| x == &format!("RebuildFinished {array} {spare}")));

    // The whole path: monitor --test, the program, the log.
    let o = ok(&["monitor", "--test", "--control", &ctl]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("TestMessage"));
    wait_for("TestMessage at the program", 10, || {
        lines(&out)
            .iter()
            .any(|x| x == &format!("TestMessage {array}"))
    });

    // The log has the same events, numbered in order, as JSON.
    let log = logged(&events_log);
    let log_names: Vec<String> = log
        .iter()
        .map(|e| e["event"].as_str().unwrap().to_string())
        .collect();
    assert!(
        in_order(&log_names, &["Fail", "DegradedArray"]),
        "{log_names:?}"
    );
    assert!(in_order(&log_names, &rebuild), "{log_names:?}");
    assert!(log_names.iter().any(|n| n == "TestMessage"));
    assert!(log
        .windows(2)
        .all(|w| w[0]["seq"].as_u64() < w[1]["seq"].as_u64()));
    // Clients coming and going: in the log at debug level, not for the program.
    for e in ["ClientConnected", "ClientDisconnected"] {
        let ev = log
            .iter()
            .find(|x| x["event"] == e)
            .unwrap_or_else(|| panic!("no {e}"));
        assert_eq!(ev["severity"], "debug", "{ev}");
        assert!(
            ev["data"]["peer"]
                .as_str()
                .is_some_and(|p| p.contains("127.0.0.1")),
            "{ev}"
        );
    }
    assert!(
        !lines(&out).iter().any(|x| x.starts_with("Client")),
        "the program ran for a debug event"
    );
    let fin = log
        .iter()
        .find(|e| e["event"] == "RebuildFinished")
        .unwrap();
    assert_eq!(fin["data"]["result"], "done");
    assert_eq!(fin["member"], spare.as_str());

    // The follower saw them as they happened.
    wait_for("the monitor to print the TestMessage", 10, || {
        std::fs::read_to_string(&mon_out)
            .unwrap_or_default()
            .contains("TestMessage")
    });
    let seen: Vec<String> = logged(&mon_out)
        .iter()
        .map(|e| e["event"].as_str().unwrap().to_string())
        .collect();
    assert!(in_order(&seen, &["Fail", "DegradedArray"]), "{seen:?}");
    assert!(in_order(&seen, &rebuild), "{seen:?}");
    monitor.kill();
}

#[test]
fn a_program_that_hangs_or_fails_holds_up_nothing() {
    let dir = tmp();
    let ms = members(dir.path(), 3);
    create("1", &ms, "16M");
    // Hangs for a minute on every event.
    let (prog, out) = recorder(dir.path(), "sleep 60");
    let p = prog.display().to_string();
    let s = Served::start(
        dir.path(),
        &ms,
        &["--program", &p, "--program-timeout", "5"],
    );
    let ctl = s.control.display().to_string();
    ok(&["monitor", "--test", "--control", &ctl]);
    // The failure and I/O go on at once while the program hangs on the
    // TestMessage (and then on Fail, DegradedArray).
    let t = Instant::now();
    ok(&["fail", "--control", &ctl, &ms[2]]);
    qemu(&s.uri, &["write -P 9 0 1M", "read -P 9 0 1M"]);
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "the failure or the I/O waited for the program ({:?})",
        t.elapsed()
    );
    // Each run is killed after its second; the kill is logged.
    wait_for("the hung program to be killed and logged", 30, || {
        s.log().contains("killed")
    });
    assert!(
        lines(&out).is_empty(),
        "the program was not cut short: {:?}",
        lines(&out)
    );
    // A program that is not there is refused at start.
    let missing = dir.path().join("nope.sh").display().to_string();
    let d2 = tmp();
    let ms2 = members(d2.path(), 2);
    create("1", &ms2, "8M");
    let o = raidkit_refused(&args(
        &["serve", "--listen", "127.0.0.1:0", "--program", &missing],
        &ms2,
    ));
    assert_eq!(o.status.code(), Some(1));
}

#[test]
fn a_member_slowed_by_a_delay_is_reported_slow() {
    let dir = tmp();
    let ms = members(dir.path(), 4);
    create("5", &ms, "16M");
    let log = dir.path().join("events.jsonl");
    let l = log.display().to_string();
    let mut specs = ms.clone();
    specs[2] = format!("fault:{}?delay=20ms", ms[2]);
    let s = Served::start(dir.path(), &specs, &["--events-log", &l]);
    let ctl = s.control.display().to_string();
    // Reads that reach every member, for a few seconds.
    let t = Instant::now();
    let mut slow = Value::Null;
    while t.elapsed() < Duration::from_secs(30) {
        qemu(&s.uri, &["read 0 4M"]);
        let st = status(&ctl);
        if let Some(m) = st["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m.get("slow").is_some())
        {
            slow = m.clone();
            break;
        }
    }
    assert_eq!(
        slow["path"],
        ms[2].as_str(),
        "no member reported slow, or the wrong one: {slow}"
    );
    assert!(
        slow["slow"]["latency_us"].as_u64().unwrap() >= 20_000,
        "{slow}"
    );
    assert!(
        slow["slow"]["peers_us"].as_u64().unwrap() < 10_000,
        "{slow}"
    );
    let st = status(&ctl);
    let others = st["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["path"] != ms[2].as_str() && m.get("slow").is_some())
        .count();
    assert_eq!(others, 0, "a healthy member reported slow: {st}");
    // People reading `raidkit status` see it too, on that member's line.
    let text = String::from_utf8_lossy(&ok(&["status", "--control", &ctl]).stdout).to_string();
    let line = text
        .lines()
        .find(|l| l.contains(ms[2].as_str()))
        .unwrap_or_else(|| panic!("no line for the member:\n{text}"));
    assert!(line.contains("SLOW"), "{text}");
    assert_eq!(text.matches("SLOW").count(), 1, "{text}");
    wait_for("SlowMember in the events log", 10, || {
        logged(&log)
            .iter()
            .any(|e| e["event"] == "SlowMember" && e["member"] == ms[2].as_str())
    });
}

#[test]
fn status_says_which_members_spin() {
    // A simulated disk spins; a file in memory has no device to ask.
    let dir = tmp();
    let ms = members(dir.path(), 2);
    create("1", &ms, "16M");
    let specs = [format!("sim:{}?bw=1G&seek=1ms", ms[0]), ms[1].clone()];
    let mut s = Served::start(dir.path(), &specs, &[]);
    qemu(&s.uri, &["read 0 4M"]);
    let st = s.status();
    let member = |p: &str| {
        st["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["path"] == p)
            .unwrap_or_else(|| panic!("no member {p}: {st}"))
            .clone()
    };
    assert_eq!(member(&ms[0])["rotational"], true, "{st}");
    if dir.path().starts_with("/dev/shm") {
        assert!(member(&ms[1]).get("rotational").is_none(), "{st}");
    }
    assert!(s.stop().success());
}

/// Headless Chromium on the page (its scripts run for 5 s of virtual
/// time), doing `what` (`--dump-dom`, `--screenshot=PATH`); its stdout.
fn chromium(base: &str, profile: &Path, what: &[&str]) -> String {
    let profile = format!("--user-data-dir={}", profile.display());
    let mut a = vec![
        "60",
        "chromium",
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        &profile,
        "--virtual-time-budget=5000",
        "--window-size=1200,900",
    ];
    a.extend_from_slice(what);
    a.push(base);
    String::from_utf8_lossy(&tool("timeout", &a).stdout).to_string()
}

/// The status page as headless Chromium renders it (scripts run).
fn rendered(base: &str, profile: &Path) -> String {
    chromium(base, profile, &["--dump-dom"])
}

#[test]
fn metrics_and_the_status_page_follow_a_failure_and_a_rebuild() {
    let dir = tmp();
    let ms = members(dir.path(), 5);
    let (four, spare) = (&ms[..4], &ms[4]);
    create("5", four, "32M");
    let s = Served::start(
        dir.path(),
        four,
        &["--http=127.0.0.1:0", "--rebuild-max", "12M"],
    );
    let ctl = s.control.display().to_string();
    let line = s.line_with("status page http://");
    let base = line[line.find("http://").unwrap()..]
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    let name = status(&ctl)["array"]["name"].as_str().unwrap().to_string();
    let key = |metric: &str, labels: &[(&str, &str)]| {
        let mut l: Vec<(&str, &str)> = labels.to_vec();
        l.push(("array", &name));
        l.sort();
        let l: Vec<String> = l.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
        format!("{metric}{{{}}}", l.join(","))
    };
    let m = scrape(&base);
    assert_eq!(
        metric(&m, &key("raidkit_md_state", &[("state", "optimal")])),
        1.0
    );
    assert_eq!(
        metric(&m, &key("raidkit_md_disks", &[("state", "active")])),
        4.0
    );
    assert_eq!(metric(&m, &key("raidkit_md_disks_required", &[])), 4.0);
    qemu(&s.uri, &["write -P 7 0 8M", "read -P 7 0 8M"]);
    let m = scrape(&base);
    let d0 = [("member", four[0].as_str()), ("role", "0")];
    assert!(metric(&m, &key("raidkit_member_written_bytes_total", &d0)) > 0.0);
    assert!(metric(&m, &key("raidkit_member_read_bytes_total", &d0)) > 0.0);
    assert!(metric(&m, &key("raidkit_member_operation_seconds_count", &d0)) > 0.0);
    assert!(metric(&m, &key("raidkit_nbd_requests_total", &[("type", "write")])) > 0.0);

    // The page before and after a failure.
    let profile = dir.path().join("chromium");
    let page = rendered(&base, &profile);
    for p in four {
        assert!(
            page.contains(&format!(r#"data-path="{p}" data-state="active""#)),
            "{p} not shown active:\n{page}"
        );
    }
    ok(&["fail", "--control", &ctl, &four[2]]);
    let m = scrape(&base);
    assert_eq!(
        metric(&m, &key("raidkit_md_state", &[("state", "degraded")])),
        1.0
    );
    assert_eq!(
        metric(&m, &key("raidkit_md_disks", &[("state", "faulty")])),
        1.0
    );
    let d2 = [
        ("member", four[2].as_str()),
        ("role", "2"),
        ("state", "faulty"),
    ];
    assert_eq!(metric(&m, &key("raidkit_member_state", &d2)), 1.0);
    let page = rendered(&base, &profile);
    assert!(
        page.contains(&format!(r#"data-path="{}" data-state="faulty""#, four[2])),
        "the failed member is not shown faulty:\n{page}"
    );
    assert!(
        page.contains(r#"data-event="Fail""#),
        "no Fail event on the page"
    );
    // A screenshot, kept as the test's artefact.
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page-degraded.png");
    chromium(
        &base,
        &profile,
        &[&format!("--screenshot={}", shot.display())],
    );
    assert!(
        std::fs::metadata(&shot).unwrap().len() > 10_000,
        "no screenshot"
    );

    // A rebuild: progress in the metrics while it runs, optimal after.
    swap_in(&ctl, &four[2], spare, 32 << 20);
    let mut seen_progress = 0.0f64;
    wait_for("rebuild progress in /metrics", 30, || {
        let m = scrape(&base);
        seen_progress = metric(
            &m,
            &key("raidkit_md_recovery_progress_ratio", &[("kind", "rebuild")]),
        );
        seen_progress > 0.0 && seen_progress < 1.0
    });
    assert_eq!(
        metric(
            &scrape(&base),
            &key("raidkit_md_disks", &[("state", "rebuilding")])
        ),
        1.0
    );
    ok(&["wait", "--control", &ctl]);
    let m = scrape(&base);
    assert_eq!(
        metric(&m, &key("raidkit_md_state", &[("state", "optimal")])),
        1.0
    );
    assert_eq!(
        metric(&m, &key("raidkit_md_disks", &[("state", "active")])),
        4.0
    );
    assert_eq!(
        metric(
            &m,
            &key("raidkit_md_recovery_progress_ratio", &[("kind", "rebuild")])
        ),
        0.0
    );
    // Read-only, and only what it serves.
    let post = try_tool(
        "timeout",
        &[
            "20",
            "curl",
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-X",
            "POST",
            &format!("{base}metrics"),
        ],
    );
    assert_eq!(String::from_utf8_lossy(&post.stdout), "405");
    let st: Value = serde_json::from_slice(
        &tool(
            "timeout",
            &["20", "curl", "-sf", &format!("{base}api/status")],
        )
        .stdout,
    )
    .unwrap();
    assert_eq!(st["state"], "optimal");
}

/// A start that cannot run names every role that cannot serve and why:
/// one missing, one back after an absence whose missed writes are not
/// resynced yet.
#[test]
fn a_start_that_cannot_run_names_every_unavailable_role() {
    let dir = tmp();
    let ms = members(dir.path(), 4);
    create("5", &ms, "16M");
    // d3 away while the array is written.
    let mut s = Served::start(dir.path(), &ms[..3], &["--run"]);
    qemu(&s.uri, &["write -P 4 0 4M"]);
    assert_eq!(s.stop().code(), Some(0));
    drop(s);
    // d3 back, d2 gone: two roles cannot serve.
    let o = raidkit_refused(&args(
        &["serve", "--listen", "127.0.0.1:0", "--run"],
        &[ms[0].clone(), ms[1].clone(), ms[3].clone()],
    ));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("role 2 (missing)"), "{err}");
    assert!(err.contains("role 3 (") && err.contains(&ms[3]), "{err}");
}

/// A start that fails after the NBD listeners are up (here: the status
/// page's port is taken) stops what it started, as a stop does: no socket
/// left behind, the array clean, and the next start on the same paths
/// serves.
#[test]
fn a_start_that_fails_after_listening_stops_what_it_started() {
    let dir = tmp();
    let ms = members(dir.path(), 3);
    create("5", &ms, "16M");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let http = taken.local_addr().unwrap().to_string();
    let sock = dir.path().join("nbd.sock").display().to_string();
    let ctl = dir.path().join("control.sock").display().to_string();
    let o = raidkit_refused(&args(
        &[
            "serve",
            "--socket",
            &sock,
            "--control",
            &ctl,
            "--http",
            &http,
        ],
        &ms,
    ));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        !Path::new(&sock).exists(),
        "the NBD socket was left behind: {err}"
    );
    assert!(
        !Path::new(&ctl).exists(),
        "the control socket was left behind"
    );
    for m in &ms {
        let e: Value = serde_json::from_slice(&ok(&["examine", m, "--json"]).stdout).unwrap();
        assert_eq!(e["state"], "clean", "{m}: {e}");
    }
    drop(taken);
    let mut s = Served::start_on(dir.path(), &ms, &["--socket", &sock], &[]);
    qemu(&s.uri, &["write -P 7 0 64k", "read -P 7 0 64k"]);
    assert_eq!(s.stop().code(), Some(0));
}

/// A config file whose second array cannot listen (its port is taken):
/// nothing is served, and the first array's socket, bound already, is
/// not left behind.
#[test]
fn a_config_start_that_cannot_listen_leaves_no_socket_behind() {
    let dir = tmp();
    let (disks, a, b) = two_arrays_of_disks(dir.path());
    create_alpha_and_beta(&a, &b);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let sock = dir.path().join("alpha.sock");
    let cfg =
        String::from_utf8(ok(&["scan", "--config", &disks.display().to_string()]).stdout).unwrap();
    // alpha first (its socket bound), then beta (its port taken).
    let uuid = |name: &str| {
        let line = cfg
            .lines()
            .find(|l| l.starts_with(&format!("{name} = ")))
            .unwrap_or_else(|| panic!("{name} not found: {cfg}"));
        line.split('"').nth(1).unwrap().to_string()
    };
    let head: String = cfg
        .lines()
        .take_while(|l| *l != "[arrays]")
        .map(|l| format!("{l}\n"))
        .collect();
    let text = format!(
        "{head}[arrays]\nalpha = {{ uuid = \"{}\", socket = \"{}\" }}\n\
         beta = {{ uuid = \"{}\", listen = \"127.0.0.1:{port}\" }}\n",
        uuid("alpha"),
        sock.display(),
        uuid("beta")
    );
    let file = dir.path().join("raidkit.toml");
    std::fs::write(&file, &text).unwrap();
    let o = raidkit_refused(&["serve", "--config", &file.display().to_string()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(!sock.exists(), "alpha's socket was left behind: {err}");
    for m in a.iter().chain(&b) {
        let e: Value = serde_json::from_slice(&ok(&["examine", m, "--json"]).stdout).unwrap();
        assert_eq!(e["state"], "clean", "{m}: {e}");
    }
}

/// A `disks` directory apart from the test's own files (server logs), and
/// the paths of two arrays' members in it: three, then two.
fn two_arrays_of_disks(dir: &Path) -> (PathBuf, Vec<String>, Vec<String>) {
    let disks = dir.join("disks");
    std::fs::create_dir(&disks).unwrap();
    let p = |n: &str| disks.join(n).display().to_string();
    let a = ["a0.img", "a1.img", "a2.img"].map(p).to_vec();
    let b = ["b0.img", "b1.img"].map(p).to_vec();
    (disks, a, b)
}

/// Array alpha (RAID-5, 16 MiB) on `a` and beta (RAID-1, 8 MiB) on `b`.
fn create_alpha_and_beta(a: &[String], b: &[String]) {
    ok(&args(
        &["create", "-l", "5", "--size", "16M", "--name", "alpha"],
        a,
    ));
    ok(&args(
        &["create", "-l", "1", "--size", "8M", "--name", "beta"],
        b,
    ));
}

/// `raidkit scan` over a directory of mixed files finds both arrays by
/// UUID, names the stale member and the role it leaves open, ignores the
/// rest, and the command it prints for each serves it.
#[test]
fn scan_finds_two_arrays_among_mixed_files() {
    let dir = tmp();
    let (disks, a, b) = two_arrays_of_disks(dir.path());
    let p = |n: &str| disks.join(n).display().to_string();
    create("5", &a, "16M");
    create("1", &b, "8M");
    std::fs::write(p("notes.txt"), b"not a member").unwrap();
    std::fs::File::create(p("blank.img"))
        .unwrap()
        .set_len(4 << 20)
        .unwrap();
    // Links to members, as /dev/disk/by-id holds several per disk: each
    // member is found once.
    std::os::unix::fs::symlink(&a[0], p("wwn-a0")).unwrap();
    std::os::unix::fs::symlink(&b[1], p("wwn-b1")).unwrap();
    // a2 misses a write: stale.
    let mut s = Served::start(dir.path(), &a[..2], &["--run"]);
    qemu(&s.uri, &["write -P 1 0 1M"]);
    assert_eq!(s.stop().code(), Some(0));
    drop(s);
    let o = ok(&["scan", "--json", &disks.display().to_string()]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let arrays = v["arrays"].as_array().unwrap();
    assert_eq!(arrays.len(), 2, "{v:#}");
    assert_eq!(v["not_members"], 2, "{v:#}");
    let by_level = |l: &str| arrays.iter().find(|x| x["level"] == l).unwrap().clone();
    let (r5, r1) = (by_level("raid5"), by_level("raid1"));
    assert_eq!(r1["state"], "complete");
    assert_eq!(r1["members"].as_array().unwrap().len(), 2);
    assert_eq!(r5["state"], "incomplete");
    assert_eq!(r5["missing_roles"], serde_json::json!([2]));
    let stale: Vec<&str> = r5["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["stale"] == true)
        .map(|m| m["path"].as_str().unwrap())
        .collect();
    assert_eq!(stale, [a[2].as_str()]);
    assert!(r5["serve"].as_str().unwrap().contains("--run"));
    assert!(!r5["serve"].as_str().unwrap().contains("a2.img"));
    // Each printed command, with a test's listener instead of --daemon,
    // serves its array.
    for arr in [&r5, &r1] {
        let words: Vec<String> = arr["serve"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .skip(2)
            .filter(|w| *w != "--daemon")
            .map(str::to_string)
            .collect();
        let (flags, paths): (Vec<String>, Vec<String>) =
            words.into_iter().partition(|w| w.starts_with("--"));
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let mut s = Served::start(dir.path(), &paths, &flags);
        let st = status(&s.control.display().to_string());
        assert_eq!(st["array"]["uuid"], arr["uuid"]);
        assert_eq!(s.stop().code(), Some(0));
    }
    // The human form says the same.
    let o = ok(&["scan", &disks.display().to_string()]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("STALE") && text.contains(&a[2]), "{text}");
    assert_eq!(text.matches("ARRAY ").count(), 2, "{text}");
    assert!(!text.contains("cannot start"), "{text}");
    assert_eq!(
        (r5["startable"].as_bool(), r1["startable"].as_bool()),
        (Some(true), Some(true))
    );
    // One more RAID-5 member gone: what is left cannot start, and scan
    // says so rather than propose `--run`; its config entry is left out
    // (it would stop the whole server).
    std::fs::rename(&a[1], dir.path().join("away.img")).unwrap();
    // The RAID-5's entry in `scan --json`, as the disks are now.
    let scan_r5 = || -> Value {
        let o = ok(&["scan", "--json", &disks.display().to_string()]);
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        v["arrays"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["level"] == "raid5")
            .unwrap()
            .clone()
    };
    let r5 = scan_r5();
    assert_eq!(r5["startable"], false, "{r5:#}");
    // With its stale member it has enough: the command it prints takes
    // that one back (it proposed `--run` without it, which fails).
    assert_eq!(r5["forcible"], true, "{r5:#}");
    let cmd = r5["serve"].as_str().unwrap();
    assert!(cmd.contains("--force") && cmd.contains(&a[2]), "{cmd}");
    let words: Vec<String> = cmd
        .split_whitespace()
        .skip(2)
        .filter(|w| *w != "--daemon")
        .map(str::to_string)
        .collect();
    let (flags, paths): (Vec<String>, Vec<String>) =
        words.into_iter().partition(|w| w.starts_with("--"));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let before: Vec<Vec<u8>> = [&a[0], &a[2]]
        .iter()
        .map(|m| std::fs::read(m).unwrap())
        .collect();
    let o = ok(&["scan", &disks.display().to_string()]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("cannot start"), "{text}");
    let mut s = Served::start(dir.path(), &paths, &flags);
    assert_eq!(
        status(&s.control.display().to_string())["state"],
        "degraded"
    );
    s.kill9();
    for (m, b) in [&a[0], &a[2]].iter().zip(&before) {
        std::fs::write(m, b).unwrap();
    }
    let o = ok(&["scan", "--config", &disks.display().to_string()]);
    let cfg = String::from_utf8_lossy(&o.stdout);
    let live: Vec<&str> = cfg.lines().filter(|l| l.contains("uuid = ")).collect();
    assert_eq!(live.len(), 2, "{cfg}");
    assert_eq!(
        live.iter().filter(|l| l.starts_with('#')).count(),
        1,
        "{cfg}"
    );
    // Its stale member gone too: nothing starts it, and no command is
    // offered.
    std::fs::rename(&a[2], dir.path().join("away2.img")).unwrap();
    let r5 = scan_r5();
    assert_eq!(
        (&r5["startable"], &r5["forcible"], &r5["serve"]),
        (&Value::from(false), &Value::from(false), &Value::Null),
        "{r5:#}"
    );
}

/// `raidkit scan --config` makes a config file from the arrays it finds;
/// `raidkit serve --config` serves every array in it as an export of one
/// server, finding their members by UUID after they were renamed.
#[test]
fn a_config_file_made_by_scan_serves_both_arrays_from_one_server() {
    let dir = tmp();
    let (disks, a, b) = two_arrays_of_disks(dir.path());
    let p = |n: &str| disks.join(n).display().to_string();
    create_alpha_and_beta(&a, &b);
    std::fs::write(p("notes.txt"), b"not a member").unwrap();
    // Data on each, written while served the usual way.
    let data = |seed: u8, n: usize| -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
    };
    for (ms, seed) in [(&a, 0xa5u8), (&b, 0x5b)] {
        let mut s = Served::start(dir.path(), ms, &[]);
        let f = dir.path().join("in.raw");
        std::fs::write(&f, data(seed, 1 << 20)).unwrap();
        let (uri, fname) = (s.uri.clone(), f.display().to_string());
        tool("timeout", &["60", "nbdcopy", &fname, &uri]);
        assert_eq!(s.stop().code(), Some(0));
    }
    let o = ok(&["scan", "--config", &disks.display().to_string()]);
    let cfg_text = String::from_utf8(o.stdout).unwrap();
    assert_eq!(cfg_text.matches("uuid = ").count(), 2, "{cfg_text}");
    let cfg = dir.path().join("raidkit.toml");
    std::fs::write(&cfg, &cfg_text).unwrap();
    // The disks move: members are found by UUID, not by path.
    for m in a.iter().chain(&b) {
        std::fs::rename(m, format!("{m}.moved")).unwrap();
    }
    let mut s = Served::start_config(dir.path(), &cfg, &["--http", "127.0.0.1:0"]);
    let alpha = s
        .line_with("/alpha")
        .rsplit(' ')
        .next()
        .unwrap()
        .to_string();
    let beta = s.line_with("/beta").rsplit(' ').next().unwrap().to_string();
    let port = |u: &str| u.split('/').nth(2).unwrap().to_string();
    assert_eq!(port(&alpha), port(&beta), "one server: {alpha} {beta}");
    let list = tool(
        "timeout",
        &[
            "30",
            "nbdinfo",
            "--list",
            &format!("nbd://{}", port(&alpha)),
        ],
    );
    let list = String::from_utf8_lossy(&list.stdout);
    assert!(
        list.contains("export=\"alpha\"") && list.contains("export=\"beta\""),
        "{list}"
    );
    for (uri, seed) in [(&alpha, 0xa5u8), (&beta, 0x5b)] {
        let out = dir.path().join("out.raw");
        let _ = std::fs::remove_file(&out);
        tool(
            "timeout",
            &["60", "nbdcopy", uri, &out.display().to_string()],
        );
        let got = std::fs::read(&out).unwrap();
        assert!(got[..1 << 20] == data(seed, 1 << 20), "{uri}");
    }
    // Each array has its own control socket, naming its moved members.
    let ctl_of = |name: &str| {
        let line = s.out.lock().unwrap().clone();
        let i = line
            .iter()
            .position(|l| l.contains(&format!("array '{name}'")))
            .unwrap();
        line[i..]
            .iter()
            .find_map(|l| l.strip_prefix("raidkit: control socket "))
            .unwrap()
            .to_string()
    };
    for (name, n) in [("alpha", 3), ("beta", 2)] {
        let st = status(&ctl_of(name));
        assert_eq!(st["array"]["name"], name);
        assert_eq!(st["state"], "optimal", "{st:#}");
        let paths: Vec<&str> = st["members"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["path"].as_str())
            .collect();
        assert_eq!(paths.len(), n, "{st:#}");
        assert!(paths.iter().all(|p| p.ends_with(".moved")), "{paths:?}");
    }
    // One HTTP listener for both: metrics of each, the status of either.
    let page = s.line_with("status page http://");
    let base = page.split_whitespace().nth(3).unwrap().to_string();
    let get = |path: &str| {
        let o = tool("timeout", &["20", "curl", "-sf", &format!("{base}{path}")]);
        String::from_utf8(o.stdout).unwrap()
    };
    let metrics = get("metrics");
    for name in ["alpha", "beta"] {
        let line = format!("raidkit_md_state{{array=\"{name}\",state=\"optimal\"}} 1");
        assert!(metrics.contains(&line), "{line} not in {metrics}");
        let st: Value = serde_json::from_str(&get(&format!("api/status?array={name}"))).unwrap();
        assert_eq!(st["array"]["name"], name);
    }
    assert_eq!(
        metrics.matches("# TYPE raidkit_md_state ").count(),
        1,
        "one family for both arrays"
    );
    // A stop asked of alpha stops beta too: refused while beta has a
    // client, it names beta as the one the client is on.
    let mut client = Guarded::spawn(
        Command::new("timeout")
            .args(["60", "qemu-io", "-f", "raw", "-c", "sleep 50000", &beta])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    wait_for("the client on beta", 30, || {
        status(&ctl_of("beta"))["connections"]["active"] == 1
    });
    let o = raidkit(&["stop", "--control", &ctl_of("alpha")]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("on array 'beta'"), "{err}");
    client.kill();
    wait_for("the client gone", 30, || {
        status(&ctl_of("beta"))["connections"]["active"] == 0
    });
    // Asked of alpha, the stop says that beta stopped with it.
    let o = ok(&["stop", "--json", "--control", &ctl_of("alpha")]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let mut stopped: Vec<&str> = v["arrays"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    stopped.sort_unstable();
    assert_eq!(stopped, ["alpha", "beta"], "{v}");
    let code = s.child.take().unwrap().wait().unwrap().code();
    assert_eq!(code, Some(0));
    let log = s.log();
    assert!(
        log.contains("array 'alpha' is clean") && log.contains("array 'beta' is clean"),
        "{log}"
    );
    // A config file naming an array that is nowhere, beside one that is:
    // the one found is served, the other named in a warning.
    let mut text = cfg_text.clone();
    text.push_str("gamma = { uuid = \"0b6f5a0e-1111-4222-8333-944445555666\" }\n");
    std::fs::write(&cfg, &text).unwrap();
    let mut s = Served::start_config(dir.path(), &cfg, &[]);
    s.line_with("serving 2 of the 3 arrays");
    // One server, two control sockets: a bare `stop` stops it (the
    // sockets are looked for in its temporary directory).
    let o = output_within(
        Command::new(env!("CARGO_BIN_EXE_raidkit"))
            .arg("stop")
            .env("TMPDIR", dir.path()),
        Duration::from_secs(90),
    );
    assert!(o.status.success(), "{o:?}");
    let code = s.child.take().unwrap().wait().unwrap().code();
    assert_eq!(code, Some(0));
    assert!(s
        .log()
        .contains("0b6f5a0e-1111-4222-8333-944445555666 (gamma): no member found"));
    assert!(s
        .log()
        .contains("1 array(s) of the config file are not served"));
    // Bad files are refused, with no server started.
    std::fs::write(&cfg, "[arrays]\nx = { uuid = \"nope\" }\n").unwrap();
    fails(&["serve", "--config", &cfg.display().to_string()], "uuid");
    std::fs::write(&cfg, "[arrays]\n").unwrap();
    fails(
        &["serve", "--config", &cfg.display().to_string()],
        "no arrays",
    );
}

/// Under systemd (Type=notify) the server says READY=1 once it listens,
/// and STOPPING=1 when it stops.
#[test]
fn the_server_tells_systemd_when_it_is_ready_and_stopping() {
    use std::os::unix::net::UnixDatagram;
    let dir = tmp();
    let ms = members(dir.path(), 2);
    create("1", &ms, "8M");
    let sock = dir.path().join("notify.sock");
    let rx = UnixDatagram::bind(&sock).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let ctl = dir.path().join("c.sock").display().to_string();
    let mut server = Guarded::spawn(
        Command::new(env!("CARGO_BIN_EXE_raidkit"))
            .args(args(
                &["serve", "--listen", "127.0.0.1:0", "--control", &ctl],
                &ms,
            ))
            .env("NOTIFY_SOCKET", &sock)
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    let mut buf = [0u8; 4096];
    let n = rx.recv(&mut buf).expect("no readiness message within 30 s");
    let msg = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(msg.lines().any(|l| l == "READY=1"), "{msg}");
    assert!(msg.contains("STATUS=serving array"), "{msg}");
    // Ready means served: the control socket answers at once.
    assert_eq!(status(&ctl)["state"], "optimal");
    tool("kill", &["-TERM", &server.id().to_string()]);
    let n = rx.recv(&mut buf).expect("no STOPPING message");
    assert!(String::from_utf8_lossy(&buf[..n]).contains("STOPPING=1"));
    assert_eq!(server.wait_within(Duration::from_secs(60)).code(), Some(0));
}

/// The unit files under contrib/systemd pass `systemd-analyze verify`
/// (with this build's binary in place of /usr/local/bin/raidkit).
#[test]
fn the_systemd_units_verify() {
    if try_tool("systemd-analyze", &["--version"]).status.code() != Some(0) {
        eprintln!("no systemd-analyze here: unit files not verified");
        return;
    }
    let dir = tmp();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contrib/systemd");
    let mut units = Vec::new();
    for (from, to) in [
        ("raidkit@.service", "raidkit@lab.service"),
        ("raidkit.service", "raidkit.service"),
        ("raidkit-scrub@.service", "raidkit-scrub@lab.service"),
        ("raidkit-scrub@.timer", "raidkit-scrub@lab.timer"),
    ] {
        let text = std::fs::read_to_string(src.join(from)).unwrap();
        let text = text.replace("/usr/local/bin/raidkit", env!("CARGO_BIN_EXE_raidkit"));
        let to = dir.path().join(to);
        std::fs::write(&to, text).unwrap();
        units.push(to.display().to_string());
    }
    let mut a = vec!["60", "systemd-analyze", "verify", "--man=no"];
    a.extend(units.iter().map(String::as_str));
    let o = try_tool("timeout", &a);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && err.trim().is_empty(), "{err}");
}

/// A server whose control socket is put elsewhere (`--control PATH`, as
/// the README's systemd and config set-ups do) is found by `list` and by
/// its array's name, also from a directory holding a file of that name
/// (a member named like its array): `stop NAME` stops it.
#[test]
fn a_server_with_its_own_control_path_is_found_by_list_and_by_name() {
    let dir = tmp();
    let ms: Vec<String> = ["disk1", "disk2"]
        .iter()
        .map(|n| dir.path().join(n).display().to_string())
        .collect();
    create("1", &ms, "8M");
    let mut s = Served::start(dir.path(), &ms, &[]);
    let run = |a: &[&str]| {
        output_within(
            Command::new(BIN)
                .args(a)
                .env("TMPDIR", dir.path())
                .current_dir(dir.path()),
            REFUSAL,
        )
    };
    let list = run(&["list", "--json"]);
    assert!(
        list.status.success(),
        "{}",
        String::from_utf8_lossy(&list.stderr)
    );
    let v: Value = serde_json::from_slice(&list.stdout).unwrap();
    assert!(
        v.to_string().contains("disk1"),
        "list shows the server: {v}"
    );
    let st = run(&["stop", "disk1"]);
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    assert_eq!(s.stop().code(), Some(0));
    let links: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("raidkit-"))
        .collect();
    assert!(links.is_empty(), "the link is removed at the stop");
}

/// A hot spare's superblock is written when it joins, not at every update
/// after: `scan` took it for a stale member and left it out of the
/// command it prints, so following it lost the spare.
#[test]
fn scan_keeps_a_hot_spare_in_the_array_and_its_command() {
    let dir = tmp();
    let ms = members(dir.path(), 3);
    ok(&args(
        &["create", "--level", "1", "--size", "8M", "--spare", &ms[2]],
        &ms[..2],
    ));
    let mut s = Served::start(dir.path(), &ms, &[]);
    qemu(&s.uri, &["write -P 1 0 1M"]);
    assert_eq!(s.stop().code(), Some(0));
    drop(s);
    let o = ok(&["scan", "--json", &dir.path().display().to_string()]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let arr = &v["arrays"][0];
    let spare = arr["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["path"] == ms[2].as_str())
        .unwrap_or_else(|| panic!("{v:#}"))
        .clone();
    assert_eq!(spare["stale"], false, "{v:#}");
    assert_eq!(arr["state"], "complete", "{v:#}");
    let cmd = arr["serve"].as_str().unwrap();
    assert!(cmd.contains(&ms[2]), "{cmd}");
    let mut s = Served::start(dir.path(), &ms, &[]);
    let st = status(&s.control.display().to_string());
    let spares = st["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["state"] == "spare")
        .count();
    assert_eq!(spares, 1, "{st:#}");
    assert_eq!(s.stop().code(), Some(0));
}

/// A member found twice (a disk and an image of it) and a copy cut short
/// are not counted as holding their roles: scan's command names each
/// member once and starts; a truncated member alone is left out, and the
/// array starts degraded with --run.
#[test]
fn scan_leaves_out_copies_and_truncated_members() {
    let dir = tmp();
    let ms = members(dir.path(), 3);
    create("5", &ms, "8M");
    let copy = dir.path().join("zcopy1.img");
    std::fs::copy(&ms[1], &copy).unwrap();
    let cut = dir.path().join("zcut2.img");
    let whole = std::fs::read(&ms[2]).unwrap();
    std::fs::write(&cut, &whole[..whole.len() / 2]).unwrap();
    let o = ok(&["scan", "--json", &dir.path().display().to_string()]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let arr = &v["arrays"][0];
    assert_eq!(arr["state"], "complete", "{v:#}");
    let flag = |path: &Path, key: &str| {
        arr["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["path"] == path.display().to_string().as_str())
            .unwrap_or_else(|| panic!("{v:#}"))[key]
            .clone()
    };
    assert_eq!(flag(&copy, "copy"), true, "{v:#}");
    assert_eq!(flag(&cut, "truncated"), true, "{v:#}");
    let cmd = arr["serve"].as_str().unwrap().to_string();
    assert!(!cmd.contains("zcopy1") && !cmd.contains("zcut2"), "{cmd}");
    // The command it gives starts the array.
    let given: Vec<String> = cmd.split_whitespace().skip(3).map(str::to_string).collect();
    let mut s = Served::start(dir.path(), &given, &[]);
    assert_eq!(status(&s.control.display().to_string())["state"], "optimal");
    assert_eq!(s.stop().code(), Some(0));
    // The truncated copy in its member's place: left out, started with --run.
    let with_cut = vec![ms[0].clone(), ms[1].clone(), cut.display().to_string()];
    let o = raidkit_refused(&args(&["serve", "--listen", "127.0.0.1:0"], &with_cut));
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let mut s = Served::start(dir.path(), &with_cut, &["--run"]);
    let st = status(&s.control.display().to_string());
    assert_eq!(st["state"], "degraded", "{st:#}");
    assert_eq!(s.stop().code(), Some(0));
}
