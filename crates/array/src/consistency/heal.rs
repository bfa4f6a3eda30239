//! Rot in a crash window: blocks that rotted while nothing wrote them,
//! put back from redundancy rather than taken as they are. Replay runs it
//! on each intent window before the window's parity is recomputed from
//! its data (which takes every block as it is and records its checksum
//! from it). A read in a crash window (`core::CrashWindow`) heals a block
//! that disagrees with its checksum in memory ([`Core::window_heal`]); the
//! resync, whose reads do the same, writes such blocks back.

use crate::checksums::BLOCK;
use crate::core::checked::{Checked, HealResult};
use crate::core::{Core, Disk, Healed, View};
use crate::engine::Array;
use crate::error::Result;
use crate::levels::parity::solve;
use raidkit_layout::StripeMap;
use std::sync::Arc;

impl Array {
    /// Heal the blocks of member range `[lo, hi)` of `stripe` (whole
    /// blocks, inside one chunk) that rotted, column by column (a block at
    /// the same offset on every member), with every member of the stripe
    /// present and in sync there; the caller holds the stripe's lock, and
    /// every writer of a data record holds it too (see `logging_data`). Returns how many
    /// blocks were rewritten.
    ///
    /// A column is healed only when the blocks that disagree with their
    /// checksums are data blocks, no more than the stripe's parity blocks,
    /// every parity block agrees with its own checksum, and what the rest
    /// rebuild agrees with each lost block's checksum. Why that never
    /// undoes a write: a block written since its checksum was last stored
    /// changed its stripe's parity too (a whole-stripe write writes both
    /// before it is acknowledged), so that parity disagrees with its
    /// stored checksum and the column is left to the recompute, as are
    /// blocks torn by writes in flight at the crash. What is rebuilt from
    /// blocks that all agree with their checksums, and agrees with the lost
    /// block's own, is the content that checksum was taken from: the last
    /// one written, or that of a write in flight at the crash that did not
    /// land everywhere (either may be read after a crash).
    pub(super) fn heal_rotten(&self, v: &View, stripe: u64, lo: u64, hi: u64) -> Result<u64> {
        let sm = v.geom.stripe_map(stripe);
        // Unreadable: the recompute meets the error and deals with it.
        let Some((disks, raw)) = read_stripe_raw(&self.core, v, &sm, lo, hi - lo) else {
            return Ok(0);
        };
        let mut healed = 0;
        for off in (lo..hi).step_by(BLOCK as usize) {
            let at = (off - lo) as usize..(off - lo + BLOCK) as usize;
            let column: Vec<&[u8]> = raw.iter().map(|b| &b[at.clone()]).collect();
            // Unreadable checksums count as disagreeing: nothing is healed.
            let agrees = |x: usize, bytes: &[u8]| {
                let (c, base) = disks[x];
                c.agrees(bytes, base + off).unwrap_or(false)
            };
            for (dd, block) in heal_column(&sm, &column, &agrees) {
                self.core.member_write(v, sm.data[dd], &block, off)?;
                healed += 1;
            }
        }
        Ok(healed)
    }
}

