//! The daily commands of an administrator: `list` of the running servers,
//! `stop`, `--control` by array name or UUID, default array names. Each
//! test gives its servers a temp directory of their own (TMPDIR), so that
//! `list` and name lookups see only them.

mod common;
use common::*;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// raidkit with TMPDIR set to `tmpdir`, to its end (at most the deadline).
fn rk(tmpdir: &Path, a: &[&str]) -> std::process::Output {
    output_within(Command::new(BIN).env("TMPDIR", tmpdir).args(a), DEADLINE)
}

fn rk_ok(tmpdir: &Path, a: &[&str]) -> String {
    let o = rk(tmpdir, a);
    assert!(
        o.status.success(),
        "raidkit {a:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).to_string()
}

/// A failing run: exit status 1; returns its stderr.
fn rk_fails(tmpdir: &Path, a: &[&str]) -> String {
    let o = rk(tmpdir, a);
    assert_eq!(
        o.status.code(),
        Some(1),
        "raidkit {a:?} should fail: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    String::from_utf8_lossy(&o.stderr).to_string()
}

/// `serve` with the default control socket (in `tmpdir`); returns the
/// guarded process and its first endpoint.
fn serve(tmpdir: &Path, ms: &[String]) -> (Guarded, String) {
    let mut cmd = Command::new(BIN);
    cmd.env("TMPDIR", tmpdir)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(ms)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut g = Guarded::spawn(&mut cmd);
    let out = g.child().stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if let Some(i) = line.find("nbd://") {
                let _ = tx.send(line[i..].split_whitespace().next().unwrap().to_string());
            }
        }
    });
    let uri = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("server did not start");
    (g, uri)
}

