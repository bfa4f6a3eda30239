//! A simulated disk: another member with the timing of a spinning disk, so
//! that rebuild times and scaling sweeps are repeatable on any machine.
//!
//! Configured from a query string (`sim:disk0.img?bw=150M&seek=8ms`):
//!
//! | key | meaning |
//! |-----|---------|
//! | `bw=RATE` | media transfer rate in bytes per second (K/M/G suffixes, powers of 1024), default 150M |
//! | `seek=DUR` | time to move the head to a non-sequential offset, default 8ms |
//!
//! Each operation costs `len / bw`, plus `seek` unless it starts where the
//! previous one ended (a short skip forward costs the time to pass over the
//! skipped bytes, if that is less than a seek). Operations queue on the disk as on a real one: the
//! disk keeps a virtual clock of when it will next be free, and an
//! operation completes (its caller sleeps until) its own slot on that
//! clock ends. Flushes cost nothing beyond the queue.

use crate::fault::parse_duration;
use crate::{Member, Result};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The timing of a simulated disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimConfig {
    pub bandwidth: u64,
    pub seek: Duration,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            bandwidth: 150 << 20,
            seek: Duration::from_millis(8),
        }
    }
}

impl SimConfig {
    /// Parse `bw=150M&seek=8ms`.
    pub fn parse(query: &str) -> std::result::Result<SimConfig, String> {
        let mut c = SimConfig::default();
        for part in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("'{part}' is not key=value"))?;
            match k {
                "bw" => {
                    c.bandwidth = crate::units::parse_rate(v).map_err(|e| format!("bw {e}"))?;
                    if c.bandwidth == 0 {
                        return Err("bw must be above zero".into());
                    }
                }
                "seek" => c.seek = parse_duration(v)?,
                other => return Err(format!("unknown disk setting '{other}' (bw, seek)")),
            }
        }
        Ok(c)
    }
}

#[derive(Debug)]
struct Head {
    /// When the disk finishes the work queued on it.
    free_at: Instant,
    /// Where the previous operation ended.
    pos: u64,
    /// How late the sleeper of the previous operation woke up: the host's
    /// timer, not the disk, so the next operation is not charged for it.
    late: Duration,
}

/// A member with a simulated disk's timing.
#[derive(Debug)]
pub struct SimDisk {
    inner: Arc<dyn Member>,
    config: SimConfig,
    head: Mutex<Head>,
}

impl SimDisk {
    pub fn new(inner: Arc<dyn Member>, config: SimConfig) -> SimDisk {
        SimDisk {
            inner,
            config,
            head: Mutex::new(Head {
                free_at: Instant::now(),
                pos: u64::MAX,
                late: Duration::ZERO,
            }),
        }
    }

    /// Queue an operation and sleep until the disk would have finished it.
    fn occupy(&self, offset: u64, len: u64) {
        let transfer = Duration::from_secs_f64(len as f64 / self.config.bandwidth as f64);
        let done = {
            let mut h = self.head.lock().expect("disk head");
            let start = h.free_at.max(Instant::now());
            // A short skip forward costs the time the head takes to pass
            // over it, never more than a seek.
            let seek = if h.pos == offset {
                Duration::ZERO
            } else if offset > h.pos {
                Duration::from_secs_f64((offset - h.pos) as f64 / self.config.bandwidth as f64)
                    .min(self.config.seek)
            } else {
                self.config.seek
            };
            h.free_at = start + seek + transfer;
            h.pos = offset + len;
            h.free_at
        };
        let now = Instant::now();
        if done > now {
            std::thread::sleep(done - now);
            let late = Instant::now().saturating_duration_since(done);
            let mut h = self.head.lock().expect("disk head");
            if h.free_at == done {
                h.late = late.min(Duration::from_millis(2));
            }
        } else {
            self.head.lock().expect("disk head").late = Duration::ZERO;
        }
    }
}

impl Member for SimDisk {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.inner.read_at(buf, offset)?;
        self.occupy(offset, buf.len() as u64);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.inner.write_at(buf, offset)?;
        self.occupy(offset, buf.len() as u64);
        Ok(())
    }

    fn write_at_durable(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.inner.write_at_durable(buf, offset)?;
        self.occupy(offset, buf.len() as u64);
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.inner.flush()
    }

    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }

    fn close(&self) -> Result<()> {
        self.inner.close()
    }

    fn remote(&self) -> Option<&dyn crate::Remote> {
        self.inner.remote()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemMember;

    #[test]
    fn parses_and_refuses() {
        let c = SimConfig::parse("bw=100M&seek=4ms").unwrap();
        assert_eq!(c.bandwidth, 100 << 20);
        assert_eq!(c.seek, Duration::from_millis(4));
        assert_eq!(SimConfig::parse("").unwrap(), SimConfig::default());
        assert_eq!(SimConfig::parse("bw=2G").unwrap().bandwidth, 2 << 30);
        assert!(SimConfig::parse("bw=150MB").is_err());
        assert!(SimConfig::parse("bw=0").is_err());
        assert!(SimConfig::parse("bw=fast").is_err());
        assert!(SimConfig::parse("rpm=7200").is_err());
    }

    #[test]
    fn sequential_io_costs_transfer_and_random_io_costs_seeks() {
        // 10 MB/s, 20 ms seeks: 10 sequential 100 KB reads take ~100 ms of
        // transfer plus one seek; 10 scattered ones add nine more seeks.
        let inner: Arc<dyn Member> = Arc::new(MemMember::new("m", 8 << 20));
        let d = SimDisk::new(
            inner,
            SimConfig {
                bandwidth: 10_000_000,
                seek: Duration::from_millis(20),
            },
        );
        let mut b = vec![0u8; 100_000];
        let t = Instant::now();
        for i in 0..10 {
            d.read_at(&mut b, i * 100_000).unwrap();
        }
        let seq = t.elapsed();
        let t = Instant::now();
        for i in 0..10 {
            d.read_at(&mut b, (9 - i) * 300_000).unwrap();
        }
        let random = t.elapsed();
        // Sleeps never end early, so these lower bounds cannot flake.
        assert!(seq >= Duration::from_millis(120), "{seq:?}");
        assert!(random >= Duration::from_millis(300), "{random:?}");
    }
}
