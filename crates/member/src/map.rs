//! Mappings of a member file, for data moved straight between the page
//! cache and a socket: a large read that is already cached is written to
//! the socket from the mapping, one copy (cache → socket) instead of two
//! (cache → buffer → socket); over loopback, where zero-copy splicing makes
//! the client copy from cold cache pages, this is the cheaper way. A large
//! write whose pages are cached is received from the socket straight into
//! the mapping (socket → cache, where a buffer costs socket → buffer →
//! cache), when the member is open for writing.
//!
//! A member keeps a few windows of its file mapped (not the whole file: the
//! page tables of a mapping that ends up touched across a multi-terabyte
//! disk would grow without bound) and lets go of the least recently used.
//! memmap2 maps and unmaps; `mincore(2)`, which it does not offer, tells
//! whether a range is cached, through libc.
//!
//! Only cached ranges are offered. The data is then read or written by the
//! kernel (writev, recv), so a range that changes or disappears under it (a
//! concurrent write, a truncated file, a page the file system cannot back)
//! gives at worst mixed data or an `EFAULT` from the system call, never a
//! signal; or by this program (a RAID-5 computing parity over the chunks it
//! just received in place) only inside [`crate::guarded`], which turns the
//! signal such a page raises into an error.

use memmap2::{MmapOptions, MmapRaw};
use std::fs::File;
use std::io;
use std::sync::{Arc, Mutex};

/// Size of a mapped window of a member file.
const WINDOW: u64 = 64 << 20;
/// Windows a member keeps mapped (1 GiB of address space).
const WINDOWS: usize = 16;
const PAGE: u64 = 4096;

/// The mapped windows of one member file.
#[derive(Debug)]
pub struct Mapper {
    file: File,
    len: u64,
    /// Windows are mapped for writing too (the file is open for writing).
    writable: bool,
    slots: Mutex<Slots>,
}

#[derive(Debug, Default)]
struct Slots {
    tick: u64,
    /// (window index, mapping, last use)
    held: Vec<(u64, Arc<MmapRaw>, u64)>,
}

/// `len` bytes at `ptr`, inside a mapping that `_map` keeps alive.
#[derive(Debug, Clone)]
pub struct MappedRange {
    _map: Arc<MmapRaw>,
    pub ptr: *const u8,
    pub len: usize,
    /// From [`Mapper::cached_for_write`]: the mapping may be written.
    writable: bool,
}

impl MappedRange {
    /// `len` bytes of this range from `skip` on (both within it).
    pub fn sub(&self, skip: usize, len: usize) -> MappedRange {
        assert!(skip + len <= self.len, "a sub-range lies within its range");
        MappedRange {
            _map: self._map.clone(),
            // SAFETY: within the range, checked above.
            ptr: unsafe { self.ptr.add(skip) },
            len,
            writable: self.writable,
        }
    }

    /// The range's bytes, for this program to read.
    ///
    /// # Safety
    /// Only read them inside [`crate::guarded`] (a page the file no longer
    /// backs faults), and while nothing in this program writes them.
    pub unsafe fn bytes(&self) -> &[u8] {
        // SAFETY: the range lies in a mapping it keeps alive; the caller
        // sees to faults and to concurrent writers.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The range's bytes, for this program to write: a range from
    /// [`Mapper::cached_for_write`] only (panics otherwise).
    ///
    /// # Safety
    /// As [`MappedRange::bytes`], and nothing else in this program may read
    /// or write them meanwhile (no other slice of the same bytes).
    #[allow(clippy::mut_from_ref)] // the bytes are the file's, not `self`'s
    pub unsafe fn bytes_mut(&self) -> &mut [u8] {
        assert!(self.writable, "writing a range mapped for reading");
        // SAFETY: a writable shared mapping the range keeps alive; the
        // caller sees to faults and to exclusive use.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.cast_mut(), self.len) }
    }
}

// SAFETY: the pointer is into a shared mapping that the range itself keeps
// mapped; it is handed to the kernel, or read and written here only through
// the unsafe `bytes`/`bytes_mut`, whose callers exclude concurrent writers,
// so sharing it between threads races with nothing in this program.
unsafe impl Send for MappedRange {}
// SAFETY: as for Send.
unsafe impl Sync for MappedRange {}

impl Mapper {
    /// Windows of `file` (`len` bytes), mapped when first asked for, for
    /// writing too if `writable` (the file must then be open for writing).
    /// The file descriptor is duplicated so that the mapper stands alone.
    pub fn new(file: &File, len: u64, writable: bool) -> io::Result<Mapper> {
        Ok(Mapper {
            file: file.try_clone()?,
            len,
            writable,
            slots: Mutex::default(),
        })
    }

