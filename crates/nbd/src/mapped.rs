//! Data moved straight between the socket and the page cache, through
//! mappings of the member files (see `raidkit_member::map`).
//!
//! Reads: when every byte of a large read lies in plain-file members and is
//! cached, the reply is written to the socket straight from the mappings.
//! One copy, where reading into a buffer first costs two: a third less
//! server CPU per MiB read, measured over loopback. Unlike splicing
//! (`splice.rs`), the client then copies from socket buffers freshly written
//! by the kernel, which is why this is the way on one machine and splicing
//! over a network.
//!
//! Writes: when a large write goes to cached pages of plain-file members
//! and nothing else (no redundancy to update), its payload is received from
//! the socket straight into the mappings: one copy where a buffer costs two.

use crate::stream::Stream;
use raidkit_member::{FileExtent, MappedRange, Member};
use std::io::{self, BufRead, BufReader};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::fs::FileExt;

/// One worker's mapped ranges waiting to be sent.
#[derive(Debug, Default)]
pub(crate) struct MappedReads {
    ranges: Vec<MappedRange>,
    /// Bytes waiting to be sent (0: nothing loaded).
    pub(crate) loaded: usize,
    enabled: bool,
}

impl MappedReads {
    pub(crate) fn new(enabled: bool) -> MappedReads {
        MappedReads {
            enabled,
            ..MappedReads::default()
        }
    }

    /// Take `len` bytes at `offset` of `dev` from the page cache. false:
    /// not possible (not in plain files, not all cached, a mapping refused),
    /// nothing is held: read with `read_at` instead, which deals with
    /// whatever is wrong.
    pub(crate) fn load(&mut self, dev: &dyn Member, offset: u64, len: usize) -> bool {
        debug_assert_eq!(self.loaded, 0);
        if !self.enabled {
            return false;
        }
        let ranges = &mut self.ranges;
        ranges.clear();
        let got = dev.with_file_extents(offset, len as u64, &mut |ext| {
            for e in ext {
                let Some(m) = e.mapper else {
                    return Err(io::ErrorKind::Unsupported.into());
                };
                if !m.cached(e.offset, e.len, ranges)? {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
            }
            Ok(())
        });
        if matches!(got, Some(Ok(()))) {
            self.loaded = len;
            true
        } else {
            ranges.clear();
            false
        }
    }

    /// Send `header` and the loaded data on `sock`, then let the mappings go.
    pub(crate) fn send(&mut self, sock: BorrowedFd<'_>, header: &[u8]) -> io::Result<()> {
        let mut iov: Vec<libc::iovec> = Vec::with_capacity(self.ranges.len() + 1);
        iov.push(libc::iovec {
            iov_base: header.as_ptr() as *mut libc::c_void,
            iov_len: header.len(),
        });
        iov.extend(self.ranges.iter().map(|r| libc::iovec {
            iov_base: r.ptr as *mut libc::c_void,
            iov_len: r.len,
        }));
        let sent = writev_all(sock, &mut iov);
        self.discard();
        sent
    }

    /// Forget what was loaded.
    pub(crate) fn discard(&mut self) {
        self.ranges.clear();
        self.loaded = 0;
    }
}

/// One worker's means of receiving write payloads into the page cache.
#[derive(Debug, Default)]
pub(crate) struct MappedWrites {
    ranges: Vec<MappedRange>,
}

/// How much of a write's payload `MappedWrites::receive` dealt with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Received {
    /// The first `placed` bytes are written to the device.
    pub(crate) placed: usize,
    /// The payload's bytes from `placed` up to `have` are in the caller's
    /// buffer, still to be written; the rest is still in the socket.
    pub(crate) have: usize,
}

