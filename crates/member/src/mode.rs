//! Which engine a member file or block device is opened with: direct I/O
//! ([`DirectMember`]) or the page cache ([`FileMember`]), as the user asks
//! with `--io auto|direct|buffered`.

use crate::{DirectMember, FileMember, Member, Result};
use std::fmt;
use std::io;
use std::path::Path;
use std::sync::Arc;

/// How member files and devices are read and written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IoMode {
    /// Direct I/O where the file system or device allows it (O_DIRECT
    /// opens), buffered where it does not, and on tmpfs.
    Auto,
    /// Direct I/O, or an error saying why not.
    Direct,
    /// Through the page cache.
    #[default]
    Buffered,
}

impl std::str::FromStr for IoMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<IoMode, String> {
        match s {
            "auto" => Ok(IoMode::Auto),
            "direct" => Ok(IoMode::Direct),
            "buffered" => Ok(IoMode::Buffered),
            _ => Err(format!("unknown I/O mode '{s}' (auto, direct or buffered)")),
        }
    }
}

impl fmt::Display for IoMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IoMode::Auto => "auto",
            IoMode::Direct => "direct",
            IoMode::Buffered => "buffered",
        })
    }
}

/// A member opened by [`open_member`], and what it was opened with.
#[derive(Debug, Clone)]
pub struct OpenedMember {
    pub member: Arc<dyn Member>,
    /// `Direct` or `Buffered`: what the member got.
    pub mode: IoMode,
    /// Direct I/O: the logical and physical block sizes; 0 for buffered.
    pub logical_block: u32,
    pub physical_block: u32,
    /// Auto chose buffered I/O: why direct I/O was not possible.
    pub fallback: Option<String>,
}

impl fmt::Display for OpenedMember {
    /// "direct I/O, logical block 512, physical 4096", "buffered I/O".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.mode, &self.fallback) {
            (IoMode::Direct, _) => write!(
                f,
                "direct I/O, logical block {}, physical {}",
                self.logical_block, self.physical_block
            ),
            (_, Some(why)) => write!(f, "buffered I/O (no direct I/O: {why})"),
            _ => f.write_str("buffered I/O"),
        }
    }
}

fn buffered(m: FileMember, fallback: Option<String>) -> OpenedMember {
    OpenedMember {
        member: Arc::new(m),
        mode: IoMode::Buffered,
        logical_block: 0,
        physical_block: 0,
        fallback,
    }
}

fn direct(m: DirectMember) -> OpenedMember {
    OpenedMember {
        logical_block: m.logical_block_size(),
        physical_block: m.physical_block_size(),
        member: Arc::new(m),
        mode: IoMode::Direct,
        fallback: None,
    }
}

/// Open an existing regular file or block device with the engine `io`
/// names. Auto takes buffered I/O on a file system in memory (tmpfs, which
/// since Linux 6.6 accepts O_DIRECT but has no cache to bypass), and
/// otherwise tries O_DIRECT, falling back to buffered I/O only where direct
/// I/O is impossible (the file system refuses it, or the size is not a
/// whole number of blocks); any other error (missing, in use) is returned
/// as it is. Direct takes direct I/O wherever the kernel allows it, tmpfs
/// included.
pub fn open_member(path: impl AsRef<Path>, read_only: bool, io: IoMode) -> Result<OpenedMember> {
    let path = path.as_ref();
    match io {
        IoMode::Buffered => Ok(buffered(FileMember::open(path, read_only)?, None)),
        IoMode::Direct => Ok(direct(DirectMember::open(path, read_only)?)),
        IoMode::Auto => {
            if let Some(fs) = crate::sys::memory_fs(path) {
                let why = format!("on {fs}, memory: no cache for direct I/O to bypass");
                return Ok(buffered(FileMember::open(path, read_only)?, Some(why)));
            }
            auto_direct(path, read_only)
        }
    }
}

/// Auto off memory file systems: direct I/O if O_DIRECT is possible.
fn auto_direct(path: &Path, read_only: bool) -> Result<OpenedMember> {
    match DirectMember::open(path, read_only) {
        Ok(m) => Ok(direct(m)),
        Err(e) if e.source.kind() == io::ErrorKind::Unsupported => Ok(buffered(
            FileMember::open(path, read_only)?,
            Some(e.source.to_string()),
        )),
        Err(e) => Err(e),
    }
}

/// Create a sparse member file of `len` bytes (refused if it exists) and
/// open it with the engine `io` names. In direct mode, a file that cannot
/// be opened for direct I/O is removed again and the error returned.
pub fn create_member(path: impl AsRef<Path>, len: u64, io: IoMode) -> Result<OpenedMember> {
    let path = path.as_ref();
    let created = FileMember::create(path, len)?;
    if io == IoMode::Buffered {
        return Ok(buffered(created, None));
    }
    // Reopened with O_DIRECT once the buffered handle (and its lock) is gone.
    drop(created);
    open_member(path, false, io).inspect_err(|_| {
        let _ = std::fs::remove_file(path);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print() {
        for m in [IoMode::Auto, IoMode::Direct, IoMode::Buffered] {
            assert_eq!(m.to_string().parse::<IoMode>().unwrap(), m);
        }
        assert!("fast".parse::<IoMode>().unwrap_err().contains("auto"));
        assert_eq!(IoMode::default(), IoMode::Buffered);
    }
}
