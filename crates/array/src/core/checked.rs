//! A member whose data area is checked against its checksum area
//! (`metadata::checksums`): every block read is verified, every block
//! written gets its checksum recorded. Everything outside the data area
//! (superblocks, bitmap, journal) passes through untouched.
//!
//! A block that disagrees with its checksum is a read error of that block
//! (`ErrorKind::InvalidData`), which the levels treat as any read error:
//! rebuilt from redundancy, the result checked against the block's own
//! checksum (`agrees`), rewritten and read back. Within a crash window
//! (regions being written when the array stopped uncleanly) data and
//! checksum may have been torn apart by the crash, so a block that
//! disagrees is not an error there (`read_window`, then `settle`): it is
//! put back from redundancy where the rebuild agrees with its checksum
//! (rot: `Core::window_heal`), and otherwise taken as it is and its
//! checksum recomputed (torn; journal replay, which heals each window
//! itself first, has its reads take it as it is).
//!
//! Checksums are loaded a page at a time as blocks are read and written
//! (4 bytes per 4 KiB of data), kept while used, and go back to the member
//! at every flush, before the member's own flush. At most about
//! `cache_pages()` pages stay loaded per member (16 MiB, the checksums of
//! 16 GiB of data): past it, clean pages are dropped, oldest position
//! first (a clock hand), and when too many are changed they are written
//! back early. Writing checksums back before a flush is what every flush
//! does anyway (they go out before the member's flush, beside data writes
//! not yet durable): blocks written since the last flush are in the crash
//! window, which recovery reads adopting.

use crate::metadata::checksums::{self, BLOCK, PER_PAGE};
use crate::scratch;
use crate::superblock::ChecksumArea;
use raidkit_member::{Locked, Member, MemberError, Op};
use std::collections::HashSet;
use std::io;

mod in_flight;
mod in_place;
use in_flight::InFlight;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const PAGE_BYTES: usize = (PER_PAGE * checksums::ENTRY) as usize;
/// Checksum pages written back in one write at most (1 MiB).
const MAX_RUN: usize = 256;
/// Clean pages written again, at most, to join two runs of changed ones.
const MAX_GAP: usize = 16;
/// Checksum pages read at once when one is first needed (128 KiB: the
/// checksums of 128 MiB of data).
const LOAD_AHEAD: usize = 32;
/// Checksum pages kept loaded per member by default (16 MiB).
const CACHE_PAGES: usize = 4096;

/// Checksum pages kept loaded per member: `CACHE_PAGES`, or
/// RAIDKIT_CHECKSUM_CACHE_PAGES (tests set it tiny, so that every path
/// runs with pages coming and going).
fn cache_pages() -> usize {
    static PAGES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PAGES.get_or_init(|| {
        std::env::var("RAIDKIT_CHECKSUM_CACHE_PAGES")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&n: &usize| n > 0)
            .unwrap_or(CACHE_PAGES)
    })
}

/// In `Page::pending`: a write whose content is not known in advance is
/// in flight there (placed straight into the member's file: `InPlace`), so
/// a racing read may see anything. (0 is never a recorded checksum.)
const ANY: u32 = 0;

#[derive(Debug, Default)]
struct Page {
    /// None until read from the member.
    sums: Option<Box<[u32]>>,
    dirty: bool,
    /// Checksums of writes in flight (entry index, new sum): a read that
    /// races a write of its block may see either content.
    pending: Vec<(u16, u32)>,
    /// Checksums of blocks of writes in place (`InPlace`) taken as their
    /// data landed (`Landed`), for the write's end to record (entry
    /// index, sum).
    landed: Vec<(u16, u32)>,
}

/// What verifying a range found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// Member offsets of blocks that disagree with their checksum.
    pub bad: Vec<u64>,
}

/// A member with checked data.
#[derive(Debug)]
pub(crate) struct Checked {
    inner: Arc<dyn Member>,
    data_offset: u64,
    area: ChecksumArea,
    pages: Box<[Mutex<Page>]>,
    /// One bit per page: changed since the last write-back.
    dirty: Box<[AtomicU64]>,
    /// Held by a write-back, and by whoever drops pages: a page is dropped
    /// only while no write-back is between taking its bytes and writing
    /// them (it would be read back stale).
    writing_back: Mutex<()>,
    /// Pages loaded now.
    loaded: std::sync::atomic::AtomicUsize,
    /// The page the next look for one to drop starts at.
    hand: std::sync::atomic::AtomicUsize,
    /// Pages kept loaded, at most (about).
    cap: usize,
    writing: InFlight,
    /// Blocks found bad and not rewritten since: each is counted once.
    known_bad: Mutex<HashSet<u64>>,
    /// Blocks that disagreed with their checksum (each counted once until rewritten).
    pub mismatches: AtomicU64,
    /// Blocks whose checksum was recomputed from their data in a crash window.
    pub adopted: AtomicU64,
    /// Recent incidents of rot (for the failure threshold): when each was
    /// found and the member extent its bad blocks span.
    recent: Mutex<std::collections::VecDeque<Incident>>,
    /// Whether a block read that has no checksum yet gets one (its
    /// contents as first read are its contents): off on read-only opens,
    /// which must not write.
    seal: bool,
}

