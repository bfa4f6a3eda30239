//! The direct-I/O engine on files of a real disk's file system (/var/tmp;
//! tmpfs refuses O_DIRECT): byte-exact against a model at any offset and
//! length, concurrent writers of one sector, durable writes, discards, and
//! what `--io auto` picks where.

use raidkit_member::{open_member, AlignedBuf, CutRng, DirectMember, FileMember, IoMode, Member};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A directory on a disk-backed file system, removed at the end.
fn disk_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("raidkit-direct-")
        .tempdir_in("/var/tmp")
        .unwrap()
}

fn new_file(dir: &Path, name: &str, len: u64) -> PathBuf {
    let p = dir.join(name);
    FileMember::create(&p, len).unwrap();
    p
}

/// The open descriptor's flags from /proc/self/fdinfo, for the first
/// descriptor of this process open on `path`.
fn fd_flags(path: &Path) -> Option<u32> {
    let want = std::fs::canonicalize(path).ok()?;
    for e in std::fs::read_dir("/proc/self/fd").ok()?.flatten() {
        if std::fs::read_link(e.path()).ok().as_deref() == Some(want.as_path()) {
            let info =
                std::fs::read_to_string(format!("/proc/self/fdinfo/{}", e.file_name().to_str()?))
                    .ok()?;
            let flags = info.lines().find_map(|l| l.strip_prefix("flags:"))?;
            return u32::from_str_radix(flags.trim(), 8).ok();
        }
    }
    None
}

const O_DIRECT_OCTAL: u32 = 0o40000;

#[test]
fn unaligned_reads_and_writes_match_a_model() {
    let dir = disk_dir();
    const LEN: u64 = 2 << 20;
    let p = new_file(dir.path(), "m.img", LEN);
    let m = DirectMember::open(&p, false).unwrap();
    assert_eq!(m.len(), LEN);
    assert!(m.logical_block_size() >= 512 && m.logical_block_size().is_power_of_two());
    assert_eq!(m.block_size(), m.logical_block_size());
    assert!(m.as_file().is_none() && m.as_mapper().is_none());
    assert_eq!(fd_flags(&p).unwrap() & O_DIRECT_OCTAL, O_DIRECT_OCTAL);

    let mut model = vec![0u8; LEN as usize];
    let mut rng = CutRng::new(23);
    for i in 0..600u64 {
        // Small and odd, around blocks, and over a bounce buffer's size.
        let max = [7, 600, 5000, 700_000][rng.below(4) as usize];
        let len = 1 + rng.below(max) as usize;
        let off = rng.below(LEN - len as u64);
        let aligned = rng.below(4) == 0;
        let off = if aligned { off / 4096 * 4096 } else { off };
        if rng.below(2) == 0 {
            let data: Vec<u8> = (0..len).map(|j| (i as usize * 7 + j) as u8 | 1).collect();
            if aligned {
                let a = AlignedBuf::from_slice(&data[..len / 4096 * 4096]);
                m.write_at(&a, off).unwrap();
                model[off as usize..off as usize + a.len()].copy_from_slice(&a);
            } else {
                m.write_at(&data, off).unwrap();
                model[off as usize..off as usize + len].copy_from_slice(&data);
            }
        } else {
            let mut got = vec![0u8; len];
            // An odd start in memory too, to take the bounce path.
            let mut b = vec![0u8; len + 1];
            m.read_at(&mut b[1..], off).unwrap();
            got.copy_from_slice(&b[1..]);
            assert_eq!(
                got,
                &model[off as usize..off as usize + len],
                "op {i}: read {len} at {off}"
            );
        }
    }
    m.flush().unwrap();
    drop(m);
    // What reached the file, read through the page cache.
    let all = std::fs::read(&p).unwrap();
    assert!(all == model, "the file's contents differ from the model");
}

#[test]
fn concurrent_writers_of_one_sector_lose_no_bytes() {
    let dir = disk_dir();
    let p = new_file(dir.path(), "m.img", 1 << 20);
    let m = Arc::new(DirectMember::open(&p, false).unwrap());
    // Four writers, each owning bytes spread over the same three blocks:
    // writer t owns every byte at 3 + 4 * k + t, written 3 bytes at a
    // time (odd offsets), so every write read-modify-writes a block others
    // write too.
    const WRITERS: u64 = 4;
    const ROUNDS: u32 = 300;
    let base = 4096 * 5;
    let threads: Vec<_> = (0..WRITERS)
        .map(|t| {
            let m = m.clone();
            std::thread::spawn(move || {
                let mut rng = CutRng::new(t + 1);
                let slots: Vec<u64> = (0..3000).map(|k| base + 3 + 4 * k + t).collect();
                let mut last = vec![0u8; slots.len()];
                for round in 1..=ROUNDS {
                    let s = rng.below(slots.len() as u64) as usize;
                    let v = (round % 250) as u8 + 1;
                    m.write_at(&[v], slots[s]).unwrap();
                    last[s] = v;
                    // Every byte this writer owns still holds what it wrote.
                    let c = rng.below(slots.len() as u64) as usize;
                    let mut b = [0u8];
                    m.read_at(&mut b, slots[c]).unwrap();
                    assert_eq!(b[0], last[c], "writer {t}: byte at {} lost", slots[c]);
                }
                (slots, last)
            })
        })
        .collect();
    for th in threads {
        let (slots, last) = th.join().unwrap();
        for (s, v) in slots.iter().zip(last) {
            let mut b = [0u8];
            m.read_at(&mut b, *s).unwrap();
            assert_eq!(b[0], v, "byte at {s} lost");
        }
    }
}