impl Array {
    /// After a resync recomputed unit `x` of `v` in a crash window: write
    /// back the blocks of the unit that reads put back in memory
    /// (`Core::window_heal`), the resync's own reads among them, so that
    /// the members hold what the recomputed redundancy was made from. The
    /// caller holds the unit's lock. A block is written only if it still
    /// disagrees with its checksum and what was kept agrees with it (a
    /// write since the read would have made the block agree). Returns how
    /// many were written.
    pub(crate) fn write_back_healed(&self, v: &View, x: u64) -> Result<u64> {
        if !self.checksums() || !self.core.window.heals() {
            return Ok(0);
        }
        let chunk = v.geom.chunk;
        let kept = if v.geom.level.is_parity() {
            // Every role's blocks of the stripe lie at the same offsets.
            let lo = x * chunk;
            self.core
                .window
                .take_healed(lo, lo, lo + chunk, |_, _| true)
        } else {
            // The resync's unit, placed as `resync_unit` places it (by the
            // geometry of its row: during a reshape, the old one where the
            // reshape has not reached); a unit's copies lie no lower on the
            // members than the last's.
            let g = &v.geom;
            let copies = g.pieces(x * g.chunk, g.chunk)[0].copies.clone();
            let size = g.chunk;
            let lo = copies.iter().map(|c| c.1).min().unwrap_or(0);
            let hi = copies.iter().map(|c| c.1 + size).max().unwrap_or(0);
            self.core.window.take_healed(lo, lo, hi, |role, dev| {
                copies
                    .iter()
                    .any(|&(r, d)| r == role && (d..d + size).contains(&dev))
            })
        };
        let mut written = 0;
        let mut now = vec![0u8; BLOCK as usize];
        for h in kept {
            let Some(d) = Core::readable(v, h.role, h.dev, BLOCK) else {
                continue;
            };
            let Some(c) = d.checked.as_deref() else {
                continue;
            };
            if !Arc::ptr_eq(d, &h.disk) {
                continue;
            }
            let at = d.data_offset + h.dev;
            let still_bad = self.core.timed(d, || c.read_raw(&mut now, at)).is_ok()
                && !c.agrees(&now, at).unwrap_or(true)
                && c.agrees(&h.block, at).unwrap_or(false);
            if still_bad {
                self.core.member_write(v, h.role, &h.block, h.dev)?;
                written += 1;
            }
        }
        Ok(written)
    }
}

/// How long a read in a crash window waits for a stripe's lock to heal a
/// block under it (see `Core::window_heal`), before it heals without.
const HEAL_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Each role's checksums and data offset.
type Columns<'v> = Vec<(&'v Checked, u64)>;

/// Every role of `sm`'s stripe, in its order (data, P, Q), over member
/// range `[lo, lo + len)`: its checksums, data offset and the bytes it
/// holds there. None unless every role is in service and in sync over the
/// range (a member being rebuilt may hold stale parity that agrees with a
/// stale checksum), keeps checksums and reads. Each read is timed as its
/// member's operation (`Core::timed`: a member that hangs here is failed
/// by the stall watch).
fn read_stripe_raw<'v>(
    core: &Core,
    v: &'v View,
    sm: &StripeMap,
    lo: u64,
    len: u64,
) -> Option<(Columns<'v>, Vec<Vec<u8>>)> {
    let roles = sm.data.iter().copied().chain([sm.p]).chain(sm.q);
    let mut disks = Vec::new();
    let mut raw = Vec::new();
    for r in roles {
        let d = Core::readable(v, r, lo, len)?;
        let c = d.checked.as_deref()?;
        let mut b = vec![0u8; len as usize];
        core.timed(d, || c.read_raw(&mut b, d.data_offset + lo))
            .ok()?;
        disks.push((c, d.data_offset));
        raw.push(b);
    }
    Some((disks, raw))
}

/// The column's verdict, as `heal_rotten` describes: the data blocks
/// (position in the stripe's data, rebuilt content) to put back, none
/// where the column agrees or cannot be healed. `column`: each role's
/// block in `sm`'s order (data, P, Q); `agrees(x, bytes)`: whether
/// `bytes` agrees with the checksum of `column[x]`'s block.
fn heal_column(
    sm: &StripeMap,
    column: &[&[u8]],
    agrees: &dyn Fn(usize, &[u8]) -> bool,
) -> Vec<(usize, Vec<u8>)> {
    let k = sm.data.len();
    let bad: Vec<usize> = (0..column.len())
        .filter(|&x| !agrees(x, column[x]))
        .collect();
    if bad.is_empty() || bad.len() > column.len() - k || bad.iter().any(|&x| x >= k) {
        return Vec::new();
    }
    let data: Vec<Option<Vec<u8>>> = (0..k)
        .map(|dd| (!bad.contains(&dd)).then(|| column[dd].to_vec()))
        .collect();
    let q = sm.q.map(|_| column[k + 1]);
    let Ok(mut rows) = solve(sm, data, Some(column[k]), q, BLOCK as usize) else {
        return Vec::new();
    };
    if !bad.iter().all(|&dd| agrees(dd, &rows[dd])) {
        return Vec::new();
    }
    bad.into_iter()
        .map(|dd| (dd, std::mem::take(&mut rows[dd])))
        .collect()
}

