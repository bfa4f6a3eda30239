//! Reading and writing mapped member files in this program, with faults
//! caught. The kernel reports a fault in a system call as `EFAULT`, but a
//! fault in this program's own loads and stores, on a page of a file
//! mapping that the file no longer backs (a member truncated under the
//! server, a page its file system cannot read or allocate), is a SIGBUS,
//! which would kill the server with every array it serves.
//!
//! [`guarded`] runs a function with such faults turned into an error: a
//! SIGBUS handler jumps back out of it (`siglongjmp`, in the small C file
//! `csrc/guard.c`, as Rust has no way to return twice from a call). No
//! crate does this for data the program computes on in place; the larger
//! ones that catch hardware faults are made for other jobs (stack probes,
//! wasm traps). A SIGBUS anywhere else is handed to the handler that was
//! there before, so the process still dies of it as it would have.

use std::ffi::{c_int, c_void};
use std::sync::Once;

extern "C" {
    fn raidkit_guard_install() -> c_int;
    fn raidkit_guarded(f: extern "C" fn(*mut c_void), arg: *mut c_void) -> c_int;
}

/// A guarded function was cut short by a fault on mapped memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a fault on a mapped member page (the file no longer backs it)")]
pub struct Fault;

/// Run `f`, and return `Err(Fault)` if a page it touches faults (SIGBUS)
/// instead of letting the fault kill the process. Whatever `f` wrote
/// before the fault stays written.
///
/// # Safety
/// A fault abandons `f`'s frames without unwinding them: while it touches
/// memory that may fault, `f` must hold nothing whose destructor has to
/// run (no allocation, lock guard or reference count of its own) and must
/// not be inside a call that does. Computing over slices set up beforehand
/// meets this.
pub unsafe fn guarded(f: &mut dyn FnMut()) -> Result<(), Fault> {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // SAFETY: installs a SIGBUS handler that keeps the previous one.
        let r = unsafe { raidkit_guard_install() };
        assert_eq!(r, 0, "installing the SIGBUS handler");
    });
    extern "C" fn call(arg: *mut c_void) {
        // SAFETY: `arg` is the `&mut &mut dyn FnMut()` passed below, alive
        // for the whole call.
        let f = unsafe { &mut *arg.cast::<&mut dyn FnMut()>() };
        f();
    }
    let mut f = f;
    // SAFETY: `call` gets a pointer to `f`, which outlives the call; the
    // caller has made sure that `f` may be abandoned part-way.
    let cut = unsafe { raidkit_guarded(call, (&mut f as *mut &mut dyn FnMut()).cast()) };
    if cut == 0 {
        Ok(())
    } else {
        Err(Fault)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    #[test]
    fn a_fault_on_a_truncated_mapping_is_an_error_and_the_rest_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m");
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        f.write_all_at(&[7u8; 3 * 4096], 0).unwrap();
        let map = memmap2::MmapOptions::new()
            .len(3 * 4096)
            .map_raw(&f)
            .unwrap();
        let p = map.as_mut_ptr();
        let mut sum = 0u64;
        let read = |n: usize| {
            move || {
                // SAFETY: within the mapping; a page past the file's end
                // faults, which the guard turns into an error.
                let s = unsafe { std::slice::from_raw_parts(p, n) };
                s.iter().map(|&b| b as u64).sum::<u64>()
            }
        };
        let whole = read(3 * 4096);
        // SAFETY: the closure holds nothing with a destructor.
        unsafe { guarded(&mut || sum = whole()) }.unwrap();
        assert_eq!(sum, 7 * 3 * 4096);

        // The file shrinks to one page under the mapping.
        f.set_len(4096).unwrap();
        let first = read(4096);
        // SAFETY: as above.
        unsafe { guarded(&mut || sum = first()) }.unwrap();
        assert_eq!(sum, 7 * 4096);
        for _ in 0..3 {
            sum = 0;
            let whole = read(3 * 4096);
            // SAFETY: as above.
            let r = unsafe { guarded(&mut || sum = whole()) };
            assert_eq!(r, Err(Fault), "reading past the file's end");
            assert_eq!(sum, 0, "cut short before it returned");
        }
        // Writing faults the same way; the page that is backed took it.
        // SAFETY: as above.
        let r = unsafe {
            guarded(&mut || {
                std::ptr::write_bytes(p, 9, 4096);
                std::ptr::write_bytes(p.add(4096), 9, 4096);
            })
        };
        assert_eq!(r, Err(Fault));
        let mut got = [0u8; 4096];
        f.read_exact_at(&mut got, 0).unwrap();
        assert_eq!(got, [9u8; 4096]);
    }
}
