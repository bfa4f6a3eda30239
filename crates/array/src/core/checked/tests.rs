use super::*;
use raidkit_member::MemMember;

/// 64 MiB of data (16 checksum pages) after a checksum area at 1 MiB.
fn checked(cap: usize) -> (Arc<MemMember>, Checked) {
    let data_offset = 2 << 20;
    let blocks = (64 << 20) / BLOCK;
    let mem = Arc::new(MemMember::new("m", data_offset + (64 << 20)));
    let area = ChecksumArea {
        offset: 1 << 20,
        size: blocks * checksums::ENTRY,
    };
    let mut c = Checked::new(mem.clone(), data_offset, area, true);
    c.cap = cap;
    (mem, c)
}

fn block(seed: u64) -> Vec<u8> {
    (0..BLOCK).map(|i| (i * 7 + seed * 13) as u8).collect()
}

#[test]
fn pages_come_and_go_within_the_cache_and_no_checksum_is_lost() {
    let (mem, c) = checked(2);
    let at = |b: u64| c.data_offset + b * BLOCK;
    // One block in every 4 MiB: every page changed, none flushed.
    let blocks: Vec<u64> = (0..16).map(|p| p * PER_PAGE + p).collect();
    for &b in &blocks {
        c.write_at(&block(b), at(b)).unwrap();
    }
    // Changed pages are written back early rather than kept past the
    // cache (each load overshoots it, and the shrink after it brings
    // it back).
    assert!(
        c.loaded.load(Ordering::Relaxed) <= 2,
        "{} pages loaded",
        c.loaded.load(Ordering::Relaxed)
    );
    c.flush().unwrap();
    // Reading everything back loads and drops pages again: all agree.
    for &b in &blocks {
        let mut got = vec![0u8; BLOCK as usize];
        c.read_at(&mut got, at(b)).unwrap();
        assert_eq!(got, block(b));
    }
    assert_eq!(c.mismatches.load(Ordering::Relaxed), 0);
    // Rot in a block whose page was dropped is still caught: the
    // checksum came back from the member.
    let victim = blocks[3];
    let mut raw = block(victim);
    raw[100] ^= 0x10;
    mem.write_at(&raw, at(victim)).unwrap();
    for &b in blocks.iter().rev() {
        let mut got = vec![0u8; BLOCK as usize];
        let r = c.read_at(&mut got, at(b));
        if b == victim {
            assert!(r.as_ref().is_err_and(is_mismatch), "{r:?}");
        } else {
            r.unwrap();
        }
    }
    // And a fresh open of the member (nothing cached) agrees with
    // every block written.
    let (_, again) = {
        let mut c2 = Checked::new(mem.clone(), c.data_offset, c.area, true);
        c2.cap = 2;
        ((), c2)
    };
    for &b in &blocks {
        let mut got = vec![0u8; BLOCK as usize];
        let r = again.read_at(&mut got, at(b));
        assert_eq!(r.is_err(), b == victim, "block {b}: {r:?}");
    }
}

#[test]
fn blocks_written_in_place_read_as_anything_meanwhile_and_get_their_checksums_after() {
    let (mem, c) = checked(4);
    let at = |b: u64| c.data_offset + b * BLOCK;
    for b in 0..4 {
        c.write_at(&block(b), at(b)).unwrap();
    }
    let read = |b: u64| {
        let mut got = vec![0u8; BLOCK as usize];
        c.read_at(&mut got, at(b)).map(|()| got)
    };
    // Not whole blocks of the data area: not offered.
    assert!(c.in_place(at(0) + 512, BLOCK).unwrap().is_none());
    assert!(c.in_place(at(0), 100).unwrap().is_none());
    assert!(c
        .in_place(c.data_offset - BLOCK, 2 * BLOCK)
        .unwrap()
        .is_none());

    // Blocks 1 and 2 written behind the checks while held: a read that
    // races the write takes what it finds, and no mismatch counts.
    let g = c.in_place(at(1), 2 * BLOCK).unwrap().unwrap();
    mem.write_at(&block(11), at(1)).unwrap();
    assert_eq!(read(1).unwrap(), block(11));
    assert_eq!(read(2).unwrap(), block(2));
    drop(g);
    assert_eq!(read(1).unwrap(), block(11));
    assert_eq!(c.mismatches.load(Ordering::Relaxed), 0);
    // The checksum recorded is the new data's: rot in it is caught.
    let mut raw = block(11);
    raw[7] ^= 1;
    mem.write_at(&raw, at(1)).unwrap();
    assert!(read(1).is_err_and(|e| is_mismatch(&e)));

    // Nothing written: the old checksums stay, so rot that was there
    // is not sealed.
    let mut raw = block(3);
    raw[9] ^= 4;
    mem.write_at(&raw, at(3)).unwrap();
    let mut g = c.in_place(at(3), BLOCK).unwrap().unwrap();
    g.nothing_written();
    drop(g);
    assert!(read(3).is_err_and(|e| is_mismatch(&e)));
    // Once the guard is gone, a read no longer takes anything.
    let mut raw = block(2);
    raw[0] ^= 2;
    mem.write_at(&raw, at(2)).unwrap();
    assert!(read(2).is_err_and(|e| is_mismatch(&e)));
}

