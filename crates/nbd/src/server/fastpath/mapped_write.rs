//! Writes received straight into the page cache: when a large write goes
//! to cached pages of plain-file members and nothing else (no copy to keep
//! in step; a parity array takes whole stripes and computes their parity
//! afterwards), its payload is received from the socket straight into
//! mappings of the member files (see `raidkit_member::map`): one copy where
//! a buffer costs two. A run of pipelined writes can go together (a parity
//! array's stripes are often larger than one write; see `run.rs`).

use super::{Outcome, Stop};
use crate::proto::{parse_request, Request, REQUEST_LEN};
use crate::stream::Stream;
use raidkit_member::{FileExtent, MappedRange, Member};
use std::io::{self, BufRead, BufReader, Read};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::fs::FileExt;
use std::sync::MutexGuard;

/// One worker's means of receiving write payloads into the page cache.
#[derive(Debug, Default)]
pub(crate) struct MappedWrites {
    ranges: Vec<MappedRange>,
}

/// How much of a run of writes' payloads `MappedWrites::receive` dealt
/// with. Positions count payload bytes from the start of the run.
#[derive(Debug, Default)]
pub(crate) struct Received {
    /// The first `placed` bytes are written to the device.
    pub(crate) placed: usize,
    /// The bytes from `placed` up to `have` are in the caller's buffer,
    /// still to be written; the rest of the requests taken is still in the
    /// socket.
    pub(crate) have: usize,
    /// The end of the last request whose header was taken (the first
    /// request's header is the caller's).
    pub(crate) end: usize,
}

impl MappedWrites {
    /// Take the payloads of `run`, contiguous writes whose headers have all
    /// arrived (the first one's already taken from `r`, the others only
    /// peeked at), as far as possible straight into the member files of
    /// `dev` (`Member::with_write_extents`): the first `have` bytes, which
    /// the caller has already read into `buf` (at most the first payload),
    /// and those `r` has buffered with `pwrite`, the rest with `recv` into
    /// the mappings. The headers of the later requests are taken from `r`
    /// on the way and added to `taken`. Stops at the first thing that goes
    /// wrong with a member (a page not cached, a refused mapping, a fault
    /// while receiving) and says how far it got; the caller reads and
    /// writes the rest the ordinary way, which also reports the error. With
    /// every payload in, `reader` is let go. `Err`: the connection failed.
    pub(crate) fn receive(
        &mut self,
        reader: &mut Option<MutexGuard<'_, BufReader<Stream>>>,
        dev: &dyn Member,
        run: &[Request],
        buf: &mut [u8],
        have: usize,
        taken: &mut Vec<Request>,
    ) -> io::Result<(Outcome, Received)> {
        let Some(first) = run.first() else {
            return Ok((Outcome::Declined, Received::default()));
        };
        debug_assert!(have <= first.len as usize);
        let mut got = Received {
            end: first.len as usize,
            have,
            ..Received::default()
        };
        let ranges = &mut self.ranges;
        let mut socket = Ok(());
        let outcome = dev.with_write_extents(first.offset, buf.len() as u64, &mut |ext| {
            let r = reader.as_mut().expect("reader held");
            ranges.clear();
            for e in ext {
                // Not mapped, not cached, or no mapping to be had: nothing
                // is written.
                let Some(m) = e.mapper else {
                    return Err(Stop::Declined.into_error());
                };
                if !matches!(m.cached_for_write(e.offset, e.len, ranges), Ok(true)) {
                    return Err(Stop::Declined.into_error());
                }
            }
            let mut pos = 0;
            for (i, req) in run.iter().enumerate() {
                let n = req.len as usize;
                if i > 0 {
                    let mut hb = [0u8; REQUEST_LEN];
                    if let Err(e) = r.read_exact(&mut hb) {
                        socket = Err(e);
                        return Err(Stop::Connection.into_error());
                    }
                    // The bytes peeked at before: the same request.
                    debug_assert_eq!(parse_request(&hb).ok(), Some(*req));
                    taken.push(*req);
                    got.end = pos + n;
                }
                let sub_ext = window(
                    ext,
                    pos as u64,
                    n as u64,
                    |e| e.len,
                    |e, skip, len| FileExtent {
                        offset: e.offset + skip,
                        len,
                        ..*e
                    },
                );
                let sub_ranges = window(
                    ranges,
                    pos as u64,
                    n as u64,
                    |m| m.len as u64,
                    |m, skip, len| m.sub(skip as usize, len as usize),
                );
                let mut one = Received::default();
                let head = have.saturating_sub(pos);
                match place(
                    r,
                    &sub_ext,
                    &sub_ranges,
                    &mut buf[pos..pos + n],
                    head,
                    &mut one,
                ) {
                    Ok(true) => {}
                    Ok(false) => {
                        got.placed = pos + one.placed;
                        got.have = pos + one.have;
                        return Err(Stop::Member.into_error());
                    }
                    Err(e) => {
                        socket = Err(e);
                        return Err(Stop::Connection.into_error());
                    }
                }
                pos += n;
                got.placed = pos;
                got.have = pos;
            }
            // Every payload is in: other workers may take the next requests
            // while the device finishes these (a parity array's parity).
            reader.take();
            Ok(())
        });
        ranges.clear();
        socket?;
        let outcome = match outcome {
            None => Outcome::Declined,
            Some(Ok(())) => Outcome::Served,
            Some(Err(e)) => match Stop::of(&e) {
                Some(Stop::Declined) => Outcome::Declined,
                Some(Stop::Member | Stop::Connection) => Outcome::Stopped,
                // The device's own work after the placing failed: it put
                // its error in place of ours, or of our success.
                None => Outcome::DeviceFailed(e.to_string()),
            },
        };
        Ok((outcome, got))
    }
}

