//! What the file engines (`file.rs`, buffered, and `direct.rs`, O_DIRECT)
//! share: opening a member file or block device safely, its size and block
//! sizes, durable writes (RWF_DSYNC) and discards that read back zeroes.

use crate::{write_zeroes, Member, MemberError, Op, Result};
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

// Block-device ioctls libc does not name (linux/fs.h, asm-generic encoding).
/// `_IOR(0x12, 114, size_t)`: the device's size in bytes.
const BLKGETSIZE64: libc::Ioctl = 0x8008_1272;
/// `_IO(0x12, 127)`: zero a byte range; the device reads zeroes there after.
const BLKZEROOUT: libc::Ioctl = 0x127f;
/// statfs's f_type of ramfs (linux/magic.h).
const RAMFS_MAGIC: libc::c_long = 0x8584_58f6;

/// A member file opened for one of the engines.
#[derive(Debug)]
pub(crate) struct Opened {
    pub file: File,
    /// A regular file (which another process can truncate), not a device.
    pub regular: bool,
    /// Size in bytes.
    pub len: u64,
    /// Whether its device spins (see [`rotational`]).
    pub rotational: Option<bool>,
}

/// Open an existing regular file or block device. Writers take the
/// exclusive writer's lock (flock), so that two raidkit processes never write
/// one member, and open a block device with O_EXCL, which the kernel refuses
/// while the device is mounted or claimed by another program (md, LVM,
/// another raidkit); read-only opens take neither, so examining a member of a
/// running array works. `direct`: open with O_DIRECT.
pub(crate) fn open_member_file(
    path: &Path,
    name: &str,
    read_only: bool,
    direct: bool,
) -> Result<Opened> {
    let regular = check_kind(path, name)?;
    let mut flags = 0;
    if direct {
        flags |= libc::O_DIRECT;
    }
    if !regular && !read_only {
        flags |= libc::O_EXCL;
    }
    let open_err = |e: io::Error| MemberError::new(name, Op::Open, 0, 0, e);
    let open = || {
        OpenOptions::new()
            .read(true)
            .write(!read_only)
            .custom_flags(flags)
            .open(path)
    };
    let mut opened = open();
    // A device this process itself still holds (a member just removed,
    // its last requests in flight keeping it open a moment): the claim
    // goes with them, so it is waited for (at most 5 s), not refused.
    let t = std::time::Instant::now();
    while matches!(&opened, Err(e) if e.raw_os_error() == Some(libc::EBUSY))
        && !regular
        && !read_only
        && t.elapsed() < std::time::Duration::from_secs(5)
        && held_by_this_process(path)
    {
        std::thread::sleep(std::time::Duration::from_millis(50));
        opened = open();
    }
    let file = opened.map_err(|e| match e.raw_os_error() {
        Some(libc::EBUSY) if !regular && !read_only => open_err(io::Error::new(
            io::ErrorKind::ResourceBusy,
            InUse::holding_device(path),
        )),
        Some(libc::EINVAL) if direct => open_err(io::Error::new(
            io::ErrorKind::Unsupported,
            "its file system does not allow direct I/O (O_DIRECT refused)",
        )),
        _ => open_err(e),
    })?;
    if !read_only {
        lock(&file, name)?;
    }
    let len = if regular {
        file.metadata().map(|m| m.len())
    } else {
        device_size(&file)
    }
    .map_err(open_err)?;
    let rotational = rotational(&file, regular);
    Ok(Opened {
        file,
        regular,
        len,
        rotational,
    })
}

/// Whether this process has block device `path` open.
fn held_by_this_process(path: &Path) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let Ok(want) = std::fs::metadata(path) else {
        return false;
    };
    std::fs::read_dir("/proc/self/fd").is_ok_and(|fds| {
        fds.flatten().any(|fd| {
            std::fs::metadata(fd.path())
                .is_ok_and(|m| m.file_type().is_block_device() && m.rdev() == want.rdev())
        })
    })
}