fn json(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

#[test]
fn list_stop_and_control_by_name() {
    let dir = tmp();
    let t = dir.path();
    let a: Vec<String> = (0..2)
        .map(|i| t.join(format!("a{i}.img")).display().to_string())
        .collect();
    let b: Vec<String> = (0..3)
        .map(|i| t.join(format!("b{i}.img")).display().to_string())
        .collect();
    // Default names come from the first member: 'a0' and 'b0'.
    let mut c = vec!["create", "--json", "--level", "1", "--size", "8M"];
    c.extend(a.iter().map(String::as_str));
    assert_eq!(json(&rk_ok(t, &c))["name"], "a0");
    let mut c = vec![
        "create", "--json", "--level", "5", "--size", "8M", "--chunk", "64K",
    ];
    c.extend(b.iter().map(String::as_str));
    assert_eq!(json(&rk_ok(t, &c))["name"], "b0");

    let (mut sa, uri_a) = serve(t, &a);
    let (mut sb, _) = serve(t, &b);

    // Both listed, with their PIDs, members and endpoints.
    let rows = json(&rk_ok(t, &["list", "--json"]));
    let rows = rows.as_array().expect("a list");
    assert_eq!(rows.len(), 2, "{rows:?}");
    for (row, pid, n, level) in [(0, sa.id(), 2, "raid1"), (1, sb.id(), 3, "raid5")] {
        let r = &rows[row];
        assert_eq!(r["name"], ["a0", "b0"][row], "{r}");
        assert_eq!(r["pid"], pid, "{r}");
        assert_eq!(r["level"], level, "{r}");
        assert_eq!(
            (r["members_up"].as_u64(), r["members_total"].as_u64()),
            (Some(n), Some(n))
        );
        assert!(r["endpoints"][0]
            .as_str()
            .unwrap()
            .starts_with("nbd://127.0.0.1:"));
    }
    let text = rk_ok(t, &["list"]);
    assert!(
        text.contains("a0") && text.contains("b0") && text.contains("2/2"),
        "{text}"
    );

    // Two servers: a command needs to be told which; by name or UUID.
    let err = rk_fails(t, &["status"]);
    assert!(err.contains("several raidkit servers"), "{err}");
    let st = json(&rk_ok(t, &["status", "--json", "--control", "b0"]));
    assert_eq!(st["array"]["name"], "b0");
    assert_eq!(st["pid"], sb.id());
    let uuid = st["array"]["uuid"].as_str().unwrap().to_string();
    let st = json(&rk_ok(t, &["status", "--json", "--control", &uuid]));
    assert_eq!(st["array"]["name"], "b0");
    let err = rk_fails(t, &["status", "--control", "nosuch"]);
    assert!(err.contains("'nosuch'"), "{err}");

    // A client connected to a0: stop refuses and names it; the server runs on.
    let mut client = Guarded::spawn(
        Command::new("/usr/bin/python3")
            .args([
                "-c",
                "import nbd, sys, time\nh = nbd.NBD()\nh.connect_uri(sys.argv[1])\ntime.sleep(120)\n",
                &uri_a,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    wait_for("the client to connect", 30, || {
        json(&rk_ok(t, &["status", "--json", "--control", "a0"]))["connections"]["active"] == 1
    });
    let err = rk_fails(t, &["stop", "a0"]);
    assert!(err.contains("1 client(s) connected (127.0.0.1:"), "{err}");
    assert!(sa.try_wait().is_none(), "stop refused, yet the server went");
    // --force disconnects it; the server exits cleanly and the array is clean.
    let out = json(&rk_ok(t, &["stop", "a0", "--force", "--json"]));
    assert_eq!(out["stopped"], true);
    assert_eq!(out["pid"], sa.id());
    assert_eq!(sa.wait_within(Duration::from_secs(60)).code(), Some(0));
    client.kill();
    let e = json(&rk_ok(t, &["examine", "--json", &a[0]]));
    assert_eq!(e["state"], "clean", "{e}");

    // The other by its UUID, no client: stopped at once.
    let out = rk_ok(t, &["stop", &uuid]);
    assert!(out.contains("stopped array 'b0'"), "{out}");
    assert_eq!(sb.wait_within(Duration::from_secs(60)).code(), Some(0));
    assert!(rk_ok(t, &["list"]).contains("no raidkit server is running"));
    assert_eq!(json(&rk_ok(t, &["list", "--json"])), serde_json::json!([]));
}

#[test]
fn logs_have_no_colour_and_say_every_membership_change() {
    let dir = tmp();
    let ms = members(dir.path(), 2);
    create("1", &ms, "8M");
    let spare = dir.path().join("spare.img").display().to_string();
    tool("truncate", &["-s", "8M", &spare]);
    let mut s = Served::start(dir.path(), &ms, &[]);
    let ctl = s.control.display().to_string();
    ok(&["fail", "--control", &ctl, &ms[1]]);
    ok(&["remove", "--control", &ctl, &ms[1]]);
    ok(&["add", "--control", &ctl, &spare]);
    ok(&["wait", "--control", &ctl]);
    assert_eq!(s.stop().code(), Some(0));
    let log = s.log();
    assert!(!log.contains('\x1b'), "colour codes in a log file:\n{log}");
    for line in [
        "member failed",
        "member removed",
        "member takes role 1 and is rebuilt",
        "rebuild started",
        "rebuild ended",
    ] {
        assert!(log.contains(line), "no '{line}' in the log:\n{log}");
    }
}

#[test]
fn log_format_json_gives_one_json_object_per_line() {
    let dir = tmp();
    let ms = members(dir.path(), 3);
    create("1", &ms, "8M");
    // Started degraded (a warning), a member failed (a warning), stopped
    // (notes): every line of the log an event with a level and a message.
    let mut s = Served::start(dir.path(), &ms[..2], &["--log-format", "json", "--run"]);
    let ctl = s.control.display().to_string();
    ok(&["fail", "--control", &ctl, &ms[1]]);
    assert_eq!(s.stop().code(), Some(0));
    let log = s.log();
    let events: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let find = |level: &str, text: &str| {
        events.iter().any(|e| {
            e["level"] == level
                && e["fields"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains(text))
                && e["timestamp"].is_string()
        })
    };
    assert!(find("WARN", "is degraded"), "{log}");
    assert!(find("WARN", "member failed"), "{log}");
    assert!(find("INFO", "is clean"), "{log}");
    // A command's error, too.
    let o = output_within(
        Command::new(BIN).args(["--log-format", "json", "examine", "/nonexistent.img"]),
        DEADLINE,
    );
    assert_eq!(o.status.code(), Some(1));
    let e: Value = serde_json::from_slice(&o.stderr).expect("a JSON error line");
    assert_eq!(e["level"], "ERROR", "{e}");
}

#[test]
fn a_report_cut_short_by_its_reader_ends_quietly() {
    let dir = tmp();
    let ms = members(dir.path(), 4);
    create("5", &ms, "8M");
    // `detail` into a pipe whose reader has gone: no panic, no message.
    let script = format!(
        "\"$1\" detail {} | head -c 1 >/dev/null; echo \"${{PIPESTATUS[0]}}\"",
        ms.join(" ")
    );
    let o = tool("bash", &["-c", &script, "bash", BIN]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    let code: i32 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
    // 0 if it had written everything before the reader went, else SIGPIPE.
    assert!(code == 0 || code == 141, "exit status {code}: {err}");
    // A large read into a reader that goes at once.
    let script = format!(
        "\"$1\" read {} --offset 0 --length 8M | head -c 1 >/dev/null; echo \"${{PIPESTATUS[0]}}\"",
        ms.join(" ")
    );
    let o = tool("bash", &["-c", &script, "bash", BIN]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked") && !err.contains("error"), "{err}");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "141", "{err}");
}

#[test]
fn add_and_replace_create_a_missing_member_file_sized_like_its_peers() {
    let dir = tmp();
    let t = dir.path();
    let ms = members(t, 2);
    create("1", &ms, "8M");
    let size = std::fs::metadata(&ms[0]).unwrap().len();
    let mut s = Served::start(t, &ms, &[]);
    let ctl = s.control.display().to_string();
    // Relative names, from the user's directory: the files are made there.
    let run = |a: &[&str]| {
        let o = output_within(Command::new(BIN).current_dir(t).args(a), DEADLINE);
        assert!(
            o.status.success(),
            "raidkit {a:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    run(&["fail", "--control", &ctl, &ms[1]]);
    run(&["remove", "--control", &ctl, &ms[1]]);
    run(&["add", "--control", &ctl, "new.img"]);
    run(&["wait", "--control", &ctl]);
    assert_eq!(std::fs::metadata(t.join("new.img")).unwrap().len(), size);
    run(&["replace", "--control", &ctl, &ms[0], "--with", "fresh.img"]);
    run(&["wait", "--control", &ctl]);
    assert_eq!(std::fs::metadata(t.join("fresh.img")).unwrap().len(), size);
    let st: Value =
        serde_json::from_slice(&ok(&["status", "--json", "--control", &ctl]).stdout).unwrap();
    let paths: Vec<String> = st["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["state"] == "active")
        .map(|m| m["path"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(paths.len(), 2, "{st}");
    assert!(paths.iter().any(|p| p.ends_with("/new.img")), "{paths:?}");
    assert!(paths.iter().any(|p| p.ends_with("/fresh.img")), "{paths:?}");
    // A file that cannot be created: refused, saying why.
    let o = output_within(
        Command::new(BIN)
            .current_dir(t)
            .args(["add", "--control", &ctl, "no/such/dir/x.img"]),
        DEADLINE,
    );
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("could not be created"), "{err}");
    assert_eq!(s.stop().code(), Some(0));
    // The array, its new members, reads back what was there.
    ok(&[
        "check",
        &t.join("new.img").display().to_string(),
        &t.join("fresh.img").display().to_string(),
    ]);
}

#[test]
fn the_consistency_policy_is_shown_everywhere() {
    let dir = tmp();
    for (level, policy, want) in [
        ("5", None, "journal"),
        ("1", None, "bitmap"),
        ("6", Some("none"), "none"),
        ("5", Some("bitmap"), "bitmap"),
    ] {
        let sub = dir.path().join(format!("{level}-{want}"));
        std::fs::create_dir(&sub).unwrap();
        let ms = members(&sub, 4);
        let mut c = vec!["create", "--level", level, "--size", "8M", "--chunk", "64K"];
        if let Some(p) = policy {
            c.extend(["--consistency-policy", p]);
        }
        ok(&args(&c, &ms));
        let e: Value = serde_json::from_slice(&ok(&["examine", "--json", &ms[0]]).stdout).unwrap();
        assert_eq!(e["consistency_policy"], want, "examine, raid{level}: {e}");
        let d: Value =
            serde_json::from_slice(&ok(&args(&["detail", "--json"], &ms)).stdout).unwrap();
        assert_eq!(d["consistency_policy"], want, "detail, raid{level}: {d}");
        let text = String::from_utf8_lossy(&ok(&args(&["detail"], &ms)).stdout).to_string();
        assert!(text.contains(&format!("Consistency : {want}")), "{text}");
        let mut s = Served::start(&sub, &ms, &[]);
        let ctl = s.control.display().to_string();
        let st: Value =
            serde_json::from_slice(&ok(&["status", "--json", "--control", &ctl]).stdout).unwrap();
        assert_eq!(
            st["array"]["consistency_policy"], want,
            "status, raid{level}: {st}"
        );
        let text = String::from_utf8_lossy(&ok(&["status", "--control", &ctl]).stdout).to_string();
        assert!(
            text.contains(&format!("consistency policy {want}")),
            "{text}"
        );
        assert_eq!(s.stop().code(), Some(0));
    }
}

#[test]
fn status_shows_a_member_without_a_role_as_such() {
    let dir = tmp();
    let ms = members(dir.path(), 2);
    let spare = dir.path().join("s0.img").display().to_string();
    ok(&args(
        &["create", "--level", "1", "--size", "8M", "--spare", &spare],
        &ms,
    ));
    let mut all = ms.clone();
    all.push(spare.clone());
    let mut s = Served::start(dir.path(), &all, &[]);
    let ctl = s.control.display().to_string();
    ok(&["fail", "--control", &ctl, &ms[1]]);
    ok(&["wait", "--control", &ctl]);
    let text = String::from_utf8_lossy(&ok(&["status", "--control", &ctl]).stdout).to_string();
    // The failed member has no role any more: '-' and faulty, not 'spare'.
    let failed = text
        .lines()
        .find(|l| l.contains(&ms[1]))
        .unwrap_or_else(|| panic!("{} not listed:\n{text}", ms[1]));
    let cols: Vec<&str> = failed.split_whitespace().collect();
    assert_eq!(&cols[..2], &["-", "faulty"], "{text}");
    // The spare serves role 1 now.
    let took = text
        .lines()
        .find(|l| l.contains(&spare))
        .expect("spare listed");
    assert_eq!(
        &took.split_whitespace().collect::<Vec<_>>()[..2],
        &["1", "active"],
        "{text}"
    );
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn every_control_command_answers_in_json() {
    let dir = tmp();
    let t = dir.path();
    let ms = members(t, 2);
    create("1", &ms, "8M");
    let mut s = Served::start(t, &ms, &[]);
    let ctl = s.control.display().to_string();
    let j = |a: &[&str]| -> Value {
        let mut full = a.to_vec();
        full.extend(["--json", "--control", &ctl]);
        let o = ok(&full);
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
            panic!(
                "raidkit {a:?}: not JSON ({e}): {}",
                String::from_utf8_lossy(&o.stdout)
            )
        })
    };
    let v = j(&["fail", &ms[1]]);
    assert_eq!(
        (v["member"].as_str(), v["state"].as_str()),
        (Some(ms[1].as_str()), Some("faulty")),
        "{v}"
    );
    let v = j(&["remove", &ms[1]]);
    assert_eq!(v["removed"], true, "{v}");
    let new = t.join("n.img").display().to_string();
    let v = j(&["add", &new]);
    assert_eq!(
        (v["as"].as_str(), v["role"].as_u64()),
        (Some("rebuild"), Some(1)),
        "{v}"
    );
    let v = j(&["wait"]);
    assert_eq!(v["state"], "optimal", "{v}");
    assert_eq!(v["last_recovery"]["kind"], "rebuild", "{v}");
    let v = j(&[
        "replace",
        &ms[0],
        "--with",
        &t.join("r.img").display().to_string(),
    ]);
    assert_eq!(v["role"], 0, "{v}");
    j(&["wait"]);
    let v = j(&["speed", "--rebuild-max", "64M"]);
    assert_eq!(v["rebuild_speed"]["max"], 64 << 20, "{v}");
    assert_eq!(v["rebuild_max"], 64 << 20, "{v}");
    let st = j(&["status"]);
    assert_eq!(st["rebuild_speed"]["max"], 64 << 20, "{st}");
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn a_member_in_use_names_the_server_that_holds_it() {
    let dir = tmp();
    let t = dir.path();
    let files = |p: &str| -> Vec<String> {
        (0..2)
            .map(|i| t.join(format!("{p}{i}.img")).display().to_string())
            .collect()
    };
    let (a, b) = (files("lab"), files("other"));
    for (ms, name) in [(&a, "lab"), (&b, "other")] {
        let mut c = vec!["create", "--level", "1", "--size", "8M", "--name", name];
        c.extend(ms.iter().map(String::as_str));
        rk_ok(t, &c);
    }
    let (mut sa, _) = serve(t, &a);
    let (mut sb, _) = serve(t, &b);
    let holder = format!(
        "{} is in use by the raidkit server of array 'lab' (PID {})",
        a[0],
        sa.id()
    );
    // A second server of the same members: refused, naming the first.
    let mut c = vec!["serve", "--listen", "127.0.0.1:0"];
    c.extend(a.iter().map(String::as_str));
    let err = rk_fails(t, &c);
    assert!(err.contains(&holder), "{err}");
    // A read-only one (which takes no lock, and a control socket of its
    // own): refused too, naming the server that writes the members.
    let ro = t.join("ro.ctl").display().to_string();
    let mut c = vec![
        "serve",
        "--read-only",
        "--listen",
        "127.0.0.1:0",
        "--control",
        &ro,
    ];
    c.extend(a.iter().map(String::as_str));
    let err = rk_fails(t, &c);
    assert!(err.contains(&format!("PID {}", sa.id())), "{err}");
    // Another array's server asked to take a member in use: the same.
    rk_ok(t, &["fail", "--control", "other", &b[1]]);
    rk_ok(t, &["remove", "--control", "other", &b[1]]);
    let err = rk_fails(t, &["add", "--control", "other", &a[0], "--force"]);
    assert!(err.contains(&holder), "{err}");
    // Nothing was written to the member in use: its array checks clean.
    for s in [&mut sa, &mut sb] {
        // SAFETY: kill(2) on our own, unreaped child.
        unsafe { libc::kill(s.id() as i32, libc::SIGTERM) };
        assert!(s.wait_within(Duration::from_secs(60)).success());
    }
    let mut c = vec!["check"];
    c.extend(a.iter().map(String::as_str));
    rk_ok(t, &c);
}

#[test]
fn status_names_members_by_absolute_path() {
    let dir = tmp();
    let t = dir.path();
    let ms = members(t, 2);
    create("1", &ms, "8M");
    // Served by relative names, from the members' directory.
    let rel: Vec<String> = ms
        .iter()
        .map(|m| {
            Path::new(m)
                .file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let mut cmd = Command::new(BIN);
    cmd.env("TMPDIR", t)
        .current_dir(t)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(&rel)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut s = Guarded::spawn(&mut cmd);
    let out = s.child().stdout.take().expect("stdout");
    let mut lines = BufReader::new(out).lines();
    assert!(lines
        .by_ref()
        .map_while(Result::ok)
        .any(|l| l.contains("nbd://")));
    let st = json(&rk_ok(t, &["status", "--json"]));
    let paths: Vec<&str> = st["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ms.iter().map(String::as_str).collect::<Vec<_>>());
    let human = rk_ok(t, &["status"]);
    for m in &ms {
        assert!(human.contains(m.as_str()), "{human}");
    }
    rk_ok(t, &["stop"]);
    s.wait_within(Duration::from_secs(60));
}

#[test]
fn a_recovery_reports_its_recent_rate_and_time_left() {
    let dir = tmp();
    let t = dir.path();
    let ms = members(t, 2);
    create("1", &ms, "256M");
    let mut s = Served::start(t, &ms, &["--rebuild-min", "0", "--rebuild-max", "64M"]);
    let c = s.control.display().to_string();
    let st = || {
        json(&String::from_utf8_lossy(
            &ok(&["status", "--json", "--control", &c]).stdout,
        ))
    };
    ok(&["fail", "--control", &c, &ms[1]]);
    ok(&["remove", "--control", &c, &ms[1]]);
    ok(&[
        "add",
        "--control",
        &c,
        &t.join("new.img").display().to_string(),
    ]);
    // Fast at first, then slowed to 2 MiB/s: after a few seconds the rate
    // reported is the new one, not the run's average.
    wait_for("the rebuild to pass 96 MiB", 60, || {
        st()["recovery"]["bytes_done"].as_u64().unwrap_or(0) >= 96 << 20
    });
    ok(&["speed", "--control", &c, "--rebuild-max", "2M"]);
    std::thread::sleep(Duration::from_secs(7));
    let v = st();
    let r = &v["recovery"];
    let mib = 1048576.0;
    let rate = r["rate"].as_f64().unwrap();
    let average = r["rate_average"].as_f64().unwrap();
    assert!(rate > 0.5 * mib && rate < 3.0 * mib, "{r}");
    assert!(average > 2.0 * rate, "{r}");
    assert!(r["seconds"].as_f64().unwrap() > 7.0, "{r}");
    let left = (r["bytes_total"].as_u64().unwrap() - r["bytes_done"].as_u64().unwrap()) as f64;
    let eta = r["seconds_left"].as_f64().unwrap();
    assert!((eta - left / rate).abs() < 0.1 * eta, "{r}");
    // The human status says the same.
    let human = String::from_utf8_lossy(&ok(&["status", "--control", &c]).stdout).to_string();
    assert!(
        human.contains("rebuild of role 1") && human.contains(" left)"),
        "{human}"
    );
    // After: no recovery running, the last one recorded as done.
    ok(&["speed", "--control", &c, "--rebuild-max", "0"]);
    ok(&["wait", "--control", &c, "--timeout", "120"]);
    let v = st();
    assert!(v["recovery"].is_null(), "{v}");
    assert_eq!(v["last_recovery"]["result"], "done", "{v}");
    assert_eq!(v["last_recovery"]["role"], 1, "{v}");
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn the_policy_of_a_stopped_array_changes_and_keeps_its_data() {
    let dir = tmp();
    let t = dir.path();
    let ms = members(t, 4);
    create("5", &ms, "32M");
    let policy = |m: &str| -> Value {
        json(&String::from_utf8_lossy(
            &ok(&["examine", "--json", m]).stdout,
        ))["consistency_policy"]
            .clone()
    };
    assert_eq!(policy(&ms[0]), "journal");
    // Data written under the journal.
    let mut s = Served::start(t, &ms, &[]);
    tool(
        "qemu-io",
        &["-f", "raw", "-c", "write -P 0x5a 0 40M", &s.uri],
    );
    // Refused while the server holds the members, naming it.
    let err = fails(&args(&["policy", "bitmap"], &ms), "");
    assert!(err.contains(&format!("(PID {})", s.pid())), "{err}");
    assert_eq!(s.stop().code(), Some(0));

    // journal -> bitmap -> none -> journal: every member's superblock says
    // so, and the data stays.
    for (to, region) in [("bitmap", "8M"), ("none", "0"), ("journal", "16M")] {
        let r = json(&String::from_utf8_lossy(
            &ok(&args(
                &["policy", to, "--json", "--bitmap-region", region],
                &ms,
            ))
            .stdout,
        ));
        assert_eq!(
            (r["to"].as_str(), r["members"].as_u64()),
            (Some(to), Some(4)),
            "{r}"
        );
        for m in &ms {
            assert_eq!(policy(m), to, "{m}");
        }
        ok(&args(&["check"], &ms));
    }
    let e = json(&String::from_utf8_lossy(
        &ok(&["examine", "--json", &ms[2]]).stdout,
    ));
    assert_eq!(e["bitmap"]["region"], 16 << 20, "{e}");
    // The new journal starts empty: nothing of the first one's records is
    // left to be replayed.
    let (at, len) = (
        e["journal"]["offset"].as_u64().unwrap() as usize,
        e["journal"]["size"].as_u64().unwrap() as usize,
    );
    assert_eq!(e["journal"]["applied_seq"], 0, "{e}");
    // It ends where the checksums begin, as one made by `create` does (it
    // was laid up to the data, over the checksums' first blocks).
    assert!(
        (at + len) as u64 <= e["checksums"]["offset"].as_u64().unwrap(),
        "{e}"
    );
    for m in &ms {
        let b = std::fs::read(m).unwrap();
        assert!(
            b[at..at + len].iter().all(|&x| x == 0),
            "{m}: journal not blank"
        );
    }
    // The same again: nothing to do, said so.
    let r = json(&String::from_utf8_lossy(
        &ok(&args(&["policy", "journal", "--json"], &ms)).stdout,
    ));
    assert_eq!(r["changed"], false, "{r}");

    // Small writes, enough to wrap the journal a few times; after a clean
    // stop and a start, each reads back (rot in the checksum area made
    // them EIO).
    let mut s = Served::start(t, &ms, &[]);
    let small: Vec<String> = (0..200u64)
        .map(|i| format!("write -P 0x5a {} 16k", (i * 80) << 10))
        .collect();
    let mut io = vec!["-f", "raw"];
    for c in &small {
        io.extend(["-c", c.as_str()]);
    }
    io.push(&s.uri);
    tool("qemu-io", &io);
    assert_eq!(s.stop().code(), Some(0));
    let mut s = Served::start(t, &ms, &[]);
    let o = tool(
        "qemu-io",
        &["-f", "raw", "-c", "read -P 0x5a 0 40M", &s.uri],
    );
    let out = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(!out.contains("failed") && !out.contains("error"), "{out}");
    assert_eq!(s.stop().code(), Some(0));
    ok(&args(&["check"], &ms));

    // The new journal works: writes, a crash, replay at the next start.
    let mut s = Served::start(t, &ms, &[]);
    tool(
        "qemu-io",
        &["-f", "raw", "-c", "write -P 0xa5 4M 8M", &s.uri],
    );
    s.kill9();
    // An array not stopped cleanly: refused, nothing changed.
    let before = std::fs::read(&ms[0]).unwrap();
    fails(&args(&["policy", "none"], &ms), "");
    assert!(
        std::fs::read(&ms[0]).unwrap() == before,
        "a refused change wrote"
    );
    let mut s = Served::start(t, &ms, &[]);
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "read -P 0x5a 0 4M",
            "-c",
            "read -P 0xa5 4M 8M",
            "-c",
            "read -P 0x5a 12M 28M",
            &s.uri,
        ],
    );
    ok(&["wait", "--control", &s.control.display().to_string()]);
    assert_eq!(s.stop().code(), Some(0));
    ok(&args(&["check"], &ms));

    // Refusals: a missing member; a journal on a mirror; no member touched.
    fails(&args(&["policy", "bitmap"], &ms[..3]), "");
    assert_eq!(policy(&ms[0]), "journal");
    let m1 = members(&t.join("mirror"), 2);
    std::fs::create_dir_all(t.join("mirror")).unwrap();
    create("1", &m1, "8M");
    fails(&args(&["policy", "journal"], &m1), "");
    assert_eq!(policy(&m1[0]), "bitmap");
    // Nor does create make one when asked by name (it made a bitmap and
    // said nothing); nothing is created.
    let m2 = members(&t.join("mirror2"), 2);
    std::fs::create_dir_all(t.join("mirror2")).unwrap();
    for level in ["1", "10"] {
        fails(
            &args(
                &[
                    "create",
                    "--level",
                    level,
                    "--size",
                    "8M",
                    "--consistency-policy",
                    "journal",
                ],
                &m2,
            ),
            "closes the write hole of parity levels",
        );
        assert!(m2.iter().all(|m| !Path::new(m).exists()));
    }
}

#[test]
fn help_says_sizes_rates_json_and_force_the_same_way_everywhere() {
    let help = |c: &[&str]| -> String {
        let mut a = c.to_vec();
        a.push("--help");
        String::from_utf8_lossy(&ok(&a).stdout).to_string()
    };
    let commands: Vec<Vec<&str>> = [
        "create", "examine", "detail", "read", "write", "serve", "status", "list", "stop", "check",
        "fail", "remove", "add", "replace", "wait", "speed", "policy", "bench",
    ]
    .iter()
    .map(|c| vec![*c])
    .chain([
        vec!["bench", "sweep"],
        vec!["bench", "engine"],
        vec!["bench", "parity"],
    ])
    .collect();
    let mut sizes = 0;
    for c in &commands {
        let h = help(c);
        // Options are one per line ("  -z, --size <SIZE>  ...").
        for line in h.lines().filter(|l| l.trim_start().starts_with('-')) {
            if line.contains("<SIZE>") {
                sizes += 1;
                assert!(line.contains("(powers of 1024)"), "{c:?}: {line}");
            }
            if line.contains("<RATE>") {
                assert!(
                    line.contains("(powers of 1024), /s accepted; 0: no limit"),
                    "{c:?}: {line}"
                );
            }
            if line.contains("--force ") {
                // Says what it overrides, not just "force".
                let what = line.split("--force").nth(1).unwrap().trim();
                assert!(what.split_whitespace().count() >= 5, "{c:?}: {line}");
            }
        }
        // Every command that reports can report in JSON; read and write
        // move data, serve serves, the bench subcommands print tables.
        let reports = c.len() == 1 && !matches!(c[0], "read" | "write" | "serve");
        if reports {
            assert!(h.contains("--json"), "{c:?} has no --json:\n{h}");
        }
    }
    assert!(sizes >= 10, "only {sizes} size options found");
    // A decimal unit is refused as a bad value (clap's exit status 2), not
    // taken as a power of 1024; the same value in K/M/G/T passes parsing
    // (and fails later for want of a server or a member: status 1).
    let read = |offset| {
        [
            "read",
            "--offset",
            offset,
            "--length",
            "1",
            "/nonexistent.img",
        ]
    };
    for (bad, good) in [
        (
            &[
                "speed",
                "--control",
                "/nonexistent/c.sock",
                "--rebuild-max",
                "50MB/s",
            ][..],
            &[
                "speed",
                "--control",
                "/nonexistent/c.sock",
                "--rebuild-max",
                "50M/s",
            ][..],
        ),
        (&read("1GB")[..], &read("1G")[..]),
    ] {
        assert_eq!(raidkit_refused(bad).status.code(), Some(2), "{bad:?}");
        assert_eq!(raidkit_refused(good).status.code(), Some(1), "{good:?}");
    }
}

/// Kills a process this test started indirectly (a daemon) if the test
/// ends before stopping it.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // Only while it is still a raidkit process: its PID cannot have been
        // reused by another program.
        let comm = std::fs::read_to_string(format!("/proc/{}/comm", self.0)).unwrap_or_default();
        if comm.trim() == "raidkit" {
            // SAFETY: kill(2) on a raidkit server this test started.
            unsafe { libc::kill(self.0 as i32, libc::SIGKILL) };
        }
    }
}

#[test]
fn serve_daemon_returns_once_serving_and_endpoints_are_uri_encoded() {
    let dir = tmp();
    let t = dir.path();
    let ms = members(t, 2);
    let mut c = vec!["create", "--level", "1", "--size", "8M", "--name", "a b/c"];
    c.extend(ms.iter().map(String::as_str));
    rk_ok(t, &c);
    let sock = t.join("s k.sock").display().to_string();
    let mut c = vec![
        "serve",
        "--daemon",
        "--listen",
        "127.0.0.1:0",
        "--socket",
        &sock,
    ];
    c.extend(ms.iter().map(String::as_str));
    // The server's log goes on to a file, as the help says to redirect it.
    let log = std::fs::File::create(t.join("lab.log")).unwrap();
    let o = Guarded::spawn(
        Command::new(BIN)
            .env("TMPDIR", t)
            .args(&c)
            .stdout(Stdio::piped())
            .stderr(log),
    )
    .output_within(DEADLINE);
    assert!(o.status.success(), "{o:?}");
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let pid: u32 = out
        .lines()
        .find_map(|l| l.split("(PID ").nth(1)?.split(')').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no PID in: {out}"));
    let _guard = KillOnDrop(pid);
    // It serves now: the endpoints it printed work as they are.
    let uris: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("raidkit: listening on "))
        .collect();
    assert_eq!(uris.len(), 2, "{out}");
    assert!(uris[0].ends_with("/a%20b%2Fc"), "{out}");
    assert!(
        uris[1].starts_with("nbd+unix:///a%20b%2Fc?socket=/"),
        "{out}"
    );
    assert!(uris[1].ends_with("/s%20k.sock"), "{out}");
    let size = json(&rk_ok(t, &["detail", "--json", &ms[0], &ms[1]]))["size"].clone();
    for u in &uris {
        let o = tool("nbdinfo", &["--size", u]);
        assert_eq!(
            String::from_utf8_lossy(&o.stdout).trim(),
            size.to_string(),
            "{u}"
        );
    }
    // A second one of the same members fails, and says why, at once.
    let err = rk_fails(t, &c);
    assert!(err.contains(&format!("(PID {pid})")), "{err}");
    // Found and stopped by its name, slash and all.
    rk_ok(t, &["stop", "a b/c"]);
    assert_eq!(json(&rk_ok(t, &["list", "--json"])), serde_json::json!([]));
}

/// A daemon whose stderr reader went away (`serve --daemon 2>&1 | head
/// -1`, a log collector restarted) goes on: failing a member logs, and a
/// log line that cannot be written panicked the thread that logged it
/// (there, with the metadata lock held), so `fail` got no answer and the
/// member stayed in service.
#[test]
fn a_daemon_whose_log_reader_is_gone_still_fails_members_and_stops() {
    let dir = tmp();
    let t = dir.path();
    let ms = members(t, 3);
    let mut c = vec!["create", "--level", "5", "--size", "8M"];
    c.extend(ms.iter().map(String::as_str));
    rk_ok(t, &c);
    let ctl = t.join("c.sock").display().to_string();
    let mut c = vec![
        "-s",
        "KILL",
        "60",
        BIN,
        "serve",
        "--daemon",
        "--listen",
        "127.0.0.1:0",
        "--control",
        &ctl,
    ];
    c.extend(ms.iter().map(String::as_str));
    let mut child = Command::new("timeout")
        .env("TMPDIR", t)
        .args(&c)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
    assert!(child.wait().unwrap().success(), "{out}");
    let pid: u32 = out
        .lines()
        .find_map(|l| l.split("(PID ").nth(1)?.split(')').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no PID in: {out}"));
    let _guard = KillOnDrop(pid);
    // The only reader of the daemon's stderr goes.
    drop(child.stderr.take());
    rk_ok(t, &["fail", "--control", &ctl, &ms[1]]);
    let st = json(&rk_ok(t, &["status", "--json", "--control", &ctl]));
    assert_eq!(st["members"][1]["state"], "faulty", "{st}");
    assert_eq!(st["state"], "degraded", "{st}");
    rk_ok(t, &["stop", "--control", &ctl]);
    let gone = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        // SAFETY: kill(2) with signal 0 only asks whether the PID is there.
        let alive = unsafe { libc::kill(pid as i32, 0) } == 0;
        !alive
    });
    assert!(gone, "the daemon did not stop");
}

#[test]
fn create_can_leave_the_initial_sync_to_the_server() {
    let dir = tmp();
    let t = dir.path();
    let ms = members(t, 4);
    // Existing members with data on them: their parity is not consistent.
    for (i, m) in ms.iter().enumerate() {
        let mut junk = vec![0u8; 64 << 20];
        for (j, b) in junk.iter_mut().enumerate().skip(1 << 20) {
            *b = ((j * (i + 3)) >> 7) as u8;
        }
        std::fs::write(m, &junk).unwrap();
    }
    let mut c = vec![
        "create",
        "--json",
        "--force",
        "--level",
        "5",
        "--chunk",
        "64K",
        "--background-sync",
    ];
    c.extend(ms.iter().map(String::as_str));
    let r = json(&rk_ok(t, &c));
    assert_eq!(
        (
            r["initial_sync"].as_bool(),
            r["initial_sync_pending"].as_bool()
        ),
        (Some(false), Some(true)),
        "{r}"
    );
    let d = json(&rk_ok(t, &args(&["detail", "--json"], &ms)));
    assert_eq!(d["resync_offset"], 0, "{d}");
    let e = json(&rk_ok(t, &["examine", "--json", &ms[0]]));
    assert_eq!(e["resync_offset"], 0, "{e}");
    // check waits for the sync rather than counting unsynced stripes.
    let o = rk(t, &args(&["check"], &ms));
    let err = String::from_utf8_lossy(&o.stderr);
    // Could not check: 2 (1 would say that redundancy disagrees).
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("has not finished its initial sync"), "{err}");
    // Served: the sync runs in the background, then check is clean.
    let mut s = Served::start(t, &ms, &[]);
    ok(&[
        "wait",
        "--control",
        &s.control.display().to_string(),
        "--timeout",
        "120",
    ]);
    let st: Value = serde_json::from_slice(
        &ok(&[
            "status",
            "--json",
            "--control",
            &s.control.display().to_string(),
        ])
        .stdout,
    )
    .unwrap();
    assert_eq!(st["last_recovery"]["result"], "done", "{st}");
    assert_eq!(s.stop().code(), Some(0));
    let d = json(&rk_ok(t, &args(&["detail", "--json"], &ms)));
    assert!(d["resync_offset"].is_null(), "{d}");
    rk_ok(t, &args(&["check"], &ms));
}

#[test]
fn data_offset_sets_the_metadata_area_and_members_joining_keep_it() {
    let dir = tmp();
    let t = dir.path();
    let ms = members(t, 3);
    let examine = |m: &str| {
        json(&String::from_utf8_lossy(
            &ok(&["examine", "--json", m]).stdout,
        ))
    };
    // Bad offsets: refused, exit 1, and no member file made.
    for (off, extra) in [
        ("1500K", &[][..]),
        ("64M", &[][..]),
        (
            "4M",
            &[
                "--metadata",
                "md",
                "--checksums",
                "off",
                "--consistency-policy",
                "none",
            ][..],
        ),
    ] {
        let mut a = vec![
            "create",
            "--level",
            "5",
            "--size",
            "64M",
            "--data-offset",
            off,
        ];
        a.extend_from_slice(extra);
        let o = raidkit_refused(&args(&a, &ms));
        assert_eq!(o.status.code(), Some(1), "--data-offset {off}: {o:?}");
        assert!(
            ms.iter().all(|m| !Path::new(m).exists()),
            "--data-offset {off} left files"
        );
    }
    ok(&args(
        &[
            "create",
            "--level",
            "5",
            "--size",
            "64M",
            "--chunk",
            "64K",
            "--data-offset",
            "16M",
        ],
        &ms,
    ));
    let sb = examine(&ms[0]);
    assert_eq!(sb["data_offset"], 16 << 20, "{sb}");
    // The journal takes what the bitmap and checksums leave of the area:
    // far more than the 1 MiB a 64 MiB member gets by default.
    assert!(sb["journal"]["size"].as_u64().unwrap() > 15 << 20, "{sb}");

    let mut s = Served::start(t, &ms, &[]);
    let ctl = s.control.display().to_string();
    tool(
        "qemu-io",
        &["-f", "raw", "-c", "write -P 0x5a 0 40M", &s.uri],
    );
    ok(&["fail", "--control", &ctl, &ms[1]]);
    ok(&["remove", "--control", &ctl, &ms[1]]);
    // A member of 64 MiB joining gets the array's metadata area, not the
    // 1 MiB its size alone would give: the journal lies there on every
    // member, and a smaller area would put the member's data under it.
    let new = t.join("new.img").display().to_string();
    ok(&["add", "--control", &ctl, &new]);
    ok(&["wait", "--control", &ctl]);
    let joined = examine(&new);
    assert_eq!(joined["data_offset"], 16 << 20, "{joined}");
    assert_eq!(joined["journal"], sb["journal"], "{joined}");
    // Written again after the rebuild, through the journal onto the new
    // member too, and read back.
    tool(
        "qemu-io",
        &["-f", "raw", "-c", "write -P 0xa5 8M 16M", &s.uri],
    );
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "read -P 0x5a 0 8M",
            "-c",
            "read -P 0xa5 8M 16M",
            "-c",
            "read -P 0x5a 24M 16M",
            &s.uri,
        ],
    );
    assert_eq!(s.stop().code(), Some(0));
    ok(&["check", &ms[0], &ms[2], &new]);
}

/// `raidkit stop` reports how the server's close ended: an array whose
/// members all failed cannot be marked clean, and the stop says so and
/// fails (it took the socket's going as success, exit 0); a close that
/// works is reported as clean.
#[test]
fn stop_fails_when_the_array_cannot_be_closed_cleanly() {
    for broken in [true, false] {
        let dir = tmp();
        let t = dir.path();
        let ms = members(t, 2);
        create("1", &ms, "16M");
        // Both members refuse writes from their 12th on: the client's
        // writes fail both and the array fails.
        let given: Vec<String> = ms
            .iter()
            .map(|m| match broken {
                true => format!("fault:{m}?fail-writes-after=12"),
                false => m.clone(),
            })
            .collect();
        let (mut g, uri) = serve(t, &given);
        for _ in 0..20 {
            try_tool("qemu-io", &["-f", "raw", "-c", "write 0 64k", &uri]);
        }
        let o = rk(t, &["stop", "--json"]);
        let v = json(&String::from_utf8_lossy(&o.stdout));
        assert_eq!(v["stopped"], true, "{v}");
        if broken {
            assert_eq!(o.status.code(), Some(1), "{v}");
            assert_eq!(v["clean"], false, "{v}");
            assert!(v["error"].is_string(), "{v}");
        } else {
            assert_eq!(o.status.code(), Some(0), "{v}");
            assert_eq!(
                (v["clean"].as_bool(), v["error"].as_str()),
                (Some(true), None),
                "{v}"
            );
        }
        let st = g.wait_within(Duration::from_secs(30));
        assert_eq!(st.success(), !broken, "the server's own exit status");
    }
    // Members that fail only at the close (the last superblock writes):
    // the array fails there, after serving fine; the stop says so.
    let dir = tmp();
    let t = dir.path();
    let ms = members(t, 3);
    create("5", &ms, "16M");
    let given = vec![
        ms[0].clone(),
        format!("fault:{}?fail-writes-after=7", ms[1]),
        format!("fault:{}?fail-writes-after=7", ms[2]),
    ];
    let (mut g, uri) = serve(t, &given);
    tool("qemu-io", &["-f", "raw", "-c", "write 0 4k", &uri]);
    let o = rk(t, &["stop", "--json"]);
    let v = json(&String::from_utf8_lossy(&o.stdout));
    assert_eq!(o.status.code(), Some(1), "{v}");
    assert_eq!(v["clean"], false, "{v}");
    assert!(!g.wait_within(Duration::from_secs(30)).success());
}

/// A rebuild floor above its ceiling is refused (the rebuild would go
/// faster while clients are busy than when idle), at `serve` and by
/// `speed`; a ceiling set alone below the floor brings the floor down.
#[test]
fn a_rebuild_floor_above_its_ceiling_is_refused() {
    let dir = tmp();
    let t = dir.path();
    let ms = members(t, 2);
    create("1", &ms, "8M");
    let mut c = vec![
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--rebuild-min",
        "100M",
        "--rebuild-max",
        "1M",
    ];
    c.extend(ms.iter().map(String::as_str));
    rk_fails(t, &c);
    let (mut g, _) = serve(t, &ms);
    rk_fails(
        t,
        &["speed", "--rebuild-min", "100M", "--rebuild-max", "1M"],
    );
    let v = json(&rk_ok(t, &["speed", "--rebuild-max", "2M", "--json"]));
    assert_eq!(
        (v["rebuild_min"].as_u64(), v["rebuild_max"].as_u64()),
        (Some(2 << 20), Some(2 << 20)),
        "{v}"
    );
    rk_fails(t, &["speed", "--rebuild-min", "3M"]);
    rk_ok(t, &["stop"]);
    assert!(g.wait_within(Duration::from_secs(30)).success());
}

#[test]
fn stop_returns_once_the_server_has_let_go_of_its_members() {
    // `stop` then at once `check` (as the tour does) or `serve`: `stop`
    // returned when the control socket went, before the process had let
    // go of the members as it exited, and the next command sometimes
    // found them "in use by raidkit (PID ...)".
    let dir = tmp();
    let t = dir.path();
    let ms = members(t, 3);
    create("5", &ms, "16M");
    for round in 0..8 {
        let (mut g, uri) = serve(t, &ms);
        tool(
            "qemu-io",
            &["-f", "raw", "-c", &format!("write -P {round} 0 1M"), &uri],
        );
        rk_ok(t, &["stop"]);
        let o = rk(t, &args(&["check"], &ms));
        assert_eq!(
            o.status.code(),
            Some(0),
            "round {round}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        g.wait_within(Duration::from_secs(30));
    }
}