/// A member with this many checksum errors within `MISMATCH_WINDOW` is
/// failed (ZED's default for a checksum-degraded vdev).
pub(crate) const MISMATCH_LIMIT: usize = 10;
pub(crate) const MISMATCH_WINDOW: Duration = Duration::from_secs(600);
/// Bad blocks this close to an incident's are part of it. ZED counts one
/// error per I/O, so a scratch under one read is one error; counted per
/// block, one rotten 64 KiB extent (16 blocks) failed a member at its
/// first read, and counted per read, reading it 4 KiB at a time would.
/// One defect is one incident however it is read; rot spread over the
/// disk is many.
pub(crate) const INCIDENT_SPAN: u64 = 1 << 20;

/// Bad blocks close together, found within the window.
#[derive(Debug)]
struct Incident {
    at: Instant,
    lo: u64,
    hi: u64,
}

fn invalid(name: &str, op: Op, offset: u64, len: u64, what: String) -> MemberError {
    MemberError::new(
        name,
        op,
        offset,
        len,
        io::Error::new(io::ErrorKind::InvalidData, what),
    )
}

/// Puts back the block at a member offset in a crash window (see
/// `Checked::settle`).
pub(crate) type Heal<'a> = &'a mut dyn FnMut(u64, &mut [u8]) -> HealResult;

/// What a heal in a crash window made of a block that disagrees with its
/// checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HealResult {
    /// Put back (in the buffer).
    Healed,
    /// Cannot be rebuilt so as to agree with its checksum: torn by the
    /// crash, taken as it is.
    Torn,
    /// Could not be told (its column could not be read with its writes
    /// held off): served as it is, its checksum left as it is.
    Unsure,
    /// Its column (or another copy) holds a block a rebuild could not
    /// rebuild (`Checked::mark_lost`): there is no redundancy left to tell
    /// rot from a torn write, and the block read as bad before the crash.
    /// It stays bad: a read of it fails, and it is not taken.
    Lost,
}

/// Reads a block as the member holds it (see `Checked::settle`).
pub(crate) type Reread<'a> = &'a dyn Fn(&mut [u8], u64) -> Result<(), MemberError>;

/// Whether a member error is a checksum mismatch (not an I/O error).
pub(crate) fn is_mismatch(e: &MemberError) -> bool {
    e.source.kind() == io::ErrorKind::InvalidData
}

