//! Writes placed straight into a checked member's file (the NBD server
//! receiving a payload into its mapping of the member): the blocks are held
//! as a write in flight while they land, and their checksums are taken as
//! they land (`Landed`) or read back when the write ends.

use super::in_flight::Writing;
use super::{Checked, ANY};
use crate::metadata::checksums::{self, BLOCK};
use crate::scratch;
use raidkit_member::{Locked, MemberError};

impl Checked {
    /// Hold whole blocks `[at, at + len)` of the data area for a write that
    /// someone else places straight into the inner member's file (the
    /// server receiving a payload into its mapping), as a write in flight:
    /// other writes of them wait, and reads that race it take whatever they
    /// find there. Dropping the guard records the checksums of what the
    /// blocks then hold. None: not whole blocks of the data area (write
    /// with `write_at`).
    pub fn in_place(&self, at: u64, len: u64) -> Result<Option<InPlace<'_>>, MemberError> {
        if len == 0
            || !(at.wrapping_sub(self.data_offset)).is_multiple_of(BLOCK)
            || !len.is_multiple_of(BLOCK)
            || self.data_part(at, len) != Some((at, at + len))
        {
            return Ok(None);
        }
        let w = self.writing.enter(at, at + len);
        let (first, n) = ((at - self.data_offset) / BLOCK, (len / BLOCK) as usize);
        let marked = self.page_runs(first, n, |p, e, _, m| {
            p.pending.extend((0..m).map(|j| ((e + j) as u16, ANY)));
            if !p.landed.is_empty() {
                p.landed
                    .retain(|&(i, _)| !(e..e + m).contains(&(i as usize)));
            }
        });
        let mut g = InPlace {
            c: self,
            lo: at,
            hi: at + len,
            wrote: false,
            _w: w,
        };
        // On an error part of the marks are made: the guard takes them
        // back as it goes (nothing written, nothing recorded).
        marked?;
        g.wrote = true;
        Ok(Some(g))
    }

    /// The checksums of the blocks the inner member holds at `[lo, hi)`
    /// (block aligned): read through its mapping when every page is cached
    /// (the case of a write just placed there), else read.
    fn sums_held(&self, lo: u64, hi: u64) -> Result<Vec<u32>, MemberError> {
        let mut sums = Vec::with_capacity(((hi - lo) / BLOCK) as usize);
        if let Some(m) = self.inner.as_mapper() {
            let mut ranges = Vec::new();
            if matches!(m.cached(lo, hi - lo, &mut ranges), Ok(true)) {
                // SAFETY: each range lies in a mapping that `ranges` keeps
                // alive, `len` bytes long, and is only read, inside
                // `guarded`: a page the file system cannot back ends the
                // pass with an error instead of a signal. Windows are
                // 64 MiB aligned, so no block straddles two ranges.
                let r = unsafe {
                    raidkit_member::guarded(&mut || {
                        for r in &ranges {
                            let data = std::slice::from_raw_parts(r.ptr, r.len);
                            sums.extend(data.chunks(BLOCK as usize).map(checksums::sum));
                        }
                    })
                };
                if r.is_ok() {
                    return Ok(sums);
                }
                sums.clear();
            }
        }
        let mut buf = scratch::take((hi - lo) as usize);
        let r = self.inner.read_at(&mut buf, lo);
        sums.extend(buf.chunks(BLOCK as usize).map(checksums::sum));
        scratch::give(buf);
        r.map(|()| sums)
    }
}

/// Blocks being written in place (`Checked::in_place`). Dropped: the
/// blocks' checksums are those of what they hold now (the write's data,
/// or for a write that failed part-way, whatever it left, which is what a
/// failed write may leave), unless `nothing_written` said that nothing
/// was written, which keeps the old ones. A block that cannot be read
/// back has its checksum cleared (none yet: it is sealed as next read).
pub(crate) struct InPlace<'a> {
    c: &'a Checked,
    lo: u64,
    hi: u64,
    wrote: bool,
    _w: Writing<'a>,
}

