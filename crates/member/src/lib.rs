//! The one interface every array member goes through.
//!
//! A [`Member`] is anything with a fixed length that can be read and written
//! at byte offsets and flushed to stable storage: a file, a block device, and
//! later a remote NBD export, a fault-injecting wrapper, a simulated disk, or
//! another array (which is how RAID-50/60 nest). Methods take `&self` so that
//! one member can serve concurrent requests; implementations synchronise
//! internally (positional I/O needs no lock at all).
//!
//! ```no_run
//! use raidkit_member::{FileMember, Member};
//! let m = FileMember::open("disk0.img", false).unwrap();
//! let mut buf = [0u8; 512];
//! m.read_at(&mut buf, 4096).unwrap();
//! ```

pub mod fault;
pub mod guard;
pub mod map;
pub mod powercut;
pub mod sim;

pub use fault::{FaultConfig, FaultMember};
pub use guard::{guarded, Fault};
pub use map::{MappedRange, Mapper};
pub use powercut::{CutRng, PowerCutMember};
pub use sim::{SimConfig, SimDisk};

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The operation that failed, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Open,
    Read,
    Write,
    Flush,
    Discard,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Open => "open",
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
#[error("{member}: {op} of {len} bytes at offset {offset} failed: {source}")]
pub struct MemberError {
    pub member: String,
    pub op: Op,
    pub offset: u64,
    pub len: u64,
    #[source]
    pub source: io::Error,
}

impl MemberError {
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
    /// Read exactly `buf.len()` bytes at `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()>;
    /// Write all of `buf` at `offset`.
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()>;
    /// Make every completed write durable.
    fn flush(&self) -> Result<()>;
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

/// A member backed by a regular file or a block device.
#[derive(Debug)]
pub struct FileMember {
    file: File,
    /// None where a duplicate descriptor could not be had.
    mapper: Option<Mapper>,
    path: PathBuf,
    name: String,
    len: u64,
    /// A regular file (which another process can truncate), not a device.
    regular: bool,
    /// Found shorter than `len`: every operation fails from then on.
    shrunk: std::sync::atomic::AtomicBool,
    /// When (`clock_ns`) reads and writes next look at the file's size.
    next_size_check: std::sync::atomic::AtomicU64,
}

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

/// Refuse what is neither a regular file nor a block device before opening
/// it: opening a FIFO blocks until a writer comes, and a character device
/// or socket is no disk.
fn check_kind(path: &Path, name: &str) -> Result<bool> {
    use std::os::unix::fs::FileTypeExt;
    let meta = std::fs::metadata(path).map_err(|e| MemberError::new(name, Op::Open, 0, 0, e))?;
    let t = meta.file_type();
    if t.is_file() || t.is_block_device() {
        return Ok(t.is_file());
    }
    let kind = if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    };
    Err(MemberError::new(
        name,
        Op::Open,
        0,
        0,
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{kind}; a member must be a regular file or a block device"),
        ),
    ))
}

impl FileMember {
    /// Open an existing file or block device. Opening for writing takes an
    /// exclusive lock on it, so that two raidkit processes never write the
    /// same member (read-only opens take none: examining a member of a
    /// running array is fine).
    pub fn open(path: impl AsRef<Path>, read_only: bool) -> Result<FileMember> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let regular = check_kind(path, &name)?;
        let file = OpenOptions::new()
            .read(true)
            .write(!read_only)
            .open(path)
            .map_err(|e| MemberError::new(&name, Op::Open, 0, 0, e))?;
        if !read_only {
            lock(&file, &name)?;
        }
        let len = file_len(&file).map_err(|e| MemberError::new(&name, Op::Open, 0, 0, e))?;
        Ok(FileMember {
            mapper: Mapper::new(&file, len, !read_only).ok(),
            file,
            path: path.to_path_buf(),
            name,
            len,
            regular,
            shrunk: Default::default(),
            next_size_check: Default::default(),
        })
    }

    /// Create a sparse file of `len` bytes; fails if it exists.
    pub fn create(path: impl AsRef<Path>, len: u64) -> Result<FileMember> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| MemberError::new(&name, Op::Open, 0, 0, e))?;
        lock(&file, &name)?;
        file.set_len(len)
            .map_err(|e| MemberError::new(&name, Op::Write, 0, len, e))?;
        Ok(FileMember {
            mapper: Mapper::new(&file, len, true).ok(),
            file,
            path: path.to_path_buf(),
            name,
            len,
            regular: true,
            shrunk: Default::default(),
            next_size_check: Default::default(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether another process holds the writer's lock on the file at
    /// `path` (a running raidkit server, say). Takes no lock itself.
    pub fn in_use(path: impl AsRef<Path>) -> io::Result<bool> {
        let f = File::open(path)?;
        match f.try_lock_shared() {
            Ok(()) => {
                f.unlock()?;
                Ok(false)
            }
            Err(std::fs::TryLockError::WouldBlock) => Ok(true),
            Err(std::fs::TryLockError::Error(e)) => Err(e),
        }
    }

    /// `check_size`, at most once every `SIZE_CHECK_EVERY_NS` (and on every
    /// call once the file was found short). A file cut by another process
    /// is found within that time by reads and writes, and by the next flush
    /// in any case; until then a write past the cut grows the file back (a
    /// write to its very last block would hide the cut from later checks;
    /// a short read is found at once).
    fn check_size_soon(&self, op: Op, offset: u64, len: u64) -> Result<()> {
        use std::sync::atomic::Ordering;
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
        self.check_size(op, offset, len)
    }

    /// Fail if the file has become shorter than it was when opened (cut by
    /// another process): a write there would silently grow it back with a
    /// hole of zeros in between, and reads would return those zeros. An
    /// fstat of a regular file; a device cannot shrink.
    fn check_size(&self, op: Op, offset: u64, len: u64) -> Result<()> {
        use std::sync::atomic::Ordering;
        if !self.regular {
            return Ok(());
        }
        let now = if self.shrunk.load(Ordering::Acquire) {
            None
        } else {
            match self.file.metadata() {
                Ok(m) if m.len() >= self.len => return Ok(()),
                Ok(m) => Some(m.len()),
                Err(e) => return Err(MemberError::new(&self.name, op, offset, len, e)),
            }
        };
        self.shrunk.store(true, Ordering::Release);
        Err(MemberError::new(
            &self.name,
            op,
            offset,
            len,
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                match now {
                    Some(n) => format!("the file shrank to {n} bytes from {}", self.len),
                    None => format!("the file shrank below {} bytes", self.len),
                },
            ),
        ))
    }
}

/// Take the exclusive writer's lock (released when the file is closed).
fn lock(file: &File, name: &str) -> Result<()> {
    file.try_lock().map_err(|e| {
        let source = match e {
            std::fs::TryLockError::WouldBlock => io::Error::new(
                io::ErrorKind::ResourceBusy,
                "in use by another process (a running raidkit server?)",
            ),
            std::fs::TryLockError::Error(e) => e,
        };
        MemberError::new(name, Op::Open, 0, 0, source)
    })
}

/// Length of a file or block device (whose metadata length is 0, so seek to the end).
fn file_len(file: &File) -> io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    let meta = file.metadata()?;
    if meta.is_file() {
        return Ok(meta.len());
    }
    let mut f = file;
    f.seek(SeekFrom::End(0))
}