impl Checked {
    pub fn new(
        inner: Arc<dyn Member>,
        data_offset: u64,
        area: ChecksumArea,
        seal: bool,
    ) -> Checked {
        let n = area.size.div_ceil(PAGE_BYTES as u64) as usize;
        Checked {
            inner,
            data_offset,
            area,
            pages: (0..n).map(|_| Mutex::new(Page::default())).collect(),
            dirty: (0..n.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            writing_back: Mutex::new(()),
            loaded: Default::default(),
            hand: Default::default(),
            cap: cache_pages(),
            writing: InFlight::default(),
            known_bad: Mutex::new(HashSet::new()),
            mismatches: AtomicU64::new(0),
            adopted: AtomicU64::new(0),
            recent: Mutex::new(Default::default()),
            seal,
        }
    }

    /// The member under the checks (for the fast paths, which verify
    /// what they take from it themselves).
    pub fn inner(&self) -> &Arc<dyn Member> {
        &self.inner
    }

    fn entries(&self) -> u64 {
        self.area.size / checksums::ENTRY
    }

    /// The part of `[off, off + len)` in the checked data area.
    fn data_part(&self, off: u64, len: u64) -> Option<(u64, u64)> {
        let lo = off.max(self.data_offset);
        let hi = (off + len).min(self.data_offset + self.entries() * BLOCK);
        (lo < hi).then_some((lo, hi))
    }

    /// Run `f` on the loaded page of entry `i` (block index in the data area).
    fn with_page<T>(
        &self,
        i: u64,
        f: impl FnOnce(&mut Page, usize) -> T,
    ) -> Result<T, MemberError> {
        let (pg, at) = ((i / PER_PAGE) as usize, (i % PER_PAGE) as usize);
        let mut page = self.pages[pg].locked();
        if page.sums.is_none() {
            // The pages after it come in the same read: a sequential pass
            // (scrub, sync, a client streaming) would otherwise leave its
            // data for the checksum area every 4 MiB, a seek each way on
            // a spinning disk. Pages already loaded (perhaps changed) or
            // busy are left as they are; a page not loaded has its
            // contents only on the member, so the copy read here is current.
            let run = LOAD_AHEAD.min(self.pages.len() - pg);
            let mut raw = vec![0u8; PAGE_BYTES * run];
            self.inner
                .read_at(&mut raw, self.area.offset + pg as u64 * PAGE_BYTES as u64)?;
            let decode = |b: &[u8]| -> Box<[u32]> {
                b.chunks_exact(4)
                    .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
                    .collect()
            };
            let mut pages = raw.chunks_exact(PAGE_BYTES);
            page.sums = Some(decode(pages.next().expect("one page")));
            let mut loaded = 1;
            for (k, b) in pages.enumerate() {
                if let Ok(mut p) = self.pages[pg + 1 + k].try_lock() {
                    if p.sums.is_none() {
                        p.sums = Some(decode(b));
                        loaded += 1;
                    }
                }
            }
            self.loaded.fetch_add(loaded, Ordering::AcqRel);
        }
        let r = f(&mut page, at);
        if page.dirty {
            self.mark(pg);
        }
        drop(page);
        if self.loaded.load(Ordering::Acquire) > self.cap {
            self.shrink();
        }
        Ok(r)
    }

    /// Drop clean pages until a quarter of the cache is free; when too
    /// few are clean, write the changed ones back first. Skipped while a
    /// write-back runs (the next load tries again).
    fn shrink(&self) {
        let Ok(_one) = self.writing_back.try_lock() else {
            return;
        };
        let target = self.cap - self.cap / 4;
        if !self.drop_clean(target) && self.write_back_locked().is_ok() {
            self.drop_clean(target);
        }
    }

    /// Drop clean pages, from the clock hand on, until at most `target`
    /// are loaded or every page was looked at once. Pages that are busy,
    /// changed, or have writes in flight stay. With `writing_back` held.
    fn drop_clean(&self, target: usize) -> bool {
        let n = self.pages.len();
        for _ in 0..n {
            if self.loaded.load(Ordering::Acquire) <= target {
                return true;
            }
            let pg = self.hand.fetch_add(1, Ordering::Relaxed) % n;
            if self.dirty[pg / 64].load(Ordering::Acquire) & (1 << (pg % 64)) != 0 {
                continue;
            }
            if let Ok(mut p) = self.pages[pg].try_lock() {
                if p.sums.is_some() && !p.dirty && p.pending.is_empty() {
                    p.sums = None;
                    self.loaded.fetch_sub(1, Ordering::AcqRel);
                }
            }
        }
        self.loaded.load(Ordering::Acquire) <= target
    }

    /// Check `data`, read from member offset `at` (block aligned), against
    /// the recorded checksums (and those of writes in flight).
    fn verify(&self, data: &[u8], at: u64) -> Result<Verdict, MemberError> {
        let mut v = Verdict::default();
        let blocks: Vec<&[u8]> = data.chunks(BLOCK as usize).collect();
        let first = (at - self.data_offset) / BLOCK;
        self.per_page(first, blocks.len(), |p, e, k| {
            let blk = blocks[k];
            let s = p.sums.as_ref().expect("loaded")[e];
            let ok = if s == 0 {
                // Never written since create or add (so never synced or
                // scrubbed either): sealed as first read, unless a write
                // of it is in flight (which records its own).
                if self.seal && !p.pending.iter().any(|&(x, _)| x as usize == e) {
                    p.sums.as_mut().expect("loaded")[e] = checksums::sum(blk);
                    p.dirty = true;
                }
                true
            } else if checksums::matches(s, blk) {
                true
            } else {
                let fresh = checksums::sum(blk);
                p.pending
                    .iter()
                    .any(|&(x, ps)| x as usize == e && (ps == fresh || ps == ANY))
            };
            if !ok {
                v.bad.push(at + k as u64 * BLOCK);
            }
        })?;
        Ok(v)
    }

    /// Run `f(page, entry in page, k)` for entries `first + k`, k < n, each
    /// page locked once for all its entries.
    fn per_page(
        &self,
        first: u64,
        n: usize,
        mut f: impl FnMut(&mut Page, usize, usize),
    ) -> Result<(), MemberError> {
        self.page_runs(first, n, |p, e, k, m| {
            for j in 0..m {
                f(p, e + j, k + j);
            }
        })
    }

    /// Run `f(page, first entry in page, k, count)` for each page's run of
    /// the entries `first + k`, k < n: a page locked once for all its
    /// entries (not once per 4 KiB block).
    fn page_runs(
        &self,
        first: u64,
        n: usize,
        mut f: impl FnMut(&mut Page, usize, usize, usize),
    ) -> Result<(), MemberError> {
        let mut k = 0;
        while k < n {
            let i = first + k as u64;
            let m = ((PER_PAGE - i % PER_PAGE) as usize).min(n - k);
            self.with_page(i, |p, e| f(p, e, k, m))?;
            k += m;
        }
        Ok(())
    }

    /// Record `sum` for entry `i`.
    fn record(&self, i: u64, sum: u32) -> Result<(), MemberError> {
        self.with_page(i, |p, e| {
            p.sums.as_mut().expect("loaded")[e] = sum;
            p.dirty = true;
        })
    }

    /// Whether `data`, meant for member offset `at`, agrees with the
    /// checksums recorded for it (blocks with none agree; so do parts of
    /// blocks, which cannot be checked alone): a reconstruction is
    /// trusted only if it does.
    pub fn agrees(&self, data: &[u8], at: u64) -> Result<bool, MemberError> {
        let Some((lo, hi)) = self.data_part(at, data.len() as u64) else {
            return Ok(true);
        };
        let (a, b) = (lo.next_multiple_of(BLOCK), hi / BLOCK * BLOCK);
        if a >= b {
            return Ok(true);
        }
        let part = &data[(a - at) as usize..(b - at) as usize];
        Ok(self.verify(part, a)?.bad.is_empty())
    }

    /// The member's own flush, checksum pages not written back (see
    /// `Disk::flush_device`).
    pub fn flush_device(&self) -> Result<(), MemberError> {
        self.inner.flush()
    }

    /// Read `buf` at `off` as the member holds it, with the member offsets
    /// of its blocks that disagree with their checksums (counted, as by
    /// `bad_blocks`). Writes of the range wait meanwhile: one landing
    /// between the read and the verdict would make the old bytes look
    /// rotten against the new checksum.
    pub fn read_verdict(&self, buf: &mut [u8], off: u64) -> Result<Vec<u64>, MemberError> {
        let _held = self.data_part(off, buf.len() as u64).map(|(lo, hi)| {
            self.writing
                .enter(lo / BLOCK * BLOCK, hi.next_multiple_of(BLOCK))
        });
        self.inner.read_at(buf, off)?;
        self.bad_blocks(buf, off)
    }

    /// The member offsets of blocks of `data` (read from `at`, block
    /// aligned) that disagree with their checksums, counted as errors.
    fn bad_blocks(&self, data: &[u8], at: u64) -> Result<Vec<u64>, MemberError> {
        let Some((lo, hi)) = self.data_part(at, data.len() as u64) else {
            return Ok(Vec::new());
        };
        let part = &data[(lo - at) as usize..(hi - at) as usize];
        let bad = self.verify(part, lo)?.bad;
        for &off in &bad {
            self.count_bad(off);
        }
        Ok(bad)
    }

    /// Read without checking (what the disk holds, right or wrong).
    pub fn read_raw(&self, buf: &mut [u8], off: u64) -> Result<(), MemberError> {
        self.inner.read_at(buf, off)
    }

    /// Read `buf` at `off`, the data part checked block by block. Returns
    /// the member offsets of the blocks that disagree with their checksums
    /// (after a second read, as `check_read`), counted as errors if
    /// `count`: `buf` holds them as read. A block only partly in `buf` is
    /// read whole to be checked. `held`: the caller holds writes of the
    /// range off (a write reading the blocks at its edges).
    fn read_checked(
        &self,
        buf: &mut [u8],
        off: u64,
        held: bool,
        count: bool,
    ) -> Result<Vec<u64>, MemberError> {
        let Some((lo, hi)) = self.data_part(off, buf.len() as u64) else {
            self.inner.read_at(buf, off)?;
            return Ok(Vec::new());
        };
        let (a, b) = (lo / BLOCK * BLOCK, hi.next_multiple_of(BLOCK));
        let aligned = a == off && b == off + buf.len() as u64;
        if aligned {
            self.inner.read_at(buf, off)?;
            return self.check_read(buf, a, held, count);
        }
        // Parts outside the data area, then the blocks the request touches.
        if off < lo {
            self.inner.read_at(&mut buf[..(lo - off) as usize], off)?;
        }
        let end = off + buf.len() as u64;
        if hi < end {
            let from = (hi - off) as usize;
            self.inner.read_at(&mut buf[from..], hi)?;
        }
        let mut whole = scratch::take((b - a) as usize);
        let r = self.inner.read_at(&mut whole, a).and_then(|()| {
            let bad = self.check_read(&mut whole, a, held, count)?;
            buf[(lo - off) as usize..(hi - off) as usize]
                .copy_from_slice(&whole[(lo - a) as usize..(hi - a) as usize]);
            Ok(bad)
        });
        scratch::give(whole);
        r
    }

    /// Verify blocks just read at `a`; a block that disagrees is read once
    /// more (a write may have raced the read) before it counts (if
    /// `count`). Returns those that still disagree.
    fn check_read(
        &self,
        data: &mut [u8],
        a: u64,
        held: bool,
        count: bool,
    ) -> Result<Vec<u64>, MemberError> {
        let first = self.verify(data, a)?;
        let mut bad = Vec::new();
        for off in first.bad {
            let at = (off - a) as usize;
            let blk = &mut data[at..at + BLOCK as usize];
            // The second read and the count hold off writes of the block
            // (and wait for one in flight). A write still landing can be
            // read half old, half new, twice in a row: a block right on
            // the member taken for rotten. And a block that another
            // request's read counted and healed meanwhile must not be
            // counted again once its heal cleared it: the heal waits
            // until this read's count is in.
            let _held = (!held).then(|| self.writing.enter(off, off + BLOCK));
            self.inner.read_at(blk, off)?;
            if !self.verify(blk, off)?.bad.is_empty() {
                if count {
                    self.count_bad(off);
                }
                bad.push(off);
            }
        }
        Ok(bad)
    }

    /// A block found to disagree with its checksum is a checksum error:
    /// counted once until rewritten, and part of an incident of rot.
    fn count_bad(&self, off: u64) {
        // A block a rebuild marked lost is not this member's rot (what it
        // was rebuilt from was bad): it reads as an error until written,
        // as md's bad block list, and never counts toward failing the
        // member (two new members of a RAID-6 were failed for it).
        if self.is_lost(off).unwrap_or(false) {
            return;
        }
        if !self.known_bad.locked().insert(off) {
            return;
        }
        self.mismatches.fetch_add(1, Ordering::Relaxed);
        let mut recent = self.recent.locked();
        let near = recent.iter_mut().find(|i| {
            i.at.elapsed() <= MISMATCH_WINDOW
                && off + BLOCK + INCIDENT_SPAN > i.lo
                && off < i.hi + INCIDENT_SPAN
        });
        match near {
            Some(i) => {
                i.lo = i.lo.min(off);
                i.hi = i.hi.max(off + BLOCK);
            }
            None => recent.push_back(Incident {
                at: Instant::now(),
                lo: off,
                hi: off + BLOCK,
            }),
        }
        while recent.len() > MISMATCH_LIMIT {
            recent.pop_front();
        }
    }

    /// A read's blocks `bad` (counted by `check_read`) fail it, with the
    /// first.
    fn fail_read(&self, bad: &[u64]) -> Result<(), MemberError> {
        let Some(&first) = bad.first() else {
            return Ok(());
        };
        Err(invalid(
            self.inner.name(),
            Op::Read,
            first,
            BLOCK,
            format!(
                "checksum mismatch: {} block(s) of {BLOCK} bytes disagree with their checksum, the first at member offset {first}",
                bad.len(),
            ),
        ))
    }

    /// Whether the member has had `MISMATCH_LIMIT` incidents of rot (bad
    /// blocks not within `INCIDENT_SPAN` of each other) within
    /// `MISMATCH_WINDOW`.
    pub fn past_limit(&self) -> bool {
        let recent = self.recent.locked();
        recent.len() >= MISMATCH_LIMIT
            && recent
                .front()
                .is_some_and(|i| i.at.elapsed() <= MISMATCH_WINDOW)
    }

    /// Read, taking blocks that disagree with their checksum as they are
    /// (a crash window: see the module).
    pub fn read_adopting(&self, buf: &mut [u8], off: u64) -> Result<(), MemberError> {
        let bad = self.read_checked(buf, off, false, false)?;
        self.settle(buf, off, &bad, None, &|blk, at| self.inner.read_at(blk, at))
    }

    /// A read in a crash window, its first part: `buf` read at `off`, with
    /// the member offsets of the blocks that disagree with their checksums
    /// (not counted), for `settle` to deal with. Two parts so that the
    /// member's operation timer (`Core::timed`) covers this member's reads
    /// only, not the heal's reads of other members or a wait for a write
    /// in flight.
    pub fn read_window(&self, buf: &mut [u8], off: u64) -> Result<Vec<u64>, MemberError> {
        self.read_checked(buf, off, false, false)
    }

    /// The second part of a read in a crash window: each block of `bad`
    /// (from `read_window(buf, off)`) is replaced by what `heal(member
    /// offset, block)` puts in it where it says `Healed` (a rebuild from
    /// redundancy that agrees with the block's checksum: rot, put back),
    /// taken as it is where it says `Torn` (a write torn by the crash),
    /// its checksum recorded from it, and served as it is, its checksum
    /// kept, where it says `Unsure`. Neither counts as a checksum error: in
    /// the window the two cannot always be told apart. `reread(block,
    /// member offset)` reads a block as the member holds it.
    pub fn settle(
        &self,
        buf: &mut [u8],
        off: u64,
        bad: &[u64],
        mut heal: Option<Heal<'_>>,
        reread: Reread<'_>,
    ) -> Result<(), MemberError> {
        if bad.is_empty() {
            return Ok(());
        }
        let end = off + buf.len() as u64;
        let mut blk = vec![0u8; BLOCK as usize];
        let mut lost = Vec::new();
        for &at in bad {
            // A block marked lost by a rebuild was never torn by a write
            // (a write records its own checksum): it stays bad.
            let verdict = if self.is_lost(at)? {
                HealResult::Lost
            } else {
                heal.as_mut().map_or(HealResult::Torn, |h| h(at, &mut blk))
            };
            if verdict == HealResult::Lost {
                lost.push(at);
                continue;
            }
            if verdict == HealResult::Unsure {
                reread(&mut blk, at)?;
            } else if verdict == HealResult::Torn {
                // Taken as it is now, with writes of the block held off: a
                // write landing since it was read (a client's, or the
                // resync putting it back) would otherwise have its checksum
                // replaced by that of the bytes it overwrote.
                let _held = self.writing.enter(at, at + BLOCK);
                reread(&mut blk, at)?;
                if !self.verify(&blk, at)?.bad.is_empty() {
                    let s = checksums::sum(&blk);
                    self.record((at - self.data_offset) / BLOCK, s)?;
                    self.adopted.fetch_add(1, Ordering::Relaxed);
                }
            }
            // The part of the block the read asked for.
            let (lo, hi) = (at.max(off), (at + BLOCK).min(end));
            buf[(lo - off) as usize..(hi - off) as usize]
                .copy_from_slice(&blk[(lo - at) as usize..(hi - at) as usize]);
        }
        self.fail_read(&lost)
    }

    /// Whether the block at member offset `at` is marked lost (a rebuild
    /// could not rebuild it, `mark_lost`) and not written since.
    pub fn is_lost(&self, at: u64) -> Result<bool, MemberError> {
        if self.data_part(at, BLOCK).is_none() {
            return Ok(false);
        }
        self.with_page((at - self.data_offset) / BLOCK, |p, e| {
            p.sums.as_ref().expect("loaded")[e] == checksums::lost_sum()
        })
    }

    /// Take the blocks of `[off, off + len)` as the member holds them and
    /// record their checksums (a checksum entry found wrong where the data
    /// is right). Returns how many changed.
    pub fn adopt(&self, off: u64, len: u64) -> Result<u64, MemberError> {
        let before = self.adopted.load(Ordering::Relaxed);
        let mut buf = scratch::take(len as usize);
        let r = self.read_adopting(&mut buf, off);
        scratch::give(buf);
        r?;
        Ok(self.adopted.load(Ordering::Relaxed) - before)
    }

    /// Write whole blocks at `a` (block aligned): checksums recorded as
    /// pending first, so a racing read of either content passes, then
    /// for good once written.
    fn write_blocks(&self, data: &[u8], a: u64) -> Result<(), MemberError> {
        let first = (a - self.data_offset) / BLOCK;
        let sums: Vec<u32> = data.chunks(BLOCK as usize).map(checksums::sum).collect();
        self.page_runs(first, sums.len(), |p, e, k, m| {
            p.pending
                .extend((0..m).map(|j| ((e + j) as u16, sums[k + j])));
        })?;
        let done = self.inner.write_at(data, a);
        self.page_runs(first, sums.len(), |p, e, k, m| {
            // Writes of one block never overlap (`InFlight`): each entry
            // of this run is pending once, for this write.
            p.pending.retain(|&(i, ps)| {
                let i = i as usize;
                !(i >= e && i < e + m && ps == sums[k + i - e])
            });
            if done.is_ok() {
                p.sums.as_mut().expect("loaded")[e..e + m].copy_from_slice(&sums[k..k + m]);
                p.dirty = true;
            }
        })?;
        if done.is_ok() && !self.known_bad.locked().is_empty() {
            let mut known = self.known_bad.locked();
            for k in 0..sums.len() as u64 {
                known.remove(&(a + k * BLOCK));
            }
        }
        done
    }

    /// Whether the checksum area has entries for a data area of `bytes`.
    pub fn covers(&self, bytes: u64) -> bool {
        self.covered() >= bytes
    }

    /// Bytes of data the area has entries for.
    pub fn covered(&self) -> u64 {
        self.entries() * BLOCK
    }

    /// Clear the checksums of the blocks of `[lo, hi)` (member offsets in
    /// the data area, block aligned): none yet, so each is sealed as first
    /// written or read. For space that joins the data area (members that
    /// grew), whose entries nothing kept.
    pub fn forget(&self, lo: u64, hi: u64) -> Result<(), MemberError> {
        let Some((lo, hi)) = self.data_part(lo, hi - lo) else {
            return Ok(());
        };
        let first = (lo - self.data_offset) / BLOCK;
        let n = (hi - lo).div_ceil(BLOCK) as usize;
        self.page_runs(first, n, |p, e, _, m| {
            let sums = p.sums.as_mut().expect("loaded");
            if sums[e..e + m].iter().any(|&x| x != 0) {
                sums[e..e + m].fill(0);
                p.dirty = true;
            }
        })
    }

    /// Record that the block at member offset `off`, just written with
    /// zeroes, holds nothing: its checksum is set to one zeroes do not
    /// have, so that it reads as bad until written anew.
    pub fn mark_lost(&self, off: u64) -> Result<(), MemberError> {
        if self.data_part(off, BLOCK).is_none() {
            return Ok(());
        }
        self.record((off - self.data_offset) / BLOCK, checksums::lost_sum())
    }

    /// Write the checksum pages changed since the last flush, each run of
    /// adjacent ones in one write. Only the pages marked in `dirty` are
    /// looked at: a flush costs what changed, not the member's size.
    fn write_back(&self) -> Result<(), MemberError> {
        // One at a time: a flush that found nothing marked must not return
        // (and flush the device) while another's page writes, which took
        // the marks, are still on their way.
        let _one = self.writing_back.locked();
        self.write_back_locked()
    }

    /// `write_back`, with `writing_back` held.
    fn write_back_locked(&self) -> Result<(), MemberError> {
        let mut marked = Vec::new();
        for (w, word) in self.dirty.iter().enumerate() {
            let mut bits = word.swap(0, Ordering::AcqRel);
            while bits != 0 {
                marked.push(w * 64 + bits.trailing_zeros() as usize);
                bits &= bits - 1;
            }
        }
        let mut k = 0;
        while k < marked.len() {
            // A run: the marked pages from marked[k], with the pages
            // between them when those are loaded (clean, written again as
            // they are) and the gap is short: one write instead of one per
            // page, which random writes would otherwise cost at every
            // checkpoint.
            let mut end = k + 1;
            while end < marked.len()
                && marked[end] - marked[k] < MAX_RUN
                && marked[end] - marked[end - 1] <= MAX_GAP
                && (marked[end - 1] + 1..marked[end])
                    .all(|pg| self.pages[pg].locked().sums.is_some())
            {
                end += 1;
            }
            let (first, last) = (marked[k], marked[end - 1]);
            let mut bytes = Vec::with_capacity((last - first + 1) * PAGE_BYTES);
            for pg in first..=last {
                let mut p = self.pages[pg].locked();
                p.dirty = false;
                let Some(sums) = p.sums.as_ref() else {
                    // Pages are dropped only under `writing_back`, which
                    // this write-back holds: the pages of its runs, found
                    // loaded above, stay loaded.
                    unreachable!("a page in a write-back run is loaded");
                };
                bytes.extend(sums.iter().flat_map(|s| s.to_le_bytes()));
            }
            let at = self.area.offset + first as u64 * PAGE_BYTES as u64;
            if let Err(e) = self.inner.write_at(&bytes, at) {
                // Still to write, at the next flush.
                for &pg in &marked[k..] {
                    self.pages[pg].locked().dirty = true;
                    self.mark(pg);
                }
                return Err(e);
            }
            k = end;
        }
        Ok(())
    }

    /// Note that page `pg` has changes to write back.
    fn mark(&self, pg: usize) {
        self.dirty[pg / 64].fetch_or(1 << (pg % 64), Ordering::AcqRel);
    }
}

impl Member for Checked {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn refresh_len(&self) -> Result<u64, MemberError> {
        self.inner.refresh_len()
    }

