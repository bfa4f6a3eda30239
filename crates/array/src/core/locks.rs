//! Stripe locks as each thread holds them: a guard counts itself for its
//! thread, so that a read healing a block in a crash window knows whether
//! it may wait for the stripe's lock (`Core::window_heal`).

use super::{Core, LOCKS};
use raidkit_member::Locked;
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

thread_local! {
    /// The arrays (their `Core`'s address) whose stripe locks this thread
    /// holds, once per lock (or holds through the caller it runs a job
    /// for: `with_locks_held`).
    static LOCKS_HELD: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The stripe locks the calling thread holds (see `LOCKS_HELD`).
pub(crate) fn locks_held() -> Vec<usize> {
    LOCKS_HELD.with(|h| h.borrow().clone())
}

/// Run `f` counted as holding the stripe locks `held` as well: a job run
/// on another thread for a caller that holds them and waits for it.
pub(crate) fn with_locks_held<T>(held: &[usize], f: impl FnOnce() -> T) -> T {
    struct Restore(Vec<usize>);
    impl Drop for Restore {
        fn drop(&mut self) {
            LOCKS_HELD.with(|h| *h.borrow_mut() = std::mem::take(&mut self.0));
        }
    }
    let _restore = Restore(locks_held());
    LOCKS_HELD.with(|h| h.borrow_mut().extend_from_slice(held));
    f()
}

/// A held stripe lock, counted for its thread (`LOCKS_HELD`).
#[must_use]
pub(crate) struct StripeGuard<'a> {
    _g: MutexGuard<'a, ()>,
    core: usize,
}

impl<'a> StripeGuard<'a> {
    fn new(core: &Core, g: MutexGuard<'a, ()>) -> StripeGuard<'a> {
        let core = core as *const Core as usize;
        LOCKS_HELD.with(|h| h.borrow_mut().push(core));
        StripeGuard { _g: g, core }
    }
}

impl Drop for StripeGuard<'_> {
    fn drop(&mut self) {
        LOCKS_HELD.with(|h| {
            let mut h = h.borrow_mut();
            if let Some(i) = h.iter().rposition(|&c| c == self.core) {
                h.swap_remove(i);
            }
        });
    }
}

impl Core {
    pub(crate) fn lock(&self, stripe: u64) -> StripeGuard<'_> {
        StripeGuard::new(self, self.stripe_lock(stripe).locked())
    }

    /// Lock a run of stripes (in lock-table order, so no two holders deadlock).
    pub(crate) fn lock_range(&self, s0: u64, s1: u64) -> Vec<StripeGuard<'_>> {
        lock_indices(s0, s1)
            .into_iter()
            .map(|i| StripeGuard::new(self, self.locks[i].locked()))
            .collect()
    }

    /// As `lock_range`, but only if every lock is free at once (None
    /// otherwise, nothing held): for a holder of other stripe locks.
    pub(crate) fn try_lock_range(&self, s0: u64, s1: u64) -> Option<Vec<StripeGuard<'_>>> {
        lock_indices(s0, s1)
            .into_iter()
            .map(|i| self.try_guard(&self.locks[i]))
            .collect()
    }

    /// Whether the calling thread holds stripe locks of this array.
    pub(crate) fn holds_locks(&self) -> bool {
        let me = self as *const Core as usize;
        LOCKS_HELD.with(|h| h.borrow().contains(&me))
    }

    /// The lock of `stripe`, waited for at most `wait` (None then). For a
    /// thread that holds no stripe lock of this array (`holds_locks`): a
    /// holder that waited for this thread through a hand-off the count
    /// does not see would hold it up for `wait`, never deadlock.
    pub(crate) fn lock_within(&self, stripe: u64, wait: Duration) -> Option<StripeGuard<'_>> {
        let lock = self.stripe_lock(stripe);
        let until = Instant::now() + wait;
        loop {
            if let Some(g) = self.try_guard(lock) {
                return Some(g);
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    fn stripe_lock(&self, stripe: u64) -> &Mutex<()> {
        &self.locks[(stripe % LOCKS as u64) as usize]
    }

    /// `lock` if it is free now (a poisoned lock is taken: it guards no
    /// data of its own).
    fn try_guard<'a>(&'a self, lock: &'a Mutex<()>) -> Option<StripeGuard<'a>> {
        match lock.try_lock() {
            Ok(g) => Some(StripeGuard::new(self, g)),
            Err(TryLockError::Poisoned(p)) => Some(StripeGuard::new(self, p.into_inner())),
            Err(TryLockError::WouldBlock) => None,
        }
    }
}

/// The lock-table entries of stripes `[s0, s1)`, in order, once each.
fn lock_indices(s0: u64, s1: u64) -> Vec<usize> {
    let mut idx: Vec<usize> = (s0..s1).map(|s| (s % LOCKS as u64) as usize).collect();
    idx.sort_unstable();
    idx.dedup();
    idx
}
