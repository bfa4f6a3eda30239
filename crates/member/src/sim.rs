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
//! skipped bytes, if that is less than a seek). Operations queue on the
//! disk as on a real one: the disk keeps a virtual clock of when it will
//! next be free, picks the next of the waiting operations as an elevator
//! does (the one nearest ahead of the head), and an operation completes
//! (its caller sleeps until) its own slot on that clock ends. Flushes cost
//! nothing beyond the queue.

use crate::fault::parse_duration;
use crate::{Member, Result};
use std::sync::{Arc, Condvar, Mutex};
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

/// A request waiting for the simulated disk.
#[derive(Debug)]
struct Waiting {
    id: u64,
    offset: u64,
    len: u64,
    asked: Instant,
}

#[derive(Debug)]
struct Head {
    /// When the disk finishes the work it has started.
    free_at: Instant,
    /// Where the last operation started ends.
    pos: u64,
    /// Requests not started yet, in the order they came.
    queue: Vec<Waiting>,
    /// Started requests whose callers have not yet seen when they end.
    started: Vec<(u64, Instant)>,
    next_id: u64,
}

/// A request waiting longer than this is served next whatever it costs,
/// as mq-deadline does, so that one stream cannot starve another.
const DEADLINE: Duration = Duration::from_millis(500);

/// A member with a simulated disk's timing.
#[derive(Debug)]
pub struct SimDisk {
    inner: Arc<dyn Member>,
    config: SimConfig,
    head: Mutex<Head>,
    turn: Condvar,
}

impl SimDisk {
    pub fn new(inner: Arc<dyn Member>, config: SimConfig) -> SimDisk {
        SimDisk {
            inner,
            config,
            head: Mutex::new(Head {
                free_at: Instant::now(),
                pos: u64::MAX,
                queue: Vec::new(),
                started: Vec::new(),
                next_id: 0,
            }),
            turn: Condvar::new(),
        }
    }

    /// Time to move the head from `from` to `to`: nothing if `to` is where
    /// it is; the time to pass over the bytes between for a short skip
    /// forward; else a seek.
    fn positioning(&self, from: u64, to: u64) -> Duration {
        if to == from {
            return Duration::ZERO;
        }
        if to > from && from != u64::MAX {
            let pass = Duration::from_secs_f64((to - from) as f64 / self.config.bandwidth as f64);
            if pass < self.config.seek {
                return pass;
            }
        }
        self.config.seek
    }

    /// Start the waiting requests the disk would have started by `now`.
    /// The next one is the cheapest to reach from where the head is (an
    /// elevator, as the block layer's scheduler and a disk's command queue
    /// are; without one, two streams would pay a seek at every request),
    /// unless one has waited past the deadline.
    fn dispatch(&self, h: &mut Head, now: Instant) {
        while h.free_at <= now && !h.queue.is_empty() {
            let free = h.free_at;
            let late = h
                .queue
                .iter()
                .position(|w| free.saturating_duration_since(w.asked) > DEADLINE);
            let pick = late.unwrap_or_else(|| {
                let pos = h.pos;
                (0..h.queue.len())
                    .min_by_key(|&i| (self.positioning(pos, h.queue[i].offset), h.queue[i].id))
                    .expect("queue not empty")
            });
            let w = h.queue.remove(pick);
            let moving = self.positioning(h.pos, w.offset);
            // The platter turns while the disk waits for a request, so a
            // short skip forward overlaps the time it was idle: a stream
            // that skips a parity chunk reads at the disk's rate. A request
            // starts when it was asked for (before the backing file's copy,
            // which stands in for the transfer counted here) or when the
            // disk is free, whichever is later; never when a sleeper woke.
            let start = if moving < self.config.seek {
                (free + moving).max(w.asked)
            } else {
                free.max(w.asked) + moving
            };
            let transfer = Duration::from_secs_f64(w.len as f64 / self.config.bandwidth as f64);
            h.free_at = start + transfer;
            h.pos = w.offset + w.len;
            h.started.push((w.id, h.free_at));
        }
    }

    /// Queue an operation asked for at `asked` and sleep until the disk
    /// would have finished it.
    fn occupy(&self, asked: Instant, offset: u64, len: u64) {
        self.occupy_all(asked, &[(offset, len)]);
    }

