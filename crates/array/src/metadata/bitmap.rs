//! The write-intent bitmap: one bit per region of the members' data areas,
//! set (durably, on every member) before any write to the region starts and
//! cleared lazily once the region has been idle while the array was whole.
//!
//! A member that drops out and comes back therefore needs only the regions
//! whose bits are set: nothing else was written while it was away, because
//! bits are never cleared while the array is degraded. The superblock
//! records `events_cleared`, the event count when bits were last cleared; a
//! returning member whose event count is older than that may have missed
//! writes whose bits are gone, and is rebuilt in full.
//!
//! # On disk
//!
//! Every member holds a copy at member offset [`BITMAP_OFFSET`] (inside the
//! metadata area, after the two superblock copies): `ceil(regions / 8)`
//! bytes, region `i` in bit `i % 8` of byte `i / 8`, written in whole 4 KiB
//! blocks. The superblock's bitmap fields hold the offset, the region size
//! and `events_cleared`; a region size of zero means no bitmap. Assembly
//! ORs the copies of every fresh member, so a torn bitmap write can only
//! add regions to resync, never lose one.
//!
//! An md array's bitmap is md's own (see `md::MdBitmap`): the same bit
//! order, at md's place, written to exactly its bytes ([`Place`]).
//!
//! # Concurrency
//!
//! A write raises its regions' in-flight counters, then looks at the
//! durable bits; the cleaner clears a bit, then looks at the in-flight
//! counter and puts the bit back if a write arrived. Both sides use
//! sequentially consistent operations, so one of them always sees the
//! other: a write never proceeds on a region whose bit is being cleared.

use crate::superblock::SB_SIZE;
use raidkit_member::Locked;
use raidkit_member::{Member, MemberError};
use smallvec::SmallVec;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

/// Where the bitmap lives on every member.
pub const BITMAP_OFFSET: u64 = 2 * SB_SIZE as u64;
/// md's default region ("bitmap chunk") size.
pub const DEFAULT_REGION: u64 = 64 << 20;
const BLOCK: usize = 4096;

/// Bytes of metadata area a bitmap of `regions` regions needs.
pub fn bytes_for(regions: u64) -> u64 {
    regions.div_ceil(8).div_ceil(BLOCK as u64).max(1) * BLOCK as u64
}

/// Where a bitmap's bits lie on each member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// Byte offset of the first bit's byte from the member's start, or,
    /// with `from_md_end`, from md's superblock.
    pub offset: i64,
    /// md 1.0: the superblock (and the bitmap before it) sits at the
    /// member's end, so where the bits are depends on each member's length.
    pub from_md_end: bool,
    /// Written to exactly the bits' bytes rather than whole 4 KiB blocks:
    /// md's bits share their blocks with md's bitmap superblock (and, for
    /// metadata 1.0, end just before md's superblock).
    pub exact: bool,
}

impl Place {
    /// Where `sb`'s array keeps its bitmap.
    pub fn of(sb: &crate::superblock::Superblock) -> Place {
        let offset = sb.bitmap.offset as i64;
        match &sb.md {
            None => Place {
                offset,
                from_md_end: false,
                exact: false,
            },
            Some(m) => {
                let from_md_end = m.version == crate::metadata::md::MdVersion::V1_0;
                Place {
                    offset: if from_md_end {
                        offset - m.sb_offset as i64
                    } else {
                        offset
                    },
                    from_md_end,
                    exact: true,
                }
            }
        }
    }

    /// The bits' byte offset on `m`.
    pub fn at(&self, m: &dyn Member) -> u64 {
        if self.from_md_end {
            (crate::metadata::md::v1_0_offset(m.len()) as i64 + self.offset).max(0) as u64
        } else {
            self.offset as u64
        }
    }

    fn bytes(&self, regions: u64) -> usize {
        if self.exact {
            regions.div_ceil(8) as usize
        } else {
            bytes_for(regions) as usize
        }
    }
}

/// A set of regions (a snapshot of dirty bits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionSet {
    pub region: u64,
    pub words: Vec<u64>,
}

impl RegionSet {
    pub fn contains(&self, r: u64) -> bool {
        self.words
            .get((r / 64) as usize)
            .is_some_and(|w| w >> (r % 64) & 1 == 1)
    }

    /// Whether any region overlapping device range `[lo, hi)` is in the set.
    pub fn overlaps(&self, lo: u64, hi: u64) -> bool {
        hi > lo && (lo / self.region..hi.div_ceil(self.region)).any(|r| self.contains(r))
    }

