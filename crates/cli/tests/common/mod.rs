//! Helpers shared by the tests that drive the real binary.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

pub mod nbd;

pub const BIN: &str = env!("CARGO_BIN_EXE_raidkit");

/// How long one run of an external tool, or of a raidkit command that is
/// expected to end by itself (a refusal included), may take: past it the
/// run is killed and the test fails, so a regression that hangs cannot
/// hang the suite.
pub const DEADLINE: Duration = Duration::from_secs(300);

/// A spawned child in a process group of its own (its pid), killed with
/// that whole group (SIGKILL) when dropped while still running: a test
/// that panics leaves no fio, qemu-io or server behind. Only this child's
/// group is signalled, and only while the child is not yet reaped, so its
/// id cannot have been reused.
pub struct Guarded {
    child: Option<Child>,
    what: String,
}

impl Guarded {
    /// Spawn `cmd` (stdin from /dev/null) in a process group of its own.
    pub fn spawn(cmd: &mut Command) -> Guarded {
        let what = format!("{cmd:?}");
        let child = cmd
            .stdin(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {what} (installed by scripts/deps.sh): {e}"));
        Guarded {
            child: Some(child),
            what,
        }
    }

    pub fn id(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("running")
    }

    /// Whether it has exited (and its status), without waiting.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child().try_wait().expect("try_wait")
    }

    /// Kill its process group now and reap it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            if matches!(c.try_wait(), Ok(None)) {
                // SAFETY: kill(2) on the group of our own, unreaped child.
                unsafe { libc::kill(-(c.id() as i32), libc::SIGKILL) };
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Wait at most `limit` for it to exit; past that, kill it and panic.
    pub fn wait_within(&mut self, limit: Duration) -> ExitStatus {
        self.wait_or_kill(limit)
            .unwrap_or_else(|| panic!("{} did not finish within {limit:?}: killed", self.what))
    }

