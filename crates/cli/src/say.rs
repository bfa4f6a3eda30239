//! Messages to the person at the terminal (stderr, "raidkit: warning: …"),
//! or, with `--log-format json`, log events like every other line, so that
//! a log collector reads one JSON object per line and nothing else.

use std::sync::atomic::{AtomicBool, Ordering};

static JSON: AtomicBool = AtomicBool::new(false);

/// From now on, messages are JSON log events.
pub fn json_logs() {
    JSON.store(true, Ordering::Relaxed);
}

pub fn note(msg: &str) {
    if JSON.load(Ordering::Relaxed) {
        tracing::info!("{msg}");
    } else {
        eprintln!("raidkit: {msg}");
    }
}

pub fn warning(msg: &str) {
    if JSON.load(Ordering::Relaxed) {
        tracing::warn!("{msg}");
    } else {
        eprintln!("raidkit: warning: {msg}");
    }
}

pub fn error(msg: &str) {
    if JSON.load(Ordering::Relaxed) {
        tracing::error!("{msg}");
    } else {
        eprintln!("raidkit: error: {msg}");
    }
}
