//! Per-thread reusable buffers for stripe work, so that the hot path
//! neither allocates nor zero-fills fresh memory for every request.

use std::cell::RefCell;

const KEEP: usize = 16;

thread_local! {
    static FREE: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// A buffer of `len` bytes with unspecified contents.
pub fn take(len: usize) -> Vec<u8> {
    let mut b = FREE.with(|f| f.borrow_mut().pop()).unwrap_or_default();
    b.resize(len, 0);
    b
}

/// Return a buffer for reuse.
pub fn give(b: Vec<u8>) {
    if b.capacity() == 0 {
        return;
    }
    FREE.with(|f| {
        let mut f = f.borrow_mut();
        if f.len() < KEEP {
            f.push(b);
        }
    });
}