    /// Wait at most `limit` for it to exit; past that, kill it (None).
    /// Never panics: for cleanups that may run while a test unwinds.
    pub fn wait_or_kill(&mut self, limit: Duration) -> Option<ExitStatus> {
        let t = Instant::now();
        loop {
            let c = self.child.as_mut()?;
            if let Ok(Some(st)) = c.try_wait() {
                self.child = None;
                return Some(st);
            }
            if t.elapsed() > limit {
                self.kill();
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Its stdout and stderr (if piped) and exit status, waiting at most
    /// `limit` (then killed, and the test fails).
    pub fn output_within(mut self, limit: Duration) -> Output {
        let c = self.child();
        let reader = |r: Option<Box<dyn Read + Send>>| {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let mut v = Vec::new();
                if let Some(mut r) = r {
                    let _ = r.read_to_end(&mut v);
                }
                let _ = tx.send(v);
            });
            rx
        };
        let out = reader(c.stdout.take().map(|r| Box::new(r) as Box<dyn Read + Send>));
        let err = reader(c.stderr.take().map(|r| Box::new(r) as Box<dyn Read + Send>));
        let status = self.wait_within(limit);
        // A process it left behind may hold its pipes open: not forever.
        let what = &self.what;
        let collect = |rx: std::sync::mpsc::Receiver<Vec<u8>>| {
            rx.recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|_| {
                    panic!("{what} exited, but something it started still holds its output open")
                })
        };
        Output {
            status,
            stdout: collect(out),
            stderr: collect(err),
        }
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Run a cleanup command (output discarded) for at most `limit`; never
/// panics, whether it is missing, fails or hangs (then killed).
pub fn cleanup(cmd: &str, a: &[&str], limit: Duration) {
    let spawned = Command::new(cmd)
        .args(a)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn();
    if let Ok(child) = spawned {
        let mut g = Guarded {
            child: Some(child),
            what: cmd.to_string(),
        };
        let _ = g.wait_or_kill(limit);
    }
}

/// Run `cmd` to its end with its output captured, at most `limit`.
pub fn output_within(cmd: &mut Command, limit: Duration) -> Output {
    Guarded::spawn(cmd.stdout(Stdio::piped()).stderr(Stdio::piped())).output_within(limit)
}

/// A scratch directory, on the RAM disk when there is one; removed on drop.
pub fn tmp() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

/// Run raidkit to its end (at most `DEADLINE`).
pub fn raidkit(args: &[&str]) -> Output {
    output_within(Command::new(BIN).args(args), DEADLINE)
}

/// How long a raidkit run that must be refused (a `serve` that may not
/// start, bad input) may take: a refusal comes at once.
pub const REFUSAL: Duration = Duration::from_secs(60);

/// Run raidkit expecting it to end quickly (at most `REFUSAL`).
pub fn raidkit_refused(args: &[&str]) -> Output {
    output_within(Command::new(BIN).args(args), REFUSAL)
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

/// Run an external tool (at most `DEADLINE`), whatever its exit status.
pub fn try_tool(cmd: &str, a: &[&str]) -> Output {
    output_within(Command::new(cmd).args(a), DEADLINE)
}

/// Run an external tool (at most `DEADLINE`); panics with its output if it
/// fails, is missing or hangs.
pub fn tool(cmd: &str, a: &[&str]) -> Output {
    let o = try_tool(cmd, a);
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
    /// Every line the server printed on stdout so far.
    pub out: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Served {
    /// The first printed line that contains `needle` (waits up to 30 s).
    pub fn line_with(&self, needle: &str) -> String {
        let mut found = None;
        wait_for(&format!("'{needle}' from the server"), 30, || {
            found = self
                .out
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.contains(needle))
                .cloned();
            found.is_some()
        });
        found.unwrap()
    }

    pub fn start(dir: &Path, members: &[String], extra: &[&str]) -> Served {
        Served::start_on(dir, members, &["--listen", "127.0.0.1:0"], extra)
    }

    /// As `start`, listening where `listen` says (`--listen ADDR`,
    /// `--socket PATH`, or both); `uri` is the first endpoint printed
    /// (`nbd://` or `nbd+unix://`).
    pub fn start_on(dir: &Path, members: &[String], listen: &[&str], extra: &[&str]) -> Served {
        let control = dir.join("control.sock");
        let ctl = control.display().to_string();
        let mut a = vec!["serve"];
        a.extend_from_slice(listen);
        a.extend(["--control", ctl.as_str()]);
        a.extend_from_slice(extra);
        a.extend(members.iter().map(|s| s.as_str()));
        Served::launch(dir, &a, control.clone())
    }

    /// `raidkit serve --config FILE` on a free loopback port; `control`
    /// is the first array's control socket, as printed.
    pub fn start_config(dir: &Path, config: &Path, extra: &[&str]) -> Served {
        let cfg = config.display().to_string();
        let mut a = vec!["serve", "--listen", "127.0.0.1:0", "--config", cfg.as_str()];
        a.extend_from_slice(extra);
        let mut s = Served::launch(dir, &a, PathBuf::new());
        let line = s.line_with("control socket ");
        s.control = PathBuf::from(line.rsplit(' ').next().unwrap());
        s
    }

    /// `raidkit` with `a`, its stderr appended to the test's server log in
    /// `dir`, its stdout lines kept.
    fn launch(dir: &Path, a: &[&str], control: PathBuf) -> Served {
        let log = dir.join(format!("serve-{}.log", std::process::id()));
        let logf = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let mut child = Command::new(BIN)
            .args(a)
            // Default control sockets (raidkit-<uuid>.ctl in the temp
            // directory) land in the test's directory, removed with it
            // even when a failing test kills the server.
            .env("TMPDIR", dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(logf))
            .spawn()
            .expect("spawn raidkit serve");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let out = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let lines = out.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line.clone());
                // The endpoints (not members, which may be NBD URIs too).
                let endpoint = line.contains("listening on ");
                if let Some(i) = ["nbd://", "nbds://", "nbd+unix://", "nbds+unix://"]
                    .iter()
                    .find_map(|scheme| line.find(scheme))
                    .filter(|_| endpoint)
                {
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
            out,
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

    /// `raidkit status --json` of this server.
    pub fn status(&self) -> serde_json::Value {
        let ctl = self.control.display().to_string();
        serde_json::from_slice(&ok(&["status", "--json", "--control", &ctl]).stdout).unwrap()
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

/// `raidkit stop --json` of the server at `control` reported success and
/// said it left the array dirty (nothing failed): the JSON it printed.
pub fn stopped_dirty(control: &Path) -> serde_json::Value {
    let c = control.display().to_string();
    let o = raidkit(&[
        "stop",
        "--force",
        "--json",
        "--timeout",
        "60",
        "--control",
        &c,
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert_eq!(
        (v["clean"].as_bool(), v["error"].as_str()),
        (Some(false), None),
        "{v}"
    );
    v
}

/// One qemu-io command on the NBD export `uri` (at most 30 s); its output.
pub fn qemu_cmd(uri: &str, cmd: &str) -> std::process::Output {
    tool("timeout", &["30", "qemu-io", "-f", "raw", "-c", cmd, uri])
}

/// Create an array with `raidkit create`.
pub fn create(level: &str, ms: &[String], size: &str) {
    ok(&args(
        &["create", "--level", level, "--size", size, "--chunk", "64K"],
        ms,
    ));
}

/// `create` without checksums: the server's fast paths (reads and writes
/// straight from and into the member files) serve only such arrays, since
/// with checksums every block must be verified on its way.
pub fn create_plain(level: &str, ms: &[String], size: &str) {
    ok(&args(
        &[
            "create",
            "--level",
            level,
            "--size",
            size,
            "--chunk",
            "64K",
            "--checksums",
            "off",
        ],
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
    let o = raidkit_refused(args);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(o.status.code(), Some(1), "raidkit {args:?}: {err}");
    assert!(
        err.contains(needle),
        "raidkit {args:?}: expected '{needle}' in: {err}"
    );
    err
}

// kill -9 torture (scripts/torture.py), shared by crash.rs and realdisk.rs.

/// How long one torture run may take before it is killed (with the
/// servers it started: they are in its process group).
pub const TORTURE_DEADLINE: Duration = Duration::from_secs(240);

/// Runs scripts/torture.py; (exit code, stdout and stderr).
pub fn torture(extra: &[&str]) -> (Option<i32>, String) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/torture.py");
    let o = output_within(
        Command::new("/usr/bin/python3")
            .arg(script)
            .args(["--raidkit", BIN])
            .args(extra),
        TORTURE_DEADLINE,
    );
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    (o.status.code(), text)
}

/// The figures of the summary line: (cycles, blocks acknowledged and
/// flushed, losses). None when there is no summary (the run failed).
pub fn summary(out: &str) -> Option<(u64, u64, u64)> {
    let line = out.lines().find(|l| l.starts_with("summary: "))?;
    let num = |after: &str| -> Option<u64> {
        let i = line.find(after)? + after.len();
        line[i..]
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    let cycles = num("summary: ")?;
    let acked = num("cycles, ")?;
    Some((cycles, acked, num("losses: ")?))
}

/// Blocks acknowledged and flushed in each cycle, from the cycle lines.
pub fn acked_per_cycle(out: &str) -> Vec<u64> {
    out.lines()
        .filter(|l| l.starts_with("cycle "))
        .map(|l| {
            let i = l.find("s, ").expect("cycle line") + 3;
            l[i..].split(' ').next().unwrap().parse().expect("a count")
        })
        .collect()
}

/// A torture run that passed: exit 0, `cycles` cycles and no loss, work
/// done in every cycle (a server that refused or dropped writes would have
/// none acknowledged: the script fails on any NBD error but the kill), at
/// least `min_acked` blocks acknowledged and flushed in all, and some cycle
/// run without a member.
pub fn assert_torture_clean(
    code: Option<i32>,
    out: &str,
    label: &str,
    cycles: u64,
    min_acked: u64,
) {
    assert_eq!(code, Some(0), "{label}:\n{out}");
    let (ran, acked, losses) = summary(out).unwrap_or_else(|| panic!("{out}"));
    assert_eq!((ran, losses), (cycles, 0), "{out}");
    let per = acked_per_cycle(out);
    assert_eq!(per.len() as u64, cycles, "{out}");
    assert!(per.iter().all(|&n| n >= 20), "a cycle did little:\n{out}");
    assert_eq!(per.iter().sum::<u64>(), acked, "{out}");
    assert!(
        acked >= min_acked,
        "only {acked} blocks acknowledged:\n{out}"
    );
    assert!(
        out.contains("left out"),
        "no cycle ran without a member:\n{out}"
    );
}

/// The samples of a /metrics scrape at `base` (`http://ADDR/`), parsed by
/// the Prometheus client library's own text-format parser:
/// `name{k="v",...}` (labels sorted) to value.
pub fn scrape(base: &str) -> std::collections::BTreeMap<String, f64> {
    let body = tool("timeout", &["20", "curl", "-sf", &format!("{base}metrics")]).stdout;
    let script = r#"
import sys, json
from prometheus_client.parser import text_string_to_metric_families
out = {}
for fam in text_string_to_metric_families(sys.stdin.read()):
    for s in fam.samples:
        labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
        out[f"{s.name}{{{labels}}}"] = s.value
print(json.dumps(out))
"#;
    let mut child = Command::new("timeout")
        .args(["20", "/usr/bin/python3", "-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(&body).unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "the Prometheus parser refused /metrics");
    serde_json::from_slice(&o.stdout).unwrap()
}

/// One series of a scrape; panics naming what there is when absent.
pub fn metric(m: &std::collections::BTreeMap<String, f64>, key: &str) -> f64 {
    *m.get(key).unwrap_or_else(|| {
        panic!(
            "no {key} in /metrics: {:?}",
            m.keys().take(80).collect::<Vec<_>>()
        )
    })
}