/// Whether the disk under `file` spins, as the kernel says of it
/// (`/sys/dev/block/MAJ:MIN/queue/rotational`): the device itself, or the
/// one holding the file system of a regular file; a partition's answer is
/// its disk's. None where there is no such device (tmpfs, a file system
/// over several devices) or sysfs does not say.
pub(crate) fn rotational(file: &File, regular: bool) -> Option<bool> {
    use std::os::unix::fs::MetadataExt;
    let m = file.metadata().ok()?;
    let dev = if regular { m.dev() } else { m.rdev() };
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    if major == 0 {
        // Anonymous devices: memory and multi-device file systems.
        return None;
    }
    let base = format!("/sys/dev/block/{major}:{minor}");
    // The path goes through the symlink sysfs keeps for the device, so
    // `..` of a partition is its disk.
    [
        format!("{base}/queue/rotational"),
        format!("{base}/../queue/rotational"),
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok())
    .and_then(|t| match t.trim() {
        "1" => Some(true),
        "0" => Some(false),
        _ => None,
    })
}

/// Refuse what is neither a regular file nor a block device before opening
/// it: opening a FIFO blocks until a writer comes, and a character device
/// or socket is no disk. Ok(true): a regular file.
pub(crate) fn check_kind(path: &Path, name: &str) -> Result<bool> {
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

/// Take the exclusive writer's lock (released when the file is closed).
pub(crate) fn lock(file: &File, name: &str) -> Result<()> {
    let mut tries = 0;
    loop {
        let source = match file.try_lock() {
            Ok(()) => return Ok(()),
            Err(std::fs::TryLockError::Error(e)) => e,
            Err(std::fs::TryLockError::WouldBlock) => {
                let busy = InUse::locking(file);
                // No holder in /proc/locks: it let go between the refusal
                // and the look (a rebuild closing its target). Try again
                // rather than report a holder that no longer exists.
                tries += 1;
                if busy.pid.is_none() && tries < 5 {
                    continue;
                }
                io::Error::new(io::ErrorKind::ResourceBusy, busy)
            }
        };
        return Err(MemberError::new(name, Op::Open, 0, 0, source));
    }
}

/// Why a member could not be opened for writing: another process holds it.
/// The error carries the holder's PID where the kernel says it, so that the
/// command line can name the raidkit server (and its array) that holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InUse {
    /// The holding process, if found.
    pub pid: Option<u32>,
    /// Its program name (/proc/PID/comm).
    pub program: Option<String>,
    /// A block device held with O_EXCL (mounted, md, LVM), not a file's lock.
    pub device: bool,
}

impl InUse {
    /// The holder of `file`'s flock, from /proc/locks, which lists every
    /// lock with its owner's PID and the locked file's device and inode.
    pub(crate) fn locking(file: &File) -> InUse {
        use std::os::unix::fs::MetadataExt;
        let pid = file.metadata().ok().and_then(|m| {
            let locks = std::fs::read_to_string("/proc/locks").ok()?;
            let (major, minor) = (libc::major(m.dev()), libc::minor(m.dev()));
            let want = format!("{major:02x}:{minor:02x}:{}", m.ino());
            locks.lines().find_map(|l| {
                // "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF"
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.get(1) == Some(&"FLOCK") && f.get(5) == Some(&want.as_str()))
                    .then(|| f.get(4)?.parse().ok())
                    .flatten()
            })
        });
        InUse::of(pid, false)
    }

    /// The process holding block device `path` open, found by looking
    /// through every process's open files (the kernel does not name an
    /// O_EXCL holder; a mount or md has no process, and then none is found).
    fn holding_device(path: &Path) -> InUse {
        use std::os::unix::fs::MetadataExt;
        let me = std::process::id();
        let pid = std::fs::metadata(path).ok().and_then(|want| {
            std::fs::read_dir("/proc").ok()?.flatten().find_map(|p| {
                let pid: u32 = p.file_name().to_str()?.parse().ok()?;
                if pid == me {
                    return None;
                }
                std::fs::read_dir(p.path().join("fd"))
                    .ok()?
                    .flatten()
                    .any(|fd| {
                        std::fs::metadata(fd.path())
                            .is_ok_and(|m| m.rdev() == want.rdev() && m.ino() == want.ino())
                    })
                    .then_some(pid)
            })
        });
        InUse::of(pid, true)
    }

    fn of(pid: Option<u32>, device: bool) -> InUse {
        let program = pid.and_then(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm"))
                .ok()
                .map(|s| s.trim().to_string())
        });
        InUse {
            pid,
            program,
            device,
        }
    }

    /// The InUse an error carries, if it is one.
    pub fn of_error(e: &io::Error) -> Option<&InUse> {
        e.get_ref()?.downcast_ref::<InUse>()
    }
}