    pub fn count(&self) -> u64 {
        self.words.iter().map(|w| w.count_ones() as u64).sum()
    }

    /// Every one of `regions` regions.
    pub fn all(region: u64, regions: u64) -> RegionSet {
        let mut words = vec![u64::MAX; words(regions)];
        if !regions.is_multiple_of(64) {
            if let Some(last) = words.last_mut() {
                *last = (1u64 << (regions % 64)) - 1;
            }
        }
        RegionSet { region, words }
    }
}

#[derive(Debug)]
pub struct Bitmap {
    region: u64,
    /// Regions of the data area now; grows (`grow`) up to what the
    /// bitmap's blocks hold, which the vectors below are sized for.
    regions: AtomicU64,
    place: Place,
    /// Bits known durable on every member.
    durable: Vec<AtomicU64>,
    /// Regions written since the cleaner last looked.
    active: Vec<AtomicU64>,
    inflight: Vec<AtomicU32>,
    /// Serialises changes to the durable bits and their writing out.
    io: Mutex<()>,
}

/// Held while a write is in flight on its regions.
#[derive(Debug)]
pub struct WriteGuard<'a> {
    bitmap: &'a Bitmap,
    /// Region ranges `[lo, hi)`, disjoint.
    regions: SmallVec<[(u64, u64); 2]>,
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        for &(lo, hi) in &self.regions {
            for r in lo..hi {
                self.bitmap.inflight[r as usize].fetch_sub(1, SeqCst);
            }
        }
    }
}

fn words(regions: u64) -> usize {
    regions.div_ceil(64) as usize
}

impl Bitmap {
    /// A bitmap over `dev_size` bytes of member data area, starting from `initial`.
    pub fn new(place: Place, region: u64, dev_size: u64, initial: Option<&RegionSet>) -> Bitmap {
        let regions = dev_size.div_ceil(region).max(1);
        let cap = (place.bytes(regions) as u64 * 8).max(regions);
        let n = words(cap);
        let durable: Vec<AtomicU64> = (0..n)
            .map(|i| AtomicU64::new(initial.and_then(|s| s.words.get(i).copied()).unwrap_or(0)))
            .collect();
        Bitmap {
            region,
            regions: AtomicU64::new(regions),
            place,
            durable,
            active: (0..n).map(|_| AtomicU64::new(0)).collect(),
            inflight: (0..cap).map(|_| AtomicU32::new(0)).collect(),
            io: Mutex::new(()),
        }
    }

    pub fn region(&self) -> u64 {
        self.region
    }

    pub fn regions(&self) -> u64 {
        self.regions.load(SeqCst)
    }

    /// Cover a data area grown to `dev_size` bytes, if the bitmap's
    /// blocks on the members have the bits for it (a 4 KiB block holds
    /// 32768 regions). false: they do not; nothing changed.
    pub fn grow(&self, dev_size: u64) -> bool {
        let want = dev_size.div_ceil(self.region).max(1);
        if want > self.inflight.len() as u64 {
            return false;
        }
        let _g = self.io.locked();
        self.regions.fetch_max(want, SeqCst);
        true
    }

    /// Whether any region is marked dirty.
    pub fn any_set(&self) -> bool {
        self.durable.iter().any(|w| w.load(SeqCst) != 0)
    }

    /// The dirty regions now.
    pub fn snapshot(&self) -> RegionSet {
        RegionSet {
            region: self.region,
            words: self.durable.iter().map(|w| w.load(SeqCst)).collect(),
        }
    }

    fn bit(v: &[AtomicU64], r: u64) -> bool {
        v[(r / 64) as usize].load(SeqCst) >> (r % 64) & 1 == 1
    }

    fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; self.place.bytes(self.regions())];
        for (i, w) in self.durable.iter().enumerate() {
            let bytes = w.load(SeqCst).to_le_bytes();
            let at = i * 8;
            let n = bytes.len().min(b.len().saturating_sub(at));
            b[at..at + n].copy_from_slice(&bytes[..n]);
        }
        b
    }

    /// Read a member's copy.
    pub fn read(
        m: &dyn Member,
        place: Place,
        region: u64,
        dev_size: u64,
    ) -> Result<RegionSet, MemberError> {
        let regions = dev_size.div_ceil(region).max(1);
        let mut b = vec![0u8; place.bytes(regions)];
        m.read_at(&mut b, place.at(m))?;
        let mut words = vec![0u64; words(regions)];
        for (i, w) in words.iter_mut().enumerate() {
            let mut x = [0u8; 8];
            let at = i * 8;
            let n = 8.min(b.len() - at);
            x[..n].copy_from_slice(&b[at..at + n]);
            *w = u64::from_le_bytes(x);
        }
        // Bits past the last region are noise: drop them.
        if !regions.is_multiple_of(64) {
            if let Some(last) = words.last_mut() {
                *last &= (1u64 << (regions % 64)) - 1;
            }
        }
        Ok(RegionSet { region, words })
    }

    /// Write the bitmap to `members`, durably; returns the members that
    /// failed (by index), which the caller fails once no lock is held. Each
    /// copy is made durable by itself rather than by flushing the member,
    /// which would wait for every dirty page of its data area too. (Bits
    /// are cleared only after the data they cover was flushed: see
    /// `clear_idle`'s caller.)
    fn write_out(&self, members: &[Arc<dyn Member>]) -> Vec<(usize, MemberError)> {
        let b = self.encode();
        let mut failed = Vec::new();
        for (i, m) in members.iter().enumerate() {
            if let Err(e) = m.write_at_durable(&b, self.place.at(m.as_ref())) {
                failed.push((i, e));
            }
        }
        failed
    }

    /// Write the whole bitmap to one member (a member joining the array).
    pub fn write_to(&self, m: &dyn Member) -> Result<(), MemberError> {
        let _g = self.io.locked();
        m.write_at(&self.encode(), self.place.at(m))?;
        m.flush()
    }

    /// Declare a write to the device ranges `spans` (`[lo, hi)` each: one
    /// for most writes, one per far copy for RAID-10's far layout, whose
    /// copies lie far apart). The regions' bits are durable on `members`
    /// when this returns; the write must complete before the guard is
    /// dropped. Members that could not take the bitmap are returned for
    /// failing.
    pub fn start_write<'a>(
        &'a self,
        spans: &[(u64, u64)],
        members: &dyn Fn() -> Vec<Arc<dyn Member>>,
    ) -> (WriteGuard<'a>, Vec<(usize, MemberError)>) {
        let n = self.regions();
        let mut regions: SmallVec<[(u64, u64); 2]> = spans
            .iter()
            .map(|&(lo, hi)| {
                let r0 = (lo / self.region).min(n - 1);
                (r0, hi.div_ceil(self.region).clamp(r0 + 1, n))
            })
            .collect();
        // Disjoint, so that no region is counted twice in flight.
        regions.sort_unstable();
        let mut merged: SmallVec<[(u64, u64); 2]> = SmallVec::new();
        for (lo, hi) in regions {
            match merged.last_mut() {
                Some(last) if lo <= last.1 => last.1 = last.1.max(hi),
                _ => merged.push((lo, hi)),
            }
        }
        let each = || merged.iter().flat_map(|&(lo, hi)| lo..hi);
        for r in each() {
            self.inflight[r as usize].fetch_add(1, SeqCst);
            self.active[(r / 64) as usize].fetch_or(1 << (r % 64), SeqCst);
        }
        let all_durable = || each().all(|r| Self::bit(&self.durable, r));
        if all_durable() {
            return (self.guard(merged), Vec::new());
        }
        let _g = self.io.locked();
        if all_durable() {
            return (self.guard(merged), Vec::new());
        }
        for r in each() {
            self.durable[(r / 64) as usize].fetch_or(1 << (r % 64), SeqCst);
        }
        let failed = self.write_out(&members());
        (self.guard(merged), failed)
    }

    fn guard(&self, regions: SmallVec<[(u64, u64); 2]>) -> WriteGuard<'_> {
        WriteGuard {
            bitmap: self,
            regions,
        }
    }

    /// Clear the bits of regions idle since the last call. Only for an
    /// array whose every member is in sync. `before_write` runs (once, if
    /// anything is to be cleared) before the cleared bits are written out:
    /// the caller records `events_cleared` there. Returns how many bits
    /// were cleared and the members that failed.
    pub fn clear_idle(
        &self,
        members: &[Arc<dyn Member>],
        before_write: impl FnOnce(),
    ) -> (u64, Vec<(usize, MemberError)>) {
        let _g = self.io.locked();
        let mut cleared = 0;
        for r in 0..self.regions() {
            let (w, bit) = ((r / 64) as usize, 1u64 << (r % 64));
            if self.durable[w].load(SeqCst) & bit == 0 {
                continue;
            }
            if self.active[w].fetch_and(!bit, SeqCst) & bit != 0 {
                continue; // written lately: look again next time
            }
            self.durable[w].fetch_and(!bit, SeqCst);
            if self.inflight[r as usize].load(SeqCst) > 0 {
                self.durable[w].fetch_or(bit, SeqCst);
            } else {
                cleared += 1;
            }
        }
        if cleared == 0 {
            return (0, Vec::new());
        }
        before_write();
        (cleared, self.write_out(members))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use raidkit_member::MemMember;

    /// raidkit's bitmap place, on a 1 MiB member in memory.
    fn on_member() -> (Arc<dyn Member>, Place) {
        let m: Arc<dyn Member> = Arc::new(MemMember::new("m", 1 << 20));
        let place = Place {
            offset: BITMAP_OFFSET as i64,
            from_md_end: false,
            exact: false,
        };
        (m, place)
    }

    #[test]
    fn bits_are_durable_before_writes_and_cleared_when_idle() {
        let (m, place) = on_member();
        let members = || vec![m.clone()];
        let b = Bitmap::new(place, 1 << 20, 100 << 20, None);
        assert_eq!(b.regions(), 100);
        {
            let (_g, failed) = b.start_write(&[(3 << 20, (5 << 20) + 1)], &members);
            assert!(failed.is_empty());
            let on_disk = Bitmap::read(m.as_ref(), place, 1 << 20, 100 << 20).unwrap();
            assert_eq!(on_disk.count(), 3);
            assert!(on_disk.contains(3) && on_disk.contains(4) && on_disk.contains(5));
            // In flight: the cleaner leaves them alone however often it runs.
            for _ in 0..3 {
                assert_eq!(b.clear_idle(&members(), || {}).0, 0);
            }
        }
        // Written since the last look: kept one more round, then cleared.
        let (n, _) = b.clear_idle(&members(), || {});
        assert_eq!(n, 3);
        assert_eq!(
            Bitmap::read(m.as_ref(), place, 1 << 20, 100 << 20)
                .unwrap()
                .count(),
            0
        );
    }

    #[test]
    fn a_write_to_ranges_far_apart_marks_only_their_regions() {
        let (m, place) = on_member();
        let members = || vec![m.clone()];
        let b = Bitmap::new(place, 1 << 20, 100 << 20, None);
        {
            // Two copies of one chunk far apart (RAID-10 far), and a
            // range overlapping the first (counted in flight once).
            let (_g, failed) = b.start_write(
                &[(2 << 20, 3 << 20), (60 << 20, 61 << 20), (2 << 20, 4 << 20)],
                &members,
            );
            assert!(failed.is_empty());
            let on_disk = Bitmap::read(m.as_ref(), place, 1 << 20, 100 << 20).unwrap();
            assert_eq!(on_disk.count(), 3);
            assert!(on_disk.contains(2) && on_disk.contains(3) && on_disk.contains(60));
            assert!(!on_disk.contains(30));
        }
        // Every region let go once: cleared after a round as active.
        assert_eq!(b.clear_idle(&members(), || {}).0, 0);
        assert_eq!(b.clear_idle(&members(), || {}).0, 3);
    }

    #[test]
    fn a_grown_data_area_gets_its_own_bits_within_the_bitmaps_blocks() {
        let (m, place) = on_member();
        let members = || vec![m.clone()];
        // 100 regions of 1 MiB: one 4 KiB block, room for 32768.
        let b = Bitmap::new(place, 1 << 20, 100 << 20, None);
        // Before growing, a write past the end lands on the last region.
        drop(b.start_write(&[(150 << 20, 151 << 20)], &members));
        assert!(b.snapshot().contains(99) && !b.snapshot().contains(150));
        assert!(!b.grow(32769 << 20), "more regions than the block holds");
        assert_eq!(b.regions(), 100);
        assert!(b.grow(200 << 20));
        assert_eq!(b.regions(), 200);
        drop(b.start_write(&[(150 << 20, 151 << 20)], &members));
        let on_disk = Bitmap::read(m.as_ref(), place, 1 << 20, 200 << 20).unwrap();
        assert!(on_disk.contains(150) && on_disk.contains(99));
        assert_eq!(on_disk.count(), 2);
    }

    #[test]
    fn region_sets_answer_overlap_questions() {
        let mut s = RegionSet {
            region: 10,
            words: vec![0; 2],
        };
        s.words[1] |= 1 << 2; // region 66: bytes 660..670
        assert!(s.overlaps(665, 666));
        assert!(s.overlaps(600, 661));
        assert!(!s.overlaps(600, 660));
        assert!(!s.overlaps(670, 700));
        assert!(!s.overlaps(665, 665));
        assert_eq!(s.count(), 1);
    }
}
