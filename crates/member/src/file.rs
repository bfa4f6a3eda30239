//! The buffered member engine for regular files and block devices:
//! positional I/O through the page cache (`pread`/`pwrite`/`fdatasync`),
//! an exclusive writer's lock, and a regular file's size watched (another
//! process can cut it short). The direct-I/O engine is `direct.rs`; what
//! the two share (opening, sizes, durable writes, discard) is `sys.rs`.

use crate::map::Mapper;
use crate::sys::{self, Dsync};
use crate::watch::SizeWatch;
use crate::{Member, MemberError, Op, Result};
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
    /// A regular file (which another process can truncate), not a device.
    regular: bool,
    /// What a discard of a device must be aligned to (its logical block
    /// size); 1 for a regular file, whose holes may start anywhere.
    zero_align: u64,
    size: SizeWatch,
    dsync: Dsync,
    rotational: Option<bool>,
}

impl FileMember {
    /// Open an existing file or block device. Opening for writing takes an
    /// exclusive lock on it, so that two raidkit processes never write the
    /// same member, and opens a block device with O_EXCL, so that a mounted
    /// disk or one another program holds is refused (read-only opens take
    /// neither: examining a member of a running array is fine).
    pub fn open(path: impl AsRef<Path>, read_only: bool) -> Result<FileMember> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let o = sys::open_member_file(path, &name, read_only, false)?;
        Ok(FileMember::from_opened(o, path, name, !read_only))
    }

    fn from_opened(o: sys::Opened, path: &Path, name: String, writable: bool) -> FileMember {
        let zero_align = if o.regular {
            1
        } else {
            sys::device_block_sizes(&o.file).map_or(512, |(l, _)| l.max(1) as u64)
        };
        FileMember {
            mapper: Mapper::new(&o.file, o.len, writable).ok(),
            file: o.file,
            path: path.to_path_buf(),
            name,
            regular: o.regular,
            zero_align,
            size: SizeWatch::new(o.len, o.regular),
            dsync: Dsync::default(),
            rotational: o.rotational,
        }
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
        // Made here: taken away again if it cannot be used.
        let made = |e: MemberError| {
            let _ = std::fs::remove_file(path);
            e
        };
        sys::lock(&file, &name).map_err(made)?;
        file.set_len(len).map_err(|e| {
            let what = if e.raw_os_error() == Some(libc::EFBIG) {
                io::Error::new(
                    e.kind(),
                    format!("the file system cannot hold a file of {len} bytes ({e})"),
                )
            } else {
                e
            };
            made(MemberError::new(&name, Op::Create, 0, len, what))
        })?;
        let o = sys::Opened {
            rotational: sys::rotational(&file, true),
            file,
            regular: true,
            len,
        };
        Ok(FileMember::from_opened(o, path, name, true))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether another process holds the writer's lock on the file at
    /// `path` (a running raidkit server, say). Takes no lock itself.
    pub fn in_use(path: impl AsRef<Path>) -> io::Result<bool> {
        Ok(FileMember::holder(path)?.is_some())
    }

    /// Who holds the writer's lock on the file at `path`, if anyone does
    /// (the holder's PID where the kernel says it). Takes no lock itself.
    pub fn holder(path: impl AsRef<Path>) -> io::Result<Option<crate::InUse>> {
        let f = File::open(path)?;
        match f.try_lock_shared() {
            Ok(()) => {
                f.unlock()?;
                Ok(None)
            }
            Err(std::fs::TryLockError::WouldBlock) => Ok(Some(crate::InUse::locking(&f))),
            Err(std::fs::TryLockError::Error(e)) => Err(e),
        }
    }
}

impl Member for FileMember {
    fn name(&self) -> &str {
        &self.name
    }

    fn len(&self) -> u64 {
        self.size.len()
    }

    fn refresh_len(&self) -> Result<u64> {
        self.size.grow(&self.file, &self.name, 1)
    }

    fn peek_len(&self) -> Result<u64> {
        self.size.peek(&self.file, &self.name, 1)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let len = buf.len() as u64;
        self.size
            .access(&self.file, &self.name, Op::Read, offset, len)?;
        self.file.read_exact_at(buf, offset).map_err(|e| {
            self.size
                .explain_short_read(&self.file, &self.name, offset, len, e)
        })
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        let len = buf.len() as u64;
        self.size
            .access(&self.file, &self.name, Op::Write, offset, len)?;
        self.file
            .write_all_at(buf, offset)
            .map_err(|e| MemberError::new(&self.name, Op::Write, offset, len, e))
    }

    fn write_at_durable(&self, buf: &[u8], offset: u64) -> Result<()> {
        let len = buf.len() as u64;
        self.size
            .access(&self.file, &self.name, Op::Write, offset, len)?;
        self.dsync
            .write(
                |dsync| sys::pwrite_all(&self.file, buf, offset, dsync),
                || self.file.sync_data(),
            )
            .map_err(|e| MemberError::new(&self.name, Op::Write, offset, len, e))
    }

    fn flush(&self) -> Result<()> {
        self.size.sync_data(&self.file, &self.name)
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        sys::discard(self, &self.file, self.regular, self.zero_align, offset, len)
    }

    fn as_file(&self) -> Option<&File> {
        Some(&self.file)
    }

    fn as_mapper(&self) -> Option<&Mapper> {
        self.mapper.as_ref()
    }

    fn rotational(&self) -> Option<bool> {
        self.rotational
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

    #[test]
    fn a_file_that_grew_is_used_to_its_new_end_once_looked_at() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.img");
        let m = FileMember::create(&path, 8192).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(16384)
            .unwrap();
        // Not before it is looked at anew, nor by a look that does not
        // take it (a grow that may be refused).
        assert_eq!(m.len(), 8192);
        assert_eq!(m.peek_len().unwrap(), 16384);
        assert_eq!(m.len(), 8192);
        assert!(m.write_at(b"x", 10000).is_err());
        assert_eq!(m.refresh_len().unwrap(), 16384);
        assert_eq!(m.len(), 16384);
        m.write_at(b"grown", 16000).unwrap();
        let mut b = [0u8; 5];
        m.read_at(&mut b, 16000).unwrap();
        assert_eq!(&b, b"grown");
        // Looking again after the file was cut keeps the length in use
        // (the cut is the size watch's to report).
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(12288)
            .unwrap();
        assert_eq!(m.refresh_len().unwrap(), 16384);
        assert!(m.flush().is_err(), "a file cut short is reported");
    }
}
