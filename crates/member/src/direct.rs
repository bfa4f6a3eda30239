//! The direct-I/O member engine: regular files and block devices opened
//! with O_DIRECT, so that reads and writes go to the device, not the page
//! cache (a disk's bandwidth is not spent twice, and `flush` is the
//! device's cache flush rather than a write-back of dirty pages).
//!
//! O_DIRECT wants offsets, lengths and memory aligned to the logical block
//! (the device's sector; for a file, the file system's direct-I/O
//! alignment). Callers may still use any offset and length: aligned
//! requests from an aligned buffer ([`AlignedBuf`](crate::AlignedBuf)) go
//! straight to `pread`/`pwrite`; others go through bounce buffers from a
//! small pool. A write that covers only part of a block reads that block,
//! merges its bytes and writes it back under a lock of that block (a small
//! striped table keyed by block number), because two writers of different
//! bytes of one sector would otherwise each write back the other's old
//! bytes, and RAID-0 has no stripe lock above the member to prevent it.
//! Writes that overlap the same bytes have no defined order, as on a disk.
//!
//! A direct-I/O member offers no page-cache access: no mappings, no splice.

use crate::aligned::{BufPool, Pooled};
use crate::sys::{self, Dsync};
use crate::watch::SizeWatch;
use crate::{Locked, Member, MemberError, Op, Result};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// Bytes one bounce buffer holds: unaligned requests larger than this are
/// done a piece at a time.
const BOUNCE: usize = 256 << 10;
/// Bounce buffers kept per member (more requests at once allocate).
const KEEP: usize = 16;
/// Bytes of a small bounce buffer, for the pieces most unaligned requests
/// are (a 4 KiB block of a read-modify-write, a client's small read).
/// They have a pool of their own, which keeps more: a queue of 32 small
/// requests took more than the large pool kept, and each of the others
/// allocated and zero-filled a 256 KiB buffer (fresh pages from the
/// kernel, then given back): with 4 KiB random reads at QD32 on a loop
/// device, most of the server's page faults and its mmap/munmap calls.
const SMALL_BOUNCE: usize = 16 << 10;
/// Small bounce buffers kept per member (256 KiB at most).
const SMALL_KEEP: usize = 64;
/// Stripes of the edge-block lock table.
const EDGE_LOCKS: usize = 64;

/// A member backed by a regular file or block device opened with O_DIRECT.
#[derive(Debug)]
pub struct DirectMember {
    file: File,
    path: PathBuf,
    name: String,
    regular: bool,
    /// Offsets and lengths of direct I/O are multiples of this.
    logical: u32,
    physical: u32,
    /// What memory of direct I/O is aligned to.
    mem_align: usize,
    size: SizeWatch,
    pool: BufPool,
    small: BufPool,
    /// Held while a block is read-modify-written: stripe `block % EDGE_LOCKS`.
    edges: Box<[Mutex<()>]>,
    dsync: Dsync,
    rotational: Option<bool>,
}