impl MappedWrites {
    /// Take the payload of a write of `buf.len()` bytes at `offset` of
    /// `dev`, as far as possible straight into the member files: the bytes
    /// `r` has already buffered with `pwrite`, the rest with `recv` into
    /// the mappings. Stops at the first thing that goes wrong with a member
    /// (a page not cached, a refused mapping, a fault while receiving), and
    /// says how far it got; the caller reads and writes the rest the
    /// ordinary way, which also reports the error. `Err`: the connection
    /// failed.
    pub(crate) fn receive(
        &mut self,
        r: &mut BufReader<Stream>,
        dev: &dyn Member,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<Received> {
        let mut got = Received::default();
        let len = buf.len();
        let ranges = &mut self.ranges;
        let mut socket = Ok(());
        let _ = dev.with_write_extents(offset, len as u64, &mut |ext| {
            ranges.clear();
            for e in ext {
                let Some(m) = e.mapper else {
                    return Err(io::ErrorKind::Unsupported.into());
                };
                if !m.cached_for_write(e.offset, e.len, ranges)? {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
            }
            match place(r, ext, ranges, buf, &mut got) {
                Ok(true) => Ok(()),
                Ok(false) => Err(io::ErrorKind::Other.into()),
                Err(e) => {
                    socket = Err(e);
                    Err(io::ErrorKind::Other.into())
                }
            }
        });
        ranges.clear();
        socket.map(|()| got)
    }
}

/// Place a write's payload, `buf.len()` bytes, in `ext` (the file extents
/// it goes to, in order; `ranges`: their mappings, in order): the bytes `r`
/// has already buffered by `pwrite` (through `buf`, so that they are not
/// lost if that fails), the rest by `recv` into the mappings. Says how far
/// it got in `got`. `Ok(false)`: a member refused (a write error, a fault
/// in a mapping); `Err`: the connection failed.
fn place(
    r: &mut BufReader<Stream>,
    ext: &[FileExtent<'_>],
    ranges: &[MappedRange],
    buf: &mut [u8],
    got: &mut Received,
) -> io::Result<bool> {
    let len = buf.len();
    let head = r.buffer().len().min(len);
    buf[..head].copy_from_slice(&r.buffer()[..head]);
    r.consume(head);
    got.have = head;
    let mut at = 0;
    for e in ext {
        if at == head {
            break;
        }
        let n = (e.len as usize).min(head - at);
        if e.file.write_all_at(&buf[at..at + n], e.offset).is_err() {
            return Ok(false);
        }
        at += n;
    }
    got.placed = head;
    let fd = r.get_ref().as_fd();
    let mut skip = head;
    for m in ranges {
        if skip >= m.len {
            skip -= m.len;
            continue;
        }
        // SAFETY: the range lies in a writable shared mapping that `m`
        // keeps mapped; only the kernel writes through it.
        let ptr = unsafe { m.ptr.cast_mut().add(skip) };
        let want = m.len - skip;
        skip = 0;
        let n = recv_all(fd, ptr, want)?;
        got.placed += n;
        got.have = got.placed;
        if n < want {
            // A fault: the bytes it stopped at are still in the socket.
            return Ok(false);
        }
    }
    Ok(true)
}

/// Receive `len` bytes from `sock` into `ptr`. Fewer: receiving into the
/// memory there faulted (`EFAULT`), and the bytes from there on are still
/// in the socket. Hand-written on libc for the reason `writev_all` is.
fn recv_all(sock: BorrowedFd<'_>, ptr: *mut u8, len: usize) -> io::Result<usize> {
    let mut at = 0;
    while at < len {
        // SAFETY: [ptr, ptr + len) is writable memory (a shared mapping
        // kept alive by the caller); the kernel checks every page it
        // touches and reports a fault as EFAULT.
        let r = unsafe {
            libc::recv(
                sock.as_raw_fd(),
                ptr.add(at).cast(),
                len - at,
                libc::MSG_WAITALL,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EFAULT) => return Ok(at),
                _ => return Err(e),
            }
        }
        if r == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        at += r as usize;
    }
    Ok(at)
}

/// Write every byte the iovecs describe, however many calls it takes.
/// Hand-written on libc because the data is only ever pointed to: making
/// `IoSlice`s (which nix's and std's writev take) would mean slices over
/// mapped memory that another thread's write may change meanwhile.
fn writev_all(sock: BorrowedFd<'_>, iov: &mut [libc::iovec]) -> io::Result<()> {
    let mut i = 0;
    while i < iov.len() {
        let n = (iov.len() - i).min(libc::UIO_MAXIOV as usize);
        // SAFETY: every iovec points into the header or into a mapping that
        // the loaded ranges keep alive for the whole call.
        let r = unsafe { libc::writev(sock.as_raw_fd(), iov[i..].as_ptr(), n as libc::c_int) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if r == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        let mut done = r as usize;
        while done > 0 {
            if done >= iov[i].iov_len {
                done -= iov[i].iov_len;
                i += 1;
            } else {
                iov[i].iov_base = (iov[i].iov_base as usize + done) as *mut libc::c_void;
                iov[i].iov_len -= done;
                done = 0;
            }
        }
        while i < iov.len() && iov[i].iov_len == 0 {
            i += 1;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use raidkit_member::{FileMember, Mapper};
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[2] ^ seed)
            .collect()
    }

    /// A connection whose reader has `buffered` bytes of `payload` in its
    /// buffer and the rest still in the socket.
    fn reader_with(payload: &[u8], buffered: usize) -> BufReader<Stream> {
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut r = BufReader::with_capacity(buffered.max(1), Stream::Unix(a));
        let payload = payload.to_vec();
        let head = payload[..buffered].to_vec();
        b.write_all(&head).unwrap();
        if buffered > 0 {
            // Fill the reader's buffer with exactly the head.
            assert_eq!(r.fill_buf().unwrap().len(), buffered);
        }
        std::thread::spawn(move || b.write_all(&payload[buffered..]).unwrap());
        r
    }

    #[test]
    fn writes_land_in_the_file_through_its_mapping_with_a_buffered_head() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m");
        let len = 8usize << 20;
        std::fs::write(&path, pattern(len, 1)).unwrap();
        let m = FileMember::open(&path, false).unwrap();
        let payload = pattern(3 << 20, 7);
        let at = 12_345u64;
        let mut r = reader_with(&payload, 5000);
        let mut buf = vec![0u8; payload.len()];
        let mut w = MappedWrites::default();
        let got = w.receive(&mut r, &m, at, &mut buf).unwrap();
        assert_eq!((got.placed, got.have), (payload.len(), payload.len()));
        let mut want = pattern(len, 1);
        want[at as usize..at as usize + payload.len()].copy_from_slice(&payload);
        assert!(std::fs::read(&path).unwrap() == want);
    }

    #[test]
    fn a_hole_or_a_read_only_member_is_not_written_through_a_mapping() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m");
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(4 << 20).unwrap();
        f.write_all_at(&[5u8; 1 << 20], 0).unwrap();
        let payload = pattern(1 << 20, 3);
        for (read_only, offset) in [(false, 2u64 << 20), (true, 0)] {
            let m = FileMember::open(&path, read_only).unwrap();
            let mut r = reader_with(&payload, 0);
            let mut buf = vec![0u8; payload.len()];
            let got = MappedWrites::default()
                .receive(&mut r, &m, offset, &mut buf)
                .unwrap();
            assert_eq!(got, Received::default(), "read-only {read_only}");
            // Nothing was taken from the socket.
            let mut rest = vec![0u8; payload.len()];
            std::io::Read::read_exact(&mut r, &mut rest).unwrap();
            assert!(rest == payload);
        }
    }

    #[test]
    fn a_fault_part_way_leaves_the_rest_in_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m");
        let len = 1u64 << 20;
        std::fs::write(&path, vec![1u8; len as usize]).unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let mapper = Mapper::new(&file, len, true).unwrap();
        let mut ranges = Vec::new();
        assert!(mapper.cached_for_write(0, len, &mut ranges).unwrap());
        // The file shrinks after the ranges were found cached: receiving
        // into the pages past its new end faults.
        let cut = 300 << 10;
        file.set_len(cut).unwrap();
        let payload = pattern(len as usize, 9);
        let mut r = reader_with(&payload, 4096);
        let ext = [FileExtent {
            file: &file,
            mapper: Some(&mapper),
            offset: 0,
            len,
        }];
        let mut buf = vec![0u8; len as usize];
        let mut got = Received::default();
        assert!(!place(&mut r, &ext, &ranges, &mut buf, &mut got).unwrap());
        // The socket gives up whole packets only: the one with the fault
        // stays, possibly with some bytes before the new end.
        let placed = got.placed;
        assert_eq!(got.have, placed);
        assert!(4096 < placed && placed <= cut as usize, "{placed}");
        assert!(std::fs::read(&path).unwrap()[..placed] == payload[..placed]);
        let mut rest = vec![0u8; len as usize - placed];
        std::io::Read::read_exact(&mut r, &mut rest).unwrap();
        assert!(rest == payload[placed..]);
    }

    #[test]
    fn a_head_that_cannot_be_written_is_kept_for_the_ordinary_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m");
        std::fs::write(&path, vec![1u8; 1 << 20]).unwrap();
        let rw = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let mapper = Mapper::new(&rw, 1 << 20, true).unwrap();
        let mut ranges = Vec::new();
        assert!(mapper.cached_for_write(0, 1 << 20, &mut ranges).unwrap());
        // pwrite through a descriptor open for reading only fails.
        let ro = std::fs::File::open(&path).unwrap();
        let payload = pattern(1 << 20, 4);
        let mut r = reader_with(&payload, 1000);
        let ext = [FileExtent {
            file: &ro,
            mapper: Some(&mapper),
            offset: 0,
            len: 1 << 20,
        }];
        let mut buf = vec![0u8; 1 << 20];
        let mut got = Received::default();
        assert!(!place(&mut r, &ext, &ranges, &mut buf, &mut got).unwrap());
        assert_eq!((got.placed, got.have), (0, 1000));
        assert!(buf[..1000] == payload[..1000]);
        let mut rest = vec![0u8; payload.len() - 1000];
        std::io::Read::read_exact(&mut r, &mut rest).unwrap();
        assert!(rest == payload[1000..]);
    }
}
