//! Read-ahead for one sequential reader of a member without a page cache.
//!
//! A member opened with direct I/O (or an array of them) has no page cache
//! to read ahead: a single reader at queue depth 1 (the seeds' dd-style
//! test) waits for every request in turn, and the disks idle between them.
//! [`ReadAhead`] notices a sequential stream and reads the next blocks
//! (whole stripes, several at once, so every disk of an array works)
//! while the reader is busy with the last; md sets an array's read-ahead
//! to whole stripes for the same reason.
//!
//! Coherence: every write, discard or flush through the wrapper drops what
//! was read ahead once it is done, and blocks read ahead are used only by
//! reads that begin after their read began, so a read never returns data
//! older than a write that finished before it was asked for.
//!
//! Written here rather than taken from a crate: it is the kernel's
//! per-file read-ahead logic, for a `Member`, with its invalidation on
//! writes; no crate offers that over a positional-I/O trait.

use crate::{Locked, Member, Result};
use std::collections::VecDeque;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};

/// Reads in a row at the end of the last one before reading ahead starts.
const STREAK: u32 = 2;

/// How many read-ahead windows behind the stream's end a read must start
/// to begin a stream of its own (16 x four blocks of 1 MiB: 64 MiB, more
/// than 32 requests of 1 MiB in flight leave between the first and last).
const RESTART: u64 = 16;

#[derive(Debug)]
enum State {
    Reading,
    Ready(Vec<u8>),
    Failed,
}

#[derive(Debug)]
struct Block {
    start: u64,
    len: u64,
    state: Mutex<State>,
    done: Condvar,
}

impl Block {
    /// Copy `[off, off + dst.len())` of the block once it is read; false
    /// if its read failed.
    fn copy_to(&self, dst: &mut [u8], off: u64) -> bool {
        let mut st = self.state.locked();
        loop {
            match &*st {
                State::Reading => {
                    st = self
                        .done
                        .wait(st)
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                }
                State::Ready(data) => {
                    let at = (off - self.start) as usize;
                    dst.copy_from_slice(&data[at..at + dst.len()]);
                    return true;
                }
                State::Failed => return false,
            }
        }
    }
}

#[derive(Debug, Default)]
struct Stream {
    /// Where the last read ended.
    last_end: u64,
    /// Reads in a row that began where the one before ended.
    streak: u32,
    /// Blocks read ahead, in order, contiguous.
    blocks: VecDeque<Arc<Block>>,
}

/// A block to read ahead, and the member to read it from.
type Job = (Arc<Block>, Arc<dyn Member>);

/// A member that reads ahead of one sequential reader.
#[derive(Debug)]
pub struct ReadAhead {
    inner: Arc<dyn Member>,
    block: u64,
    ahead: usize,
    stream: Mutex<Stream>,
    jobs: Mutex<mpsc::Sender<Job>>,
}

impl ReadAhead {
    /// Read ahead `ahead` blocks of `block` bytes (a multiple of the
    /// member's natural unit, a full stripe for an array), read by as many
    /// threads at once.
    pub fn new(inner: Arc<dyn Member>, block: u64, ahead: usize) -> std::io::Result<ReadAhead> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..ahead.max(1) {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("read-ahead-{i}"))
                .spawn(move || loop {
                    let job = rx.locked().recv();
                    let Ok((b, m)) = job else { return };
                    let mut data = vec![0u8; b.len as usize];
                    let st = match m.read_at(&mut data, b.start) {
                        Ok(()) => State::Ready(data),
                        // The reader reads it itself and meets the error.
                        Err(_) => State::Failed,
                    };
                    *b.state.locked() = st;
                    b.done.notify_all();
                })?;
        }
        Ok(ReadAhead {
            inner,
            block: block.max(4096),
            ahead: ahead.max(1),
            stream: Mutex::new(Stream::default()),
            jobs: Mutex::new(tx),
        })
    }

    /// Drop everything read ahead (after a write: it may be older).
    fn forget(&self) {
        let mut s = self.stream.locked();
        s.blocks.clear();
        s.streak = 0;
    }
}

