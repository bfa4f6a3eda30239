//! The client's own CPU use beside every figure, as bonnie++'s %CP
//! columns: the process's user and system time over the wall time of a
//! measurement, in % of one CPU. A figure taken while the client's threads
//! had no CPU to spare measures the client, not the target.
//!
//! The wall time leaves out what the measuring thread spent waiting for a
//! CPU (its run-queue delay, /proc/thread-self/schedstat): a client that
//! other processes kept off the CPU is as much the bound as one that used
//! it all, and on a busy machine bonnie++'s plain ratio would hide that.
//!
//! The CPU time leaves out what the NBD client spent polling for replies
//! (`raidkit_nbd::client::polled`): with many requests in flight it polls
//! a few microseconds before sleeping, which is waiting, not work, and
//! counted as work would mark every such figure client-bound.

use std::time::{Duration, Instant};

/// CPU time of this process (all its threads, live and ended), less its
/// polling for NBD replies.
fn process_cpu() -> Duration {
    rusage_cpu().saturating_sub(raidkit_nbd::client::polled())
}

fn rusage_cpu() -> Duration {
    // SAFETY: getrusage writes into the zeroed struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is always valid.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Time this thread has waited on a run queue for a CPU.
fn run_delay() -> Duration {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map(Duration::from_nanos)
        .unwrap_or(Duration::ZERO)
}

/// A running measurement of the process's CPU use.
pub(crate) struct Clock {
    wall: Instant,
    cpu: Duration,
    delay: Duration,
}

impl Clock {
    pub(crate) fn start() -> Clock {
        Clock {
            wall: Instant::now(),
            cpu: process_cpu(),
            delay: run_delay(),
        }
    }

    /// CPU used since the start, in % of one CPU, over the time the
    /// measuring thread was not waiting for a CPU.
    pub(crate) fn pct(&self) -> f64 {
        let waited = run_delay().saturating_sub(self.delay);
        let wall = self.wall.elapsed().saturating_sub(waited).as_secs_f64();
        if wall <= 0.0 {
            return 0.0;
        }
        100.0 * process_cpu().saturating_sub(self.cpu).as_secs_f64() / wall
    }
}

/// Share of its CPUs (90 %) at which a client counts as the bound.
pub(crate) const BOUND_PCT: f64 = 90.0;

/// Whether a client that drove the test from `threads` threads was the
/// bound: its CPU use reached 90 % of the CPUs those threads could use.
pub(crate) fn client_bound(cpu_pct: f64, threads: usize) -> bool {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    cpu_pct >= BOUND_PCT * threads.clamp(1, cpus) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_loop_uses_a_cpu() {
        let c = Clock::start();
        let t0 = Instant::now();
        let mut x = 1u64;
        while t0.elapsed() < Duration::from_millis(200) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let busy = c.pct();
        assert!(busy > 60.0, "busy loop measured {busy:.0}%");
        // (No test of an idle thread: other tests share this process.)
        assert!(client_bound(95.0, 1));
        assert!(!client_bound(60.0, 1));
    }
}
