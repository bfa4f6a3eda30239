//! `MappedWrites::receive` and `place` against real files and sockets.

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

/// What `receive` reported: the positions, what happened, and the
/// device's error if it failed after the placing.
#[derive(Debug)]
struct Got {
    placed: usize,
    have: usize,
    end: usize,
    outcome: Outcome,
    error: Option<String>,
}

/// `MappedWrites::receive` as a connection's worker calls it, holding
/// the reader's lock; the reader back, and whether the lock was let go.
fn receive(
    r: BufReader<Stream>,
    dev: &dyn Member,
    run: &[Request],
    buf: &mut [u8],
    have: usize,
) -> (Got, Vec<Request>, BufReader<Stream>, bool) {
    let lock = std::sync::Mutex::new(r);
    let mut reader = Some(lock.lock().unwrap());
    let mut taken = Vec::new();
    let (outcome, at) = MappedWrites::default()
        .receive(&mut reader, dev, run, buf, have, &mut taken)
        .unwrap();
    let released = reader.is_none();
    drop(reader);
    let error = match &outcome {
        Outcome::DeviceFailed(e) => Some(e.clone()),
        _ => None,
    };
    let got = Got {
        placed: at.placed,
        have: at.have,
        end: at.end,
        outcome,
        error,
    };
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
    assert_eq!(got.outcome, Outcome::Served);
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
    assert_eq!(got.outcome, Outcome::Served);
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
    for (read_only, offset, have) in [(false, 2u64 << 20, 0), (true, 0, 0), (false, 3 << 20, 4096)]
    {
        let m = FileMember::open(&path, read_only).unwrap();
        let r = reader_with(&payload[have..], 0);
        let mut buf = vec![0u8; payload.len()];
        buf[..have].copy_from_slice(&payload[..have]);
        let (got, taken, mut r, released) =
            receive(r, &m, &[write(offset, buf.len())], &mut buf, have);
        assert_eq!((got.placed, got.have), (0, have), "read-only {read_only}");
        assert!(taken.is_empty() && !released);
        assert_eq!(got.outcome, Outcome::Declined, "read-only {read_only}");
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
        landed: None,
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
        landed: None,
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