impl DirectMember {
    /// Open an existing regular file or block device with O_DIRECT. Writers
    /// take the exclusive writer's lock and open a block device with
    /// O_EXCL (a mounted disk, or one another program holds, is refused with
    /// `ResourceBusy`). A file system that refuses O_DIRECT (tmpfs), or a
    /// file whose size is not a whole number of blocks, is refused with
    /// `ErrorKind::Unsupported`, which [`IoMode::Auto`](crate::IoMode) takes
    /// as "use buffered I/O".
    pub fn open(path: impl AsRef<Path>, read_only: bool) -> Result<DirectMember> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let o = sys::open_member_file(path, &name, read_only, true)?;
        let open_err = |e: io::Error| MemberError::new(&name, Op::Open, 0, 0, e);
        let (logical, physical, mem_align) = if o.regular {
            file_alignment(&o.file).map_err(open_err)?
        } else {
            let (l, p) = sys::device_block_sizes(&o.file).map_err(open_err)?;
            (l, p, l as usize)
        };
        if logical == 0 || !logical.is_power_of_two() || !o.len.is_multiple_of(logical as u64) {
            return Err(open_err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "its size, {} bytes, is not a whole number of its {logical}-byte direct-I/O blocks",
                    o.len
                ),
            )));
        }
        Ok(DirectMember {
            size: SizeWatch::new(o.len, o.regular),
            file: o.file,
            path: path.to_path_buf(),
            name,
            regular: o.regular,
            logical,
            physical,
            mem_align: mem_align.max(1),
            pool: BufPool::new(BOUNCE.max(4 * logical as usize), KEEP),
            small: BufPool::new(SMALL_BOUNCE, SMALL_KEEP),
            edges: (0..EDGE_LOCKS).map(|_| Mutex::new(())).collect(),
            dsync: Dsync::default(),
            rotational: o.rotational,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The unit of direct I/O: a device's logical sector (BLKSSZGET), a
    /// file's direct-I/O offset alignment.
    pub fn logical_block_size(&self) -> u32 {
        self.logical
    }

    /// A device's physical sector (BLKPBSZGET; writes of less are
    /// read-modify-written inside the disk), a file system's block.
    pub fn physical_block_size(&self) -> u32 {
        self.physical
    }

    /// A block device, not a regular file.
    pub fn is_block_device(&self) -> bool {
        !self.regular
    }

    fn aligned(&self, ptr: *const u8, offset: u64, len: usize) -> bool {
        let a = self.logical as u64;
        offset.is_multiple_of(a)
            && (len as u64).is_multiple_of(a)
            && (ptr as usize).is_multiple_of(self.mem_align)
    }

    /// Lock the stripes of the blocks whose edges a write covers only in
    /// part, in stripe order (two writers never wait on each other's).
    /// A bounce buffer of at least `span` bytes (at most the large pool's).
    fn bounce(&self, span: usize) -> Pooled<'_> {
        if span <= self.small.size() {
            self.small.take()
        } else {
            self.pool.take()
        }
    }

    fn lock_edges(&self, blocks: [Option<u64>; 2]) -> [Option<MutexGuard<'_, ()>>; 2] {
        let stripe = |b: Option<u64>| b.map(|b| (b % EDGE_LOCKS as u64) as usize);
        let (first, second) = match [stripe(blocks[0]), stripe(blocks[1])] {
            [Some(x), Some(y)] if x != y => (Some(x.min(y)), Some(x.max(y))),
            [Some(x), _] | [None, Some(x)] => (Some(x), None),
            [None, None] => (None, None),
        };
        let first = first.map(|i| self.edges[i].locked());
        [first, second.map(|i| self.edges[i].locked())]
    }

    /// The bounce pieces of `len` bytes at `offset`: each covers whole
    /// blocks and fits one pool buffer.
    fn pieces(&self, offset: u64, len: usize) -> impl Iterator<Item = Piece> {
        let a = self.logical as u64;
        let room = self.pool.size();
        let mut done = 0;
        std::iter::from_fn(move || {
            if done == len {
                return None;
            }
            let pos = offset + done as u64;
            let lo = pos / a * a;
            let skip = (pos - lo) as usize;
            let want = (len - done).min(room - skip);
            let hi = (pos + want as u64).next_multiple_of(a);
            let p = Piece {
                done,
                lo,
                hi,
                skip,
                want,
            };
            done += want;
            Some(p)
        })
    }

    fn read_direct(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if self.aligned(buf.as_ptr(), offset, buf.len()) {
            return self.file.read_exact_at(buf, offset);
        }
        for p in self.pieces(offset, buf.len()) {
            let mut b = self.bounce(p.span());
            self.file.read_exact_at(&mut b[..p.span()], p.lo)?;
            buf[p.done..p.done + p.want].copy_from_slice(&b[p.skip..p.skip + p.want]);
        }
        Ok(())
    }

    /// Write through bounce buffers, a piece at a time; blocks covered in
    /// part are read-modify-written under their edge locks.
    fn write_direct(&self, buf: &[u8], offset: u64, dsync: bool) -> io::Result<()> {
        if self.aligned(buf.as_ptr(), offset, buf.len()) {
            return sys::pwrite_all(&self.file, buf, offset, dsync);
        }
        let a = self.logical as u64;
        let au = a as usize;
        for p in self.pieces(offset, buf.len()) {
            let (first, last) = (p.lo / a, p.hi / a - 1);
            let ragged_end = p.skip + p.want != p.span();
            let head = p.skip != 0 || (first == last && ragged_end);
            let tail = first != last && ragged_end;
            let mut b = self.bounce(p.span());
            let _held = self.lock_edges([head.then_some(first), tail.then_some(last)]);
            if head {
                self.file.read_exact_at(&mut b[..au], p.lo)?;
            }
            let span = p.span();
            if tail {
                self.file.read_exact_at(&mut b[span - au..span], p.hi - a)?;
            }
            b[p.skip..p.skip + p.want].copy_from_slice(&buf[p.done..p.done + p.want]);
            sys::pwrite_all(&self.file, &b[..span], p.lo, dsync)?;
        }
        Ok(())
    }

    fn write_checked(&self, buf: &[u8], offset: u64, durable: bool) -> Result<()> {
        let len = buf.len() as u64;
        self.size
            .access(&self.file, &self.name, Op::Write, offset, len)?;
        let r = if durable && !self.regular {
            // A block device gives RWF_DSYNC a FUA write (on a device
            // without FUA, a write and a cache flush) and then flushes the
            // cache again (blkdev_write_iter's generic_write_sync): two
            // flushes. A write and one flush make it as durable; on loop
            // devices over ext4 that is 1.4-1.7x faster (docs/performance.md).
            // A regular file keeps RWF_DSYNC: its file system writes FUA
            // and skips the flush where it can.
            self.write_direct(buf, offset, false)
                .and_then(|()| self.file.sync_data())
        } else if durable {
            self.dsync.write(
                |dsync| self.write_direct(buf, offset, dsync),
                || self.file.sync_data(),
            )
        } else {
            self.write_direct(buf, offset, false)
        };
        r.map_err(|e| MemberError::new(&self.name, Op::Write, offset, len, e))
    }
}