/// The part `[pos, pos + n)` of a list of pieces laid end to end, cut with
/// `cut(piece, skip, len)`.
fn window<T>(
    items: &[T],
    pos: u64,
    n: u64,
    len_of: impl Fn(&T) -> u64,
    cut: impl Fn(&T, u64, u64) -> T,
) -> Vec<T> {
    let mut out = Vec::new();
    let mut at = 0;
    for it in items {
        let l = len_of(it);
        let (a, b) = (pos.max(at), (pos + n).min(at + l));
        if a < b {
            out.push(cut(it, a - at, b - a));
        }
        at += l;
        if at >= pos + n {
            break;
        }
    }
    out
}

/// Place a write's payload, `buf.len()` bytes, in `ext` (the file extents
/// it goes to, in order; `ranges`: their mappings, in order): the first
/// `have` bytes, already in `buf`, and those `r` has buffered by `pwrite`
/// (through `buf`, so that they are not lost if that fails), the rest by
/// `recv` into the mappings. Says how far it got in `got`. `Ok(false)`: a
/// member refused (a write error, a fault in a mapping); `Err`: the
/// connection failed.
fn place(
    r: &mut BufReader<Stream>,
    ext: &[FileExtent<'_>],
    ranges: &[MappedRange],
    buf: &mut [u8],
    have: usize,
    got: &mut Received,
) -> io::Result<bool> {
    let len = buf.len();
    let have = have.min(len);
    let more = r.buffer().len().min(len - have);
    buf[have..have + more].copy_from_slice(&r.buffer()[..more]);
    r.consume(more);
    let head = have + more;
    got.have = head;
    let mut at = 0;
    for e in ext {
        if at == head {
            break;
        }
        let n = (e.len as usize).min(head - at);
        if e.file.write_all_at(&buf[at..at + n], e.offset).is_err() {
            return Ok(false);
        }
        at += n;
    }
    got.placed = head;
    let fd = r.get_ref().as_fd();
    let mut skip = head;
    // Each range lies in one extent (they were found extent by extent):
    // where it lies in its file, and whom to tell as it lands.
    let (mut e, mut into) = (0, 0);
    for m in ranges {
        let ex = &ext[e];
        let offset = ex.offset + into;
        into += m.len as u64;
        if into >= ex.len {
            (e, into) = (e + 1, 0);
        }
        // Received a piece at a time where someone is told (see
        // `LANDING_PIECE`), else at once.
        let piece = if ex.landed.is_some() {
            LANDING_PIECE
        } else {
            m.len
        };
        let (mut at, mut told) = (skip.min(m.len), 0);
        skip -= at;
        loop {
            if let Some(l) = ex
                .landed
                .filter(|_| at > told && (at == m.len || at % piece == 0))
            {
                l.landed(offset + told as u64, &m.sub(told, at - told));
                told = at;
            }
            if at == m.len {
                break;
            }
            let end = (at / piece + 1) * piece;
            let want = end.min(m.len) - at;
            // SAFETY: the range lies in a writable shared mapping that `m`
            // keeps mapped; only the kernel writes through it.
            let ptr = unsafe { m.ptr.cast_mut().add(at) };
            let n = recv_all(fd, ptr, want)?;
            got.placed += n;
            got.have = got.placed;
            if n < want {
                // A fault: the bytes it stopped at are still in the socket.
                return Ok(false);
            }
            at += n;
        }
    }
    Ok(true)
}

/// How much of a write is received before the member under it is told
/// that it landed (`FileExtent::landed`): small enough that the bytes are
/// still in the CPU's cache when it reads them (a checked member takes
/// their checksums), large enough that the extra system calls cost
/// little. A range of a striped array is one chunk, usually less.
const LANDING_PIECE: usize = 256 << 10;

/// Receive `len` bytes from `sock` into `ptr`. Fewer: receiving into the
/// memory there faulted (`EFAULT`), and the bytes from there on are still
/// in the socket. Hand-written on libc for the reason `writev_all` is.
fn recv_all(sock: BorrowedFd<'_>, ptr: *mut u8, len: usize) -> io::Result<usize> {
    let mut at = 0;
    while at < len {
        // SAFETY: [ptr, ptr + len) is writable memory (a shared mapping
        // kept alive by the caller); the kernel checks every page it
        // touches and reports a fault as EFAULT.
        let r = unsafe {
            libc::recv(
                sock.as_raw_fd(),
                ptr.add(at).cast(),
                len - at,
                libc::MSG_WAITALL,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EFAULT) => return Ok(at),
                _ => return Err(e),
            }
        }
        if r == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        at += r as usize;
    }
    Ok(at)
}

#[cfg(test)]
mod tests;
