//! The crash window: where data and checksums may disagree after an
//! unclean stop, and the blocks reads there put back for the resync.

use super::Disk;
use crate::bitmap::RegionSet;
use raidkit_member::Locked;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Where data and checksums may disagree because writes were in flight at
/// an unclean shutdown: until the recovery that follows it (journal
/// replay, resync of the marked regions or of everything) has passed,
/// a block read there that disagrees with its checksum is put back from
/// redundancy only if the rebuild agrees with that checksum (rot:
/// `Core::window_heal`), and otherwise taken as it is, its checksum
/// recomputed (torn: see `checked`).
#[derive(Debug, Default)]
pub(crate) struct CrashWindow {
    open: AtomicBool,
    /// Reads heal: only where the recovery that closes the window writes
    /// back what they heal in memory (the resync). Journal replay heals
    /// its windows itself first, and its reads take the rest as it is.
    heal: AtomicBool,
    zone: Mutex<Zone>,
    /// Blocks reads have put back in memory, for the resync to write back
    /// as it passes their unit.
    healed: Mutex<Kept>,
    /// How many are kept at most (0: `HEALED_KEPT`; tests set fewer).
    kept_max: AtomicUsize,
}

/// Healed blocks by member offset and role (one entry per block, the
/// latest), at most `HEALED_KEPT`, none behind `front`.
#[derive(Debug, Default)]
struct Kept {
    blocks: std::collections::BTreeMap<(u64, usize), Healed>,
    /// Where the resync is (a member offset): blocks before it are not
    /// kept, it has passed them.
    front: u64,
}

/// A block a read in a crash window put back from redundancy.
#[derive(Debug)]
pub(crate) struct Healed {
    /// The member it was read from, in `role`.
    pub disk: Arc<Disk>,
    pub role: usize,
    /// Its offset in the data area.
    pub dev: u64,
    /// What it holds (agrees with its checksum).
    pub block: Box<[u8]>,
}

/// Healed blocks kept for the resync at most (16 MiB). Past it, the one
/// farthest ahead of the resync is let go, so that what the resync's own
/// reads put back (always the nearest) is kept: a block let go is put
/// back again by the resync's read when it gets there.
const HEALED_KEPT: usize = 4096;

#[derive(Debug, Default)]
struct Zone {
    all: bool,
    marked: Option<RegionSet>,
}

impl CrashWindow {
    /// Open over everything (`marked` None) or the marked regions; `heal`:
    /// whether reads there heal (see the field).
    pub fn open(&self, marked: Option<RegionSet>, heal: bool) {
        let mut z = self.zone.locked();
        z.all = marked.is_none();
        z.marked = marked;
        self.heal.store(heal, Ordering::Release);
        *self.healed.locked() = Kept::default();
        self.open.store(true, Ordering::Release);
    }

    /// Keep a block a read put back, for the resync (the latest of each
    /// block; none the resync has passed).
    pub fn keep_healed(&self, h: Healed) {
        let mut kept = self.healed.locked();
        if h.dev < kept.front {
            return;
        }
        kept.blocks.insert((h.dev, h.role), h);
        let max = match self.kept_max.load(Ordering::Relaxed) {
            0 => HEALED_KEPT,
            n => n,
        };
        while kept.blocks.len() > max {
            kept.blocks.pop_last();
        }
    }

    /// Keep at most `n` healed blocks (tests: `HEALED_KEPT` is more than
    /// a test array has).
    pub fn set_kept_max(&self, n: usize) {
        self.kept_max.store(n, Ordering::Relaxed);
    }

    /// The resync is at member offset `front`, and takes the kept blocks
    /// in `[lo, hi)` for which `mine(role, dev)` holds. Blocks before
    /// `front` are let go (it has passed them).
    pub fn take_healed(
        &self,
        front: u64,
        lo: u64,
        hi: u64,
        mine: impl Fn(usize, u64) -> bool,
    ) -> Vec<Healed> {
        let mut kept = self.healed.locked();
        if front > kept.front {
            kept.front = front;
            kept.blocks = kept.blocks.split_off(&(front, 0));
        }
        let keys: Vec<(u64, usize)> = kept
            .blocks
            .range((lo, 0)..(hi, 0))
            .filter(|(k, _)| mine(k.1, k.0))
            .map(|(k, _)| *k)
            .collect();
        keys.iter().filter_map(|k| kept.blocks.remove(k)).collect()
    }

    pub fn heals(&self) -> bool {
        self.heal.load(Ordering::Acquire)
    }

    pub fn close(&self) {
        let mut z = self.zone.locked();
        z.all = false;
        z.marked = None;
        self.open.store(false, Ordering::Release);
        *self.healed.locked() = Kept::default();
    }

    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// Whether device range `[dev, dev + len)` lies in the window.
    pub fn covers(&self, dev: u64, len: u64) -> bool {
        if !self.open.load(Ordering::Acquire) {
            return false;
        }
        let z = self.zone.locked();
        z.all
            || z.marked
                .as_ref()
                .is_some_and(|m| m.overlaps(dev, dev + len))
    }
}
