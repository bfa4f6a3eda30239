//! Access to member files for the server's fast paths: the extents of
//! the member files that hold a range (reads), or that a write may go
//! straight into (whole stripes of parity levels, with their intent
//! logged and parity computed after).

use super::*;
use crate::core::checked::Checked;
use crate::core::Disk;

impl Array {
    /// Zero-copy reads: when every piece of `[offset, offset + len)` can be
    /// read from a plain-file member that holds it in sync (no member
    /// missing or being rebuilt there, so no reconstruction), call `f` with
    /// those files' ranges in order, under the stall watch of the members
    /// involved. None: the range needs `read` (which also cures errors:
    /// a caller whose `f` fails falls back to it).
    pub fn with_file_extents(
        &self,
        offset: u64,
        len: u64,
        f: &mut dyn FnMut(&[FileExtent<'_>]) -> std::io::Result<()>,
    ) -> Option<std::io::Result<()>> {
        if len == 0
            || self.core.check(offset, len).is_err()
            || !self.core.alive.load(Ordering::Acquire)
        {
            return None;
        }
        // Not while a reshape moves data: `read` places by the boundary.
        let fence = self.fence(offset, len, false);
        if fence.is_some() {
            return None;
        }
        let v = self.core.view.load();
        let pieces = v.geom.pieces(offset, len);
        let mut disks: Small<&Disk> = Small::new();
        let mut ext: Vec<FileExtent<'_>> = Vec::with_capacity(pieces.len());
        let mut mapped = Vec::new();
        for p in &pieces {
            // A copy in sync, in turn order (the data is in the page
            // cache: no disk head to choose by).
            let (d, dev) = self
                .copy_order(p)
                .find_map(|(role, dev)| Core::readable(&v, role, dev, p.len).map(|d| (d, dev)))?;
            let at = d.data_offset + dev;
            let (file, mapper) = match &d.checked {
                None => (d.member.as_file()?, d.member.as_mapper()),
                Some(c) => {
                    // Checked data: its cached pages are verified here,
                    // whole blocks only; anything else (a block that
                    // disagrees, a page not cached) is left to `read`,
                    // which reads, verifies, heals and counts.
                    if !(at.is_multiple_of(BLOCK) && p.len.is_multiple_of(BLOCK)) {
                        return None;
                    }
                    let inner = c.inner();
                    let (file, mapper) = (inner.as_file()?, inner.as_mapper()?);
                    mapped.clear();
                    if !mapper.cached(at, p.len, &mut mapped).ok()? {
                        return None;
                    }
                    let mut pos = at;
                    for r in &mapped {
                        // SAFETY: the range is mapped (`r` holds the
                        // mapping) and `r.len` bytes long; it is only read.
                        // A write racing this read may change the bytes
                        // meanwhile (as it may for any read racing a
                        // write): a block torn by it disagrees with both
                        // checksums and sends the read the ordinary way.
                        let data = unsafe { std::slice::from_raw_parts(r.ptr, r.len) };
                        if !c.agrees(data, pos).ok()? {
                            return None;
                        }
                        pos += r.len as u64;
                    }
                    (file, Some(mapper))
                }
            };
            push_extent(&mut ext, file, mapper, None, at, p.len);
            if !disks.iter().any(|x| std::ptr::eq(*x, &**d)) {
                disks.push(d);
            }
        }
        self.fg_ops.fetch_add(1, Ordering::Relaxed);
        Some(self.core.timed_all(&disks, || f(&ext)))
    }

    /// Writes placed straight into member files: for a level with no
    /// redundancy (linear, RAID-0), where writing a range is only writing
    /// its pieces to the members that hold them, call `f` with those files'
    /// ranges in order (see `Member::with_write_extents`), after what every
    /// write does first (the array marked dirty). None: use `write` (a
    /// redundant level, a member that is not a plain file or is being
    /// replaced, a failed array, an error to report).
    ///
    /// `f` is not under the members' stall watch: what it writes usually
    /// comes from a network client, whose pace says nothing of the member's.
    pub fn with_write_extents(
        &self,
        offset: u64,
        len: u64,
        f: &mut dyn FnMut(&[FileExtent<'_>]) -> std::io::Result<()>,
    ) -> Option<std::io::Result<()>> {
        // Not while a reshape moves data: `write` places by the boundary.
        let fence = self.fence(offset, len, false);
        if fence.is_some() {
            return None;
        }
        // (No redundancy also means no bitmap, rebuild or replacement.)
        if self.core.geom().level.is_parity() {
            return self.with_stripe_extents(offset, len, f);
        }
        if len == 0
            || self.core.geom().level.has_redundancy()
            || self.core.check(offset, len).is_err()
            || !self.core.alive.load(Ordering::Acquire)
        {
            return None;
        }
        let _writing = self.core.begin_write().ok()?;
        let v = self.core.view.load();
        let pieces = self.core.geom().pieces(offset, len);
        let mut ext: Vec<FileExtent<'_>> = Vec::with_capacity(pieces.len());
        let mut sums = Vec::new();
        for p in &pieces {
            let [(role, dev)] = p.copies[..] else {
                return None;
            };
            let d = v.roles[role].disk.as_ref()?;
            write_target(d, dev, p.len, &mut ext, &mut sums)?;
        }
        self.fg_ops.fetch_add(1, Ordering::Relaxed);
        write_in_place(&sums, || f(&ext))
    }

    /// `with_write_extents` for parity levels: whole stripes only, every
    /// member in service and in sync, the data members plain files. Each
    /// stripe's intent is logged (or its bitmap region marked) and the
    /// stripes are locked before `f` writes the data chunks in place; then
    /// P (and Q) are computed from what the data members hold and written,
    /// whatever `f` managed to write: the stripes are consistent again
    /// before the locks go. A crash in between leaves stripes that the
    /// intent log (or the bitmap) has the parity of recomputed; every data
    /// chunk of them belongs to the interrupted write, so no data outside
    /// it can be lost (no write hole).
    ///
    /// `f` returning `ErrorKind::WouldBlock` means it wrote nothing: the
    /// parity is then left alone.
    pub(crate) fn with_stripe_extents(
        &self,
        offset: u64,
        len: u64,
        f: &mut dyn FnMut(&[FileExtent<'_>]) -> std::io::Result<()>,
    ) -> Option<std::io::Result<()>> {
        let chunk = self.core.geom().chunk;
        let width = chunk * self.core.geom().data_members() as u64;
        if len == 0
            || !offset.is_multiple_of(width)
            || !len.is_multiple_of(width)
            || self.core.check(offset, len).is_err()
            || !self.core.alive.load(Ordering::Acquire)
            || !Core::whole(&self.core.view.load())
        {
            return None;
        }
        let _writing = self.core.begin_write().ok()?;
        let (s0, s1) = (offset / width, (offset + len) / width);
        let pieces = self.core.geom().pieces(offset, len);
        let _bits = self.mark_bitmap(&self.core.view.load(), &pieces);
        let _locks = self.core.lock_range(s0, s1);
        let v = self.core.view.load_full();
        if !self.core.alive.load(Ordering::Acquire) || !Core::whole(&v) {
            return None;
        }
        let mut ext: Vec<FileExtent<'_>> = Vec::with_capacity(pieces.len());
        let mut sums = Vec::new();
        for p in &pieces {
            let (role, dev) = p.copies[0];
            let d = v.roles[role].disk.as_ref()?;
            write_target(d, dev, p.len, &mut ext, &mut sums)?;
        }
        let Ok(slots) = self.journal_intents(s0, s1, chunk) else {
            return None;
        };
        self.fg_ops.fetch_add(1, Ordering::Relaxed);
        // The data's checksums are recorded before the parity is computed
        // from it (which reads it back checked).
        let r = write_in_place(&sums, || f(&ext))?;
        if matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock) {
            return Some(r);
        }
        let parity = (s0..s1).try_for_each(|s| {
            if self.parity_in_place(&v, s) {
                Ok(())
            } else {
                self.recompute_parity(&v, s, 0, chunk, DataFrom::Members)
            }
        });
        drop(slots);
        Some(match parity {
            Ok(()) => r,
            Err(e) => Err(std::io::Error::other(e.to_string())),
        })
    }
}

/// Add the piece at `dev` (`len` bytes) of member `d` to the extents a
/// write goes straight into: the member's own file, or for a checked
/// member the file under the checks, whole blocks only, with the range
/// added to `sums` (see `write_in_place`). None: the piece cannot be
/// written in place (not a plain file open for writing, or part of a
/// checked block).
fn write_target<'a>(
    d: &'a Disk,
    dev: u64,
    len: u64,
    ext: &mut Vec<FileExtent<'a>>,
    sums: &mut Vec<(&'a Checked, u64, u64)>,
) -> Option<()> {
    let at = d.data_offset + dev;
    let (member, landed) = match &d.checked {
        None => (&d.member, None),
        Some(c) => {
            if !(dev.is_multiple_of(BLOCK) && len.is_multiple_of(BLOCK)) {
                return None;
            }
            sums.push((&**c, at, len));
            (c.inner(), Some(&**c as &dyn raidkit_member::Landed))
        }
    };
    let file = member.as_file()?;
    let mapper = member.as_mapper().filter(|m| m.writable())?;
    push_extent(ext, file, Some(mapper), landed, at, len);
    Some(())
}

/// Run `write`, which places data straight into member files, with the
/// checked ranges of `sums` (member, offset, length) held as writes in
/// flight and their checksums recorded from what they hold after it
/// (`Checked::in_place`); `ErrorKind::WouldBlock` from `write` says that
/// nothing was written, and the recorded checksums stay. The ranges are
/// taken in the order given, which is the array's order for every caller:
/// two writes that overlap wait for each other the same way round. None:
/// a checksum page could not be loaded (write the ordinary way, which
/// reports it).
fn write_in_place(
    sums: &[(&Checked, u64, u64)],
    write: impl FnOnce() -> std::io::Result<()>,
) -> Option<std::io::Result<()>> {
    let mut held = Vec::with_capacity(sums.len());
    for &(c, at, len) in sums {
        held.push(c.in_place(at, len).ok().flatten()?);
    }
    let r = write();
    if matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock) {
        held.iter_mut().for_each(|g| g.nothing_written());
    }
    drop(held);
    Some(r)
}

/// Append `len` bytes at `at` of `file` to `ext`, as part of the last
/// extent where they continue it.
pub(crate) fn push_extent<'a>(
    ext: &mut Vec<FileExtent<'a>>,
    file: &'a std::fs::File,
    mapper: Option<&'a raidkit_member::Mapper>,
    landed: Option<&'a dyn raidkit_member::Landed>,
    at: u64,
    len: u64,
) {
    match ext.last_mut() {
        Some(e) if std::ptr::eq(e.file, file) && e.offset + e.len == at => e.len += len,
        _ => ext.push(FileExtent {
            file,
            mapper,
            offset: at,
            len,
            landed,
        }),
    }
}
