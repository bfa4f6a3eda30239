//! kill -9 torture against the real server (scripts/torture.py, with
//! libnbd): acknowledged and flushed writes survive every kill, with and
//! without a member missing at the restart; and the checker does see a
//! loss when one is made on purpose.

mod common;

use common::*;
use std::process::Command;

fn torture(extra: &[&str]) -> (bool, String) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/torture.py");
    let o = Command::new("/usr/bin/python3")
        .arg(script)
        .args(["--raidkit", BIN])
        .args(extra)
        .output()
        .expect("python3 (installed by .ci/run)");
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    (o.status.success(), text)
}

#[test]
fn kill9_torture_loses_nothing_flushed() {
    for (level, seed) in [("5", "3"), ("6", "4")] {
        let (ok, out) = torture(&["--cycles", "6", "--level", level, "--seed", seed]);
        assert!(ok, "RAID-{level}:\n{out}");
        assert!(
            out.contains("6 cycles") && out.contains("losses: 0"),
            "{out}"
        );
        assert!(
            out.contains("left out"),
            "no cycle ran without a member:\n{out}"
        );
    }
}

#[test]
fn kill9_torture_sees_a_planted_loss() {
    let (ok, out) = torture(&["--cycles", "2", "--sabotage"]);
    assert!(!ok, "a scribbled block went unnoticed:\n{out}");
    assert!(!out.contains("losses: 0"), "{out}");
}

/// kill -9 while whole stripes are being received straight into the
/// members' mappings (data first, then parity): at the next start the
/// logged intents have the parity of the interrupted stripes recomputed,
/// and the array is consistent.
#[test]
fn kill9_during_mapped_parity_writes_leaves_a_consistent_array() {
    for (level, n) in [("5", 4), ("6", 5)] {
        let dir = tmp();
        let ms = members(dir.path(), n);
        create(level, &ms, "16M");
        let uri_of = |s: &Served| s.uri.clone();
        // A first pass puts every page in the page cache (only cached pages
        // are written through the mappings).
        let mut s = Served::start(dir.path(), &ms, &[]);
        let fio = |uri: &str, loops: &str| {
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
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("fio (installed by .ci/run)")
        };
        assert!(fio(&uri_of(&s), "1").wait().unwrap().success());
        let mut writer = fio(&uri_of(&s), "1000");
        let ctl = s.control.display().to_string();
        wait_for("mapped writes", 30, || {
            let st: serde_json::Value =
                serde_json::from_slice(&ok(&["status", "--control", &ctl, "--json"]).stdout)
                    .unwrap();
            st["io"]["mapped_writes"].as_u64().unwrap() > 100
        });
        s.kill9();
        let _ = writer.kill();
        let _ = writer.wait();
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