#[test]
fn checksums_taken_as_a_write_lands_are_the_ones_recorded_and_the_rest_are_read_back() {
    use raidkit_member::{FileMember, Landed};
    let dir = tempfile::tempdir().unwrap();
    let data_offset = 2 << 20;
    let path = dir.path().join("m");
    let file = Arc::new(FileMember::create(&path, data_offset + (8 << 20)).unwrap());
    let area = ChecksumArea {
        offset: 1 << 20,
        size: (8 << 20) / BLOCK * checksums::ENTRY,
    };
    let c = Checked::new(file.clone(), data_offset, area, true);
    let at = |b: u64| data_offset + b * BLOCK;
    let read = |b: u64| {
        let mut got = vec![0u8; BLOCK as usize];
        c.read_at(&mut got, at(b)).map(|()| got)
    };
    let mapper = file.as_mapper().expect("a plain file maps");
    let landed_at = |b: u64, skip: usize, len: usize| {
        let mut ranges = Vec::new();
        let off = at(b) + skip as u64;
        assert!(
            mapper.cached(off, len as u64, &mut ranges).unwrap(),
            "{off}"
        );
        c.landed(off, &ranges[0]);
    };
    // Blocks 0-3 held in place and written behind the checks; the
    // write tells what landed, from a part of block 0 (not counted) to
    // the end of block 2, then changes blocks 1 and 3 afterwards, which
    // a write in place never does: the sums taken as 1 landed are
    // recorded (1 now disagrees), 3 had none taken and is read back
    // (agrees), 0 and 2 agree either way.
    let g = c.in_place(at(0), 4 * BLOCK).unwrap().unwrap();
    for b in 0..4 {
        file.write_at(&block(b), at(b)).unwrap();
    }
    landed_at(0, 100, 3 * BLOCK as usize - 100);
    file.write_at(&block(21), at(1)).unwrap();
    file.write_at(&block(23), at(3)).unwrap();
    drop(g);
    assert_eq!(read(0).unwrap(), block(0));
    assert!(read(1).is_err_and(|e| is_mismatch(&e)));
    assert_eq!(read(2).unwrap(), block(2));
    assert_eq!(read(3).unwrap(), block(23));
    // Sums told of blocks no write holds are not kept for a later
    // write of them: that one's own data is read back.
    landed_at(0, 0, 4 * BLOCK as usize);
    let g = c.in_place(at(0), 4 * BLOCK).unwrap().unwrap();
    file.write_at(&block(30), at(0)).unwrap();
    drop(g);
    assert_eq!(read(0).unwrap(), block(30));
    // Nothing written: the landed sums are dropped with the rest.
    let mut g = c.in_place(at(2), BLOCK).unwrap().unwrap();
    file.write_at(&block(40), at(2)).unwrap();
    landed_at(2, 0, BLOCK as usize);
    g.nothing_written();
    drop(g);
    assert!(read(2).is_err_and(|e| is_mismatch(&e)));
    assert_eq!(
        c.pages
            .iter()
            .map(|p| p.locked().landed.len())
            .sum::<usize>(),
        0
    );
}

#[test]
fn writes_of_one_block_at_once_wait_for_each_other_and_all_finish() {
    // Each write of the block waits for the one in flight; a write that
    // ends must wake those waiting (it wakes only when some are), or they
    // wait for ever.
    let (_, c) = checked(4);
    let c = Arc::new(c);
    let (tx, rx) = std::sync::mpsc::channel();
    for t in 0..4u64 {
        let (c, tx) = (c.clone(), tx.clone());
        std::thread::spawn(move || {
            for i in 0..2000 {
                c.write_at(&block(t * 10_000 + i), c.data_offset).unwrap();
            }
            tx.send(t).unwrap();
        });
    }
    for _ in 0..4 {
        rx.recv_timeout(std::time::Duration::from_secs(60))
            .expect("a write of the block waited for ever");
    }
    let mut got = vec![0u8; BLOCK as usize];
    c.read_at(&mut got, c.data_offset).unwrap();
    assert!((0..4).any(|t| got == block(t * 10_000 + 1999)));
}

#[test]
fn one_rotten_extent_is_one_incident_and_rot_in_ten_places_is_ten() {
    let (mem, c) = checked(16);
    let at = |b: u64| c.data_offset + b * BLOCK;
    for b in 0..(64 << 20) / BLOCK {
        c.write_at(&block(b), at(b)).unwrap();
    }
    c.flush().unwrap();
    let rot = |b: u64| {
        let mut raw = block(b);
        raw[7] ^= 0x40;
        mem.write_at(&raw, at(b)).unwrap();
    };
    let read = |b: u64| {
        let mut got = vec![0u8; BLOCK as usize];
        c.read_at(&mut got, at(b))
    };
    // A 64 KiB extent read whole, another read 4 KiB at a time: 16
    // blocks counted each, one place each.
    for b in 0..16 {
        rot(100 + b);
    }
    let mut whole = vec![0u8; 16 * BLOCK as usize];
    assert!(c
        .read_at(&mut whole, at(100))
        .is_err_and(|e| is_mismatch(&e)));
    for b in 0..16 {
        rot(13000 + b);
        assert!(read(13000 + b).is_err_and(|e| is_mismatch(&e)));
    }
    assert_eq!(c.mismatches.load(Ordering::Relaxed), 32);
    assert!(!c.past_limit());
    // Blocks 4 MiB apart: each a place of its own; ten places in all.
    // (The member's data area is 64 MiB.)
    for k in 1..8 {
        let b = k * 1024 + 7;
        rot(b);
        assert!(read(b).is_err_and(|e| is_mismatch(&e)));
        assert!(!c.past_limit(), "{k}");
    }
    rot(9000);
    assert!(read(9000).is_err_and(|e| is_mismatch(&e)));
    assert!(c.past_limit());
}
