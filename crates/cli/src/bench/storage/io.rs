//! Positional I/O on whatever is measured: buffers aligned for direct
//! I/O, the targets' read/write/flush, and random requests at a queue
//! depth (pipelined from one thread where the target can: NBD, or io_uring
//! on files and devices; a thread per request in flight otherwise).

use super::{splitmix64, uring, xorshift, Writer, BLOCK, SMALL};
use anyhow::{anyhow, Result};
use raidkit_member::Member;
use raidkit_nbd::client::FillWrite;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A buffer aligned for direct I/O.
pub(super) struct Aligned {
    ptr: *mut u8,
    pub(super) len: usize,
}

// SAFETY: the buffer is plain memory owned by this value; sharing it
// read-only across threads is sound.
unsafe impl Send for Aligned {}
// SAFETY: as above; only `&self` (read-only) access is shared.
unsafe impl Sync for Aligned {}

impl Aligned {
    pub(super) fn new(len: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len.max(SMALL), SMALL).expect("layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory");
        Aligned { ptr, len }
    }

    pub(super) fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr points at len initialised bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub(super) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        let layout =
            std::alloc::Layout::from_size_align(self.len.max(SMALL), SMALL).expect("layout");
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) }
    }
}

/// Positional I/O on whatever is measured.
pub(super) trait Rw: Sync {
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()>;
    fn write_at(&self, buf: &[u8], off: u64) -> Result<()>;
    fn flush(&self) -> Result<()>;
    /// Random 4 KiB requests at queue depth `qd` from one thread until
    /// `deadline`, for targets that can pipeline (NBD; files and devices
    /// through io_uring): completed requests.
    fn queue(
        &self,
        _qd: usize,
        _write: Option<&mut FillWrite>,
        _deadline: Instant,
        _next: &mut dyn FnMut() -> u64,
    ) -> Option<Result<u64>> {
        None
    }
    /// Whether `queue` keeps `qd` requests in flight from one thread.
    fn pipelines(&self, _qd: usize) -> bool {
        false
    }
}

impl Rw for File {
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        self.read_exact_at(buf, off).map_err(Into::into)
    }
    fn write_at(&self, buf: &[u8], off: u64) -> Result<()> {
        self.write_all_at(buf, off).map_err(Into::into)
    }
    fn flush(&self) -> Result<()> {
        self.sync_data().map_err(Into::into)
    }
    /// Queue depths above 1 through io_uring from one thread (fio's libaio
    /// or io_uring at that iodepth); depth 1 stays a plain pread/pwrite
    /// (fio's psync), as does everything where io_uring is not available.
    fn queue(
        &self,
        qd: usize,
        write: Option<&mut FillWrite>,
        deadline: Instant,
        next: &mut dyn FnMut() -> u64,
    ) -> Option<Result<u64>> {
        if qd < 2 || !uring_available() {
            return None;
        }
        uring::run(self.as_raw_fd(), qd, write, deadline, next).map(|r| r.map_err(Into::into))
    }
    fn pipelines(&self, qd: usize) -> bool {
        qd >= 2 && uring_available()
    }
}

/// Whether io_uring can be set up here (kernels may disable it).
fn uring_available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| io_uring::IoUring::new(2).is_ok())
}

impl Rw for Arc<dyn Member> {
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        Member::read_at(&**self, buf, off).map_err(Into::into)
    }
    fn write_at(&self, buf: &[u8], off: u64) -> Result<()> {
        Member::write_at(&**self, buf, off).map_err(Into::into)
    }
    fn flush(&self) -> Result<()> {
        Member::flush(&**self).map_err(Into::into)
    }
}