impl InPlace<'_> {
    /// Nothing was written: the recorded checksums stay.
    pub fn nothing_written(&mut self) {
        self.wrote = false;
    }
}

impl InPlace<'_> {
    /// The checksums of what the blocks hold now: those taken as the data
    /// landed, the others read back (0 where that fails: none yet). Takes
    /// the landed ones from the pages either way.
    fn sums_now(&self, first: u64, n: usize) -> Option<Vec<u32>> {
        let c = self.c;
        let mut sums = vec![0u32; n];
        let _ = c.page_runs(first, n, |p, e, k, m| {
            if !p.landed.is_empty() {
                p.landed.retain(|&(i, s)| {
                    let i = i as usize;
                    let ours = (e..e + m).contains(&i);
                    if ours {
                        sums[k + i - e] = s;
                    }
                    !ours
                });
            }
        });
        if !self.wrote {
            return None;
        }
        // The blocks without one, a run at a time.
        let mut k = 0;
        while k < n {
            if sums[k] != 0 {
                k += 1;
                continue;
            }
            let end = (k..n).find(|&j| sums[j] != 0).unwrap_or(n);
            let at = self.lo + k as u64 * BLOCK;
            if let Ok(s) = c.sums_held(at, at + (end - k) as u64 * BLOCK) {
                sums[k..end].copy_from_slice(&s);
            }
            k = end;
        }
        Some(sums)
    }
}

impl Drop for InPlace<'_> {
    fn drop(&mut self) {
        let c = self.c;
        let first = (self.lo - c.data_offset) / BLOCK;
        let n = ((self.hi - self.lo) / BLOCK) as usize;
        let sums = self.sums_now(first, n);
        // The pages hold pending marks, so they stay loaded (`drop_clean`)
        // and this does no I/O; a page whose loading failed in `in_place`
        // has no mark to take back.
        let _ = c.page_runs(first, n, |p, e, k, m| {
            let Some(loaded) = p.sums.as_mut() else {
                return;
            };
            if let Some(s) = &sums {
                loaded[e..e + m].copy_from_slice(&s[k..k + m]);
                p.dirty = true;
            }
            p.pending
                .retain(|&(i, ps)| !(ps == ANY && (e..e + m).contains(&(i as usize))));
        });
        if sums.is_some() && !c.known_bad.locked().is_empty() {
            c.known_bad
                .locked()
                .retain(|&o| o < self.lo || o >= self.hi);
        }
    }
}

impl raidkit_member::Landed for Checked {
    /// Take the checksums of the whole blocks of `range` now, while a
    /// write that just placed them has them in the CPU's cache, for the
    /// write's `InPlace` to record when it ends: read back then, they come
    /// from memory, at half the speed.
    fn landed(&self, offset: u64, range: &raidkit_member::MappedRange) {
        let Some((lo, hi)) = self.data_part(offset, range.len as u64) else {
            return;
        };
        let d = self.data_offset;
        let (a, b) = (
            d + (lo - d).next_multiple_of(BLOCK),
            d + (hi - d) / BLOCK * BLOCK,
        );
        if a >= b {
            return;
        }
        let n = ((b - a) / BLOCK) as usize;
        let mut sums = Vec::with_capacity(n);
        // SAFETY: [a, b) lies within `range`, which keeps its mapping
        // alive, and is only read, inside `guarded`; `sums` has room for
        // every entry, so extending it allocates nothing.
        let r = unsafe {
            raidkit_member::guarded(&mut || {
                let data = std::slice::from_raw_parts(
                    range.ptr.add((a - offset) as usize),
                    (b - a) as usize,
                );
                sums.extend(data.chunks(BLOCK as usize).map(checksums::sum));
            })
        };
        if r.is_err() || sums.len() != n {
            return;
        }
        let _ = self.page_runs((a - d) / BLOCK, n, |p, e, k, m| {
            p.landed
                .extend((0..m).map(|j| ((e + j) as u16, sums[k + j])));
        });
    }
}