    /// Queue operations asked for together at `asked` (all in the queue
    /// before the disk picks the next) and sleep until the disk would
    /// have finished the last of them.
    fn occupy_all(&self, asked: Instant, ops: &[(u64, u64)]) {
        let mut h = self.head.lock().unwrap_or_else(|e| e.into_inner());
        let mut ids = Vec::with_capacity(ops.len());
        for &(offset, len) in ops {
            let id = h.next_id;
            h.next_id += 1;
            ids.push(id);
            h.queue.push(Waiting {
                id,
                offset,
                len,
                asked,
            });
        }
        let mut done = asked;
        let done = loop {
            let now = Instant::now();
            self.dispatch(&mut h, now);
            let before = ids.len();
            ids.retain(|id| match h.started.iter().position(|s| s.0 == *id) {
                Some(i) => {
                    done = done.max(h.started.swap_remove(i).1);
                    false
                }
                None => true,
            });
            if ids.len() < before {
                // The others see whether theirs started too.
                self.turn.notify_all();
            }
            if ids.is_empty() {
                break done;
            }
            let wait = h.free_at.saturating_duration_since(now);
            h = self
                .turn
                .wait_timeout(h, wait.max(Duration::from_micros(50)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        };
        drop(h);
        let now = Instant::now();
        if done > now {
            std::thread::sleep(done - now);
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

    fn refresh_len(&self) -> Result<u64> {
        self.inner.refresh_len()
    }

    fn peek_len(&self) -> Result<u64> {
        self.inner.peek_len()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let asked = Instant::now();
        self.inner.read_at(buf, offset)?;
        self.occupy(asked, offset, buf.len() as u64);
        Ok(())
    }

    fn read_runs(&self, runs: &mut [(u64, &mut [u8])]) -> Result<()> {
        let asked = Instant::now();
        self.inner.read_runs(runs)?;
        let ops: Vec<(u64, u64)> = runs.iter().map(|r| (r.0, r.1.len() as u64)).collect();
        self.occupy_all(asked, &ops);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        let asked = Instant::now();
        self.inner.write_at(buf, offset)?;
        self.occupy(asked, offset, buf.len() as u64);
        Ok(())
    }

    fn write_at_durable(&self, buf: &[u8], offset: u64) -> Result<()> {
        let asked = Instant::now();
        self.inner.write_at_durable(buf, offset)?;
        self.occupy(asked, offset, buf.len() as u64);
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.inner.flush()
    }

    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }

    /// It models a spinning disk, whatever holds its bytes (unless its
    /// seeks cost nothing).
    fn rotational(&self) -> Option<bool> {
        Some(!self.config.seek.is_zero())
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

    /// A disk of 1 MB/s and 20 ms seeks whose head is at `pos`, busy
    /// until `free`, with `queue` (offset, len, asked) waiting: when each
    /// would end, in the order asked, after the disk picked among them at
    /// `now` (and then as it came free). No sleeping: the disk's choices
    /// on its virtual clock.
    fn schedule(
        pos: u64,
        free: Instant,
        queue: &[(u64, u64, Instant)],
        now: Instant,
    ) -> Vec<Instant> {
        let d = SimDisk::new(
            Arc::new(MemMember::new("m", 64 << 20)),
            SimConfig {
                bandwidth: 1_000_000,
                seek: Duration::from_millis(20),
            },
        );
        let mut h = d.head.lock().unwrap();
        h.pos = pos;
        h.free_at = free;
        for (i, &(offset, len, asked)) in queue.iter().enumerate() {
            h.queue.push(Waiting {
                id: i as u64,
                offset,
                len,
                asked,
            });
        }
        d.dispatch(&mut h, now);
        // The rest as the disk comes free.
        while !h.queue.is_empty() {
            let free = h.free_at;
            d.dispatch(&mut h, free);
        }
        (0..queue.len() as u64)
            .map(|id| h.started.iter().find(|s| s.0 == id).unwrap().1)
            .collect()
    }

    #[test]
    fn the_disk_takes_the_nearest_waiting_request_first() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // Busy until t0 + 500 ms with the head at 5 MB: a request 4 MB
        // further (a seek) came before one that starts where the head is.
        let done = schedule(
            5_000_000,
            t0 + ms(500),
            &[(9_000_000, 10_000, t0), (5_000_000, 10_000, t0 + ms(1))],
            t0 + ms(500),
        );
        // The near one first (10 ms), then the seek (20 ms) and the far one.
        assert_eq!(done[1], t0 + ms(510));
        assert_eq!(done[0], t0 + ms(540));
        // One that waited past the deadline goes first whatever it costs.
        let done = schedule(
            5_000_000,
            t0 + ms(900),
            &[(9_000_000, 10_000, t0), (5_000_000, 10_000, t0 + ms(800))],
            t0 + ms(900),
        );
        assert_eq!(done[0], t0 + ms(930));
    }

    #[test]
    fn a_short_skip_forward_overlaps_the_time_the_disk_was_idle() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // Free since t0 with the head at 100 KB; a request for 100 KB at
        // 110 KB asked 150 ms later: the head passed over the 10 KB between
        // (10 ms, less than a seek) while idle, so only the transfer is left.
        let done = schedule(
            100_000,
            t0,
            &[(110_000, 100_000, t0 + ms(150))],
            t0 + ms(150),
        );
        assert_eq!(done[0], t0 + ms(250));
        // Asked at once, the pass-over comes first.
        let done = schedule(100_000, t0, &[(110_000, 100_000, t0)], t0);
        assert_eq!(done[0], t0 + ms(110));
        // A request behind the head: a seek, after the idle time.
        let done = schedule(100_000, t0, &[(0, 100_000, t0 + ms(150))], t0 + ms(150));
        assert_eq!(done[0], t0 + ms(270));
    }

    #[test]
    fn runs_asked_together_are_taken_in_the_order_of_the_head() {
        // 1 GB/s, 100 ms seeks. The head at 4 KB; two runs asked in the
        // opposite order of the disk: together, the disk takes the near
        // one first and passes on to the far one (about 2 ms); one after
        // the other, the far one first and a seek back for the near one.
        let d = SimDisk::new(
            Arc::new(MemMember::new("m", 4 << 20)),
            SimConfig {
                bandwidth: 1_000_000_000,
                seek: Duration::from_millis(100),
            },
        );
        let mut b = vec![0u8; 4096];
        d.read_at(&mut b, 0).unwrap();
        let (mut far, mut near) = (vec![0u8; 64 << 10], vec![0u8; 64 << 10]);
        let t = Instant::now();
        d.read_runs(&mut [(2 << 20, &mut far[..]), (128 << 10, &mut near[..])])
            .unwrap();
        let took = t.elapsed();
        assert!(took < Duration::from_millis(50), "{took:?}");
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
