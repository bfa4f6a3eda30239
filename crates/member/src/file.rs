//! The member engine for regular files and block devices: positional
//! buffered I/O (`pread`/`pwrite`/`fdatasync`), an exclusive writer's lock,
//! and a regular file's size watched (another process can cut it short).

use crate::map::Mapper;
use crate::{check_range, Member, MemberError, Op, Result};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

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
