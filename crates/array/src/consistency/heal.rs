//! Replay's rot check: blocks of an intent window that rotted while
//! nothing wrote them, put back from redundancy before the window's parity
//! is recomputed from its data (which takes every block as it is and
//! records its checksum from it).

use crate::checksums::BLOCK;
use crate::core::{Core, View};
use crate::engine::Array;
use crate::error::Result;
use crate::levels::parity::solve;

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
        let k = sm.data.len();
        let roles: Vec<usize> = sm.data.iter().copied().chain([sm.p]).chain(sm.q).collect();
        let mut disks = Vec::with_capacity(roles.len());
        let mut raw = Vec::with_capacity(roles.len());
        for &r in &roles {
            // Every role in service over the range: a member being rebuilt
            // may hold stale parity that agrees with a stale checksum.
            let Some(d) = Core::readable(v, r, lo, hi - lo) else {
                return Ok(0);
            };
            let Some(c) = d.checked.as_ref() else {
                return Ok(0);
            };
            let mut b = vec![0u8; (hi - lo) as usize];
            if c.read_raw(&mut b, d.data_offset + lo).is_err() {
                // The recompute meets the error and deals with it.
                return Ok(0);
            }
            disks.push((c, d.data_offset));
            raw.push(b);
        }
        let mut healed = 0;
        for off in (lo..hi).step_by(BLOCK as usize) {
            let at = (off - lo) as usize..(off - lo + BLOCK) as usize;
            // Unreadable checksums count as disagreeing: nothing is healed.
            let agrees = |x: usize, bytes: &[u8]| {
                let (c, base) = disks[x];
                c.agrees(bytes, base + off).unwrap_or(false)
            };
            let bad: Vec<usize> = (0..roles.len())
                .filter(|&x| !agrees(x, &raw[x][at.clone()]))
                .collect();
            if bad.is_empty() || bad.len() > roles.len() - k || bad.iter().any(|&x| x >= k) {
                continue;
            }
            let data: Vec<Option<Vec<u8>>> = (0..k)
                .map(|dd| (!bad.contains(&dd)).then(|| raw[dd][at.clone()].to_vec()))
                .collect();
            let q = sm.q.map(|_| &raw[k + 1][at.clone()]);
            let Ok(rows) = solve(&sm, data, Some(&raw[k][at.clone()]), q, BLOCK as usize) else {
                continue;
            };
            if !bad.iter().all(|&dd| agrees(dd, &rows[dd])) {
                continue;
            }
            for &dd in &bad {
                self.core.member_write(v, sm.data[dd], &rows[dd], off)?;
                healed += 1;
            }
        }
        Ok(healed)
    }
}
