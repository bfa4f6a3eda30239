//! Several reads of one file asked of the kernel in one system call
//! (io_uring), so that the device's queue holds them all at once: a disk
//! then takes them in the order of its head, where reads asked one after
//! the other let another reader's requests in between (a seek each way).
//! `preadv` reads one contiguous range only; io_uring is the kernel's
//! interface for a batch of independent requests, and the `io-uring`
//! crate is its well-kept binding. Each thread that asks keeps a small
//! ring of its own (a ring is not shared between threads without a lock,
//! and the threads that read are long-lived: I/O pool and NBD workers).

use io_uring::{opcode, types, IoUring};
use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};

/// Reads asked through io_uring since the start, process-wide (tests look
/// that the path is taken).
static READS: AtomicU64 = AtomicU64::new(0);

/// Reads asked of members through io_uring so far.
pub fn reads_asked_together() -> u64 {
    READS.load(Ordering::Relaxed)
}

/// Entries of a thread's ring: more runs are asked in batches of this many.
const ENTRIES: usize = 32;

/// Refused submissions after which a thread stops setting up new rings
/// (a kernel that keeps refusing, not one briefly short of memory).
const REFUSALS_KEPT: u32 = 8;

thread_local! {
    /// This thread's ring; None once setting one up failed (no io_uring
    /// in this kernel, or refused by a sandbox): the caller reads the
    /// runs one after the other from then on.
    static RING: RefCell<Option<Option<IoUring>>> = const { RefCell::new(None) };
    /// Submissions this thread's rings had refused.
    static REFUSED: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Read every run of `file` (`(offset, buffer)`, each buffer filled
/// exactly), asked at once. None where io_uring cannot be had on this
/// thread: nothing was read. Buffers and offsets must suit the file's
/// direct I/O; a short read is finished by `pread`.
pub(crate) fn read_runs(file: &File, runs: &mut [(u64, &mut [u8])]) -> Option<io::Result<()>> {
    // A completion's result is an i32 of bytes: larger runs go by pread.
    if runs.iter().any(|r| r.1.len() > 1 << 30) {
        return None;
    }
    RING.with(|cell| {
        let mut cell = cell.borrow_mut();
        let ring = cell.get_or_insert_with(new_ring).as_mut()?;
        if !ring.submission().is_empty() || !ring.completion().is_empty() {
            // Left over from a call that did not finish (a panic): this
            // ring's state is unknown, so it is given up.
            *cell = Some(None);
            return None;
        }
        let mut first_error = None;
        let mut batches = runs.chunks_mut(ENTRIES);
        let mut refused = false;
        for batch in batches.by_ref() {
            match read_batch(ring, file, batch) {
                Some(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                Some(Ok(())) => {}
                None => {
                    // The kernel took none of them, so none is in flight;
                    // they are still queued in this ring, which is
                    // therefore dropped (reused, it would submit them
                    // later, into buffers gone by then). The runs are read
                    // by pread.
                    refused = true;
                    for (offset, buf) in batch.iter_mut() {
                        if let Err(e) = file.read_exact_at(buf, *offset) {
                            first_error.get_or_insert(e);
                        }
                    }
                    break;
                }
            }
        }
        for (offset, buf) in batches.flatten() {
            if let Err(e) = file.read_exact_at(buf, *offset) {
                first_error.get_or_insert(e);
            }
        }
        if refused {
            // A refusal is usually passing (EAGAIN, EBUSY: the kernel
            // short of memory for requests): the next call sets up a new
            // ring, until this thread has seen a few.
            let n = REFUSED.get() + 1;
            REFUSED.set(n);
            *cell = if n < REFUSALS_KEPT { None } else { Some(None) };
        }
        Some(first_error.map_or(Ok(()), Err))
    })
}

/// A ring for this thread, if the kernel has io_uring and its read
/// operation (5.6 and later; before, every read would fail with EINVAL).
fn new_ring() -> Option<IoUring> {
    let ring = IoUring::new(ENTRIES as u32).ok()?;
    let mut probe = io_uring::Probe::new();
    ring.submitter().register_probe(&mut probe).ok()?;
    probe.is_supported(opcode::Read::CODE).then_some(ring)
}

/// Whether this thread can ask reads through io_uring (tests look at the
/// path only where it can).
pub fn available() -> bool {
    RING.with(|cell| cell.borrow_mut().get_or_insert_with(new_ring).is_some())
}

/// One batch of at most `ENTRIES` runs. None: the kernel refused the
/// submission and took none of them (nothing was read).
fn read_batch(
    ring: &mut IoUring,
    file: &File,
    batch: &mut [(u64, &mut [u8])],
) -> Option<io::Result<()>> {
    let fd = types::Fd(file.as_raw_fd());
    let mut sq = ring.submission();
    for (i, (offset, buf)) in batch.iter_mut().enumerate() {
        let e = opcode::Read::new(fd, buf.as_mut_ptr(), buf.len() as u32)
            .offset(*offset)
            .build()
            .user_data(i as u64);
        // SAFETY: every buffer outlives its request: this function does
        // not return before each request the kernel took has completed
        // (below), and the ring is this thread's alone.
        unsafe { sq.push(&e) }.expect("a batch fits the ring");
    }
    drop(sq);
    let mut results: Vec<Option<i32>> = vec![None; batch.len()];
    let mut left = batch.len();
    while left > 0 {
        #[cfg(test)]
        if tests::REFUSE.get() {
            tests::REFUSE.set(false);
            return None;
        }
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // Refused with every entry still queued: none is in flight.
            Err(e) if left == batch.len() && ring.submission().len() == batch.len() => {
                tracing::debug!("io_uring refused member reads: {e}; read by pread");
                return None;
            }
            // Requests may be in flight into these buffers: this thread
            // cannot return before they complete, whatever the kernel says
            // of the wait. It asks again (a busy kernel: EAGAIN, EBUSY).
            Err(e) => {
                tracing::debug!("io_uring wait for member reads: {e}; asking again");
                std::thread::sleep(std::time::Duration::from_millis(1))
            }
        }
        for c in ring.completion() {
            let slot = results.get_mut(c.user_data() as usize);
            if let Some(slot) = slot.filter(|r| r.is_none()) {
                *slot = Some(c.result());
                #[cfg(test)]
                if tests::AGAIN.get() {
                    tests::AGAIN.set(false);
                    *slot = Some(-libc::EAGAIN);
                }
                left -= 1;
            }
        }
    }
    READS.fetch_add(batch.len() as u64, Ordering::Relaxed);
    let mut first_error = None;
    for ((offset, buf), res) in batch.iter_mut().zip(results) {
        let res = res.expect("every request completed");
        let done = match usize::try_from(res) {
            Ok(n) => n.min(buf.len()),
            // Passing refusals of the request, not the disk's errors: the
            // whole run is read again by pread below.
            Err(_) if [libc::EAGAIN, libc::EINTR, libc::ECANCELED].contains(&-res) => 0,
            Err(_) => {
                first_error.get_or_insert(io::Error::from_raw_os_error(-res));
                continue;
            }
        };
        if done < buf.len() {
            // A short read (the end of a file, a signal): the rest as any
            // read, which says why if it cannot be had.
            if let Err(e) = file.read_exact_at(&mut buf[done..], *offset + done as u64) {
                first_error.get_or_insert(e);
            }
        }
    }
    Some(first_error.map_or(Ok(()), Err))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    thread_local! {
        /// The next submission on this thread is refused, as a kernel
        /// short of memory refuses one.
        pub(super) static REFUSE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        /// The next request completes with EAGAIN, refused in passing.
        pub(super) static AGAIN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// The counter of reads asked together is the process's: the tests
    /// that look at it run one at a time.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// One at a time, where this thread can have a ring (None: nothing to
    /// test).
    fn serial() -> Option<std::sync::MutexGuard<'static, ()>> {
        let one = SERIAL
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !available() {
            eprintln!("no io_uring here: nothing to test");
            return None;
        }
        Some(one)
    }

    /// A file of 64 KiB of a pattern, and the pattern.
    fn patterned() -> (File, Vec<u8>) {
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..64 * 1024u32).map(|i| (i * 7 % 251) as u8).collect();
        f.write_all(&data).unwrap();
        (f, data)
    }

    /// Two runs of `f` asked together, and read as `data` holds them.
    /// None where no ring could be had.
    fn ask_two(f: &File, data: &[u8]) -> Option<io::Result<()>> {
        let (mut a, mut b) = (vec![0u8; 4096], vec![0u8; 8192]);
        let r = read_runs(f, &mut [(4096, &mut a[..]), (32768, &mut b[..])])?;
        if r.is_ok() {
            assert_eq!(a, &data[4096..8192]);
            assert_eq!(b, &data[32768..40960]);
        }
        Some(r)
    }

    #[test]
    fn a_refused_submission_reads_by_pread_and_a_new_ring_is_set_up_until_refusals_repeat() {
        let Some(_one) = serial() else { return };
        let (f, data) = patterned();
        for refusal in 1..=REFUSALS_KEPT {
            REFUSE.set(true);
            let before = reads_asked_together();
            ask_two(&f, &data).expect("a ring was set up").unwrap();
            assert_eq!(reads_asked_together(), before, "refused: read by pread");
            assert_eq!(
                available(),
                refusal < REFUSALS_KEPT,
                "after refusal {refusal}: a new ring unless refusals repeat"
            );
            if refusal < REFUSALS_KEPT {
                let before = reads_asked_together();
                ask_two(&f, &data).expect("a new ring").unwrap();
                assert!(
                    reads_asked_together() >= before + 2,
                    "asked through the new ring"
                );
            }
        }
        assert!(ask_two(&f, &data).is_none(), "given up");
    }

    #[test]
    fn a_request_refused_in_passing_is_read_again() {
        let Some(_one) = serial() else { return };
        let (f, data) = patterned();
        AGAIN.set(true);
        ask_two(&f, &data)
            .expect("a ring")
            .expect("EAGAIN is no error of the file's");
        assert!(!AGAIN.get(), "the fault was planted");
    }
}