#[test]
fn durable_writes_land_for_both_engines() {
    let dir = disk_dir();
    let p = new_file(dir.path(), "d.img", 1 << 20);
    let q = new_file(dir.path(), "f.img", 1 << 20);
    let d: Arc<dyn Member> = Arc::new(DirectMember::open(&p, false).unwrap());
    let f: Arc<dyn Member> = Arc::new(FileMember::open(&q, false).unwrap());
    for m in [d, f] {
        m.write_at_durable(b"unaligned and durable", 4093).unwrap();
        let a = AlignedBuf::from_slice(&[9u8; 8192]);
        m.write_at_durable(&a, 65536).unwrap();
        let mut b = [0u8; 21];
        m.read_at(&mut b, 4093).unwrap();
        assert_eq!(&b, b"unaligned and durable", "{}", m.name());
        let mut c = vec![0u8; 8192];
        m.read_at(&mut c, 65536).unwrap();
        assert!(c.iter().all(|&x| x == 9), "{}", m.name());
        assert!(m.write_at_durable(b"xx", (1 << 20) - 1).is_err());
    }
    // Read back by another open of the file.
    let all = std::fs::read(&p).unwrap();
    assert_eq!(&all[4093..4114], b"unaligned and durable");
}

/// Bytes the file system has allocated to a file.
fn allocated(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).unwrap().blocks() * 512
}

#[test]
fn discard_reads_back_zeroes_and_frees_space() {
    let dir = disk_dir();
    const LEN: u64 = 4 << 20;
    let p = new_file(dir.path(), "d.img", LEN);
    let q = new_file(dir.path(), "f.img", LEN);
    let d: Arc<dyn Member> = Arc::new(DirectMember::open(&p, false).unwrap());
    let f: Arc<dyn Member> = Arc::new(FileMember::open(&q, false).unwrap());
    for (m, path) in [(d, &p), (f, &q)] {
        let fill = AlignedBuf::from_slice(&vec![0xa5u8; LEN as usize]);
        m.write_at(&fill, 0).unwrap();
        m.flush().unwrap();
        let before = allocated(path);
        // Odd edges around a large aligned middle.
        let (off, len) = (4096 * 3 + 17, (2 << 20) + 1001);
        m.discard(off, len).unwrap();
        let mut all = vec![0u8; LEN as usize];
        m.read_at(&mut all, 0).unwrap();
        let (s, e) = (off as usize, (off + len) as usize);
        assert!(
            all[..s].iter().all(|&x| x == 0xa5),
            "{}: before the range",
            m.name()
        );
        assert!(all[s..e].iter().all(|&x| x == 0), "{}: not zero", m.name());
        assert!(
            all[e..].iter().all(|&x| x == 0xa5),
            "{}: after the range",
            m.name()
        );
        m.flush().unwrap();
        assert!(
            allocated(path) + (1 << 20) < before,
            "{}: no space freed ({} then {})",
            m.name(),
            before,
            allocated(path)
        );
        assert!(m.discard(LEN - 1, 2).is_err());
    }
}

#[test]
fn auto_picks_direct_on_a_disk_and_buffered_on_tmpfs() {
    let dir = disk_dir();
    let p = new_file(dir.path(), "m.img", 1 << 20);
    let o = open_member(&p, false, IoMode::Auto).unwrap();
    assert_eq!(o.mode, IoMode::Direct, "{o}");
    assert!(o.member.as_file().is_none());
    assert!(
        o.to_string().starts_with("direct I/O, logical block "),
        "{o}"
    );
    drop(o);

    let shm = tempfile::Builder::new()
        .prefix("raidkit-direct-")
        .tempdir_in("/dev/shm")
        .unwrap();
    let s = new_file(shm.path(), "m.img", 1 << 20);
    let o = open_member(&s, false, IoMode::Auto).unwrap();
    assert_eq!(o.mode, IoMode::Buffered, "{o}");
    assert!(o.member.as_file().is_some());
    assert!(o.to_string().contains("on tmpfs"), "{o}");
    assert_eq!(fd_flags(&s).unwrap() & O_DIRECT_OCTAL, 0);
    drop(o);
    // Direct asks for O_DIRECT even there: granted where the kernel has it
    // for tmpfs (6.6 on), else refused saying why.
    match open_member(&s, false, IoMode::Direct) {
        Ok(o) => assert_eq!(o.mode, IoMode::Direct),
        Err(e) => {
            assert_eq!(e.source.kind(), std::io::ErrorKind::Unsupported, "{e}");
            assert!(e.to_string().contains("does not allow direct I/O"), "{e}");
        }
    }
    let o = open_member(&p, false, IoMode::Buffered).unwrap();
    assert_eq!(o.mode, IoMode::Buffered);
    assert_eq!(fd_flags(&p).unwrap() & O_DIRECT_OCTAL, 0);
}

