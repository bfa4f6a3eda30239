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
//! and nothing else (no copy to keep in step; a parity array takes whole
//! stripes and computes their parity afterwards), its payload is received
//! from the socket straight into the mappings: one copy where a buffer
//! costs two. A run of pipelined writes can go together (a parity array's
//! stripes are often larger than one write).

use crate::proto::{parse_request, Request, REQUEST_LEN};
use crate::stream::Stream;
use raidkit_member::{FileExtent, MappedRange, Member};
use std::io::{self, BufRead, BufReader, Read};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::fs::FileExt;
use std::sync::MutexGuard;

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

/// How much of a run of writes' payloads `MappedWrites::receive` dealt
/// with. Positions count payload bytes from the start of the run.
#[derive(Debug, Default)]
pub(crate) struct Received {
    /// The first `placed` bytes are written to the device.
    pub(crate) placed: usize,
    /// The bytes from `placed` up to `have` are in the caller's buffer,
    /// still to be written; the rest of the requests taken is still in the
    /// socket.
    pub(crate) have: usize,
    /// The end of the last request whose header was taken (the first
    /// request's header is the caller's).
    pub(crate) end: usize,
    /// Writing the device failed after the payloads were placed (a parity
    /// array could not bring the stripes up to date): every request taken
    /// fails.
    pub(crate) error: Option<String>,
}

