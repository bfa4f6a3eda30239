//! Reads sent straight from the page cache: when every byte of a large
//! read lies in plain-file members and is cached, the reply is written to
//! the socket from mappings of the member files (see
//! `raidkit_member::map`). One copy, where reading into a buffer first
//! costs two. Unlike splicing (`splice.rs`), the client then copies from
//! socket buffers freshly written by the kernel, which is why this is the
//! way on one machine and splicing over a network.

use super::{Outcome, Stop};
use raidkit_member::{MappedRange, Member};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// One worker's mapped ranges waiting to be sent.
#[derive(Debug, Default)]
pub(crate) struct MappedReads {
    ranges: Vec<MappedRange>,
    /// Bytes waiting to be sent (0: nothing loaded).
    pub(crate) loaded: usize,
    enabled: bool,
}

impl MappedReads {
    pub(crate) fn new(enabled: bool) -> MappedReads {
        MappedReads {
            enabled,
            ..MappedReads::default()
        }
    }

    /// Take `len` bytes at `offset` of `dev` from the page cache.
    /// `Declined`: not possible (not in plain files, not all cached, a
    /// mapping refused), nothing is held: read with `read_at` instead,
    /// which deals with whatever is wrong.
    pub(crate) fn load(&mut self, dev: &dyn Member, offset: u64, len: usize) -> Outcome {
        debug_assert_eq!(self.loaded, 0);
        if !self.enabled {
            return Outcome::Declined;
        }
        let ranges = &mut self.ranges;
        ranges.clear();
        let got = dev.with_file_extents(offset, len as u64, &mut |ext| {
            for e in ext {
                let Some(m) = e.mapper else {
                    return Err(Stop::Declined.into_error());
                };
                if !m.cached(e.offset, e.len, ranges)? {
                    return Err(Stop::Declined.into_error());
                }
            }
            Ok(())
        });
        // Any error (ours, or the mappings' own) leaves the read to
        // `read_at`.
        if matches!(got, Some(Ok(()))) {
            self.loaded = len;
            Outcome::Served
        } else {
            ranges.clear();
            Outcome::Declined
        }
    }

    /// Send the loaded data on `sock` (its header was sent before it),
    /// then let the mappings go.
    pub(crate) fn send(&mut self, sock: BorrowedFd<'_>) -> io::Result<()> {
        let mut iov: Vec<libc::iovec> = self
            .ranges
            .iter()
            .map(|r| libc::iovec {
                iov_base: r.ptr as *mut libc::c_void,
                iov_len: r.len,
            })
            .collect();
        let sent = writev_all(sock, &mut iov);
        self.discard();
        sent
    }

    /// Forget what was loaded.
    pub(crate) fn discard(&mut self) {
        self.ranges.clear();
        self.loaded = 0;
    }
}

/// Write every byte the iovecs describe, however many calls it takes.
/// Hand-written on libc because the data is only ever pointed to: making
/// `IoSlice`s (which nix's and std's writev take) would mean slices over
/// mapped memory that another thread's write may change meanwhile.
fn writev_all(sock: BorrowedFd<'_>, iov: &mut [libc::iovec]) -> io::Result<()> {
    let mut i = 0;
    while i < iov.len() {
        let n = (iov.len() - i).min(libc::UIO_MAXIOV as usize);
        // SAFETY: every iovec points into the header or into a mapping that
        // the loaded ranges keep alive for the whole call.
        let r = unsafe { libc::writev(sock.as_raw_fd(), iov[i..].as_ptr(), n as libc::c_int) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if r == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        let mut done = r as usize;
        while done > 0 {
            if done >= iov[i].iov_len {
                done -= iov[i].iov_len;
                i += 1;
            } else {
                iov[i].iov_base = (iov[i].iov_base as usize + done) as *mut libc::c_void;
                iov[i].iov_len -= done;
                done = 0;
            }
        }
        while i < iov.len() && iov[i].iov_len == 0 {
            i += 1;
        }
    }
    Ok(())
}
