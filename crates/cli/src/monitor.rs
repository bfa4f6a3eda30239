//! `raidkit monitor`: a running server's events as they happen, read from
//! its control socket by long polls (`{"cmd":"events","after":N,
//! "wait_ms":M}`), so that a follower costs the server nothing between
//! events and misses none while it keeps up (the server keeps the last
//! 1000).

use crate::admin::find_control;
use crate::cli::MonitorArgs;
use anyhow::{anyhow, bail, Result};
use raidkit_control::call;
use serde_json::{json, Value};
use std::io::Write;
use std::time::{Duration, Instant};

/// How long one poll waits for an event.
const POLL: Duration = Duration::from_secs(5);

pub fn monitor(a: MonitorArgs) -> Result<()> {
    let path = find_control(a.control.control.as_deref())?;
    let ask = |after: Option<u64>, wait: Duration| -> Result<(Vec<Value>, u64)> {
        let mut req = json!({"cmd": "events", "wait_ms": wait.as_millis() as u64});
        if let Some(n) = after {
            req["after"] = json!(n);
        }
        let v = call(&path, &req, wait + Duration::from_secs(30)).map_err(|e| anyhow!(e))?;
        let list = v["events"].as_array().cloned().unwrap_or_default();
        let last = v["last"]
            .as_u64()
            .ok_or_else(|| anyhow!("the server's answer has no event number"))?;
        Ok((list, last))
    };
    // Where the server stands now (and, with --all, what it kept).
    let (kept, mut last) = ask(None, Duration::ZERO)?;
    let mut out = std::io::stdout().lock();
    if a.all {
        for e in &kept {
            print_event(&mut out, e, a.json)?;
        }
    }
    if a.test {
        call(
            &path,
            &json!({"cmd": "test-event"}),
            Duration::from_secs(30),
        )
        .map_err(|e| anyhow!(e))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let (list, l) = ask(Some(last), deadline - Instant::now())?;
            last = l;
            for e in &list {
                print_event(&mut out, e, a.json)?;
                if e["event"] == "TestMessage" {
                    return Ok(());
                }
            }
        }
        bail!("the TestMessage did not come back within 10 s");
    }
    loop {
        let (list, l) = match ask(Some(last), POLL) {
            Ok(x) => x,
            Err(e) => bail!("the server went away: {e}"),
        };
        if l < last {
            bail!("the server restarted (its events start again from 1)");
        }
        last = l;
        for e in &list {
            print_event(&mut out, e, a.json)?;
        }
    }
}

fn print_event(out: &mut impl Write, e: &Value, as_json: bool) -> Result<()> {
    if as_json {
        writeln!(out, "{e}")?;
    } else {
        let time = e["time"].as_f64().unwrap_or(0.0);
        let when = utc(time);
        let member = e["member"].as_str().unwrap_or("");
        writeln!(
            out,
            "{when} {} {} {}{}{}",
            e["event"].as_str().unwrap_or("?"),
            e["array"].as_str().unwrap_or("?"),
            member,
            if member.is_empty() { "" } else { ": " },
            e["detail"].as_str().unwrap_or("")
        )?;
    }
    out.flush()?;
    Ok(())
}

/// Seconds since the epoch as UTC, RFC 3339 to the second.
fn utc(t: f64) -> String {
    let at = std::time::UNIX_EPOCH + Duration::from_secs_f64(t.max(0.0));
    humantime::format_rfc3339_seconds(at).to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn dates() {
        assert_eq!(super::utc(0.0), "1970-01-01T00:00:00Z");
        assert_eq!(super::utc(1_000_000_000.0), "2001-09-09T01:46:40Z");
    }
}
