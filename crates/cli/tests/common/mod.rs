//! Helpers shared by the tests that drive the real binary.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_raidkit");

/// A scratch directory, on the RAM disk when there is one; removed on drop.
pub fn tmp() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

pub fn raidkit(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run raidkit")
}

pub fn ok(args: &[&str]) -> Output {
    let o = raidkit(args);
    assert!(
        o.status.success(),
        "raidkit {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// Member paths d0.img.. in `dir`.
pub fn members(dir: &Path, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| dir.join(format!("d{i}.img")).display().to_string())
        .collect()
}

pub fn args<'a>(head: &[&'a str], ms: &'a [String]) -> Vec<&'a str> {
    head.iter()
        .copied()
        .chain(ms.iter().map(|s| s.as_str()))
        .collect()
}

/// Run an external tool; panics with its output if it fails or is missing.
pub fn tool(cmd: &str, a: &[&str]) -> Output {
    let o = Command::new(cmd)
        .args(a)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd} (installed by .ci/run): {e}"));
    assert!(
        o.status.success(),
        "{cmd} {a:?} failed ({}):\n{}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// A `raidkit serve` process on a free loopback port, stopped by its own
/// PID (SIGKILL if the test did not stop it).
pub struct Served {
    pub child: Option<Child>,
    pub uri: String,
    pub control: PathBuf,
    pub log: PathBuf,
}

impl Served {
    pub fn start(dir: &Path, members: &[String], extra: &[&str]) -> Served {
        let control = dir.join("control.sock");
        let log = dir.join(format!("serve-{}.log", std::process::id()));
        let logf = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let ctl = control.display().to_string();
        let mut a = vec!["serve", "--listen", "127.0.0.1:0", "--control", &ctl];
        a.extend_from_slice(extra);
        a.extend(members.iter().map(|s| s.as_str()));
        let mut child = Command::new(BIN)
            .args(&a)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(logf))
            .spawn()
            .expect("spawn raidkit serve");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(i) = line.find("nbd://") {
                    let _ = tx.send(line[i..].split_whitespace().next().unwrap().to_string());
                }
            }
        });
        let uri = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(u) => u,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "server did not start: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
        };
        Served {
            child: Some(child),
            uri,
            control,
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// SIGTERM, then wait (at most 60 s) for the exit status.
    pub fn stop(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        tool("kill", &["-TERM", &child.id().to_string()]);
        let t = Instant::now();
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return st;
            }
            if t.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                let _ = child.wait();
                panic!("server ignored SIGTERM for 60 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// kill -9: the server gets no chance to clean up.
    pub fn kill9(&mut self) {
        let mut child = self.child.take().expect("running");
        let _ = child.kill();
        let _ = child.wait();
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Create an array with `raidkit create`.
pub fn create(level: &str, ms: &[String], size: &str) {
    ok(&args(
        &["create", "--level", level, "--size", size, "--chunk", "64K"],
        ms,
    ));
}

/// A deadline-bounded wait for a condition.
pub fn wait_for(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(secs),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs, expects failure (exit 1) with `needle` in the message.
pub fn fails(args: &[&str], needle: &str) -> String {
    let o = raidkit(args);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(o.status.code(), Some(1), "raidkit {args:?}: {err}");
    assert!(
        err.contains(needle),
        "raidkit {args:?}: expected '{needle}' in: {err}"
    );
    err
}