impl Core {
    /// A read in a crash window found the block at member offset `at` of
    /// `d` (`blk`) disagreeing with its checksum: put it back in `blk` if
    /// its column heals as `heal_rotten` would heal it (every role of the
    /// stripe in service, parity that agrees with its checksums, a rebuild
    /// that agrees with the block's); on a mirror, from another copy in
    /// service that agrees with its own checksum and with the block's.
    /// Reads take no stripe lock, so nothing is written here: the block is
    /// kept (`CrashWindow::keep_healed`) for the resync, which passes every
    /// unit of the window under its lock, to write back
    /// (`Array::write_back_healed`).
    ///
    /// What is put back agrees with the checksum stored for the block, so
    /// it is content the block held. The column (or the other copies) is
    /// read under the lock its writers take where this thread can have it
    /// (`Core::lock_if_free_of_others`): a write of another of its blocks
    /// half done would make the rebuild disagree and the rotten block be
    /// taken as it is. Where the thread holds stripe locks (a writer's
    /// read-modify-write, the resync), the stripe it reads is its own. The
    /// write-back checks again under the lock.
    /// What a crash window that does not heal (a journal replay) makes
    /// of block `at` of `d` that disagrees with its checksum: taken as a
    /// torn write, unless its column holds a block a rebuild lost.
    pub(crate) fn window_torn(&self, d: &Disk, at: u64) -> HealResult {
        let v = self.view.load_full();
        let role = v.role_of(d);
        match role {
            Some(role) if !self.is_reshaping() && peer_lost(&v, role, at - d.data_offset) => {
                HealResult::Lost
            }
            _ => HealResult::Torn,
        }
    }

    pub(crate) fn window_heal(&self, d: &Disk, at: u64, blk: &mut [u8]) -> HealResult {
        let v = self.view.load_full();
        if self.is_reshaping() || blk.len() != BLOCK as usize {
            return HealResult::Torn;
        }
        let Some(role) = v.role_of(d) else {
            return HealResult::Torn;
        };
        let dev = at - d.data_offset;
        let chunk = v.geom.chunk;
        if peer_lost(&v, role, dev) {
            return HealResult::Lost;
        }
        // The stripe (parity) or chunk (mirrors) as its writers lock it,
        // if there is redundancy to heal from at all.
        let key = if v.geom.level.is_parity() {
            let sm = v.geom.stripe_map(dev / chunk);
            let mut roles = sm.data.iter().copied().chain([sm.p]).chain(sm.q);
            if !roles.all(|r| Core::readable(&v, r, dev, BLOCK).is_some()) {
                return HealResult::Torn;
            }
            dev / chunk
        } else {
            match v.geom.mirror_chunk_at(role, dev / chunk) {
                Some(c) => c,
                None => return HealResult::Torn,
            }
        };
        // Healed under the lock its writers take: a write of another
        // block of the column (or of another copy) half done makes the
        // rebuild disagree, and the block would be taken as it is, rot and
        // all. A thread that holds stripe locks of this array (a writer's
        // read-modify-write, the resync, a rebuild's readers) reads what
        // it has locked. A lock not had within `HEAL_LOCK_WAIT`: healed
        // without it, and if that fails the block is served as it is but
        // not taken (its checksum kept: the resync decides, under the
        // lock).
        let (_g, sure) = if self.holds_locks() {
            (None, true)
        } else {
            let g = self.lock_within(key, HEAL_LOCK_WAIT);
            let had = g.is_some();
            (g, had)
        };
        let v = self.view.load_full();
        if !v.roles[role]
            .disk
            .as_ref()
            .is_some_and(|x| std::ptr::eq(x.as_ref(), d))
        {
            return HealResult::Torn;
        }
        let healed = if v.geom.level.is_parity() {
            heal_from_column(self, &v, role, dev)
        } else {
            heal_from_copies(self, &v, d, role, dev)
        };
        let Some(block) = healed else {
            if sure {
                return HealResult::Torn;
            }
            tracing::warn!(
                array = self.name.as_str(),
                member = d.name(),
                offset = dev,
                "a block in the crash window disagrees with its checksum and its stripe stayed locked for {} s: served as it is, left for the resync",
                HEAL_LOCK_WAIT.as_secs()
            );
            return HealResult::Unsure;
        };
        blk.copy_from_slice(&block);
        if let Some(disk) = v.roles[role].disk.clone() {
            self.window.keep_healed(Healed {
                disk,
                role,
                dev,
                block: block.into_boxed_slice(),
            });
        }
        HealResult::Healed
    }
}

