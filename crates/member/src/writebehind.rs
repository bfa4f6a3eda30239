//! Write-behind for one sequential writer at queue depth 1 of a member
//! without a page cache.
//!
//! The mirror of [`crate::ReadAhead`]: a member opened with direct I/O (or
//! an array of them) acknowledges a write only when every member has it, so
//! a writer that sends one request at a time (a dd-style stream with
//! `oflag=direct`, the seeds' own tests) leaves every disk idle while the
//! next request crosses the network and the array prepares it, and the
//! disk that finishes first idles until the slowest one does. [`WriteBehind`]
//! notices such a stream and answers its writes once their bytes are
//! copied, writing them in the background, a few at once, as a disk with a
//! write cache does.
//!
//! What a client is promised does not change where it matters: NBD (like
//! a disk with a volatile cache) promises nothing of a write that was not
//! followed by a flush or sent with FUA. A flush waits for every write
//! behind and fails if any of them failed, and so does every flush after
//! it (the wrapper cannot tell which client's write was lost, and a flush
//! must never succeed for a client whose acknowledged write is gone); a
//! FUA write, a discard, and any read wait
//! for the writes behind that they overlap. What the server's death can
//! lose is at most the writes in flight, a few MiB of unflushed data.
//!
//! It takes part only while a single request is in flight through it (a
//! client at queue depth 1: a deeper client keeps the disks busy itself,
//! and a copy would only cost it), only for writes that continue the last
//! one, from the third of a row, and never again once one has failed.
//!
//! Written here rather than taken from a crate: it is a disk's write cache
//! for a `Member`, with the ordering rules above; no crate offers that over
//! a positional-I/O trait.

use crate::{AlignedVec, Locked, Member, MemberError, Op, Result};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};

/// Writes in a row, each beginning where the last ended, before the next
/// is written behind.
const STREAK: u32 = 2;

/// A write behind: its range, and the copy of its bytes.
type Job = (u64, AlignedVec, Arc<dyn Member>);

#[derive(Debug, Default)]
struct State {
    /// Where the last write ended (none yet: the first write begins no
    /// row, wherever it is).
    last_end: Option<u64>,
    /// Writes in a row that began where the one before ended.
    streak: u32,
    /// Ranges of the writes behind, not yet done.
    pending: Vec<(u64, u64)>,
    /// Their bytes.
    bytes: u64,
    /// The first error a write behind met (offset, length, what): every
    /// flush from then on fails with it.
    error: Option<(u64, u64, String)>,
    /// Copies to reuse (a few of the stream's request size).
    free: Vec<AlignedVec>,
}

impl State {
    fn overlaps(&self, lo: u64, hi: u64) -> bool {
        self.pending.iter().any(|&(a, b)| a < hi && lo < b)
    }
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Signalled when a write behind ends.
    done: Condvar,
}

impl Shared {
    /// Wait, with `st` held, while `busy` says so.
    fn wait_while<'a>(
        &self,
        st: std::sync::MutexGuard<'a, State>,
        busy: impl FnMut(&mut State) -> bool,
    ) -> std::sync::MutexGuard<'a, State> {
        self.done
            .wait_while(st, busy)
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A member that writes one sequential writer's requests behind it.
#[derive(Debug)]
pub struct WriteBehind {
    inner: Arc<dyn Member>,
    depth: usize,
    max_bytes: u64,
    shared: Arc<Shared>,
    jobs: Mutex<mpsc::Sender<Job>>,
    /// Requests in flight through the wrapper now.
    callers: AtomicUsize,
    /// Writes answered before they were on the member, and their bytes.
    early: AtomicU64,
    early_bytes: AtomicU64,
}

/// What a [`WriteBehind`] has done (`raidkit status`, metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BehindCounts {
    /// Writes answered before they were on the member, since the start.
    pub writes: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Writes behind right now (answered, not yet done).
    pub pending: u64,
    /// Whether a write behind has failed (write-behind is off since).
    pub failed: bool,
}