    /// Whether ranges may be written through (see [`Mapper::cached_for_write`]).
    pub fn writable(&self) -> bool {
        self.writable
    }

    /// The ranges of the mappings that hold `[offset, offset + len)`, in
    /// order, if every page of it is in the page cache now. `Ok(false)`:
    /// some page is not (read it the ordinary way, which also deals with
    /// errors). `Err`: the mapping could not be made.
    pub fn cached(&self, offset: u64, len: u64, out: &mut Vec<MappedRange>) -> io::Result<bool> {
        self.ranges(offset, len, out, false)
    }

    /// As [`Mapper::cached`], for ranges the kernel may write into (recv):
    /// `Ok(false)` also when the file is not open for writing. Requiring
    /// the pages to be cached means that writing through the mapping needs
    /// no read from the disk and, on a RAM disk, allocates nothing (a hole
    /// is written the ordinary way, where a full file system is an error
    /// and not a fault). Whatever still faults (a file system refusing to
    /// back a page) makes the system call fail with `EFAULT`: the caller
    /// then writes the rest the ordinary way.
    pub fn cached_for_write(
        &self,
        offset: u64,
        len: u64,
        out: &mut Vec<MappedRange>,
    ) -> io::Result<bool> {
        if !self.writable {
            return Ok(false);
        }
        self.ranges(offset, len, out, true)
    }

    fn ranges(
        &self,
        offset: u64,
        len: u64,
        out: &mut Vec<MappedRange>,
        writable: bool,
    ) -> io::Result<bool> {
        let end = match offset.checked_add(len) {
            Some(e) if e <= self.len && len > 0 => e,
            _ => return Err(io::Error::from(io::ErrorKind::InvalidInput)),
        };
        let mut at = offset;
        while at < end {
            let index = at / WINDOW;
            let map = self.window(index)?;
            let start = index * WINDOW;
            let n = (end - at).min(start + WINDOW - at);
            let rel = (at - start) as usize;
            if !resident(&map, rel, n as usize)? {
                return Ok(false);
            }
            // SAFETY: rel + n lies within the window (rel < WINDOW and the
            // range ends at the window's end at the latest, which is within
            // the file's length as mapped).
            let ptr = unsafe { map.as_ptr().add(rel) };
            out.push(MappedRange {
                _map: map,
                ptr,
                len: n as usize,
                writable,
            });
            at += n;
        }
        Ok(true)
    }

    /// The mapping of window `index`, made now if need be.
    fn window(&self, index: u64) -> io::Result<Arc<MmapRaw>> {
        let mut s = self.slots.lock().expect("mapper");
        s.tick += 1;
        let tick = s.tick;
        if let Some(slot) = s.held.iter_mut().find(|h| h.0 == index) {
            slot.2 = tick;
            return Ok(slot.1.clone());
        }
        let start = index * WINDOW;
        let len = WINDOW.min(self.len - start) as usize;
        let mut opts = MmapOptions::new();
        opts.offset(start).len(len);
        let map = Arc::new(if self.writable {
            opts.map_raw(&self.file)?
        } else {
            opts.map_raw_read_only(&self.file)?
        });
        if s.held.len() >= WINDOWS {
            // The least recently used goes; replies still sending from it
            // keep it mapped until they are done.
            let oldest = (0..s.held.len())
                .min_by_key(|&i| s.held[i].2)
                .expect("a full set has an oldest");
            s.held.swap_remove(oldest);
        }
        s.held.push((index, map.clone(), tick));
        Ok(map)
    }