impl Member for ReadAhead {
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
        let end = offset + buf.len() as u64;
        let size = self.inner.len();
        let covering: Vec<Arc<Block>> = {
            let mut s = self.stream.locked();
            if offset == s.last_end && !buf.is_empty() {
                s.streak += 1;
            } else if offset < s.last_end.saturating_sub(self.block) || offset > s.last_end {
                // Not the stream's next read (or far behind it): a new stream.
                s.streak = 0;
                s.blocks.clear();
                if offset.saturating_add(self.block * self.ahead as u64 * RESTART) < s.last_end {
                    // Farther back than a client's requests in flight
                    // reach: a reader gone back to read again (a second
                    // pass from the start), whose next read must count.
                    // Nearer, it is a request of the same stream arriving
                    // late, and the stream's end stays the furthest.
                    s.last_end = end;
                }
            }
            s.last_end = s.last_end.max(end);
            while s.blocks.front().is_some_and(|b| b.start + b.len <= offset) {
                s.blocks.pop_front();
            }
            let covering: Vec<Arc<Block>> = s
                .blocks
                .iter()
                .filter(|b| b.start < end && b.start + b.len > offset)
                .cloned()
                .collect();
            let covered = covering.first().is_some_and(|b| b.start <= offset)
                && covering.last().is_some_and(|b| b.start + b.len >= end);
            if s.streak >= STREAK {
                // Keep `ahead` blocks beyond this read in flight or ready.
                let mut next = s.blocks.back().map_or(end, |b| b.start + b.len).max(end);
                next = next.div_ceil(self.block) * self.block;
                let jobs = self.jobs.locked();
                while next < size && next < end + self.block * self.ahead as u64 {
                    let b = Arc::new(Block {
                        start: next,
                        len: self.block.min(size - next),
                        state: Mutex::new(State::Reading),
                        done: Condvar::new(),
                    });
                    if jobs.send((b.clone(), self.inner.clone())).is_err() {
                        break;
                    }
                    next += b.len;
                    s.blocks.push_back(b);
                }
            }
            if covered {
                covering
            } else {
                Vec::new()
            }
        };
        if !covering.is_empty() {
            let mut at = offset;
            let mut ok = true;
            for b in &covering {
                let lo = at.max(b.start);
                let hi = end.min(b.start + b.len);
                if lo >= hi {
                    continue;
                }
                let dst = &mut buf[(lo - offset) as usize..(hi - offset) as usize];
                if !b.copy_to(dst, lo) {
                    ok = false;
                    break;
                }
                at = hi;
            }
            if ok && at == end {
                return Ok(());
            }
        }
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        let r = self.inner.write_at(buf, offset);
        self.forget();
        r
    }

    fn write_at_durable(&self, buf: &[u8], offset: u64) -> Result<()> {
        let r = self.inner.write_at_durable(buf, offset);
        self.forget();
        r
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        let r = self.inner.discard(offset, len);
        self.forget();
        r
    }

    fn flush(&self) -> Result<()> {
        self.inner.flush()
    }

    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FaultConfig, FaultMember, MemMember};

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 4096) as u8).collect()
    }

    /// A member that counts the reads that reach it.
    #[derive(Debug)]
    struct Counting(MemMember, std::sync::atomic::AtomicUsize);

    impl Member for Counting {
        fn name(&self) -> &str {
            self.0.name()
        }
        fn len(&self) -> u64 {
            self.0.len()
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
            self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.0.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
            self.0.write_at(buf, offset)
        }
        fn flush(&self) -> Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_sequential_reader_is_served_ahead_and_sees_every_write() {
        let m = Arc::new(Counting(MemMember::new("m", 8 << 20), Default::default()));
        let data = pattern(8 << 20);
        m.write_at(&data, 0).unwrap();
        let ra = ReadAhead::new(m.clone(), 256 << 10, 4).unwrap();
        let mut buf = vec![0u8; 64 << 10];
        let mut at = 0u64;
        while at < 4 << 20 {
            ra.read_at(&mut buf, at).unwrap();
            assert_eq!(buf, data[at as usize..at as usize + buf.len()], "at {at}");
            at += buf.len() as u64;
        }
        // 64 reads of 64 KiB: after the first few, served from blocks of
        // 256 KiB read ahead (one member read per block, not per read).
        let reads = m.1.load(std::sync::atomic::Ordering::Relaxed);
        assert!(reads < 32, "{reads} member reads for 64 sequential reads");
        // A write in the region read ahead: the next read returns it.
        let new = vec![0xEEu8; 64 << 10];
        ra.write_at(&new, at).unwrap();
        ra.read_at(&mut buf, at).unwrap();
        assert_eq!(buf, new);
        // And reading on, in sequence again, is still right.
        for _ in 0..16 {
            at += buf.len() as u64;
            ra.read_at(&mut buf, at).unwrap();
            assert_eq!(buf, data[at as usize..at as usize + buf.len()], "at {at}");
        }
        // A discard too.
        ra.discard(at + (64 << 10), 64 << 10).unwrap();
        at += buf.len() as u64;
        ra.read_at(&mut buf, at).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
    }

    #[test]
    fn a_second_pass_from_the_start_is_read_ahead_again() {
        let m = Arc::new(Counting(MemMember::new("m", 8 << 20), Default::default()));
        let data = pattern(8 << 20);
        m.write_at(&data, 0).unwrap();
        // Blocks of 64 KiB: a read 4 MiB behind the stream starts a new one.
        let ra = ReadAhead::new(m.clone(), 64 << 10, 4).unwrap();
        let mut buf = vec![0u8; 16 << 10];
        for pass in 0..3 {
            let before = m.1.load(std::sync::atomic::Ordering::Relaxed);
            // Each pass a little shorter: it starts where the last did not.
            let mut at = 0u64;
            while at < (6 << 20) - pass * (256 << 10) {
                ra.read_at(&mut buf, at).unwrap();
                assert_eq!(buf, data[at as usize..at as usize + buf.len()], "at {at}");
                at += buf.len() as u64;
            }
            // A member read per 64 KiB block read ahead, not per 16 KiB read.
            let reads = m.1.load(std::sync::atomic::Ordering::Relaxed) - before;
            let asked = at / buf.len() as u64;
            assert!(
                (reads as u64) < asked / 2,
                "pass {pass}: {reads} member reads for {asked} sequential reads"
            );
        }
    }

    #[test]
    fn a_block_that_fails_to_read_ahead_is_read_by_the_reader() {
        let m = Arc::new(MemMember::new("m", 4 << 20));
        m.write_at(&pattern(4 << 20), 0).unwrap();
        let f = Arc::new(FaultMember::new(
            m,
            FaultConfig {
                read_error_at: vec![1 << 20],
                ..Default::default()
            },
        ));
        let ra = ReadAhead::new(f, 256 << 10, 4).unwrap();
        let mut buf = vec![0u8; 64 << 10];
        let mut errors = 0;
        for i in 0..32u64 {
            match ra.read_at(&mut buf, i * (64 << 10)) {
                Ok(()) => {}
                Err(_) => errors += 1,
            }
        }
        // Only the read of the bad range fails, as without read-ahead.
        assert_eq!(errors, 1);
    }
}