/// Counts a request in flight through the wrapper while it lives.
struct Caller<'a>(&'a AtomicUsize);

impl Drop for Caller<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl WriteBehind {
    /// Write up to `depth` requests (and at most `max_bytes`) behind one
    /// sequential writer, as many at once.
    pub fn new(
        inner: Arc<dyn Member>,
        depth: usize,
        max_bytes: u64,
    ) -> std::io::Result<WriteBehind> {
        let depth = depth.max(1);
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            done: Condvar::new(),
        });
        for i in 0..depth {
            let rx = rx.clone();
            let shared = shared.clone();
            std::thread::Builder::new()
                .name(format!("write-behind-{i}"))
                .spawn(move || loop {
                    let job = rx.locked().recv();
                    let Ok((at, data, m)) = job else { return };
                    // A panic in the write is a failed write: its range must
                    // still leave the pending list, or every flush and the
                    // server's stop would wait for it for ever.
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        m.write_at(&data, at)
                    }));
                    let len = data.len() as u64;
                    let failed = match r {
                        Ok(Ok(())) => None,
                        Ok(Err(e)) => Some(e.to_string()),
                        Err(_) => Some("the write panicked".to_string()),
                    };
                    let mut st = shared.state.locked();
                    if let Some(what) = failed {
                        tracing::error!(
                            "a write of {len} bytes at {at} answered before it was done failed: {what}"
                        );
                        st.error.get_or_insert((at, len, what));
                    }
                    if let Some(i) = st.pending.iter().position(|&p| p == (at, at + len)) {
                        st.pending.swap_remove(i);
                    }
                    st.bytes -= len;
                    if st.free.len() < depth {
                        st.free.push(data);
                    }
                    drop(st);
                    shared.done.notify_all();
                })?;
        }
        Ok(WriteBehind {
            inner,
            depth,
            max_bytes: max_bytes.max(1),
            shared,
            jobs: Mutex::new(tx),
            callers: AtomicUsize::new(0),
            early: AtomicU64::new(0),
            early_bytes: AtomicU64::new(0),
        })
    }

    fn enter(&self) -> Caller<'_> {
        self.callers.fetch_add(1, Ordering::SeqCst);
        Caller(&self.callers)
    }

    /// Wait until no write behind overlaps `[lo, hi)`.
    fn wait_for(&self, lo: u64, hi: u64) {
        let st = self.shared.state.locked();
        drop(self.shared.wait_while(st, |s| s.overlaps(lo, hi)));
    }

    /// Wait until every write behind is done; the error one of them met,
    /// if any ever did.
    pub fn drain(&self) -> Result<()> {
        let st = self.shared.state.locked();
        let st = self.shared.wait_while(st, |s| !s.pending.is_empty());
        match &st.error {
            None => Ok(()),
            Some((at, len, what)) => Err(MemberError::new(
                self.inner.name(),
                Op::Write,
                *at,
                *len,
                std::io::Error::other(format!(
                    "a write answered before it was done failed: {what}"
                )),
            )),
        }
    }

    /// Writes behind right now (for tests).
    pub fn behind(&self) -> usize {
        self.shared.state.locked().pending.len()
    }

    /// What it has done so far.
    pub fn counts(&self) -> BehindCounts {
        let st = self.shared.state.locked();
        BehindCounts {
            writes: self.early.load(Ordering::Relaxed),
            bytes: self.early_bytes.load(Ordering::Relaxed),
            pending: st.pending.len() as u64,
            failed: st.error.is_some(),
        }
    }
}

