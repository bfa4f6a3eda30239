//! When each operation under way on a member started, for the stall
//! watch. Counting what completes is not enough: a disk that retries one
//! sector in its firmware answers its other commands meanwhile, so the
//! member makes progress while one request waits without end.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Slots for the start times of the operations under way; more at once
/// than this go untracked (the member then has plenty completing or
/// nothing at all, which the watch's other rule catches).
const SLOTS: usize = 64;

/// A fixed table of start times (0: free), claimed and freed without a
/// lock: every member operation passes through it. Each thread starts
/// looking at a slot of its own, so that threads seldom meet on one.
#[derive(Debug)]
pub(crate) struct Outstanding {
    slots: [AtomicU64; SLOTS],
}

/// Hands each thread its first slot.
static THREADS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static FIRST: usize = THREADS.fetch_add(1, Ordering::Relaxed) % SLOTS;
}

/// A claimed slot, freed by `Outstanding::leave`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Slot(Option<usize>);

impl Default for Outstanding {
    fn default() -> Self {
        Outstanding {
            slots: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Outstanding {
    /// An operation starts at `at` (ns on the array's clock).
    pub(crate) fn enter(&self, at: u64) -> Slot {
        let at = at.max(1);
        let from = FIRST.with(|f| *f);
        for i in 0..SLOTS {
            let k = (from + i) % SLOTS;
            if self.slots[k]
                .compare_exchange(0, at, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return Slot(Some(k));
            }
        }
        Slot(None)
    }

    pub(crate) fn leave(&self, s: Slot) {
        if let Some(k) = s.0 {
            self.slots[k].store(0, Ordering::Release);
        }
    }

    /// When the oldest operation under way started.
    pub(crate) fn oldest(&self) -> Option<u64> {
        self.slots
            .iter()
            .map(|s| s.load(Ordering::Acquire))
            .filter(|&t| t != 0)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_operation_under_way_is_known_until_it_ends() {
        let o = Outstanding::default();
        assert_eq!(o.oldest(), None);
        let a = o.enter(100);
        let b = o.enter(50);
        let c = o.enter(300);
        assert_eq!(o.oldest(), Some(50));
        o.leave(b);
        assert_eq!(o.oldest(), Some(100));
        o.leave(a);
        o.leave(c);
        assert_eq!(o.oldest(), None);
        // Full: the rest go untracked, and freeing them is harmless.
        let all: Vec<Slot> = (0..SLOTS as u64 + 5).map(|i| o.enter(i + 1)).collect();
        assert_eq!(o.oldest(), Some(1));
        for s in all {
            o.leave(s);
        }
        assert_eq!(o.oldest(), None);
    }
}
