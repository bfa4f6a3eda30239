//! README.md's tour, run as written: every shell block marked
//! `<!-- tour -->` is run, in order, command by command (`set -e`: the
//! first command that fails fails the test), in a scratch directory with
//! this build's `raidkit` first on PATH. So README stays true.
//!
//! The tour serves on NBD's default port, 10809: it runs in a network
//! namespace of its own (when this user may make one), so that no other
//! server on the machine is in its way, and with TMPDIR in its directory,
//! so that `raidkit list`, `stop` and the rest see only its servers.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

/// The tour's blocks: the fenced code after each `<!-- tour -->` line.
fn tour_blocks(readme: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut lines = readme.lines();
    while let Some(l) = lines.next() {
        if l.trim() != "<!-- tour -->" {
            continue;
        }
        let fence = lines.next().unwrap_or("");
        assert!(
            fence.starts_with("```sh"),
            "<!-- tour --> must be followed by a ```sh block, not: {fence}"
        );
        let body: Vec<&str> = lines
            .by_ref()
            .take_while(|l| !l.starts_with("```"))
            .collect();
        // `set -e` does not stop at a failure inside `a && b` or `a || b`:
        // a tour line like that could fail unseen. One command per line.
        for l in &body {
            let code = l.split('#').next().unwrap_or("");
            assert!(
                !code.contains("&&") && !code.contains("||"),
                "a tour line must be one command (set -e cannot see inside && or ||): {l}"
            );
        }
        blocks.push(body.join("\n"));
    }
    blocks
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn the_readme_tour_runs_as_written() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
            .expect("README.md");
    let blocks = tour_blocks(&readme);
    assert!(blocks.len() >= 3, "README has {} tour blocks", blocks.len());
    let dir = tmp();
    let t = dir.path();
    let bin = Path::new(BIN).parent().unwrap();
    let mut script = String::from(
        "set -euo pipefail\n\
         # Whatever happens, no server, mount or FUSE export is left behind.\n\
         cleanup() {\n\
           umount mnt 2>/dev/null || true\n\
           fusermount3 -u fuse 2>/dev/null || true\n\
           for c in \"$TMPDIR\"/raidkit-*.ctl; do\n\
             [ -S \"$c\" ] && raidkit stop --force --timeout 30 --control \"$c\" >/dev/null 2>&1 || true\n\
           done\n\
         }\n\
         trap cleanup EXIT\n\
         set -x\n",
    );
    for b in &blocks {
        // Mounting a loop device takes root: without it, that block is
        // left out (and said so), the rest still runs.
        if b.contains("mount -o loop") && !is_root() {
            eprintln!("not root: the README block that mounts a loop device is skipped");
            continue;
        }
        script.push_str(b);
        script.push('\n');
    }
    std::fs::write(t.join("tour.sh"), &script).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // A network namespace of its own where one can be made (root).
    let mut cmd = if is_root() {
        let mut c = Command::new("unshare");
        c.args([
            "--net",
            "--",
            "bash",
            "-c",
            "ip link set lo up && exec bash tour.sh",
        ]);
        c
    } else {
        let mut c = Command::new("bash");
        c.arg("tour.sh");
        c
    };
    cmd.current_dir(t).env("PATH", path).env("TMPDIR", t);
    let o = output_within(&mut cmd, DEADLINE);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success(),
        "the README tour failed ({:?}):\n{}\n{stderr}",
        o.status,
        String::from_utf8_lossy(&o.stdout)
    );
    // Every block ran: the last command of the last one is in the trace.
    let last = blocks
        .last()
        .unwrap()
        .lines()
        .rfind(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .unwrap()
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        stderr.contains(&format!("+ {last}")),
        "'{last}' did not run:\n{stderr}"
    );
    // Nothing left running.
    let o = output_within(
        Command::new(BIN).env("TMPDIR", t).args(["list", "--json"]),
        DEADLINE,
    );
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "[]");
}
