//! Test seams: named points of the write path where the engine's own
//! tests run code of theirs (a write stopped between loading its view of
//! the members and taking its stripe lock, a fault planted just before
//! parity is computed in place) and count what happened. Per thread, so
//! that tests running in parallel do not see each other's. Outside test
//! builds each seam is an empty inline function.

pub(crate) use imp::*;

#[cfg(test)]
mod imp {
    use std::cell::{Cell, RefCell};

    thread_local! {
        pub(crate) static BEFORE_STRIPE_LOCK: RefCell<Option<Box<dyn FnOnce()>>> = const { RefCell::new(None) };
        pub(crate) static BEFORE_PARITY_IN_PLACE: RefCell<Option<Box<dyn FnOnce()>>> = const { RefCell::new(None) };
        /// Stripes whose parity this thread computed in place, and those
        /// where a fault cut that short.
        pub(crate) static IN_PLACE: Cell<(u32, u32)> = const { Cell::new((0, 0)) };
    }

    /// Run this thread's hook, once, where a stripe write is about to take
    /// its lock (its view of the members already loaded).
    pub(crate) fn before_stripe_lock() {
        if let Some(f) = BEFORE_STRIPE_LOCK.with(|h| h.borrow_mut().take()) {
            f();
        }
    }

    /// Run this thread's hook, once, where parity in place has the
    /// mappings of a stripe and is about to compute over them.
    pub(crate) fn before_parity_in_place() {
        if let Some(f) = BEFORE_PARITY_IN_PLACE.with(|h| h.borrow_mut().take()) {
            f();
        }
    }

    /// Count a stripe whose parity was computed in place (or cut short).
    pub(crate) fn parity_in_place(done: bool) {
        IN_PLACE.with(|c| {
            let (ok, faulted) = c.get();
            c.set(if done {
                (ok + 1, faulted)
            } else {
                (ok, faulted + 1)
            });
        });
    }
}

#[cfg(not(test))]
mod imp {
    #[inline(always)]
    pub(crate) fn before_stripe_lock() {}

    #[inline(always)]
    pub(crate) fn before_parity_in_place() {}

    #[inline(always)]
    pub(crate) fn parity_in_place(_done: bool) {}
}
