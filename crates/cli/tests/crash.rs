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
