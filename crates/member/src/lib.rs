//! The one interface every array member goes through.
//!
//! A [`Member`] is anything with a fixed length that can be read and written
//! at byte offsets and flushed to stable storage: a file or block device,
//! through the page cache (`file.rs`) or with direct I/O (`direct.rs`; which
//! one a path gets is [`IoMode`], `mode.rs`), a fault-injecting wrapper (`fault.rs`), a simulated disk
//! (`sim.rs`), or another array (which is how RAID-50/60 nest). The test
//! members, a perfect disk in memory (`mem.rs`) and one that loses unflushed
//! writes at a power cut (`powercut.rs`), model storage for the crash tests.
//! Access to a member file's page cache (mapped windows, `map.rs`, and the
//! SIGBUS guard around touching them, `guard.rs`) is a capability a member
//! may offer (`Member::as_mapper`), not something every member has. Methods take `&self` so that
//! one member can serve concurrent requests; implementations synchronise
//! internally (positional I/O needs no lock at all).
//!
//! ```no_run
//! use raidkit_member::{FileMember, Member};
//! let m = FileMember::open("disk0.img", false).unwrap();
//! let mut buf = [0u8; 512];
//! m.read_at(&mut buf, 4096).unwrap();
//! ```

pub mod aligned;
pub mod direct;
pub mod fault;
pub mod file;
pub mod guard;
pub mod map;
pub mod mem;
pub mod mode;
pub mod powercut;
pub mod readahead;
pub mod sim;
mod sys;
pub mod units;
mod uring;
mod watch;
pub mod writebehind;

pub use aligned::{AlignedBuf, AlignedVec};
pub use direct::DirectMember;
pub use fault::{FaultConfig, FaultMember};
pub use file::FileMember;
pub use guard::{guarded, Fault};
pub use map::{MappedRange, Mapper};
pub use mem::MemMember;
pub use mode::{create_member, open_member, IoMode, OpenedMember};
pub use powercut::{CutRng, PowerCutMember};
pub use readahead::ReadAhead;
pub use sim::{SimConfig, SimDisk};
pub use sys::InUse;
pub use uring::{available as uring_available, reads_asked_together};
pub use writebehind::{BehindCounts, WriteBehind};

use std::fmt;
use std::fs::File;
use std::io;

/// The operation that failed, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Open,
    /// Making a new member file of its size.
    Create,
    Read,
    Write,
    Flush,
    Discard,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Open => "open",
            Op::Create => "create",
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Discard => "discard",
        })
    }
}

/// An I/O error on one member, with the context needed to act on it:
/// which member, which operation, where.
#[derive(Debug, thiserror::Error)]
#[error("{}", self.describe())]
pub struct MemberError {
    pub member: String,
    pub op: Op,
    pub offset: u64,
    pub len: u64,
    #[source]
    pub source: io::Error,
}

impl MemberError {
    /// An open says what could not be opened and why; an I/O error also
    /// where.
    fn describe(&self) -> String {
        match self.op {
            Op::Open => format!("{}: cannot open: {}", self.member, self.source),
            Op::Create => format!("{}: cannot create: {}", self.member, self.source),
            op => format!(
                "{}: {op} of {} bytes at offset {} failed: {}",
                self.member, self.len, self.offset, self.source
            ),
        }
    }

    pub fn new(member: &str, op: Op, offset: u64, len: u64, source: io::Error) -> MemberError {
        MemberError {
            member: member.to_string(),
            op,
            offset,
            len,
            source,
        }
    }

    /// An access outside the member's bounds.
    pub fn out_of_range(member: &str, op: Op, offset: u64, len: u64, size: u64) -> MemberError {
        MemberError::new(
            member,
            op,
            offset,
            len,
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("beyond the end of the member ({size} bytes)"),
            ),
        )
    }
}

pub type Result<T, E = MemberError> = std::result::Result<T, E>;

