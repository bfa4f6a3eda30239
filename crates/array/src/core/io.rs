//! What goes through each member: bytes and operations read and written,
//! the time each operation took (a histogram, for metrics, and a running
//! sum for the slow-member watch), and the slow-member watch itself.

use super::{Core, Disk};
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Upper bounds of the latency histogram's buckets, in microseconds (a
/// last bucket takes everything slower): from a RAM disk's tens of
/// microseconds to a dying disk's seconds.
pub const LATENCY_BOUNDS_US: [u64; 14] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000,
];

/// A member's counters (relaxed atomics: a few adds per operation).
#[derive(Debug, Default)]
pub struct IoCounters {
    read_bytes: AtomicU64,
    read_ops: AtomicU64,
    write_bytes: AtomicU64,
    write_ops: AtomicU64,
    /// Operations by latency bucket, and all their time (ns).
    buckets: [AtomicU64; LATENCY_BOUNDS_US.len() + 1],
    busy_ns_total: AtomicU64,
    /// Time and operations since the slow-member watch last looked.
    busy_ns: AtomicU64,
    ops: AtomicU64,
    /// Operations that took longer than the member timeout.
    pub timeouts: AtomicU64,
    /// Set while it is much slower than its peers: (its µs per
    /// operation, its peers' median), packed as two u32.
    slow_us: AtomicU64,
}

/// A member's counters as reported (status `io`, metrics).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemberIo {
    pub read_bytes: u64,
    pub read_ops: u64,
    pub write_bytes: u64,
    pub write_ops: u64,
    /// Operations of every kind (also metadata, journal) and their time.
    pub ops: u64,
    pub busy_us: u64,
    /// Operations per latency bucket (`LATENCY_BOUNDS_US`, then the rest).
    #[serde(skip)]
    pub latency: Vec<u64>,
}

impl IoCounters {
    pub fn read(&self, bytes: usize) {
        self.read_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        self.read_ops.fetch_add(1, Ordering::Relaxed);
    }

    pub fn wrote(&self, bytes: usize) {
        self.write_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        self.write_ops.fetch_add(1, Ordering::Relaxed);
    }

    /// An operation took `ns`.
    pub fn took(&self, ns: u64) {
        let us = ns / 1000;
        let b = LATENCY_BOUNDS_US.partition_point(|&x| x < us);
        self.buckets[b].fetch_add(1, Ordering::Relaxed);
        self.busy_ns_total.fetch_add(ns, Ordering::Relaxed);
        self.busy_ns.fetch_add(ns, Ordering::Relaxed);
        self.ops.fetch_add(1, Ordering::Relaxed);
    }

    pub fn report(&self) -> MemberIo {
        let latency: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        MemberIo {
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
            read_ops: self.read_ops.load(Ordering::Relaxed),
            write_bytes: self.write_bytes.load(Ordering::Relaxed),
            write_ops: self.write_ops.load(Ordering::Relaxed),
            ops: latency.iter().sum(),
            busy_us: self.busy_ns_total.load(Ordering::Relaxed) / 1000,
            latency,
        }
    }

    /// Whether it is slow, and how (see `Core::check_slow`).
    pub fn slow(&self) -> Option<super::status::Slow> {
        let x = self.slow_us.load(Ordering::Relaxed);
        (x != 0).then_some(super::status::Slow {
            latency_us: x >> 32,
            peers_us: x & 0xffff_ffff,
        })
    }
}

impl Disk {
    pub fn slow(&self) -> Option<super::status::Slow> {
        self.io.slow()
    }
}

impl Core {
    /// Compare the members' mean time per operation since the last look
    /// (called every few seconds): one taking `SLOW_FACTOR` times its
    /// peers' median and at least `SLOW_FLOOR` is slow (status, metrics,
    /// a SlowMember event when it becomes so); it is slow no more once
    /// within twice the median. Members with too few operations in the
    /// span keep their state. The seeds' cases: two disks of one model
    /// reading at 54-59 MB/s beside 90, a dying USB disk holding up the
    /// rest.
    pub(crate) fn check_slow(&self) {
        const SLOW_FACTOR: u64 = 3;
        const SLOW_FLOOR: u64 = 2_000_000;
        const MIN_OPS: u64 = 8;
        let v = self.view.load();
        let disks = v.writable();
        let means: Vec<Option<u64>> = disks
            .iter()
            .map(|d| {
                let ns = d.io.busy_ns.swap(0, Ordering::Relaxed);
                let ops = d.io.ops.swap(0, Ordering::Relaxed);
                (ops >= MIN_OPS).then(|| ns / ops)
            })
            .collect();
        for (i, d) in disks.iter().enumerate() {
            let Some(mine) = means[i] else { continue };
            let mut peers: Vec<u64> = (0..disks.len())
                .filter(|&j| j != i)
                .filter_map(|j| means[j])
                .collect();
            if peers.is_empty() {
                continue;
            }
            peers.sort_unstable();
            let median = peers[peers.len() / 2].max(1);
            let was = d.io.slow_us.load(Ordering::Relaxed) != 0;
            if mine >= SLOW_FACTOR * median && mine >= SLOW_FLOOR {
                let (us, peers_us) = (
                    (mine / 1000).min(u32::MAX as u64),
                    (median / 1000).min(u32::MAX as u64),
                );
                d.io.slow_us
                    .store((us << 32) | peers_us.max(1), Ordering::Relaxed);
                if !was {
                    let role = v
                        .roles
                        .iter()
                        .position(|r| r.disk.as_ref().is_some_and(|x| Arc::ptr_eq(x, d)));
                    self.emit(
                        crate::events::NewEvent::new(
                            "SlowMember",
                            crate::events::Severity::Warning,
                            format!(
                                "slow: {:.1} ms per operation, its peers {:.1} ms",
                                mine as f64 / 1e6,
                                median as f64 / 1e6
                            ),
                        )
                        .member(d.name(), role)
                        .data(serde_json::json!({"latency_us": us, "peers_us": peers_us})),
                    );
                }
            } else if mine < 2 * median {
                d.io.slow_us.store(0, Ordering::Relaxed);
            }
        }
    }
}