impl Member for WriteBehind {
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
        let _c = self.enter();
        self.wait_for(offset, offset + buf.len() as u64);
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        let c = self.enter();
        let len = buf.len() as u64;
        let end = offset + len;
        let mut st = self.shared.state.locked();
        if st.last_end == Some(offset) && len > 0 {
            st.streak += 1;
        } else {
            st.streak = 0;
        }
        st.last_end = Some(end);
        // An earlier write of the same bytes lands first.
        st = self.shared.wait_while(st, |s| s.overlaps(offset, end));
        let behind = st.streak >= STREAK
            && st.error.is_none()
            && len <= self.max_bytes
            && self.callers.load(Ordering::SeqCst) == 1;
        if !behind {
            drop(st);
            return self.inner.write_at(buf, offset);
        }
        // The copy is made before waiting for room, while the writes
        // behind keep the disks busy: made after, it left them idle for as
        // long as it took (requests of 10 MiB and more, one behind at a
        // time, measured below no write-behind at all).
        let mut copy = st.free.pop().unwrap_or_default();
        drop(st);
        copy.resize(buf.len());
        copy.copy_from_slice(buf);
        let mut st = self.shared.wait_while(self.shared.state.locked(), |s| {
            s.pending.len() >= self.depth || s.bytes + len > self.max_bytes
        });
        if st.error.is_some() {
            // One behind failed meanwhile: write-behind is off.
            st.free.push(copy);
            drop(st);
            return self.inner.write_at(buf, offset);
        }
        st.pending.push((offset, end));
        st.bytes += len;
        drop(st);
        let sent = self.jobs.locked().send((offset, copy, self.inner.clone()));
        drop(c);
        if sent.is_err() {
            // No thread left to write it (one panicked in every thread):
            // written here, as without the wrapper.
            let mut st = self.shared.state.locked();
            st.pending.retain(|&p| p != (offset, end));
            st.bytes -= len;
            drop(st);
            self.shared.done.notify_all();
            return self.inner.write_at(buf, offset);
        }
        self.early.fetch_add(1, Ordering::Relaxed);
        self.early_bytes.fetch_add(len, Ordering::Relaxed);
        Ok(())
    }

    fn write_at_durable(&self, buf: &[u8], offset: u64) -> Result<()> {
        let _c = self.enter();
        self.wait_for(offset, offset + buf.len() as u64);
        self.inner.write_at_durable(buf, offset)
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        let _c = self.enter();
        self.wait_for(offset, offset + len);
        self.inner.discard(offset, len)
    }

    fn flush(&self) -> Result<()> {
        let _c = self.enter();
        self.drain()?;
        self.inner.flush()
    }

    fn close(&self) -> Result<()> {
        // The member closes whatever the writes behind met; their error
        // comes first.
        let drained = self.drain();
        let closed = self.inner.close();
        drained.and(closed)
    }

    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FaultConfig, FaultMember, MemMember};
    use std::time::Duration;

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 4096) as u8 ^ seed).collect()
    }

    fn slow(size: u64, delay_ms: u64) -> (Arc<MemMember>, Arc<dyn Member>) {
        let m = Arc::new(MemMember::new("m", size));
        let f = FaultMember::new(
            m.clone(),
            FaultConfig {
                write_delay: Some(Duration::from_millis(delay_ms)),
                ..Default::default()
            },
        );
        (m, Arc::new(f))
    }

    /// A member whose writes take `delay_ms` each and fail after the
    /// first `after`.
    fn failing(after: u64, delay_ms: u64) -> Arc<dyn Member> {
        Arc::new(FaultMember::new(
            Arc::new(MemMember::new("m", 8 << 20)),
            FaultConfig {
                fail_writes_after: Some(after),
                write_delay: Some(Duration::from_millis(delay_ms)),
                ..Default::default()
            },
        ))
    }

    #[test]
    fn a_sequential_writer_is_answered_early_and_every_read_sees_its_writes() {
        let (mem, slow) = slow(8 << 20, 20);
        let wb = WriteBehind::new(slow, 4, 4 << 20).unwrap();
        let block = 256 << 10;
        let mut most = 0;
        for i in 0..16u64 {
            let data = pattern(block, i as u8);
            wb.write_at(&data, i * block as u64).unwrap();
            most = most.max(wb.behind());
            // A read right after the write returned sees it, landed or not.
            let mut back = vec![0u8; block];
            wb.read_at(&mut back, i * block as u64).unwrap();
            assert_eq!(back, data, "write {i}");
        }
        // Each write's member write takes 20 ms: from the third on, they
        // were answered before that.
        assert!(most >= 1, "no write was ever behind");
        wb.flush().unwrap();
        assert_eq!(wb.behind(), 0);
        // Two in place (the row begins), fourteen answered early.
        let c = wb.counts();
        assert_eq!((c.writes, c.bytes), (14, 14 * block as u64), "{c:?}");
        assert!(!c.failed);
        for i in 0..16u64 {
            let mut back = vec![0u8; block];
            mem.read_at(&mut back, i * block as u64).unwrap();
            assert_eq!(back, pattern(block, i as u8), "write {i} on the member");
        }
    }

    #[test]
    fn writes_behind_stay_within_their_depth_and_bytes() {
        let (_mem, slow) = slow(16 << 20, 30);
        let wb = WriteBehind::new(slow, 3, 1 << 20).unwrap();
        let block = 256 << 10;
        let data = pattern(block, 1);
        let mut most = 0;
        for i in 0..24u64 {
            wb.write_at(&data, i * block as u64).unwrap();
            most = most.max(wb.behind());
        }
        // 1 MiB of 256 KiB writes: at most 3 (the depth) behind.
        assert!((2..=3).contains(&most), "{most} writes behind");
        wb.flush().unwrap();
    }

    #[test]
    fn a_write_behind_that_fails_fails_every_flush_after_it() {
        let wb = WriteBehind::new(failing(4, 5), 2, 4 << 20).unwrap();
        let block = 64 << 10;
        let data = pattern(block, 3);
        // Writes 0-3 land; 4 and on fail. The first two are written in
        // place (no streak yet) and the rest behind until one fails.
        let mut direct_errors = 0;
        for i in 0..8u64 {
            if wb.write_at(&data, i * block as u64).is_err() {
                direct_errors += 1;
            }
        }
        let e = wb.flush().expect_err("a lost write must fail the flush");
        assert!(wb.counts().failed);
        assert_eq!(e.op, Op::Write);
        // The writes after it were not behind: they failed by themselves.
        assert!(
            direct_errors >= 1,
            "every write after the failure was answered early"
        );
        // Another client's flush must not succeed either.
        assert!(wb.flush().is_err(), "a second flush forgot the lost write");
    }

    #[test]
    fn a_write_waiting_for_room_when_the_one_behind_fails_is_not_answered_early() {
        // One behind at a time: write 2 goes behind (and fails after
        // 50 ms); write 3 is copied and waits for its room meanwhile.
        let wb = WriteBehind::new(failing(2, 50), 1, 4 << 20).unwrap();
        let block = 64 << 10;
        let data = pattern(block, 4);
        for i in 0..3u64 {
            wb.write_at(&data, i * block as u64).unwrap();
        }
        assert_eq!(wb.behind(), 1, "write 2 was not behind");
        assert!(
            wb.write_at(&data, 3 * block as u64).is_err(),
            "write 3 was answered early after write-behind had failed"
        );
        assert!(wb.flush().is_err());
    }

    /// A member whose writes call `.1` (with their bytes and offset)
    /// first: to make some slow, or panic.
    struct Hooked(Arc<MemMember>, fn(&[u8], u64));

    impl std::fmt::Debug for Hooked {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            self.0.fmt(f)
        }
    }

    impl Member for Hooked {
        fn name(&self) -> &str {
            self.0.name()
        }
        fn len(&self) -> u64 {
            self.0.len()
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
            self.0.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
            (self.1)(buf, offset);
            self.0.write_at(buf, offset)
        }
        fn flush(&self) -> Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_write_behind_that_panics_fails_the_flush_instead_of_hanging_it() {
        let block = 64u64 << 10;
        let m = Arc::new(Hooked(Arc::new(MemMember::new("m", 4 << 20)), |_, at| {
            assert_ne!(at, 5 * (64 << 10), "a bug in the member");
            std::thread::sleep(Duration::from_millis(5));
        }));
        let wb = Arc::new(WriteBehind::new(m, 2, 4 << 20).unwrap());
        let (tx, rx) = mpsc::channel();
        let w = wb.clone();
        std::thread::spawn(move || {
            let data = pattern(block as usize, 5);
            for i in 0..12u64 {
                // Write 5 goes behind and panics there.
                let _ = w.write_at(&data, i * block);
            }
            let _ = tx.send(w.flush().is_err());
        });
        let failed = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the flush hung on a write that panicked");
        assert!(failed, "the flush succeeded over a write that panicked");
        // Every thread still works: a read of the range does not hang.
        let mut back = vec![0u8; block as usize];
        wb.read_at(&mut back, 5 * block).unwrap();
    }

    #[test]
    fn a_later_write_of_the_same_bytes_lands_after_the_earlier_one() {
        let mem = Arc::new(MemMember::new("m", 4 << 20));
        // The stream's writes are slow, the rewrite quick.
        let slow = Hooked(mem.clone(), |buf, _| {
            // pattern(_, 9) begins with 9.
            if buf.first() == Some(&9) {
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let wb = WriteBehind::new(Arc::new(slow), 4, 4 << 20).unwrap();
        let block = 128 << 10;
        for i in 0..4u64 {
            wb.write_at(&pattern(block, 9), i * block as u64).unwrap();
        }
        // The last went behind; write its range again (not in sequence:
        // written in place, after the one behind).
        let new = pattern(block, 77);
        wb.write_at(&new, 3 * block as u64).unwrap();
        wb.flush().unwrap();
        let mut back = vec![0u8; block];
        mem.read_at(&mut back, 3 * block as u64).unwrap();
        assert_eq!(back, new);
    }

    /// A member whose reads wait until let go.
    #[derive(Debug)]
    struct Gate(MemMember, Mutex<bool>, Condvar);

    impl Member for Gate {
        fn name(&self) -> &str {
            self.0.name()
        }
        fn len(&self) -> u64 {
            self.0.len()
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
            let mut open = self.1.locked();
            while !*open {
                open = self.2.wait(open).unwrap();
            }
            self.0.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
            std::thread::sleep(Duration::from_millis(5));
            self.0.write_at(buf, offset)
        }
        fn flush(&self) -> Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_client_with_more_than_one_request_in_flight_is_not_written_behind() {
        let g = Arc::new(Gate(
            MemMember::new("m", 4 << 20),
            Mutex::new(false),
            Condvar::new(),
        ));
        let wb = Arc::new(WriteBehind::new(g.clone(), 4, 4 << 20).unwrap());
        let reader = {
            let wb = wb.clone();
            std::thread::spawn(move || {
                let mut b = vec![0u8; 4096];
                wb.read_at(&mut b, 3 << 20).unwrap();
            })
        };
        while wb.callers.load(Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        // A read is in flight: a second request, so every write waits.
        let block = 64 << 10;
        for i in 0..8u64 {
            let data = pattern(block, i as u8);
            wb.write_at(&data, i * block as u64).unwrap();
            assert_eq!(wb.behind(), 0, "write {i} went behind");
            let mut back = vec![0u8; block];
            g.0.read_at(&mut back, i * block as u64).unwrap();
            assert_eq!(back, data, "write {i} not on the member when answered");
        }
        assert_eq!(wb.counts().writes, 0);
        *g.1.locked() = true;
        g.2.notify_all();
        reader.join().unwrap();
    }
}