#[test]
fn a_size_that_is_not_whole_blocks_is_buffered_under_auto() {
    let dir = disk_dir();
    let p = new_file(dir.path(), "odd.img", 1000);
    let e = DirectMember::open(&p, false).unwrap_err();
    assert_eq!(e.source.kind(), std::io::ErrorKind::Unsupported, "{e}");
    let o = open_member(&p, false, IoMode::Auto).unwrap();
    assert_eq!(o.mode, IoMode::Buffered);
    assert!(o.fallback.unwrap().contains("whole number"));
}

#[test]
fn create_in_each_mode() {
    let dir = disk_dir();
    for (i, io) in [IoMode::Auto, IoMode::Direct, IoMode::Buffered]
        .into_iter()
        .enumerate()
    {
        let p = dir.path().join(format!("new{i}.img"));
        let o = raidkit_member::create_member(&p, 1 << 20, io).unwrap();
        assert_eq!(o.member.len(), 1 << 20);
        let want = if io == IoMode::Buffered {
            IoMode::Buffered
        } else {
            IoMode::Direct
        };
        assert_eq!(o.mode, want, "{io}");
        o.member.write_at(b"x", 12345).unwrap();
        assert!(
            raidkit_member::create_member(&p, 10, io).is_err(),
            "must not clobber"
        );
        // The writer's lock is held in every mode.
        assert!(FileMember::in_use(&p).unwrap(), "{io}");
    }
    // A size direct I/O cannot address: refused, and the file removed again.
    let p = dir.path().join("odd.img");
    let e = raidkit_member::create_member(&p, 1000, IoMode::Direct).unwrap_err();
    assert!(e.to_string().contains("whole number"), "{e}");
    assert!(!p.exists(), "a file that cannot be direct is removed again");
}

#[test]
fn runs_asked_together_read_what_each_read_would() {
    // Several ranges of one member in one call: from aligned buffers they
    // go to the file in one io_uring submission; from unaligned ones (or
    // a single range) one after the other. Either way each is read whole.
    let dir = disk_dir();
    const LEN: u64 = 4 << 20;
    let p = new_file(dir.path(), "m.img", LEN);
    let m = DirectMember::open(&p, false).unwrap();
    let model: Vec<u8> = (0..LEN).map(|i| (i * 7 % 253) as u8).collect();
    m.write_at(&AlignedBuf::from_slice(&model), 0).unwrap();
    let ranges = [
        (3 << 20, 64 << 10),
        (0, 4096),
        (1 << 20, 192 << 10),
        (8192, 4096),
    ];
    let asked = raidkit_member::reads_asked_together();
    let mut bufs: Vec<AlignedBuf> = ranges.iter().map(|r| AlignedBuf::zeroed(r.1)).collect();
    let mut runs: Vec<(u64, &mut [u8])> = ranges
        .iter()
        .zip(bufs.iter_mut())
        .map(|(r, b)| (r.0, &mut b[..]))
        .collect();
    m.read_runs(&mut runs).unwrap();
    for (r, b) in ranges.iter().zip(&bufs) {
        let o = r.0 as usize;
        assert!(b[..] == model[o..o + r.1], "run at {o}");
    }
    // Where io_uring can be had (here: the kernels this project runs on;
    // not in sandboxes that forbid it, where they are read one by one).
    if raidkit_member::uring_available() {
        assert!(
            raidkit_member::reads_asked_together() >= asked + ranges.len() as u64,
            "aligned runs were not asked together"
        );
    }
    // Unaligned memory: read one after the other, as read_at would.
    let mut plain: Vec<Vec<u8>> = ranges.iter().map(|r| vec![0u8; r.1 + 1]).collect();
    let mut runs: Vec<(u64, &mut [u8])> = ranges
        .iter()
        .zip(plain.iter_mut())
        .map(|(r, b)| (r.0 + 1, &mut b[1..]))
        .collect();
    m.read_runs(&mut runs).unwrap();
    for (r, b) in ranges.iter().zip(&plain) {
        let o = r.0 as usize + 1;
        assert!(b[1..] == model[o..o + r.1], "unaligned run at {o}");
    }
    // A range past the end fails the call.
    let mut tail = AlignedBuf::zeroed(8192);
    let mut head = AlignedBuf::zeroed(4096);
    let mut runs: Vec<(u64, &mut [u8])> = vec![(0, &mut head[..]), (LEN - 4096, &mut tail[..])];
    assert!(m.read_runs(&mut runs).is_err());
}