impl fmt::Display for InUse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.pid, &self.program) {
            (Some(pid), Some(prog)) => write!(f, "in use by {prog} (PID {pid})"),
            (Some(pid), None) => write!(f, "in use by process {pid}"),
            (None, _) if self.device => f.write_str(
                "in use: mounted, or held by md, LVM or another program (the kernel refused O_EXCL)",
            ),
            (None, _) => f.write_str("in use: locked by another process"),
        }
    }
}

impl std::error::Error for InUse {}

/// A block device's size (BLKGETSIZE64).
pub(crate) fn device_size(file: &File) -> io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points
    // at a live u64; the descriptor is open for the whole call.
    let r = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut size as *mut u64) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(size)
}

/// A block device's logical and physical block sizes (BLKSSZGET, BLKPBSZGET).
pub(crate) fn device_block_sizes(file: &File) -> io::Result<(u32, u32)> {
    let get = |req: libc::Ioctl| -> io::Result<u32> {
        let mut v: libc::c_int = 0;
        // SAFETY: both ioctls write one int through the pointer, which
        // points at a live c_int.
        let r = unsafe { libc::ioctl(file.as_raw_fd(), req, &mut v as *mut libc::c_int) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(v as u32)
    };
    let logical = get(libc::BLKSSZGET)?;
    let physical = get(libc::BLKPBSZGET)?;
    Ok((logical, physical.max(logical)))
}

/// Whether an error says the kernel or file system lacks the operation
/// (so a slower way that every system has is to be used instead).
pub(crate) fn unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP)
    )
}

