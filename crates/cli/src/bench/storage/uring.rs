//! Random 4 KiB requests at a queue depth from one thread, on a file or
//! block device, through io_uring: what fio's libaio and io_uring engines
//! do at `iodepth=32`. A thread per request in flight (the fallback where
//! io_uring is not available) costs the client a context switch per
//! request, more CPU than the target it measures on fast devices.

use super::{Aligned, SMALL};
use io_uring::{opcode, types, IoUring};
use raidkit_nbd::client::FillWrite;
use std::io;
use std::os::unix::io::RawFd;
use std::time::Instant;

/// Keep `qd` requests in flight on `fd` until `deadline`: reads, or with
/// `write` writes whose data it fills in per request. Completed requests;
/// None when io_uring cannot be set up here (the caller falls back).
pub(super) fn run(
    fd: RawFd,
    qd: usize,
    mut write: Option<&mut FillWrite>,
    deadline: Instant,
    next: &mut dyn FnMut() -> u64,
) -> Option<io::Result<u64>> {
    let qd = qd.max(1);
    let mut ring = IoUring::new(qd.next_power_of_two() as u32).ok()?;
    let mut bufs: Vec<Aligned> = (0..qd).map(|_| Aligned::new(SMALL)).collect();
    let mut failed: Option<io::Error> = None;
    let mut in_flight = 0usize;
    let mut done = 0u64;
    // Queue request `slot` at the next offset.
    let mut queue = |ring: &mut IoUring, bufs: &mut [Aligned], slot: usize| -> io::Result<()> {
        let off = next();
        let b = bufs[slot].as_mut_slice();
        let entry = match &mut write {
            Some(fill) => {
                fill(off, b);
                opcode::Write::new(types::Fd(fd), b.as_ptr(), b.len() as u32)
                    .offset(off)
                    .build()
            }
            None => opcode::Read::new(types::Fd(fd), b.as_mut_ptr(), b.len() as u32)
                .offset(off)
                .build(),
        }
        .user_data(slot as u64);
        // SAFETY: the buffer of `slot` lives in `bufs` until this request
        // completes: no slot is queued again before its completion is
        // reaped, and every request is reaped before `bufs` is dropped.
        unsafe { ring.submission().push(&entry) }
            .map_err(|_| io::Error::other("io_uring submission queue full"))
    };
    for slot in 0..qd {
        if let Err(e) = queue(&mut ring, &mut bufs, slot) {
            failed = Some(e);
            break;
        }
        in_flight += 1;
    }
    while in_flight > 0 {
        if let Err(e) = ring.submit_and_wait(1) {
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            // The ring is unusable: its requests cannot be reaped, so the
            // buffers must outlive this function (leaked, not freed under
            // the kernel's feet).
            std::mem::forget(bufs);
            return Some(Err(e));
        }
        let reaped: Vec<(usize, i32)> = ring
            .completion()
            .map(|c| (c.user_data() as usize, c.result()))
            .collect();
        for (slot, res) in reaped {
            in_flight -= 1;
            if res < 0 {
                failed.get_or_insert(io::Error::from_raw_os_error(-res));
            } else if res as usize != SMALL {
                failed.get_or_insert(io::Error::other(format!(
                    "short transfer: {res} of {SMALL} bytes"
                )));
            } else {
                done += 1;
            }
            if failed.is_none() && Instant::now() < deadline {
                match queue(&mut ring, &mut bufs, slot) {
                    Ok(()) => in_flight += 1,
                    Err(e) => failed = Some(e),
                }
            }
        }
    }
    Some(match failed {
        Some(e) => Err(e),
        None => Ok(done),
    })
}
