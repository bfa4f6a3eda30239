//! Zero-copy read replies: data that lies in plain files is moved file →
//! pipe → socket with splice(2) and never copied into this process. A
//! buffered reply copies it twice (into a buffer, then into the socket);
//! nbdkit's file plugin and qemu-nbd do. No crate offers this over our
//! `Member` abstraction, so it is written here on nix's splice.
//!
//! The pipe is filled first, before the reply header is sent: a member
//! that fails to give its data (an I/O error) is then noticed while the
//! read can still be served the ordinary way, through `read_at`, which
//! cures the error from redundancy or fails the member as it should.
//!
//! Splicing pays over a network, not on one machine: the client then
//! copies the data out of the file system's cache rather than out of
//! freshly written socket buffers (see `ZeroCopy`).

use super::Outcome;
use crate::stream::Stream;
use nix::fcntl::{fcntl, splice, FcntlArg, OFlag, SpliceFFlags};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use raidkit_member::{FileExtent, Member};
use std::io;
use std::os::fd::OwnedFd;

/// Reads at least this big are spliced (smaller replies are better
/// coalesced with others in the reply buffer).
pub(crate) const SPLICE_MIN: usize = 64 << 10;
/// Pipe sizes asked for, in turn: the largest read that can be spliced is
/// a page or two less (a range that starts inside a page spans one more).
/// 1 MiB is what an unprivileged process may ask for by default
/// (/proc/sys/fs/pipe-max-size); more needs CAP_SYS_RESOURCE.
const PIPE_SIZES: [i32; 2] = [2 << 20, 1 << 20];
const PAGE: u64 = 4096;

/// One worker's pipe.
#[derive(Debug, Default)]
pub(crate) struct Splicer {
    pipe: Option<(OwnedFd, OwnedFd)>,
    cap: usize,
    /// Bytes in the pipe, waiting for `send`.
    pub(crate) loaded: usize,
    /// Turned off, or the system refused a pipe.
    disabled: bool,
}

impl Splicer {
    /// A splicer that splices (`enabled`) or always declines.
    pub(crate) fn new(enabled: bool) -> Splicer {
        Splicer {
            disabled: !enabled,
            ..Splicer::default()
        }
    }

    /// Move `len` bytes at `offset` of `dev` into the pipe. `Declined`:
    /// not possible (no plain files under that range, too large, an error),
    /// and the pipe is empty: read with `read_at` instead.
    pub(crate) fn load(&mut self, dev: &dyn Member, offset: u64, len: usize) -> Outcome {
        debug_assert_eq!(self.loaded, 0);
        if self.disabled || len < SPLICE_MIN {
            return Outcome::Declined;
        }
        if self.pipe.is_none() {
            match new_pipe() {
                Ok((p, cap)) => {
                    self.pipe = Some(p);
                    self.cap = cap;
                }
                Err(e) => {
                    tracing::debug!("no pipe for zero-copy reads: {e}");
                    self.disabled = true;
                    return Outcome::Declined;
                }
            }
        }
        if len > self.cap {
            return Outcome::Declined;
        }
        let Some((_, w)) = &self.pipe else {
            return Outcome::Declined;
        };
        let (cap, mut fits) = (self.cap as u64, false);
        let loaded = dev.with_file_extents(offset, len as u64, &mut |ext: &[FileExtent<'_>]| {
            // Each page of the files takes a slot of the pipe, which must
            // hold them all: a range that would not fit is not started.
            let pages: u64 = ext
                .iter()
                .map(|e| (e.offset + e.len).div_ceil(PAGE) - e.offset / PAGE)
                .sum();
            fits = pages * PAGE <= cap;
            if fits {
                for e in ext {
                    fill(e, w)?;
                }
            }
            Ok(())
        });
        match loaded {
            Some(Ok(())) if fits => {
                self.loaded = len;
                Outcome::Served
            }
            Some(Ok(())) | None => Outcome::Declined,
            Some(Err(e)) => {
                // Whatever got in stays there: start again with a new pipe.
                tracing::debug!("zero-copy read of {len} bytes at {offset} failed: {e}");
                self.pipe = None;
                Outcome::Declined
            }
        }
    }

    /// Send `header`, then what `load` put in the pipe, on `s`. On an
    /// error the pipe is dropped (the connection is finished anyway).
    pub(crate) fn send(&mut self, s: &mut Stream, header: &[u8]) -> io::Result<()> {
        let Some((r, _)) = &self.pipe else {
            return Err(io::Error::other("nothing loaded"));
        };
        s.send_more(header)?;
        let sock = s.as_fd();
        let mut left = std::mem::take(&mut self.loaded);
        while left > 0 {
            match splice(r, None, sock, None, left, SpliceFFlags::SPLICE_F_MOVE) {
                Ok(0) => {
                    self.pipe = None;
                    return Err(io::ErrorKind::WriteZero.into());
                }
                Ok(n) => left -= n,
                Err(nix::errno::Errno::EINTR) => {}
                Err(nix::errno::Errno::EAGAIN) => {
                    // The socket is full and the splice was not let wait.
                    let mut fds = [PollFd::new(sock, PollFlags::POLLOUT)];
                    if let Err(e) = poll(&mut fds, PollTimeout::NONE) {
                        if e != nix::errno::Errno::EINTR {
                            self.pipe = None;
                            return Err(e.into());
                        }
                    }
                }
                Err(e) => {
                    self.pipe = None;
                    return Err(e.into());
                }
            }
        }
        Ok(())
    }

    /// Forget a load that will not be sent.
    pub(crate) fn discard(&mut self) {
        if self.loaded > 0 {
            self.loaded = 0;
            self.pipe = None;
        }
    }
}

/// A pipe of (about) PIPE_SIZE bytes, non-blocking so that a range that does
/// not fit (an unaligned one may need a page more) fails instead of waiting
/// for a reader that is this very thread.
fn new_pipe() -> io::Result<((OwnedFd, OwnedFd), usize)> {
    let (r, w) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
    let cap = PIPE_SIZES
        .iter()
        .find_map(|&n| fcntl(&w, FcntlArg::F_SETPIPE_SZ(n)).ok())
        .map_or_else(|| fcntl(&w, FcntlArg::F_GETPIPE_SZ), Ok)?;
    Ok(((r, w), cap as usize))
}

/// Splice one file range into the pipe.
fn fill(e: &FileExtent<'_>, w: &OwnedFd) -> io::Result<()> {
    let mut off = i64::try_from(e.offset).map_err(io::Error::other)?;
    let mut left = e.len as usize;
    while left > 0 {
        match splice(
            e.file,
            Some(&mut off),
            w,
            None,
            left,
            SpliceFFlags::SPLICE_F_MOVE,
        ) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => left -= n,
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