impl Member for FileMember {
    fn name(&self) -> &str {
        &self.name
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let len = buf.len() as u64;
        check_range(&self.name, Op::Read, offset, len, self.len)?;
        self.check_size_soon(Op::Read, offset, len)?;
        self.file.read_exact_at(buf, offset).map_err(|e| {
            // A short read: say why if the file was cut.
            if e.kind() == io::ErrorKind::UnexpectedEof {
                if let Err(shrunk) = self.check_size(Op::Read, offset, len) {
                    return shrunk;
                }
            }
            MemberError::new(&self.name, Op::Read, offset, len, e)
        })
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        let len = buf.len() as u64;
        check_range(&self.name, Op::Write, offset, len, self.len)?;
        self.check_size_soon(Op::Write, offset, len)?;
        self.file
            .write_all_at(buf, offset)
            .map_err(|e| MemberError::new(&self.name, Op::Write, offset, len, e))
    }

    fn flush(&self) -> Result<()> {
        self.check_size(Op::Flush, 0, 0)?;
        self.file
            .sync_data()
            .map_err(|e| MemberError::new(&self.name, Op::Flush, 0, 0, e))
    }

    fn as_file(&self) -> Option<&File> {
        Some(&self.file)
    }

    fn as_mapper(&self) -> Option<&Mapper> {
        self.mapper.as_ref()
    }
}

/// A member held in memory, for tests and as a model of a perfect disk.
#[derive(Debug)]
pub struct MemMember {
    name: String,
    data: std::sync::RwLock<Vec<u8>>,
}

impl MemMember {
    pub fn new(name: &str, len: u64) -> MemMember {
        MemMember {
            name: name.to_string(),
            data: std::sync::RwLock::new(vec![0; len as usize]),
        }
    }

    /// A copy of the whole contents.
    pub fn snapshot(&self) -> Vec<u8> {
        self.data.read().expect("lock").clone()
    }
}

impl Member for MemMember {
    fn name(&self) -> &str {
        &self.name
    }

    fn len(&self) -> u64 {
        self.data.read().expect("lock").len() as u64
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let d = self.data.read().expect("lock");
        check_range(
            &self.name,
            Op::Read,
            offset,
            buf.len() as u64,
            d.len() as u64,
        )?;
        buf.copy_from_slice(&d[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        let mut d = self.data.write().expect("lock");
        check_range(
            &self.name,
            Op::Write,
            offset,
            buf.len() as u64,
            d.len() as u64,
        )?;
        d[offset as usize..offset as usize + buf.len()].copy_from_slice(buf);
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_member_reads_writes_and_refuses_out_of_range() {
        let dir = std::env::temp_dir().join(format!("raidkit-member-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m.img");
        let _ = std::fs::remove_file(&path);
        let m = FileMember::create(&path, 8192).unwrap();
        assert_eq!(m.len(), 8192);
        m.write_at(b"hello", 4000).unwrap();
        let mut b = [0u8; 5];
        m.read_at(&mut b, 4000).unwrap();
        assert_eq!(&b, b"hello");
        let e = m.write_at(b"xx", 8191).unwrap_err();
        assert!(e.to_string().contains("beyond the end"), "{e}");
        assert!(m.read_at(&mut b, u64::MAX - 1).is_err());
        assert!(
            FileMember::create(&path, 10).is_err(),
            "create_new must not clobber"
        );
        m.discard(4000, 5).unwrap();
        m.read_at(&mut b, 4000).unwrap();
        assert_eq!(b, [0; 5]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