/// A storage member of an array.
pub trait Member: Send + Sync + fmt::Debug {
    /// A human name for messages (usually the path).
    fn name(&self) -> &str;
    /// Size in bytes.
    fn len(&self) -> u64;
    /// The member's length looked at anew: a file or device that grew
    /// since it was opened is used to its new end from then on (`raidkit
    /// grow --size max`). Never less than `len()` was. Members that cannot
    /// grow (memory, remote exports) say `len()`; wrappers ask what they
    /// wrap.
    fn refresh_len(&self) -> Result<u64> {
        Ok(self.len())
    }
    /// The length `refresh_len` would use now, without using it (a grow
    /// looks before it knows it will go ahead: refused, it must leave the
    /// member's length as it was). Wrappers ask what they wrap.
    fn peek_len(&self) -> Result<u64> {
        Ok(self.len())
    }
    /// Read exactly `buf.len()` bytes at `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()>;
    /// Read several ranges, each exactly: the pieces one request needs
    /// from this member that do not lie one after the other (a parity
    /// chunk or the other copy's chunk between them). Asked of a disk one
    /// after the other, they let another reader's requests in between,
    /// and the head seeks back and forth; asked together, the disk's
    /// queue holds them all and takes them in order. Members that wait
    /// for a device ask them at once; the default reads them one after
    /// the other. On an error, the ranges' contents are unspecified.
    fn read_runs(&self, runs: &mut [(u64, &mut [u8])]) -> Result<()> {
        runs.iter_mut()
            .try_for_each(|(offset, buf)| self.read_at(buf, *offset))
    }
    /// Write all of `buf` at `offset`.
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()>;
    /// Make every completed write durable.
    fn flush(&self) -> Result<()>;
    /// Write all of `buf` at `offset` and return once those bytes are
    /// durable (a FUA write), without making any other pending write
    /// durable where the member can tell them apart. The default writes
    /// and flushes everything, which is durable but costs a whole flush.
    fn write_at_durable(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.write_at(buf, offset)?;
        self.flush()
    }
    /// The block size I/O should be aligned to, as a hint: reads and writes
    /// at offsets and lengths that are multiples of it (from an
    /// [`AlignedBuf`]) reach the device without a bounce copy or a
    /// read-modify-write. Any offset and length still works. 1: no
    /// preference (buffered files, memory, arrays).
    fn block_size(&self) -> u32 {
        1
    }
    /// Whether the member is on a spinning disk, where reaching another
    /// offset costs a seek of milliseconds: as the kernel says of its
    /// device (`queue/rotational`). None where that is not known (memory,
    /// a remote member, an array). Mirrored levels read copies on spinning
    /// disks as md does: a sequential reader stays on the copy whose head
    /// is where it reads, other reads go to the nearest head.
    fn rotational(&self) -> Option<bool> {
        None
    }
    /// Flush and let go: a member with state of its own (an array) records
    /// a clean shutdown here. Called once, when its user is done with it.
    fn close(&self) -> Result<()> {
        self.flush()
    }
    /// Whether the member has zero length.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Declare a range unused. The default writes zeroes, which every member
    /// supports; members that can deallocate override it.
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        write_zeroes(self, offset, len)
    }
    /// The plain file (or block device) that holds this member's bytes at
    /// the same offsets, if that is all it is: no wrapper that changes,
    /// delays or checks what is read.
    fn as_file(&self) -> Option<&File> {
        None
    }
    /// Whether the member's writes are copies into the page cache that do
    /// not wait for a device (a buffered file or block device), seen
    /// through any wrapper that only checks what passes: work for such
    /// members is not worth handing to other threads.
    fn buffered(&self) -> bool {
        self.as_file().is_some()
    }
    /// Mapped windows of the file `as_file` gives, for replies sent
    /// straight from the page cache (see [`map`]).
    fn as_mapper(&self) -> Option<&Mapper> {
        None
    }
    /// Zero-copy reads (splice): when `[offset, offset + len)` can be read
    /// straight from plain files with no redundancy work, call `f` with the
    /// pieces in order, while they are sure to stay open, and return what
    /// it returns. None: use `read_at`. The bytes in the pieces are exactly
    /// what `read_at` would return; if `f` fails to move them, the caller
    /// falls back to `read_at`, which deals with the error (a redundant
    /// array cures it or fails the member).
    fn with_file_extents(
        &self,
        offset: u64,
        len: u64,
        f: &mut dyn FnMut(&[FileExtent<'_>]) -> io::Result<()>,
    ) -> Option<io::Result<()>> {
        let file = self.as_file()?;
        let end = offset.checked_add(len)?;
        if end > self.len() {
            return None;
        }
        Some(f(&[FileExtent {
            file,
            mapper: self.as_mapper(),
            offset,
            len,
            landed: None,
        }]))
    }
    /// Writes placed straight into plain files: when writing
    /// `[offset, offset + len)` comes down to writing the same bytes at the
    /// extents of plain files open for writing (no copy to keep in step),
    /// call `f` with the extents in order and return what it returns. What
    /// `f` writes there, through the file or its mapping, is written to the
    /// member. A parity array offers whole stripes and, once `f` returns,
    /// brings their parity up to date from what the data extents hold
    /// (unless `f` returned `ErrorKind::WouldBlock`, which says it wrote
    /// nothing); an error of its own there comes back as
    /// `ErrorKind::Other`. None: use `write_at`. If `f` fails part-way, the
    /// caller writes the rest with `write_at`, which deals with whatever is
    /// wrong.
    fn with_write_extents(
        &self,
        offset: u64,
        len: u64,
        f: &mut dyn FnMut(&[FileExtent<'_>]) -> io::Result<()>,
    ) -> Option<io::Result<()>> {
        if !self.as_mapper()?.writable() {
            return None;
        }
        self.with_file_extents(offset, len, f)
    }
    /// A member reached over a network (an NBD export): its link, which
    /// can drop and be made again. None for local members; wrappers that
    /// only check or delay what passes give their inner member's.
    fn remote(&self) -> Option<&dyn Remote> {
        None
    }
}

/// The link to a member on another host.
pub trait Remote: Send + Sync {
    /// Why the connection is down, if it is: requests fail at once until
    /// [`Remote::reconnect`] succeeds.
    fn lost(&self) -> Option<String>;
    /// Drop the connection (a request got no answer in time): requests in
    /// flight fail now instead of waiting for the network to say so.
    fn cut(&self, why: &str);
    /// Connect again, giving up after `timeout`. The export must be the
    /// same size; what is on it is for the caller to check.
    fn reconnect(&self, timeout: std::time::Duration) -> std::io::Result<()>;
}

/// `len` bytes at `offset` in `file`: where a piece of a member's contents
/// lies (see [`Member::with_file_extents`]).
#[derive(Debug, Clone, Copy)]
pub struct FileExtent<'a> {
    pub file: &'a File,
    /// The file's mapped windows, if it has them.
    pub mapper: Option<&'a Mapper>,
    pub offset: u64,
    pub len: u64,
    /// For a write placed straight into the extent's mapping: what to tell
    /// as each part of it lands (a checked member under the file, which
    /// takes the blocks' checksums there, while the bytes are still in the
    /// CPU's cache, instead of reading them back from memory when the
    /// write ends). None: nothing to tell.
    pub landed: Option<&'a dyn Landed>,
}

/// Told, by a write that places data straight into a file's mapping (see
/// [`Member::with_write_extents`]), what it has placed so far.
pub trait Landed: Sync + std::fmt::Debug {
    /// `range`, the mapping of the file at `offset`, holds what the write
    /// placed there, which stays as it is until the write ends. Whole
    /// blocks of it count; parts of blocks are left to the end of the
    /// write. Called only for extents the write was given.
    fn landed(&self, offset: u64, range: &MappedRange);
}

/// Write `len` zero bytes at `offset`, a MiB at a time.
pub fn write_zeroes<M: Member + ?Sized>(m: &M, offset: u64, len: u64) -> Result<()> {
    const STEP: u64 = 1 << 20;
    let zeros = vec![0u8; STEP.min(len) as usize];
    let mut pos = offset;
    while pos < offset + len {
        let n = STEP.min(offset + len - pos) as usize;
        m.write_at(&zeros[..n], pos)?;
        pos += n as u64;
    }
    Ok(())
}

/// Check that `[offset, offset + len)` lies within a member of `size` bytes.
pub fn check_range(name: &str, op: Op, offset: u64, len: u64, size: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(MemberError::out_of_range(name, op, offset, len, size)),
    }
}

/// Mutexes that keep working after a thread panicked while holding one.
///
/// A storage server must not go down because one request's thread panicked:
/// the state these locks guard is updated so that every step leaves it
/// usable (views are replaced whole, superblocks rewritten whole), so a
/// poisoned lock is taken as it is rather than turned into a second panic.
pub trait Locked<T> {
    fn locked(&self) -> std::sync::MutexGuard<'_, T>;
}

impl<T> Locked<T> for std::sync::Mutex<T> {
    fn locked(&self) -> std::sync::MutexGuard<'_, T> {
        self.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
