//! The stop of `raidkit serve`, in order: requests in flight finished,
//! writes answered early landed, background work stopped at a checkpoint,
//! each array closed and marked clean (or why not, kept for `raidkit stop`),
//! the control sockets last.

use super::control::Closing;
use super::Started;
use anyhow::Result;
use raidkit_control::ControlServer;
use raidkit_nbd::Server;
use std::sync::Arc;

/// Stop what `serve` started (`up`: how the start went) and say how
/// closing each array ended.
pub(super) fn stop_all(
    up: Result<()>,
    servers: &[Arc<Server>],
    started: &[Started],
    closings: &[Arc<Closing>],
    recovery: Vec<std::thread::JoinHandle<()>>,
    controls: Vec<ControlServer>,
) -> Result<()> {
    match &up {
        Ok(()) => crate::say::note("stopping: finishing requests in flight"),
        Err(_) => crate::say::note("the start failed: stopping what was started"),
    }
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    // A request still in flight once the member timeout has passed waits
    // on a member the stall watch has failed (it fails a member with an
    // operation outstanding that long) and that may never answer: it is
    // given up on, and the arrays are left dirty for the next start to
    // replay or resync what it left half done.
    let patience = started
        .iter()
        .map(|s| s.array.member_timeout())
        .max()
        .unwrap_or_default()
        + std::time::Duration::from_secs(5);
    let abandoned: usize = servers.iter().map(|s| s.shutdown_within(patience)).sum();
    if abandoned > 0 {
        crate::say::warning(&format!(
            "{abandoned} connection(s) still waited on a failed member's operations {}s after the stop began: their requests were given up on, unanswered",
            patience.as_secs()
        ));
    }
    let mut failed = None;
    let mut lost_writes: Vec<Option<String>> = vec![None; started.len()];
    for (s, lost) in started.iter().zip(lost_writes.iter_mut()) {
        // Writes answered before they were done land before the array
        // closes. One that failed lost data a client was told was written:
        // the stop says so and fails (the array itself is consistent).
        if let Some(Err(e)) = s.behind.as_ref().map(|b| b.drain()) {
            let name = s.array.superblock().name;
            crate::say::warning(&format!(
                "array '{name}': a write answered before it was done failed: {e}"
            ));
            *lost = Some(format!("a write answered before it was done was lost: {e}"));
            failed = Some(anyhow::Error::new(e).context(format!(
                "array '{name}': a write answered before it was done was lost"
            )));
        }
        s.array.stop_background();
    }
    // The background threads (rebuild, housekeeping) end at their next
    // step; one held by a failed member's operation that never returns (a
    // flush begun before it was failed) is left, as the requests are.
    let until = std::time::Instant::now() + patience;
    let mut held = 0;
    for r in recovery {
        while !r.is_finished() && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        if r.is_finished() {
            let _ = r.join();
        } else {
            held += 1;
        }
    }
    if held > 0 {
        crate::say::warning(&format!(
            "{held} background thread(s) still waited on a failed member's operations: left as they are"
        ));
    }
    let abandoned = abandoned + held;
    for ((s, closing), lost) in started.iter().zip(closings).zip(lost_writes) {
        if let Some(p) = &s.plan.socket {
            let _ = std::fs::remove_file(p);
        }
        let name = s.array.superblock().name;
        let closed = if abandoned > 0 {
            s.array.close_leaving_dirty()
        } else {
            s.array.close()
        };
        match closed {
            // The close itself worked, but members failed on the way (the
            // last superblock writes): the array did not survive it.
            Ok(()) if s.array.health() == raidkit_array::Health::Failed => {
                let why = "the array failed while closing: too many members lost (their superblocks could not be written)";
                crate::say::warning(&format!("array '{name}': {why}"));
                closing.set(Err(why.to_string()));
                failed = Some(anyhow::anyhow!("array '{name}': {why}"));
            }
            Ok(()) => {
                let clean =
                    s.array.superblock().state == raidkit_array::superblock::ArrayState::Clean;
                crate::say::note(&if clean {
                    format!("stopped; array '{name}' is clean")
                } else if abandoned > 0 {
                    format!(
                        "stopped; array '{name}' is left dirty (requests given up on): the next start replays or resyncs what it must"
                    )
                } else {
                    format!(
                        "stopped; array '{name}' is left dirty (a resync not finished): the next start resyncs what it must"
                    )
                });
                closing.set(lost.map_or(Ok(clean), Err));
            }
            Err(e) => {
                let why = format!("flushing members and marking the array clean: {e}");
                crate::say::warning(&format!("array '{name}': {why}"));
                closing.set(Err(why));
                failed = Some(
                    anyhow::Error::new(e)
                        .context(format!("flushing members and marking array '{name}' clean")),
                );
            }
        }
    }
    for c in closings.iter() {
        c.let_followers_answer();
    }
    // The control sockets go last: `raidkit stop` waits for them to, and
    // then finds the arrays closed and marked clean.
    for mut c in controls {
        c.stop();
    }
    match (up, failed) {
        // A write lost outweighs the start's failure (said above).
        (Err(start), Some(lost)) => {
            crate::say::warning(&format!("{start:#}"));
            Err(lost)
        }
        (Err(start), None) => Err(start),
        (Ok(()), Some(lost)) => Err(lost),
        (Ok(()), None) => Ok(()),
    }
}
