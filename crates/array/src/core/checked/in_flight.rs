//! Writes in flight on a checked member, by block range.

use raidkit_member::Locked;
use std::sync::Mutex;

/// The block ranges being written: a write waits for those in flight
/// that overlap it. Two writes of one block at once (NBD clients may send
/// them; levels without a stripe lock pass them on) could land in one
/// order and have their checksums recorded in the other, leaving a block
/// that disagrees with its checksum; a write of part of a block reads,
/// merges and writes it whole, which must not interleave either. Disjoint
/// writes go on in parallel. (A short list: writes in flight on one member
/// number at most the queue depth.)
#[derive(Debug, Default)]
pub(super) struct InFlight {
    ranges: Mutex<Ranges>,
    done: std::sync::Condvar,
}

#[derive(Debug, Default)]
struct Ranges {
    held: Vec<(u64, u64)>,
    /// Writes waiting in `enter`: a write that ends wakes them only if
    /// there are any (a condition variable's wake is a system call even
    /// when nobody waits, once per write otherwise).
    waiting: usize,
}

pub(super) struct Writing<'a> {
    set: &'a InFlight,
    range: (u64, u64),
}

impl InFlight {
    pub(super) fn enter(&self, lo: u64, hi: u64) -> Writing<'_> {
        let mut r = self.ranges.locked();
        while r.held.iter().any(|&(a, b)| a < hi && lo < b) {
            r.waiting += 1;
            r = self.done.wait(r).unwrap_or_else(|e| e.into_inner());
            r.waiting -= 1;
        }
        r.held.push((lo, hi));
        Writing {
            set: self,
            range: (lo, hi),
        }
    }
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        let mut r = self.set.ranges.locked();
        if let Some(i) = r.held.iter().position(|&x| x == self.range) {
            r.held.swap_remove(i);
        }
        // Read under the lock: a write that waits from now on finds this
        // range gone, so none is missed.
        let waiting = r.waiting > 0;
        drop(r);
        if waiting {
            self.set.done.notify_all();
        }
    }
}