impl MappedWrites {
    /// Take the payloads of `run`, contiguous writes whose headers have all
    /// arrived (the first one's already taken from `r`, the others only
    /// peeked at), as far as possible straight into the member files of
    /// `dev` (`Member::with_write_extents`): the first `have` bytes, which
    /// the caller has already read into `buf` (at most the first payload),
    /// and those `r` has buffered with `pwrite`, the rest with `recv` into
    /// the mappings. The headers of the later requests are taken from `r`
    /// on the way and added to `taken`. Stops at the first thing that goes wrong with a
    /// member (a page not cached, a refused mapping, a fault while
    /// receiving) and says how far it got; the caller reads and writes the
    /// rest the ordinary way, which also reports the error. `Err`: the
    /// connection failed.
    pub(crate) fn receive(
        &mut self,
        reader: &mut Option<MutexGuard<'_, BufReader<Stream>>>,
        dev: &dyn Member,
        run: &[Request],
        buf: &mut [u8],
        have: usize,
        taken: &mut Vec<Request>,
    ) -> io::Result<Received> {
        let Some(first) = run.first() else {
            return Ok(Received::default());
        };
        debug_assert!(have <= first.len as usize);
        let mut got = Received {
            end: first.len as usize,
            have,
            ..Received::default()
        };
        let ranges = &mut self.ranges;
        let mut socket = Ok(());
        let mut all_placed = false;
        let outcome = dev.with_write_extents(first.offset, buf.len() as u64, &mut |ext| {
            let r = reader.as_mut().expect("reader held");
            ranges.clear();
            for e in ext {
                let Some(m) = e.mapper else {
                    return Err(io::ErrorKind::Unsupported.into());
                };
                // Not cached, or no mapping to be had: nothing is written
                // (see `Member::with_write_extents`).
                if !matches!(m.cached_for_write(e.offset, e.len, ranges), Ok(true)) {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
            }
            let mut pos = 0;
            for (i, req) in run.iter().enumerate() {
                let n = req.len as usize;
                if i > 0 {
                    let mut hb = [0u8; REQUEST_LEN];
                    if let Err(e) = r.read_exact(&mut hb) {
                        socket = Err(e);
                        return Err(io::ErrorKind::Interrupted.into());
                    }
                    // The bytes peeked at before: the same request.
                    debug_assert_eq!(parse_request(&hb).ok(), Some(*req));
                    taken.push(*req);
                    got.end = pos + n;
                }
                let sub_ext = window(
                    ext,
                    pos as u64,
                    n as u64,
                    |e| e.len,
                    |e, skip, len| FileExtent {
                        offset: e.offset + skip,
                        len,
                        ..*e
                    },
                );
                let sub_ranges = window(
                    ranges,
                    pos as u64,
                    n as u64,
                    |m| m.len as u64,
                    |m, skip, len| m.sub(skip as usize, len as usize),
                );
                let mut one = Received::default();
                let head = have.saturating_sub(pos);
                match place(
                    r,
                    &sub_ext,
                    &sub_ranges,
                    &mut buf[pos..pos + n],
                    head,
                    &mut one,
                ) {
                    Ok(true) => {}
                    Ok(false) => {
                        got.placed = pos + one.placed;
                        got.have = pos + one.have;
                        return Err(io::ErrorKind::Interrupted.into());
                    }
                    Err(e) => {
                        socket = Err(e);
                        return Err(io::ErrorKind::Interrupted.into());
                    }
                }
                pos += n;
                got.placed = pos;
                got.have = pos;
            }
            all_placed = true;
            // Every payload is in: other workers may take the next requests
            // while the device finishes these (a parity array's parity).
            reader.take();
            Ok(())
        });
        ranges.clear();
        socket?;
        if let Some(Err(e)) = outcome {
            // The device's own work after the placing failed (our stops
            // are Interrupted, WouldBlock or Unsupported).
            if e.kind() == io::ErrorKind::Other {
                got.error = Some(e.to_string());
            } else {
                debug_assert!(!all_placed);
            }
        }
        Ok(got)
    }
}

/// The part `[pos, pos + n)` of a list of pieces laid end to end, cut with
/// `cut(piece, skip, len)`.
fn window<T>(
    items: &[T],
    pos: u64,
    n: u64,
    len_of: impl Fn(&T) -> u64,
    cut: impl Fn(&T, u64, u64) -> T,
) -> Vec<T> {
    let mut out = Vec::new();
    let mut at = 0;
    for it in items {
        let l = len_of(it);
        let (a, b) = (pos.max(at), (pos + n).min(at + l));
        if a < b {
            out.push(cut(it, a - at, b - a));
        }
        at += l;
        if at >= pos + n {
            break;
        }
    }
    out
}

/// Place a write's payload, `buf.len()` bytes, in `ext` (the file extents
/// it goes to, in order; `ranges`: their mappings, in order): the first
/// `have` bytes, already in `buf`, and those `r` has buffered by `pwrite`
/// (through `buf`, so that they are not lost if that fails), the rest by
/// `recv` into the mappings. Says how far it got in `got`. `Ok(false)`: a
/// member refused (a write error, a fault in a mapping); `Err`: the
/// connection failed.
fn place(
    r: &mut BufReader<Stream>,
    ext: &[FileExtent<'_>],
    ranges: &[MappedRange],
    buf: &mut [u8],
    have: usize,
    got: &mut Received,
) -> io::Result<bool> {
    let len = buf.len();
    let have = have.min(len);
    let more = r.buffer().len().min(len - have);
    buf[have..have + more].copy_from_slice(&r.buffer()[..more]);
    r.consume(more);
    let head = have + more;
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

    fn write(offset: u64, len: usize) -> Request {
        Request {
            flags: 0,
            kind: crate::proto::CMD_WRITE,
            cookie: offset,
            offset,
            len: len as u32,
        }
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

    /// `MappedWrites::receive` as a connection's worker calls it, holding
    /// the reader's lock; the reader back, and whether the lock was let go.
    fn receive(
        r: BufReader<Stream>,
        dev: &dyn Member,
        run: &[Request],
        buf: &mut [u8],
        have: usize,
    ) -> (Received, Vec<Request>, BufReader<Stream>, bool) {
        let lock = std::sync::Mutex::new(r);
        let mut reader = Some(lock.lock().unwrap());
        let mut taken = Vec::new();
        let got = MappedWrites::default()
            .receive(&mut reader, dev, run, buf, have, &mut taken)
            .unwrap();
        let released = reader.is_none();
        drop(reader);
        (got, taken, lock.into_inner().unwrap(), released)
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
        let r = reader_with(&payload, 5000);
        let mut buf = vec![0u8; payload.len()];
        let (got, taken, _, released) = receive(r, &m, &[write(at, payload.len())], &mut buf, 0);
        assert!(taken.is_empty() && got.error.is_none() && released);
        assert_eq!((got.placed, got.have), (payload.len(), payload.len()));
        let mut want = pattern(len, 1);
        want[at as usize..at as usize + payload.len()].copy_from_slice(&payload);
        assert!(std::fs::read(&path).unwrap() == want);
    }

    #[test]
    fn a_run_of_writes_takes_the_later_headers_on_the_way() {
        // The first payload still on the wire, or already read by the
        // caller (`have`).
        for first_read in [false, true] {
            run_of_writes(first_read);
        }
    }

    fn run_of_writes(first_read: bool) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m");
        let len = 4usize << 20;
        std::fs::write(&path, pattern(len, 1)).unwrap();
        let m = FileMember::open(&path, false).unwrap();
        let run = [
            write(1 << 20, 300_000),
            write((1 << 20) + 300_000, 65_536),
            write((1 << 20) + 365_536, 100_003),
        ];
        let total: usize = run.iter().map(|q| q.len as usize).sum();
        let payload = pattern(total, 9);
        let mut buf = vec![0u8; total];
        let have = if first_read { run[0].len as usize } else { 0 };
        buf[..have].copy_from_slice(&payload[..have]);
        // On the wire: the first payload (its header taken already) unless
        // read, then each later request's header and payload.
        let mut wire = payload[have..run[0].len as usize].to_vec();
        let mut at = run[0].len as usize;
        for q in &run[1..] {
            wire.extend_from_slice(&crate::proto::encode_request(q));
            wire.extend_from_slice(&payload[at..at + q.len as usize]);
            at += q.len as usize;
        }
        wire.extend_from_slice(b"after");
        let r = reader_with(&wire, 1000);
        let (got, taken, mut r, released) = receive(r, &m, &run, &mut buf, have);
        assert_eq!(taken, run[1..]);
        assert_eq!((got.placed, got.have, got.end), (total, total, total));
        assert!(got.error.is_none() && released);
        let mut want = pattern(len, 1);
        want[1 << 20..(1 << 20) + total].copy_from_slice(&payload);
        assert!(std::fs::read(&path).unwrap() == want);
        let mut rest = [0u8; 5];
        std::io::Read::read_exact(&mut r, &mut rest).unwrap();
        assert_eq!(&rest, b"after");
    }

    #[test]
    fn a_hole_or_a_read_only_member_is_not_written_through_a_mapping() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m");
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(4 << 20).unwrap();
        f.write_all_at(&[5u8; 1 << 20], 0).unwrap();
        let payload = pattern(1 << 20, 3);
        // The third: the first 4 KiB already read by the caller.
        for (read_only, offset, have) in
            [(false, 2u64 << 20, 0), (true, 0, 0), (false, 3 << 20, 4096)]
        {
            let m = FileMember::open(&path, read_only).unwrap();
            let r = reader_with(&payload[have..], 0);
            let mut buf = vec![0u8; payload.len()];
            buf[..have].copy_from_slice(&payload[..have]);
            let (got, taken, mut r, released) =
                receive(r, &m, &[write(offset, buf.len())], &mut buf, have);
            assert_eq!((got.placed, got.have), (0, have), "read-only {read_only}");
            assert!(taken.is_empty() && !released);
            // Nothing was taken from the socket.
            let mut rest = vec![0u8; payload.len() - have];
            std::io::Read::read_exact(&mut r, &mut rest).unwrap();
            assert!(rest == payload[have..]);
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
        assert!(!place(&mut r, &ext, &ranges, &mut buf, 0, &mut got).unwrap());
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
        assert!(!place(&mut r, &ext, &ranges, &mut buf, 0, &mut got).unwrap());
        assert_eq!((got.placed, got.have), (0, 1000));
        assert!(buf[..1000] == payload[..1000]);
        let mut rest = vec![0u8; payload.len() - 1000];
        std::io::Read::read_exact(&mut r, &mut rest).unwrap();
        assert!(rest == payload[1000..]);
    }
}