    fn peek_len(&self) -> Result<u64, MemberError> {
        self.inner.peek_len()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), MemberError> {
        let bad = self.read_checked(buf, offset, false, true)?;
        self.fail_read(&bad)
    }

    /// Runs of whole blocks of the data area are asked of the member
    /// together, then checked as `read_at` checks them; others are read
    /// one after the other.
    fn read_runs(&self, runs: &mut [(u64, &mut [u8])]) -> Result<(), MemberError> {
        let whole = runs.iter().all(|(off, buf)| {
            let len = buf.len() as u64;
            self.data_part(*off, len) == Some((*off, *off + len))
                && off.is_multiple_of(BLOCK)
                && len.is_multiple_of(BLOCK)
        });
        if !whole {
            return runs
                .iter_mut()
                .try_for_each(|(off, buf)| self.read_at(buf, *off));
        }
        self.inner.read_runs(runs)?;
        let mut bad = Vec::new();
        for (off, buf) in runs.iter_mut() {
            bad.append(&mut self.check_read(buf, *off, false, true)?);
        }
        self.fail_read(&bad)
    }

    fn write_at(&self, buf: &[u8], off: u64) -> Result<(), MemberError> {
        let Some((lo, hi)) = self.data_part(off, buf.len() as u64) else {
            return self.inner.write_at(buf, off);
        };
        if off < lo {
            self.inner.write_at(&buf[..(lo - off) as usize], off)?;
        }
        let end = off + buf.len() as u64;
        if hi < end {
            self.inner.write_at(&buf[(hi - off) as usize..], hi)?;
        }
        let (a, b) = (lo / BLOCK * BLOCK, hi.next_multiple_of(BLOCK));
        let part = &buf[(lo - off) as usize..(hi - off) as usize];
        let _w = self.writing.enter(a, b);
        if a == lo && b == hi {
            return self.write_blocks(part, a);
        }
        // Part of a block: read it (checked: a bad block must not be sealed
        // with a fresh checksum), merge, write it whole. The array heals
        // the blocks at a write's edges before writing; what fails here
        // is rot that came in between, and fails the write.
        let mut whole = scratch::take((b - a) as usize);
        let r = self
            .read_checked(&mut whole, a, true, true)
            .and_then(|bad| self.fail_read(&bad))
            .and_then(|()| {
                whole[(lo - a) as usize..(hi - a) as usize].copy_from_slice(part);
                self.write_blocks(&whole, a)
            });
        scratch::give(whole);
        r
    }

