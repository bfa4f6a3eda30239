//! `--clients N`: the streams tests from N separate processes, each with a
//! connection of its own, as the lab's three farm nodes read one server at
//! once. Each client is this program (`raidkit bench stream-worker`, a
//! hidden subcommand) started directly or through `--client-via`, a
//! command prefix such as `ssh farm{i}` or `ip netns exec lab{i}` in which
//! `{i}` is the client's number (1 to N), so that the clients may run on
//! other hosts (where raidkit is at the same path).
//!
//! The parent starts every client, waits until each has connected and made
//! its buffers ("ready"), then tells them all to go at once; each moves its
//! own part of the export and reports its seconds and its CPU use.

use super::{cpu, Aligned, Writer, BLOCK};
use crate::cli::StreamWorkerArgs;
use anyhow::{anyhow, bail, Context, Result};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The data-path tests' buffer (the lab's 256 KiB).
const BUF: usize = 256 << 10;

/// What one client reported.
pub(super) struct Report {
    pub seconds: f64,
    pub cpu: f64,
}

struct Client {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<std::io::Result<String>>,
}

impl Drop for Client {
    fn drop(&mut self) {
        // A client that has not finished is not left behind.
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

fn reader(out: ChildStdout) -> mpsc::Receiver<std::io::Result<String>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

fn next_line(c: &Client, what: &str, timeout: Duration) -> Result<String> {
    match c.lines.recv_timeout(timeout) {
        Ok(Ok(l)) => Ok(l),
        Ok(Err(e)) => Err(anyhow!("client {what}: {e}")),
        Err(mpsc::RecvTimeoutError::Timeout) => {
            bail!("client {what}: no answer within {} s", timeout.as_secs())
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            bail!("client {what} ended without an answer (its errors are above)")
        }
    }
}

/// Split a --client-via template into words, `{i}` replaced by `i`.
pub(super) fn prefix(via: Option<&str>, i: usize) -> Vec<String> {
    via.map(|v| {
        v.split_whitespace()
            .map(|w| w.replace("{i}", &i.to_string()))
            .collect()
    })
    .unwrap_or_default()
}

/// Run `jobs` (write?, offset, length) at once, one client process each,
/// against the NBD export `target`.
pub(super) fn together(
    target: &str,
    via: Option<&str>,
    seed: u64,
    jobs: &[(bool, u64, u64)],
) -> Result<Vec<Report>> {
    let exe = std::env::current_exe().context("finding this program")?;
    let mut clients = Vec::new();
    for (i, &(write, off, len)) in jobs.iter().enumerate() {
        let words = prefix(via, i + 1);
        let mut cmd = match words.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        cmd.args(["bench", "stream-worker", target])
            .args(["--offset", &off.to_string(), "--length", &len.to_string()])
            .args(["--seed", &(seed ^ i as u64).to_string()]);
        if write {
            cmd.arg("--write");
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting client {}: {cmd:?}", i + 1))?;
        let stdin = child.stdin.take().expect("piped");
        let lines = reader(child.stdout.take().expect("piped"));
        clients.push(Client {
            child,
            stdin,
            lines,
        });
    }
    for (i, c) in clients.iter().enumerate() {
        let l = next_line(c, &format!("{}", i + 1), Duration::from_secs(60))?;
        if l.trim() != "ready" {
            bail!("client {}: expected 'ready', got '{l}'", i + 1);
        }
    }
    for c in &mut clients {
        c.stdin.write_all(b"go\n")?;
        c.stdin.flush()?;
    }
    let mut out = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        // A stream is bounded by its length; a day is beyond any of them.
        let l = next_line(c, &format!("{}", i + 1), Duration::from_secs(86_400))?;
        let v: serde_json::Value = serde_json::from_str(&l)
            .with_context(|| format!("client {}: not a report: {l}", i + 1))?;
        out.push(Report {
            seconds: v["seconds"]
                .as_f64()
                .ok_or_else(|| anyhow!("client {}: no seconds in {l}", i + 1))?,
            cpu: v["cpu"].as_f64().unwrap_or(0.0),
        });
    }
    Ok(out)
}

/// The client's side: connect, get ready, wait for "go", move the part,
/// report.
pub fn stream_worker(a: StreamWorkerArgs) -> Result<()> {
    if !(a.target.starts_with("nbd://") || a.target.starts_with("nbd+unix://")) {
        bail!("stream-worker measures NBD exports only");
    }
    let c = raidkit_nbd::NbdClient::connect(&a.target)?;
    let size = raidkit_member::Member::len(&c);
    if a.offset.checked_add(a.length).is_none_or(|end| end > size) {
        bail!(
            "--offset {} --length {} runs past the export's end ({size} bytes)",
            a.offset,
            a.length
        );
    }
    let mut pattern = Aligned::new(BLOCK);
    super::fill_random(pattern.as_mut_slice(), a.seed | 1);
    let mut w = a.write.then(|| Writer::new(&pattern));
    let mut buf = Aligned::new(BUF);
    let mut line = String::new();
    println!("ready");
    std::io::stdout().flush()?;
    std::io::stdin().read_line(&mut line)?;
    if line.trim() != "go" {
        bail!("expected 'go' on standard input");
    }
    let clock = cpu::Clock::start();
    let t0 = Instant::now();
    let mut o = a.offset;
    let end = a.offset + a.length;
    while o < end {
        let n = BUF.min((end - o) as usize);
        if let Some(w) = &mut w {
            let at = ((o - a.offset) % BLOCK as u64) as usize;
            raidkit_member::Member::write_at(&c, w.data(at, n, o), o)?;
        } else {
            raidkit_member::Member::read_at(&c, &mut buf.as_mut_slice()[..n], o)?;
        }
        o += n as u64;
    }
    if a.write {
        raidkit_member::Member::flush(&c)?;
    }
    let seconds = t0.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::json!({"seconds": seconds, "bytes": a.length, "cpu": clock.pct()})
    );
    c.disconnect();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_via_templates_number_the_clients() {
        assert_eq!(
            prefix(Some("ip netns exec lab{i}"), 2),
            ["ip", "netns", "exec", "lab2"]
        );
        assert_eq!(prefix(Some("ssh  farm{i}.lab "), 3), ["ssh", "farm3.lab"]);
        assert!(prefix(None, 1).is_empty());
    }
}