/// One bounce buffer's worth of a request: caller bytes
/// `[done, done + want)` are member bytes at `lo + skip`, inside the whole
/// blocks `[lo, hi)`.
#[derive(Debug, Clone, Copy)]
struct Piece {
    done: usize,
    lo: u64,
    hi: u64,
    skip: usize,
    want: usize,
}

impl Piece {
    fn span(&self) -> usize {
        (self.hi - self.lo) as usize
    }
}

/// A regular file's direct-I/O alignment: (offset and length unit,
/// file-system block, memory alignment), from statx STATX_DIOALIGN where
/// the kernel and file system report it, else found by trying.
fn file_alignment(file: &File) -> io::Result<(u32, u32, usize)> {
    let fs_block = file.metadata()?.blksize() as u32;
    // SAFETY: statx is plain data, for which all zeroes is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: an empty C string with AT_EMPTY_PATH names the descriptor
    // itself; the kernel writes into `stx`, which lives across the call.
    let r = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    if r == 0 && stx.stx_mask & libc::STATX_DIOALIGN != 0 {
        if stx.stx_dio_offset_align == 0 {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "its file system does not allow direct I/O on it (statx)",
            ));
        }
        let l = stx.stx_dio_offset_align;
        return Ok((l, fs_block.max(l), stx.stx_dio_mem_align as usize));
    }
    let l = probe_block(file);
    Ok((l, fs_block.max(l), l as usize))
}

/// The smallest of 512 and 4096 that a direct read of that length at
/// offset 0 accepts; 4096 if neither says (an empty file).
pub(crate) fn probe_block(file: &File) -> u32 {
    let mut b = crate::AlignedBuf::zeroed(4096);
    for size in [512u32, 4096] {
        match file.read_at(&mut b[..size as usize], 0) {
            Ok(n) if n > 0 => return size,
            _ => {}
        }
    }
    4096
}

impl Member for DirectMember {
    fn name(&self) -> &str {
        &self.name
    }

    fn len(&self) -> u64 {
        self.size.len()
    }

    fn refresh_len(&self) -> Result<u64> {
        self.size.grow(&self.file, &self.name, self.logical as u64)
    }

    fn peek_len(&self) -> Result<u64> {
        self.size.peek(&self.file, &self.name, self.logical as u64)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let len = buf.len() as u64;
        self.size
            .access(&self.file, &self.name, Op::Read, offset, len)?;
        self.read_direct(buf, offset).map_err(|e| {
            self.size
                .explain_short_read(&self.file, &self.name, offset, len, e)
        })
    }

    /// Aligned runs are asked of the device in one system call
    /// (io_uring), so that its queue holds them all at once; others, or
    /// where io_uring cannot be had, one after the other.
    fn read_runs(&self, runs: &mut [(u64, &mut [u8])]) -> Result<()> {
        let together = runs.len() > 1
            && runs
                .iter()
                .all(|(offset, buf)| self.aligned(buf.as_ptr(), *offset, buf.len()));
        if together {
            for (offset, buf) in runs.iter() {
                let len = buf.len() as u64;
                self.size
                    .access(&self.file, &self.name, Op::Read, *offset, len)?;
            }
            if let Some(r) = crate::uring::read_runs(&self.file, runs) {
                let lo = runs.iter().map(|r| r.0).min().unwrap_or(0);
                let hi = runs.iter().map(|r| r.0 + r.1.len() as u64).max();
                let len = hi.unwrap_or(lo) - lo;
                return r.map_err(|e| {
                    self.size
                        .explain_short_read(&self.file, &self.name, lo, len, e)
                });
            }
        }
        runs.iter_mut()
            .try_for_each(|(offset, buf)| self.read_at(buf, *offset))
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.write_checked(buf, offset, false)
    }

    fn write_at_durable(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.write_checked(buf, offset, true)
    }

    /// fdatasync: with no dirty pages to write back, the device's cache flush.
    fn flush(&self) -> Result<()> {
        self.size.sync_data(&self.file, &self.name)
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        let a = self.logical as u64;
        sys::discard(self, &self.file, self.regular, a, offset, len)
    }

    fn block_size(&self) -> u32 {
        self.logical
    }

    /// None: a direct-I/O member is read and written only through the
    /// device, never through (possibly stale) page-cache pages or splice.
    fn as_file(&self) -> Option<&File> {
        None
    }

    fn as_mapper(&self) -> Option<&crate::Mapper> {
        None
    }

    fn rotational(&self) -> Option<bool> {
        self.rotational
    }
}