impl Rw for Arc<raidkit_nbd::NbdClient> {
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        Member::read_at(&**self, buf, off).map_err(Into::into)
    }
    fn write_at(&self, buf: &[u8], off: u64) -> Result<()> {
        Member::write_at(&**self, buf, off).map_err(Into::into)
    }
    fn flush(&self) -> Result<()> {
        Member::flush(&**self).map_err(Into::into)
    }
    /// As fio's nbd engine: one thread, `qd` requests in flight on one
    /// connection.
    fn queue(
        &self,
        qd: usize,
        write: Option<&mut FillWrite>,
        deadline: Instant,
        next: &mut dyn FnMut() -> u64,
    ) -> Option<Result<u64>> {
        Some(
            self.run_queue(qd, SMALL as u32, write, deadline, next)
                .map_err(|e| anyhow!("{}: {e}", self.name())),
        )
    }
    fn pipelines(&self, _qd: usize) -> bool {
        true
    }
}

/// 4 KiB random reads or writes within `[z0, z0 + len)` by `qd` threads
/// for --seconds, at offsets drawn from a seed of their own (writes end
/// with a flush inside the timing); IOPS.
pub(super) struct RandomJob<'a> {
    pub(super) t: &'a dyn Rw,
    pub(super) secs: f64,
    pub(super) pattern: &'a Aligned,
    pub(super) seed: u64,
    pub(super) z0: u64,
    pub(super) len: u64,
    pub(super) qd: usize,
    pub(super) write: bool,
}

impl RandomJob<'_> {
    pub(super) fn run(self) -> Result<f64> {
        let RandomJob {
            t,
            secs,
            pattern,
            seed,
            z0,
            len,
            qd,
            write,
        } = self;
        let blocks = len / SMALL as u64;
        let deadline = Duration::from_secs_f64(secs.max(0.05));
        // Targets that pipeline: one thread keeps qd requests in flight.
        let mut x = seed | 1;
        let mut next = || z0 + (xorshift(&mut x) % blocks) * SMALL as u64;
        let mut k = 0usize;
        let mut fill = write.then(|| {
            let mut w = Writer::new(pattern);
            move |off: u64, b: &mut [u8]| {
                k = (k + 1) % (BLOCK / SMALL);
                b.copy_from_slice(w.data(k * SMALL, b.len(), off));
            }
        });
        let payload = fill.as_mut().map(|f| f as &mut FillWrite);
        let t0 = Instant::now();
        if let Some(n) = t.queue(qd, payload, t0 + deadline, &mut next) {
            let n = n?;
            if write {
                t.flush()?;
            }
            return Ok(n as f64 / t0.elapsed().as_secs_f64());
        }
        let ops = AtomicU64::new(0);
        // Each thread's buffers made before the clock starts.
        let kits: Vec<(Aligned, Option<Writer>)> = (0..qd)
            .map(|_| (Aligned::new(SMALL), write.then(|| Writer::new(pattern))))
            .collect();
        let t0 = Instant::now();
        let errors: Vec<anyhow::Error> = std::thread::scope(|sc| {
            let handles: Vec<_> = kits
                .into_iter()
                .enumerate()
                .map(|(i, (mut buf, mut w))| {
                    let ops = &ops;
                    sc.spawn(move || -> Result<()> {
                        let mut x = splitmix64(seed ^ i as u64) | 1;
                        // At least one batch, however late the thread starts.
                        loop {
                            for _ in 0..16 {
                                let off = z0 + (xorshift(&mut x) % blocks) * SMALL as u64;
                                if let Some(w) = &mut w {
                                    let at = ((x >> 20) as usize % (BLOCK / SMALL)) * SMALL;
                                    t.write_at(w.data(at, SMALL, off), off)?;
                                } else {
                                    t.read_at(buf.as_mut_slice(), off)?;
                                }
                            }
                            ops.fetch_add(16, Ordering::Relaxed);
                            if t0.elapsed() >= deadline {
                                break;
                            }
                        }
                        Ok(())
                    })
                })
                .collect();
            handles
                .into_iter()
                .filter_map(|h| h.join().expect("bench thread").err())
                .collect()
        });
        if let Some(e) = errors.into_iter().next() {
            return Err(e);
        }
        if write {
            t.flush()?;
        }
        Ok(ops.load(Ordering::Relaxed) as f64 / t0.elapsed().as_secs_f64())
    }
}
