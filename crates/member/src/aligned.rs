//! Buffers aligned for direct I/O: O_DIRECT wants the memory, not only the
//! offset and length, aligned to the device's block. [`AlignedBuf`] is
//! aligned to 4096 bytes, which covers every logical block size in use, so
//! an upper layer that reads and writes through one needs no bounce copy;
//! [`BufPool`] keeps a few for the direct engine's own bounce buffers, so
//! that its hot path does not allocate.

use crate::Locked;
use std::alloc::{self, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Mutex;

/// The alignment of every [`AlignedBuf`].
pub const ALIGN: usize = 4096;

/// An owned, zero-initialised byte buffer whose start is aligned to
/// [`ALIGN`] bytes. Dereferences to `[u8]`.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads, like a Vec<u8>.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// `len` zero bytes (an empty buffer allocates one block).
    pub fn zeroed(len: usize) -> AlignedBuf {
        let layout = Self::layout(len);
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }

    /// A copy of `data` in an aligned buffer.
    pub fn from_slice(data: &[u8]) -> AlignedBuf {
        let mut b = AlignedBuf::zeroed(data.len());
        b.copy_from_slice(data);
        b
    }

    fn layout(len: usize) -> Layout {
        Layout::from_size_align(len.max(1), ALIGN).expect("buffer size overflows")
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this very layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `len` initialised bytes (zeroed at allocation) owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and &mut self makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Clone for AlignedBuf {
    fn clone(&self) -> AlignedBuf {
        AlignedBuf::from_slice(self)
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .finish()
    }
}

/// A growable byte buffer whose start stays aligned to [`ALIGN`], for a
/// server's per-request buffers: a read into one, or a write from one,
/// goes to a direct-I/O member without a bounce copy. Used as `Vec<u8>`
/// is by those buffers: `resize` zero-fills only what it adds and keeps
/// the allocation for the next request.
#[derive(Debug, Default)]
pub struct AlignedVec {
    buf: Option<AlignedBuf>,
    len: usize,
}

impl AlignedVec {
    pub fn new() -> AlignedVec {
        AlignedVec::default()
    }

    /// Make it `len` bytes long: bytes added are zero, bytes kept keep
    /// their values (as `Vec::resize(len, 0)`).
    pub fn resize(&mut self, len: usize) {
        let cap = self.buf.as_ref().map_or(0, |b| b.len());
        if len > cap {
            // Grown by at least half, so a rising size allocates rarely.
            let mut bigger = AlignedBuf::zeroed(len.max(cap + cap / 2));
            bigger[..self.len].copy_from_slice(&self[..]);
            self.buf = Some(bigger);
        } else if len > self.len {
            let old = self.len;
            self.buf.as_mut().expect("capacity")[old..len].fill(0);
        }
        self.len = len;
    }

    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Make it `len` bytes long with unspecified contents (what it held
    /// before, or zeroes): for a buffer about to be overwritten whole, no
    /// fill and no copy of old contents into a larger allocation.
    pub fn resize_for_overwrite(&mut self, len: usize) {
        if len > self.capacity() {
            self.buf = Some(AlignedBuf::zeroed(len));
        }
        self.len = len;
    }

    /// Bytes it holds without allocating.
    pub fn capacity(&self) -> usize {
        self.buf.as_ref().map_or(0, |b| b.len())
    }
}

impl Deref for AlignedVec {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.buf.as_ref().map_or(&[], |b| &b[..self.len])
    }
}

impl DerefMut for AlignedVec {
    fn deref_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        self.buf.as_mut().map_or(&mut [], |b| &mut b[..len])
    }
}

/// A few aligned buffers of one size, reused: taking one allocates only
/// when every kept buffer is in use (more requests at once than ever
/// before), and at most `keep` are kept.
#[derive(Debug)]
pub(crate) struct BufPool {
    free: Mutex<Vec<AlignedBuf>>,
    size: usize,
    keep: usize,
}

impl BufPool {
    pub fn new(size: usize, keep: usize) -> BufPool {
        BufPool {
            free: Mutex::new(Vec::new()),
            size,
            keep,
        }
    }

    /// The size of every buffer.
    pub fn size(&self) -> usize {
        self.size
    }

    /// A buffer of `size()` bytes, contents unspecified, back to the pool
    /// when dropped.
    pub fn take(&self) -> Pooled<'_> {
        let buf = self
            .free
            .locked()
            .pop()
            .unwrap_or_else(|| AlignedBuf::zeroed(self.size));
        Pooled {
            pool: self,
            buf: Some(buf),
        }
    }
}

/// A buffer taken from a [`BufPool`].
#[derive(Debug)]
pub(crate) struct Pooled<'a> {
    pool: &'a BufPool,
    buf: Option<AlignedBuf>,
}

impl Deref for Pooled<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.buf.as_deref().expect("taken until dropped")
    }
}

impl DerefMut for Pooled<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.buf.as_deref_mut().expect("taken until dropped")
    }
}

impl Drop for Pooled<'_> {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            let mut free = self.pool.free.locked();
            if free.len() < self.pool.keep {
                free.push(b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_reused() {
        for len in [0, 1, 511, 4096, 100_000] {
            let b = AlignedBuf::zeroed(len);
            assert_eq!(b.as_ptr() as usize % ALIGN, 0);
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&x| x == 0));
        }
        let c = AlignedBuf::from_slice(b"abc").clone();
        assert_eq!(&c[..], b"abc");
        let pool = BufPool::new(8192, 2);
        let first = pool.take().as_ptr();
        assert_eq!(pool.take().as_ptr(), first, "a returned buffer is reused");
        let (a, b, c) = (pool.take(), pool.take(), pool.take());
        assert!(a.len() == 8192 && b.len() == 8192 && c.len() == 8192);
        drop((a, b, c));
        assert_eq!(pool.free.locked().len(), 2, "at most `keep` are kept");
        let mut v = AlignedVec::new();
        assert!(v.is_empty());
        v.resize(10);
        v[..3].copy_from_slice(b"abc");
        v.resize(3);
        v.resize(9000);
        assert_eq!(v.as_ptr() as usize % ALIGN, 0);
        assert_eq!(&v[..3], b"abc", "kept bytes keep their values");
        assert!(v[3..].iter().all(|&x| x == 0), "added bytes are zero");
        v[8999] = 7;
        let at = v.as_ptr();
        v.resize(100);
        v.resize(9000);
        assert_eq!(v.as_ptr(), at, "the allocation is kept");
        assert_eq!(v[8999], 0, "bytes added again are zero");
        v.clear();
        assert!(v.is_empty());
    }
}
