//! Messages to the person at the terminal (stderr, "raidkit: warning: …"),
//! or, with `--log-format json`, log events like every other line, so that
//! a log collector reads one JSON object per line and nothing else.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

static JSON: AtomicBool = AtomicBool::new(false);

/// From now on, messages are JSON log events.
/// An error with its causes, outermost first, each said once (a cause
/// whose text the message holds already is not repeated).
pub fn causes(e: &anyhow::Error) -> String {
    let mut msg = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !msg.contains(&c) {
            msg.push_str(": ");
            msg.push_str(&c);
        }
    }
    msg
}

pub fn json_logs() {
    JSON.store(true, Ordering::Relaxed);
}

pub fn note(msg: &str) {
    if JSON.load(Ordering::Relaxed) {
        tracing::info!("{msg}");
    } else {
        stderr_line(format_args!("raidkit: {msg}"));
    }
}

pub fn warning(msg: &str) {
    if JSON.load(Ordering::Relaxed) {
        tracing::warn!("{msg}");
    } else {
        stderr_line(format_args!("raidkit: warning: {msg}"));
    }
}

pub fn error(msg: &str) {
    if JSON.load(Ordering::Relaxed) {
        tracing::error!("{msg}");
    } else {
        stderr_line(format_args!("raidkit: error: {msg}"));
    }
}

/// The error of a command that checks something (`check`, `scrub --wait`)
/// and could not finish: the process exits 2, where 1 means that it
/// finished and found something wrong. A script that repairs on 1 must not
/// take "could not tell" (a member missing, the server gone, the scrub
/// stopped) for either answer.
#[derive(Debug)]
pub struct Unfinished(pub anyhow::Error);

impl std::fmt::Display for Unfinished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl std::error::Error for Unfinished {}

/// A line to stdout that may fail unseen: a server's reader may have gone
/// (`raidkit serve ... | grep -m1 listening`, a supervisor's closed pipe),
/// and a server that lost its reader keeps serving; `println!` would panic.
pub fn stdout_line(line: std::fmt::Arguments) {
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

/// The same for stderr.
pub fn stderr_line(line: std::fmt::Arguments) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// `println!` for lines a server prints once it runs (see [`stdout_line`]).
macro_rules! report {
    ($($t:tt)*) => {
        $crate::say::stdout_line(format_args!($($t)*))
    };
}
pub(crate) use report;