    /// How many windows are mapped now.
    #[cfg(test)]
    fn windows(&self) -> usize {
        self.slots.lock().expect("mapper").held.len()
    }
}

/// Whether every page of `len` bytes at `rel` in `map` is in the page cache.
fn resident(map: &MmapRaw, rel: usize, len: usize) -> io::Result<bool> {
    let first = rel as u64 / PAGE * PAGE;
    let last = (rel + len) as u64;
    let mut vec = [0u8; 256];
    let mut at = first;
    while at < last {
        let n = (last - at).min(vec.len() as u64 * PAGE);
        let pages = n.div_ceil(PAGE) as usize;
        // SAFETY: `at` is page-aligned and [at, at + n) lies within the
        // mapping; `vec` has room for one byte per page of it.
        let r = unsafe {
            libc::mincore(
                map.as_mut_ptr().add(at as usize).cast(),
                n as usize,
                vec.as_mut_ptr(),
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        if vec[..pages].iter().any(|b| b & 1 == 0) {
            return Ok(false);
        }
        at += n;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    fn bytes(r: &MappedRange) -> Vec<u8> {
        // SAFETY: test only: nothing writes the file while this reads it.
        unsafe { std::slice::from_raw_parts(r.ptr, r.len) }.to_vec()
    }

    #[test]
    fn cached_ranges_hold_the_file_bytes_across_windows() {
        let f = tempfile::tempfile().unwrap();
        let len = WINDOW + (3 << 20);
        f.set_len(len).unwrap();
        let data: Vec<u8> = (0..(2u32 << 20)).map(|i| (i * 7 + 3) as u8).collect();
        let at = WINDOW - (1 << 20);
        f.write_all_at(&data, at).unwrap();
        let m = Mapper::new(&f, len, false).unwrap();
        let mut out = Vec::new();
        assert!(m.cached(at + 5, (2 << 20) - 5, &mut out).unwrap());
        assert_eq!(out.len(), 2, "split at the window boundary");
        let got: Vec<u8> = out.iter().flat_map(bytes).collect();
        assert_eq!(got, data[5..]);
        assert!(m.cached(len, 1, &mut out).is_err(), "past the end");
    }

    #[test]
    fn a_range_not_in_the_page_cache_is_not_offered() {
        // A hole in a sparse file has no page in the cache.
        let f = tempfile::tempfile().unwrap();
        f.set_len(8 << 20).unwrap();
        f.write_all_at(&[1u8; 4096], 0).unwrap();
        let m = Mapper::new(&f, 8 << 20, false).unwrap();
        let mut out = Vec::new();
        assert!(m.cached(0, 4096, &mut out).unwrap());
        out.clear();
        assert!(!m.cached(4 << 20, 1 << 20, &mut out).unwrap());
    }

    #[test]
    fn only_the_most_recently_used_windows_stay_mapped() {
        let f = tempfile::tempfile().unwrap();
        let len = WINDOW * (WINDOWS as u64 + 2);
        f.set_len(len).unwrap();
        let m = Mapper::new(&f, len, false).unwrap();
        for i in 0..WINDOWS as u64 + 2 {
            f.write_all_at(&[9u8; 4096], i * WINDOW).unwrap();
            let mut out = Vec::new();
            assert!(m.cached(i * WINDOW, 4096, &mut out).unwrap());
            assert_eq!(bytes(&out[0]), vec![9u8; 4096]);
        }
        assert_eq!(m.windows(), WINDOWS);
    }
}
