//! A regular member file's size, watched: another process can cut the file
//! short under a running array, and a write past the cut would silently grow
//! it back with a hole of zeroes in between. Shared by the file engines.

use crate::{MemberError, Op, Result};
use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// How often, at most, reads and writes of a regular file look at its size
/// (an fstat: about a microsecond here, as much as a 4 KiB write to the page
/// cache, so once per write cost a third of the 4 KiB random-write rate;
/// docs/performance.md). Flushes always look.
const SIZE_CHECK_EVERY_NS: u64 = 1_000_000;

/// Nanoseconds since the first call: a cheap, monotonic clock (vDSO).
fn clock_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
}

/// The size a member file had when opened (or grew to, `grow`), and
/// whether it still has it.
#[derive(Debug, Default)]
pub(crate) struct SizeWatch {
    len: AtomicU64,
    /// A regular file; a device cannot shrink, so nothing is watched.
    regular: bool,
    /// Found shorter than `len`: every operation fails from then on.
    shrunk: AtomicBool,
    /// When (`clock_ns`) reads and writes next look at the file's size.
    next_size_check: AtomicU64,
}

impl SizeWatch {
    pub fn new(len: u64, regular: bool) -> SizeWatch {
        SizeWatch {
            len: AtomicU64::new(len),
            regular,
            ..SizeWatch::default()
        }
    }

    /// The member's length in use.
    pub fn len(&self) -> u64 {
        self.len.load(Ordering::Acquire)
    }

    /// Look at the file's or device's size anew and use it to its end from
    /// now on if it grew (whole `align`-byte units). A size below the one
    /// in use changes nothing (a file cut short is `check`'s business).
    pub fn grow(&self, file: &File, name: &str, align: u64) -> Result<u64> {
        let now = self.peek(file, name, align)?;
        self.len.fetch_max(now, Ordering::AcqRel);
        Ok(self.len())
    }

    /// The length `grow` would use now, without using it: a grow that may
    /// yet be refused must leave the member as it was.
    pub fn peek(&self, file: &File, name: &str, align: u64) -> Result<u64> {
        let now = if self.regular {
            file.metadata().map(|m| m.len())
        } else {
            crate::sys::device_size(file)
        }
        .map_err(|e| MemberError::new(name, Op::Read, 0, 0, e))?;
        Ok((now / align * align).max(self.len()))
    }

    /// The checks before a read or write of `[offset, offset + len)`: within
    /// the member, and (`check_soon`) the file not cut short.
    pub fn access(&self, file: &File, name: &str, op: Op, offset: u64, len: u64) -> Result<()> {
        crate::check_range(name, op, offset, len, self.len())?;
        self.check_soon(file, name, op, offset, len)
    }

    /// `flush` of the file engines: the size checked, then fdatasync.
    pub fn sync_data(&self, file: &File, name: &str) -> Result<()> {
        self.check(file, name, Op::Flush, 0, 0)?;
        file.sync_data()
            .map_err(|e| MemberError::new(name, Op::Flush, 0, 0, e))
    }

    /// `check`, at most once every `SIZE_CHECK_EVERY_NS` (and on every call
    /// once the file was found short). A file cut by another process is
    /// found within that time by reads and writes, and by the next flush in
    /// any case; until then a write past the cut grows the file back (a
    /// write to its very last block would hide the cut from later checks; a
    /// short read is found at once).
    pub fn check_soon(&self, file: &File, name: &str, op: Op, offset: u64, len: u64) -> Result<()> {
        if !self.regular {
            return Ok(());
        }
        if !self.shrunk.load(Ordering::Relaxed) {
            let now = clock_ns();
            if now < self.next_size_check.load(Ordering::Relaxed) {
                return Ok(());
            }
            self.next_size_check
                .store(now + SIZE_CHECK_EVERY_NS, Ordering::Relaxed);
        }
        self.check(file, name, op, offset, len)
    }

    /// Fail if the file has become shorter than it was when opened (cut by
    /// another process). An fstat of a regular file.
    pub fn check(&self, file: &File, name: &str, op: Op, offset: u64, len: u64) -> Result<()> {
        if !self.regular {
            return Ok(());
        }
        let now = if self.shrunk.load(Ordering::Acquire) {
            None
        } else {
            match file.metadata() {
                Ok(m) if m.len() >= self.len() => return Ok(()),
                Ok(m) => Some(m.len()),
                Err(e) => return Err(MemberError::new(name, op, offset, len, e)),
            }
        };
        self.shrunk.store(true, Ordering::Release);
        Err(MemberError::new(
            name,
            op,
            offset,
            len,
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                match now {
                    Some(n) => format!("the file shrank to {n} bytes from {}", self.len()),
                    None => format!("the file shrank below {} bytes", self.len()),
                },
            ),
        ))
    }

    /// A read that came up short: the reason, if the file was cut.
    pub fn explain_short_read(
        &self,
        file: &File,
        name: &str,
        offset: u64,
        len: u64,
        e: io::Error,
    ) -> MemberError {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            if let Err(shrunk) = self.check(file, name, Op::Read, offset, len) {
                return shrunk;
            }
        }
        MemberError::new(name, Op::Read, offset, len, e)
    }
}