/// Whether another block of the column of block `dev` of `role` (parity),
/// or another copy of it (mirrors), is marked lost by a rebuild: the
/// redundancy that could tell rot from a torn write is gone there.
fn peer_lost(v: &View, role: usize, dev: u64) -> bool {
    let chunk = v.geom.chunk;
    let lost = |r: usize, at: u64| {
        v.roles[r]
            .disk
            .as_ref()
            .and_then(|d| d.checked.as_ref().map(|c| (c, d.data_offset)))
            .is_some_and(|(c, base)| c.is_lost(base + at).unwrap_or(false))
    };
    if v.geom.level.is_parity() {
        let sm = v.geom.stripe_map(dev / chunk);
        let mut roles = sm.data.iter().copied().chain([sm.p]).chain(sm.q);
        return roles.any(|r| r != role && lost(r, dev));
    }
    let Some(c) = v.geom.mirror_chunk_at(role, dev / chunk) else {
        return false;
    };
    v.geom.pieces(c * chunk + dev % chunk, BLOCK)[0]
        .copies
        .iter()
        .any(|&(r, at)| r != role && lost(r, at))
}

/// `window_heal` on a parity level: data block `dev` of `role` rebuilt
/// from its column.
fn heal_from_column(core: &Core, v: &View, role: usize, dev: u64) -> Option<Vec<u8>> {
    let sm = v.geom.stripe_map(dev / v.geom.chunk);
    let me = sm.data.iter().position(|&r| r == role)?;
    let (disks, raw) = read_stripe_raw(core, v, &sm, dev, BLOCK)?;
    let column: Vec<&[u8]> = raw.iter().map(|b| b.as_slice()).collect();
    let agrees = |x: usize, bytes: &[u8]| {
        let (c, base) = disks[x];
        c.agrees(bytes, base + dev).unwrap_or(false)
    };
    heal_column(&sm, &column, &agrees)
        .into_iter()
        .find(|(dd, _)| *dd == me)
        .map(|(_, block)| block)
}

/// `window_heal` on a mirror: block `dev` of `role` (`d`) from another
/// copy.
fn heal_from_copies(core: &Core, v: &View, d: &Disk, role: usize, dev: u64) -> Option<Vec<u8>> {
    let chunk = v.geom.chunk;
    let mine = d.checked.as_deref()?;
    let logical = v.geom.mirror_chunk_at(role, dev / chunk)? * chunk + dev % chunk;
    let piece = v.geom.pieces(logical, BLOCK).into_iter().next()?;
    piece
        .copies
        .iter()
        .filter(|&&(r, _)| r != role)
        .find_map(|&(r, at)| {
            let x = Core::readable(v, r, at, BLOCK)?;
            let c = x.checked.as_deref()?;
            let mut b = vec![0u8; BLOCK as usize];
            core.timed(x, || c.read_raw(&mut b, x.data_offset + at))
                .ok()?;
            let ok = c.agrees(&b, x.data_offset + at).unwrap_or(false)
                && mine.agrees(&b, d.data_offset + dev).unwrap_or(false);
            ok.then_some(b)
        })
}