    fn write_at_durable(&self, buf: &[u8], offset: u64) -> Result<(), MemberError> {
        if self.data_part(offset, buf.len() as u64).is_none() {
            return self.inner.write_at_durable(buf, offset);
        }
        self.write_at(buf, offset)?;
        self.flush()
    }

    fn flush(&self) -> Result<(), MemberError> {
        self.write_back()?;
        self.inner.flush()
    }

    fn close(&self) -> Result<(), MemberError> {
        self.write_back()?;
        self.inner.close()
    }

    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }

    fn buffered(&self) -> bool {
        self.inner.buffered()
    }

    fn remote(&self) -> Option<&dyn raidkit_member::Remote> {
        self.inner.remote()
    }

    fn rotational(&self) -> Option<bool> {
        self.inner.rotational()
    }

    fn discard(&self, off: u64, len: u64) -> Result<(), MemberError> {
        let Some((lo, hi)) = self.data_part(off, len) else {
            return self.inner.discard(off, len);
        };
        // Whole blocks read back zeroes after; parts of blocks are written
        // with zeroes (and their checksums updated) instead.
        let (a, b) = (lo.next_multiple_of(BLOCK), hi / BLOCK * BLOCK);
        if a >= b {
            return raidkit_member::write_zeroes(self, off, len);
        }
        raidkit_member::write_zeroes(self, off, a - off)?;
        raidkit_member::write_zeroes(self, b, off + len - b)?;
        let _w = self.writing.enter(a, b);
        self.inner.discard(a, b - a)?;
        let z = checksums::zero_sum();
        for i in (a - self.data_offset) / BLOCK..(b - self.data_offset) / BLOCK {
            self.record(i, z)?;
        }
        let mut known = self.known_bad.locked();
        known.retain(|&o| o < a || o >= b);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