/// Write all of `buf` at `offset`; `dsync`: with RWF_DSYNC, so that each
/// call returns only once its bytes are on stable storage (a FUA write on a
/// device that has it), without flushing anything else of the file.
pub(crate) fn pwrite_all(
    file: &File,
    mut buf: &[u8],
    mut offset: u64,
    dsync: bool,
) -> io::Result<()> {
    if !dsync {
        return file.write_all_at(buf, offset);
    }
    while !buf.is_empty() {
        let iov = libc::iovec {
            iov_base: buf.as_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: one iovec over `buf`, which outlives the call and is
        // only read by it.
        let n = unsafe {
            libc::pwritev2(
                file.as_raw_fd(),
                &iov,
                1,
                offset as libc::off_t,
                libc::RWF_DSYNC,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        buf = &buf[n as usize..];
        offset += n as u64;
    }
    Ok(())
}

/// Durable writes with RWF_DSYNC where the kernel has it, else a write and
/// an fdatasync (remembered, so the refused call is made only once).
#[derive(Debug, Default)]
pub(crate) struct Dsync {
    unsupported: AtomicBool,
}

impl Dsync {
    /// `write(dsync)` writes the bytes (with RWF_DSYNC if `dsync`); `sync`
    /// flushes the whole file. A kernel that refuses the flag refuses it
    /// before writing anything, so falling back then writes nothing twice.
    pub fn write(
        &self,
        write: impl Fn(bool) -> io::Result<()>,
        sync: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<()> {
        if !self.unsupported.load(Ordering::Relaxed) {
            match write(true) {
                Err(e) if unsupported(&e) => self.unsupported.store(true, Ordering::Relaxed),
                other => return other,
            }
        }
        write(false)?;
        sync()
    }
}

/// Zero `[offset, offset + len)` without writing zeroes: punch a hole in a
/// regular file (its size kept), or BLKZEROOUT on a block device (which
/// guarantees zeroes, unlike BLKDISCARD). Device ranges must be aligned to
/// the logical block size.
pub(crate) fn zero_range(file: &File, regular: bool, offset: u64, len: u64) -> io::Result<()> {
    let fd = file.as_raw_fd();
    let r = if regular {
        // SAFETY: plain system call on an open descriptor.
        unsafe {
            libc::fallocate(
                fd,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                len as libc::off_t,
            )
        }
    } else {
        let range: [u64; 2] = [offset, len];
        // SAFETY: BLKZEROOUT reads two u64 (start, length) through the
        // pointer, which points at a live array of two.
        unsafe { libc::ioctl(fd, BLKZEROOUT, range.as_ptr()) }
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `Member::discard` for the file engines: the part of the range aligned to
/// `align` is deallocated (`zero_range`), the edges around it, and the whole
/// range where the system cannot deallocate, written with zeroes through
/// `m` (so that a direct-I/O member read-modify-writes partial blocks under
/// its own locks). Either way the range reads back zeroes.
pub(crate) fn discard<M: Member + ?Sized>(
    m: &M,
    file: &File,
    regular: bool,
    align: u64,
    offset: u64,
    len: u64,
) -> Result<()> {
    crate::check_range(m.name(), Op::Discard, offset, len, m.len())?;
    let end = offset + len;
    let lo = offset.next_multiple_of(align).min(end);
    let hi = (end / align * align).max(lo);
    if lo == hi {
        return write_zeroes(m, offset, len);
    }
    write_zeroes(m, offset, lo - offset)?;
    write_zeroes(m, hi, end - hi)?;
    match zero_range(file, regular, lo, hi - lo) {
        Ok(()) => Ok(()),
        Err(e) if unsupported(&e) => write_zeroes(m, lo, hi - lo),
        Err(e) => Err(MemberError::new(m.name(), Op::Discard, lo, hi - lo, e)),
    }
}

/// The name of the file system in memory (tmpfs, ramfs) that holds
/// the regular file `path`, if it is on one: there direct I/O bypasses no
/// cache (the page cache is the storage) and would only cost the
/// page-cache fast paths. A device node is never on one in this sense,
/// though /dev itself is a tmpfs (devtmpfs).
pub(crate) fn memory_fs(path: &Path) -> Option<&'static str> {
    use std::os::unix::ffi::OsStrExt;
    if !std::fs::metadata(path).ok()?.is_file() {
        return None;
    }
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statfs is plain data, for which all zeroes is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a live statfs to fill in.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    match st.f_type {
        libc::TMPFS_MAGIC => Some("tmpfs"),
        RAMFS_MAGIC => Some("ramfs"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_on_a_disk_is_asked_of_its_disk_and_one_in_memory_of_none() {
        use std::os::unix::fs::MetadataExt;
        let on_disk = File::open(env!("CARGO_MANIFEST_DIR").to_string() + "/Cargo.toml").unwrap();
        let dev = on_disk.metadata().unwrap().dev();
        let sysfs = format!("/sys/dev/block/{}:{}", libc::major(dev), libc::minor(dev));
        if Path::new(&sysfs).exists() {
            let want = ["queue/rotational", "../queue/rotational"]
                .iter()
                .find_map(|q| std::fs::read_to_string(format!("{sysfs}/{q}")).ok())
                .map(|t| t.trim() == "1");
            assert!(want.is_some(), "sysfs says nothing for {sysfs}");
            assert_eq!(rotational(&on_disk, true), want);
        }
        if Path::new("/dev/shm").is_dir() {
            let t = tempfile::NamedTempFile::new_in("/dev/shm").unwrap();
            assert_eq!(rotational(t.as_file(), true), None);
        }
    }
    use std::cell::RefCell;

    #[test]
    fn durable_writes_fall_back_to_write_and_sync_where_rwf_dsync_is_refused() {
        let d = Dsync::default();
        let calls = RefCell::new(Vec::new());
        let refuse = |dsync: bool| {
            calls
                .borrow_mut()
                .push(if dsync { "dsync" } else { "write" });
            if dsync {
                Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
            } else {
                Ok(())
            }
        };
        let sync = || {
            calls.borrow_mut().push("sync");
            Ok(())
        };
        d.write(refuse, sync).unwrap();
        d.write(refuse, sync).unwrap();
        // Refused once, then never asked again; each time written and synced.
        assert_eq!(*calls.borrow(), ["dsync", "write", "sync", "write", "sync"]);

        // Where the kernel has it: one RWF_DSYNC write, no whole-file sync.
        let d = Dsync::default();
        calls.borrow_mut().clear();
        let accept = |dsync: bool| {
            calls
                .borrow_mut()
                .push(if dsync { "dsync" } else { "write" });
            Ok(())
        };
        d.write(accept, sync).unwrap();
        assert_eq!(*calls.borrow(), ["dsync"]);
        // Another error is the write's error, not a reason to fall back.
        let d = Dsync::default();
        let eio = |_: bool| Err(io::Error::from_raw_os_error(libc::EIO));
        assert_eq!(
            d.write(eio, || Ok(())).unwrap_err().raw_os_error(),
            Some(libc::EIO)
        );
    }

    #[test]
    fn rwf_dsync_writes_reach_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&p)
            .unwrap();
        pwrite_all(&f, b"durable", 100, true).unwrap();
        assert_eq!(&std::fs::read(&p).unwrap()[100..107], b"durable");
    }
}
