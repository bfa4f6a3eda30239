//! Where a server's events go besides its log: a program run for each
//! (`serve --program`, as mdadm's PROGRAM: `PATH EVENT ARRAY [MEMBER]`),
//! a file of JSON lines (`serve --events-log`), and followers on the
//! control socket (`raidkit monitor`).
//!
//! The array emits events on whatever thread changed its state, often one
//! serving I/O, so the program and the log each get a thread of their
//! own fed through a bounded queue: a slow or hung program delays only
//! the next programs (each runs under a timeout and is killed after it),
//! never a request; if the queue fills, events are dropped for that sink
//! (and said so in the log) rather than waited for.

use anyhow::{Context, Result};
use raidkit_array::{Event, Events};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{sync_channel, Receiver, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Events queued for one sink at most.
const QUEUE: usize = 1024;

/// Hand every event of `events` to `sink` on a thread of its own.
fn feed(events: &Events, name: &str, sink: impl FnMut(Event) + Send + 'static) -> Result<()> {
    let (tx, rx) = sync_channel::<Event>(QUEUE);
    let label = name.to_string();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || drain(rx, sink))
        .with_context(|| format!("starting the {name} thread"))?;
    events.subscribe(move |e| match tx.try_send(e.clone()) {
        Ok(()) => {}
        Err(TrySendError::Full(e)) => {
            tracing::warn!(
                event = e.event,
                "{label}: {QUEUE} events waiting already; this one is dropped"
            )
        }
        Err(TrySendError::Disconnected(_)) => {}
    });
    Ok(())
}

fn drain(rx: Receiver<Event>, mut sink: impl FnMut(Event)) {
    for e in rx {
        sink(e);
    }
}

/// Run `program EVENT ARRAY [MEMBER]` for every event, one at a time, each
/// killed after `timeout`. The event as JSON is in its environment
/// (RAIDKIT_EVENT), with the severity and detail (RAIDKIT_SEVERITY,
/// RAIDKIT_DETAIL). Debug events (clients coming and going) are not sent.
pub fn run_program(events: &Events, program: &Path, timeout: Duration) -> Result<()> {
    let program = absolute(program)?;
    feed(events, "event-program", move |e| {
        if e.severity == raidkit_array::Severity::Debug {
            return;
        }
        if let Err(why) = run_once(&program, &e, timeout) {
            tracing::warn!(
                event = e.event,
                program = %program.display(),
                "event program: {why}"
            );
        }
    })
}

fn run_once(program: &Path, e: &Event, timeout: Duration) -> Result<(), String> {
    let mut cmd = Command::new(program);
    cmd.arg(e.event).arg(&e.array);
    if let Some(m) = &e.member {
        cmd.arg(m);
    }
    let json = serde_json::to_string(e).unwrap_or_default();
    let mut child = cmd
        .env("RAIDKIT_EVENT", json)
        .env(
            "RAIDKIT_SEVERITY",
            format!("{:?}", e.severity).to_lowercase(),
        )
        .env("RAIDKIT_DETAIL", &e.detail)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|err| format!("cannot run it: {err}"))?;
    let began = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => return Err(format!("it ended with {status}")),
            Ok(None) if began.elapsed() >= timeout => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "still running after {:.0} s: killed",
                    timeout.as_secs_f64()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(err) => return Err(format!("cannot wait for it: {err}")),
        }
    }
}

/// Append every event to `path` as one JSON line (the file is created if
/// need be; each line is written whole and flushed).
pub fn log_to(events: &Events, path: &Path) -> Result<()> {
    let path = absolute(path)?;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("cannot open the events log {}", path.display()))?;
    feed(events, "event-log", move |e| {
        let mut line = serde_json::to_vec(&e).unwrap_or_default();
        line.push(b'\n');
        if let Err(err) = f.write_all(&line).and_then(|()| f.flush()) {
            tracing::warn!(event = e.event, "events log {}: {err}", path.display());
        }
    })
}

fn absolute(p: &Path) -> Result<PathBuf> {
    std::path::absolute(p).with_context(|| format!("{}", p.display()))
}

/// Set up the sinks a server was asked for.
pub fn attach(
    events: &Arc<Events>,
    program: Option<&Path>,
    log: Option<&Path>,
    timeout: Duration,
) -> Result<()> {
    if let Some(p) = program {
        let meta = std::fs::metadata(p)
            .with_context(|| format!("--program {}: cannot use it", p.display()))?;
        use std::os::unix::fs::PermissionsExt;
        if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
            anyhow::bail!("--program {}: not an executable file", p.display());
        }
        run_program(events, p, timeout)?;
    }
    if let Some(l) = log {
        log_to(events, l)?;
    }
    Ok(())
}
