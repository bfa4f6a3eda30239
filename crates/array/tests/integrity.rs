//! Silent corruption at every level: bits flipped straight into member
//! files (data and parity, random members and offsets) and through the
//! corrupting fault member. Every byte read back must be right, the
//! members' checksum counters must count the bad blocks, a scrub must find
//! and repair every remaining one (a second finds none), and damage beyond
//! redundancy must fail the read (naming the range), never return wrong
//! data.

use raidkit_array::assemble::assemble;
use raidkit_array::create::{CreateOptions, Policy};
use raidkit_array::{Array, OpenOptions};
use raidkit_layout::Level;
use raidkit_member::Member;
use raidkit_open::spec::{self, Spec};
use rand::{Rng, SeedableRng};
use std::os::unix::fs::FileExt;
use std::path::Path;

const CHUNK: u64 = 16 << 10;
const MEMBER: u64 = 3 << 20;

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap())
}

fn make(dir: &Path, level: Level, n: usize) -> Vec<String> {
    make_sized(dir, level, n, MEMBER)
}

fn make_sized(dir: &Path, level: Level, n: usize, member: u64) -> Vec<String> {
    let members: Vec<String> = (0..n)
        .map(|i| dir.join(format!("m{i}.img")).display().to_string())
        .collect();
    let opts = CreateOptions {
        level,
        layout: level.default_layout(),
        chunk: CHUNK,
        size: Some(member),
        name: "i".into(),
        force: false,
        assume_clean: false,
        background_sync: false,
        bitmap_region: if level.has_redundancy() { 64 << 10 } else { 0 },
        policy: if level.is_parity() {
            Policy::Journal
        } else if level.has_redundancy() {
            Policy::Bitmap
        } else {
            Policy::None
        },
        spares: Vec::new(),
        checksums: true,
        md: false,
        data_offset: None,
        domains: Vec::new(),
    };
    let specs: Vec<Spec> = members.iter().map(|m| Spec::File(m.clone())).collect();
    raidkit_open::create(&specs, &[], &opts, |_, _| {}).unwrap();
    members
}

fn open(specs: &[String]) -> Array {
    let parsed: Vec<Spec> = specs.iter().map(|s| Spec::parse(s).unwrap()).collect();
    let asm = assemble(spec::open_all(&parsed, false).unwrap()).unwrap();
    Array::open_with(asm, "i", OpenOptions::default()).unwrap()
}

fn data_offset(path: &str) -> u64 {
    let m = raidkit_member::FileMember::open(path, true).unwrap();
    raidkit_array::superblock::read_superblock(&m)
        .unwrap()
        .sb
        .data_offset
}

/// Flip one byte of a member file's data area.
fn flip(path: &str, dev: u64) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let at = data_offset(path) + dev;
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).unwrap();
    b[0] ^= 0x10;
    f.write_all_at(&b, at).unwrap();
}

/// A new array of `level` on `n` members in a directory of its own, every
/// byte written and the array closed: the directory, the members and the
/// bytes.
fn written_and_closed(level: Level, n: usize) -> (tempfile::TempDir, Vec<String>, Vec<u8>) {
    let dir = tmp();
    let members = make(dir.path(), level, n);
    let a = open(&members);
    let data: Vec<u8> = (0..a.capacity()).map(|i| (i % 251) as u8).collect();
    a.write(&data, 0).unwrap();
    a.close().unwrap();
    (dir, members, data)
}

fn checksum_errors(a: &Array) -> u64 {
    a.members_status()
        .iter()
        .filter_map(|m| m.errors)
        .map(|e| e.checksum)
        .sum()
}

/// A scrub run to its end here (the server's worker runs it in the background).
fn scrub(a: &Array, check_only: bool) -> raidkit_array::LastScrub {
    a.start_scrub(check_only).unwrap();
    a.recover_all().unwrap();
    a.last_scrub().expect("a scrub ran")
}

fn levels() -> Vec<(Level, usize)> {
    vec![
        (Level::Raid1, 2),
        (Level::Raid10, 4),
        (Level::Raid4, 4),
        (Level::Raid5, 4),
        (Level::Raid6, 5),
    ]
}

#[test]
fn flipped_bits_are_healed_at_every_redundant_level_and_scrubbed_away() {
    for (level, n) in levels() {
        let dir = tmp();
        let members = make(dir.path(), level, n);
        let a = open(&members);
        let cap = a.capacity();
        let mut rng = rand::rngs::StdRng::seed_from_u64(level as u64 * 7 + n as u64);
        let data: Vec<u8> = (0..cap).map(|_| rng.gen()).collect();
        a.write(&data, 0).unwrap();
        a.close().unwrap();
        drop(a);
        // One flipped byte in each of many blocks: at most one bad block
        // per block row (as much as every level survives), at random
        // offsets, in data and in parity alike, three on every member
        // (below the 10 that fail a member).
        let data_size = MEMBER - data_offset(&members[0]);
        let blocks = data_size / 4096;
        let mut flipped = std::collections::BTreeSet::new();
        while flipped.len() < 3 * n {
            let row = rng.gen_range(0..blocks);
            if flipped.iter().any(|&(r, _)| r == row) {
                continue;
            }
            let m = flipped.len() % n;
            flip(&members[m], row * 4096 + rng.gen_range(0..4096));
            flipped.insert((row, m));
        }
        // Half of them read by a client: right data, counted.
        let a = open(&members);
        let half = cap / 2;
        let mut got = vec![0u8; half as usize];
        a.read(&mut got, 0).unwrap();
        assert!(got == data[..half as usize], "{level}: wrong data read");
        let counted = checksum_errors(&a);
        assert!(counted > 0, "{level}: no checksum error counted");
        // The scrub finds the rest (and none it already healed) and
        // repairs them; a second finds nothing.
        let first = scrub(&a, false);
        assert_eq!(first.result, "done", "{level}");
        assert_eq!(first.unrepaired, 0, "{level}: {:?}", first.mismatches);
        assert!(
            first.repaired > 0,
            "{level}: the scrub repaired nothing of {} flips ({counted} healed by reads)",
            flipped.len()
        );
        assert!(
            counted + first.repaired >= flipped.len() as u64 / 2,
            "{level}: {} flipped, {counted} healed, {} scrubbed",
            flipped.len(),
            first.repaired
        );
        for f in &first.mismatches {
            assert!(members.contains(&f.member), "{level}: {f:?}");
            assert_eq!(f.action, "repaired", "{level}: {f:?}");
        }
        let second = scrub(&a, false);
        assert!(
            second.mismatches.is_empty(),
            "{level}: second scrub found {:?}",
            second.mismatches
        );
        let mut all = vec![0u8; cap as usize];
        a.read(&mut all, 0).unwrap();
        assert!(all == data, "{level}: wrong data after the scrub");
        assert_eq!(a.count_mismatches().unwrap(), 0, "{level}: redundancy");
        a.close().unwrap();
    }
}

/// Every copy of a chunk rotten, each in a block of its own: a mirror
/// still holds every block right somewhere, so a read of the whole chunk
/// is served block by block from the copies, and both are healed.
#[test]
fn rot_in_every_copy_of_a_chunk_in_different_blocks_is_healed() {
    for (level, n) in [(Level::Raid1, 2), (Level::Raid10, 4)] {
        let (_dir, members, data) = written_and_closed(level, n);
        // Chunk 0's copies: RAID-1 on every member, RAID-10 (near 2) on
        // members 0 and 1, at the same device offset.
        flip(&members[0], 4096 + 100);
        flip(&members[1], 2 * 4096 + 100);
        let a = open(&members);
        let mut whole = vec![0u8; a.capacity() as usize];
        a.read(&mut whole, 0)
            .unwrap_or_else(|e| panic!("{level}: {e}"));
        assert!(whole == data, "{level}: wrong data");
        assert_eq!(checksum_errors(&a), 2, "{level}");
        let s = scrub(&a, true);
        assert_eq!(s.mismatches.len(), 0, "{level}: left unrepaired: {s:?}");
        assert_eq!(checksum_errors(&a), 2, "{level}: counted again");
    }
}

/// A member rotting at many places is failed when a scrub finds them, as
/// when clients' reads do (10 places within 10 minutes), not healed block
/// after block; the array serves on without it, every byte right.
#[test]
fn a_scrub_fails_a_member_that_rots_at_many_places() {
    for check_only in [true, false] {
        let dir = tmp();
        let members = make_sized(dir.path(), Level::Raid5, 4, 32 << 20);
        let a = open(&members);
        let data: Vec<u8> = (0..a.capacity()).map(|i| (i % 253) as u8).collect();
        a.write(&data, 0).unwrap();
        a.close().unwrap();
        drop(a);
        // Twelve places, 2 MiB apart (places closer than 1 MiB are one).
        for i in 0..12u64 {
            flip(&members[1], i * (2 << 20) + 100);
        }
        let a = open(&members);
        let s = scrub(&a, check_only);
        let st = a.members_status();
        let m1 = st
            .iter()
            .find(|m| m.path.as_deref() == Some(members[1].as_str()))
            .expect("member 1 listed");
        assert_eq!(m1.state, "faulty", "check only {check_only}: {s:?} {st:?}");
        assert_ne!(s.result, "done", "the scrub went on over a failed member");
        let mut whole = vec![0u8; a.capacity() as usize];
        a.read(&mut whole, 0).unwrap();
        assert!(whole == data, "wrong data after the member failed");
    }
}

/// Two members of a RAID-5 rotting at twelve places each, read by two
/// clients in step: both pass their checksum limit at the same moment.
/// Failing one leaves the array without redundancy, so the other must stay
/// (its good blocks are better than none): never both, which would fail
/// the array.
#[test]
fn two_members_past_their_checksum_limit_at_once_fail_one_only() {
    let dir = tmp();
    let members = make_sized(dir.path(), Level::Raid5, 4, 32 << 20);
    let a = open(&members);
    let data: Vec<u8> = (0..a.capacity()).map(|i| (i % 253) as u8).collect();
    a.write(&data, 0).unwrap();
    let g = raidkit_layout::Geometry::new(
        Level::Raid5,
        Level::Raid5.default_layout(),
        CHUNK,
        vec![a.capacity() / 3; 4],
    )
    .unwrap();
    a.close().unwrap();
    drop(a);
    // Member 1's places 2 MiB apart, member 2's 1 MiB after each: every
    // place an incident of its own, each in a stripe of its own.
    let places = |m: usize, first: u64| -> Vec<u64> {
        (0..12u64)
            .map(|i| {
                let mut row = (first + i * (2 << 20)) / CHUNK;
                while g.stripe_map(row).p == m {
                    row += 1;
                }
                flip(&members[m], row * CHUNK + 100);
                let d = g.stripe_map(row).data.iter().position(|&x| x == m).unwrap();
                (row * 3 + d as u64) * CHUNK
            })
            .collect()
    };
    let rot = [places(1, 0), places(2, 1 << 20)];
    let a = open(&members);
    let step = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        for at in &rot {
            let (a, step, data) = (&a, &step, &data);
            s.spawn(move || {
                for &off in at {
                    step.wait();
                    let mut buf = vec![0u8; 4096];
                    // Once one member is failed, the other's rot is beyond
                    // the level: an error then, never wrong data.
                    if a.read(&mut buf, off).is_ok() {
                        assert!(buf == data[off as usize..off as usize + 4096], "at {off}");
                    }
                }
            });
        }
    });
    let faulty: Vec<_> = a
        .members_status()
        .into_iter()
        .filter(|m| m.state == "faulty")
        .filter_map(|m| m.path)
        .collect();
    assert_eq!(faulty.len(), 1, "{faulty:?}");
    assert_eq!(a.health(), raidkit_array::Health::Degraded);
}

/// A RAID-5 rebuild that found a source block rotten could not make that
/// block of the new member: it is marked lost. The rest of its stripe is
/// still whole, column by column: a scrub must repair rot there (parity
/// in one column, data in another) and leave only the lost column as it
/// is, never reading or rebuilding over the lost block.
#[test]
fn a_scrub_repairs_the_rest_of_a_stripe_holding_a_lost_block() {
    let dir = tmp();
    let members = make(dir.path(), Level::Raid5, 4);
    let a = open(&members);
    let data: Vec<u8> = (0..a.capacity()).map(|i| (i % 251) as u8).collect();
    a.write(&data, 0).unwrap();
    let g = (*a.geometry()).clone();
    a.close().unwrap();
    drop(a);
    // A stripe with data on members 1 and 2; member 1 rots in column 0.
    let u = (2..)
        .find(|&u| {
            let sm = g.stripe_map(u);
            sm.data.contains(&1) && sm.data.contains(&2)
        })
        .unwrap();
    let sm = g.stripe_map(u);
    let dev = u * CHUNK;
    flip(&members[1], dev + 100);
    // Member 2 replaced by a blank disk and rebuilt: its column 0 is lost.
    let a = open(&members);
    a.fail_member(&members[2], false).unwrap();
    a.remove_member(&members[2]).unwrap();
    let fresh = dir.path().join("new.img").display().to_string();
    std::fs::File::create(&fresh)
        .unwrap()
        .set_len(MEMBER)
        .unwrap();
    raidkit_open::add_member(&a, &fresh, false).unwrap();
    a.recover_all().unwrap();
    a.close().unwrap();
    drop(a);
    let now = [&members[0], &members[1], &fresh, &members[3]].map(|m| m.to_string());
    // Then parity rots in column 1, and the third data member in column 2.
    let third = *sm.data.iter().find(|&&r| r != 1 && r != 2).unwrap();
    flip(&now[sm.p], dev + 4096 + 100);
    flip(&now[third], dev + 8192 + 100);
    let a = open(&now);
    let s = scrub(&a, false);
    let at = |role: usize, col: u64| {
        s.mismatches
            .iter()
            .find(|f| f.role == role && f.member_offset == data_offset(&now[role]) + dev + col)
            .map(|f| f.action)
    };
    assert_eq!(at(sm.p, 4096), Some("repaired"), "parity: {s:?}");
    assert_eq!(at(third, 8192), Some("repaired"), "data: {s:?}");
    assert_eq!(at(1, 0), Some("unrepaired"), "beside the lost block: {s:?}");
    assert_eq!(at(2, 0), Some("unrepaired"), "the lost block: {s:?}");
    // Only the lost column is left, the lost block named as such;
    // everything else reads right.
    let again = scrub(&a, true);
    let kinds: Vec<_> = again.mismatches.iter().map(|f| (f.role, f.kind)).collect();
    assert_eq!(kinds, [(1, "checksum"), (2, "lost")], "{again:?}");
    for (i, want) in data.chunks(4096).enumerate() {
        let mut buf = vec![0u8; 4096];
        let off = i as u64 * 4096;
        match a.read(&mut buf, off) {
            Ok(()) => assert!(buf == want, "block {i} read wrong data"),
            Err(e) => {
                // The lost column: member 1's and member 2's blocks.
                let col0 = [1usize, 2].map(|r| {
                    let dd = sm.data.iter().position(|&x| x == r).unwrap();
                    g.stripe_data_offset(u, dd)
                });
                assert!(col0.contains(&off), "block {i}: {e}");
            }
        }
    }
}

/// More rotten blocks in one stripe than the level has parity, but each
/// in a column of its own (the same offset on every member): every column
/// is short of one block only, so a read of the whole stripe is served
/// right, block by block, and the blocks are put back.
#[test]
fn rot_on_more_members_than_parity_in_separate_columns_is_healed() {
    for (level, n) in levels().into_iter().filter(|(l, _)| l.is_parity()) {
        let (_dir, members, data) = written_and_closed(level, n);
        let lose = level.parity_count() + 1;
        for (i, m) in members[..lose].iter().enumerate() {
            flip(m, CHUNK + i as u64 * 4096 + 100);
        }
        let a = open(&members);
        let mut whole = vec![0u8; a.capacity() as usize];
        a.read(&mut whole, 0)
            .unwrap_or_else(|e| panic!("{level}: {e}"));
        assert!(whole == data, "{level}: wrong data");
        assert_eq!(checksum_errors(&a), lose as u64, "{level}");
        let s = scrub(&a, true);
        assert_eq!(s.mismatches.len(), 0, "{level}: left unrepaired: {s:?}");
    }
}

#[test]
fn damage_beyond_redundancy_fails_the_read_and_never_returns_wrong_data() {
    for (level, n) in levels().into_iter().chain([(Level::Raid0, 3)]) {
        let (_dir, members, data) = written_and_closed(level, n);
        // The same block row on more members than the level can lose
        // (every member of it for mirrors: all copies).
        let lose = match level {
            Level::Raid0 => 1,
            Level::Raid10 => 2,
            Level::Raid1 => 2,
            l => l.parity_count() + 1,
        };
        let row = 5 * 4096 + 100;
        for m in &members[..lose] {
            flip(m, row);
        }
        let a = open(&members);
        let mut whole = vec![0u8; a.capacity() as usize];
        let mut failed = 0;
        for (i, want) in data.chunks(4096).enumerate() {
            let buf = &mut whole[i * 4096..(i + 1) * 4096];
            match a.read(buf, i as u64 * 4096) {
                Ok(()) => assert!(buf == want, "{level}: block {i} read wrong data"),
                Err(e) => {
                    failed += 1;
                    assert!(
                        matches!(
                            e,
                            raidkit_array::Error::Unavailable { .. }
                                | raidkit_array::Error::Member(_)
                        ),
                        "{level}: {e}"
                    );
                }
            }
        }
        assert!(failed > 0, "{level}: nothing failed with {lose} copies bad");
        let s = scrub(&a, false);
        assert!(s.unrepaired > 0, "{level}: scrub says all repaired: {s:?}");
    }
}

#[test]
fn the_corrupting_fault_member_is_caught_and_check_only_scrubs_repair_nothing() {
    let dir = tmp();
    let members = make(dir.path(), Level::Raid5, 4);
    let a = open(&members);
    let data: Vec<u8> = (0..a.capacity()).map(|i| (i * 13 % 256) as u8).collect();
    a.write(&data, 0).unwrap();
    a.close().unwrap();
    drop(a);
    let off = data_offset(&members[2]) + 9 * 4096 + 7;
    let mut specs = members.clone();
    specs[2] = format!("fault:{}?corrupt-at={off}", members[2]);
    let a = open(&specs);
    let report = scrub(&a, true);
    assert_eq!(report.repaired, 0);
    assert_eq!(report.mismatches.len(), 1, "{:?}", report.mismatches);
    let f = &report.mismatches[0];
    assert_eq!(
        (f.role, f.member_offset, f.kind, f.action),
        (2, off - 7, "checksum", "reported")
    );
    // Still there for a client read, which heals it.
    let mut got = vec![0u8; data.len()];
    a.read(&mut got, 0).unwrap();
    assert!(got == data);
    assert!(checksum_errors(&a) >= 1);
    assert!(scrub(&a, false).mismatches.is_empty(), "the read healed it");
}

/// Scrubs while clients write everywhere (each writer thread owns every
/// other 4 KiB slot, so the expected contents are known; writes span
/// slots, blocks and stripes, aligned or not). The scrub reads members
/// ahead of the unit it checks: those reads must see what the writes
/// left, never a block half written or a checksum ahead of its data, so a
/// scrub finds nothing, repairs nothing, and every byte reads back.
#[test]
fn scrubs_under_client_writes_find_nothing_and_lose_nothing() {
    let mut all = levels();
    all.push((Level::Raid0, 3));
    for (level, n) in all {
        let dir = tmp();
        let members = make(dir.path(), level, n);
        let a = open(&members);
        let cap = a.capacity();
        const SLOT: u64 = 4096;
        let model = std::sync::Mutex::new(vec![0u8; cap as usize]);
        a.write(&vec![0u8; cap as usize], 0).unwrap();
        let done = std::sync::atomic::AtomicBool::new(false);
        let scrubs = std::thread::scope(|sc| {
            for t in 0..2u64 {
                let (a, model, done) = (&a, &model, &done);
                sc.spawn(move || {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(t * 31 + level as u64);
                    while !done.load(std::sync::atomic::Ordering::Relaxed) {
                        // A slot of this writer's, a piece of it at any
                        // byte offset (so also parts of blocks).
                        let slot = rng.gen_range(0..cap / SLOT / 2) * 2 + t;
                        let lo = rng.gen_range(0..SLOT - 1);
                        let len = rng.gen_range(1..=SLOT - lo);
                        let off = slot * SLOT + lo;
                        let buf: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                        a.write(&buf, off).unwrap();
                        model.lock().unwrap()[off as usize..(off + len) as usize]
                            .copy_from_slice(&buf);
                    }
                });
            }
            let runs: Vec<_> = (0..3).map(|_| scrub(&a, false)).collect();
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            runs
        });
        for s in &scrubs {
            assert_eq!(s.result, "done", "{level:?}: {s:?}");
            assert!(
                s.mismatches.is_empty() && s.repaired == 0 && s.unrepaired == 0,
                "{level:?}: a scrub under writes found what is not there: {s:?}"
            );
        }
        assert_eq!(checksum_errors(&a), 0, "{level:?}");
        let mut back = vec![0u8; cap as usize];
        a.read(&mut back, 0).unwrap();
        assert!(
            back == *model.lock().unwrap(),
            "{level:?}: data changed under scrubs"
        );
        a.close().unwrap();
    }
}

/// A journal an earlier `raidkit policy journal` laid up to the data, over
/// the first bytes of the checksum area: every record overwrote checksums
/// and the blocks they covered read as rot. Such an array is refused
/// (nothing written) until `set_policy` moves the journal below the
/// checksums and clears the entries it overwrote; then every byte reads
/// back and a scrub finds it all consistent.
#[test]
fn a_journal_laid_over_the_checksums_is_refused_then_moved_off_them() {
    let (_dir, members, data) = written_and_closed(Level::Raid5, 4);
    for m in &members {
        let f = raidkit_member::FileMember::open(m, false).unwrap();
        let mut sb = raidkit_array::superblock::read_superblock(&f).unwrap().sb;
        assert!(sb.journal.offset + sb.journal.size <= sb.checksums.offset);
        sb.journal.size = sb.data_offset - sb.journal.offset;
        raidkit_array::superblock::write_superblock(&f, &mut sb).unwrap();
        // What records left there.
        let (at, len) = raidkit_array::policy::journal_over_checksums(&sb).unwrap();
        f.write_at(&vec![0xab; len as usize], at).unwrap();
        f.flush().unwrap();
    }
    let before: Vec<Vec<u8>> = members.iter().map(|m| std::fs::read(m).unwrap()).collect();
    let parsed: Vec<Spec> = members.iter().map(|s| Spec::parse(s).unwrap()).collect();
    let asm = assemble(spec::open_all(&parsed, false).unwrap()).unwrap();
    let err = match Array::open_with(asm, "i", OpenOptions::default()) {
        Ok(_) => panic!("an array whose journal overlaps its checksums was opened"),
        Err(e) => e,
    };
    assert!(
        err.to_string().contains("overlaps the checksum area"),
        "{err}"
    );
    for (m, b) in members.iter().zip(&before) {
        assert!(
            std::fs::read(m).unwrap() == *b,
            "{m}: written by a refused open"
        );
    }
    let asm = assemble(spec::open_all(&parsed, false).unwrap()).unwrap();
    let c = raidkit_array::policy::set_policy(&asm, Policy::Journal, None).unwrap();
    assert_eq!(c.members, 4);
    assert!(c.cleared_checksums > 0);
    drop(asm);
    for m in &members {
        let f = raidkit_member::FileMember::open(m, true).unwrap();
        let sb = raidkit_array::superblock::read_superblock(&f).unwrap().sb;
        assert_eq!(raidkit_array::policy::journal_over_checksums(&sb), None);
    }
    let a = open(&members);
    let mut back = vec![0u8; data.len()];
    a.read(&mut back, 0).unwrap();
    assert!(back == data, "data changed");
    let s = scrub(&a, false);
    assert_eq!((s.result.as_str(), s.unrepaired), ("done", 0), "{s:?}");
    assert_eq!(checksum_errors(&a), 0);
    a.close().unwrap();
}

/// `scrub --stop` ends a throttled scrub at once, not after its rest
/// (which at a low limit lasts minutes: the scrub stayed in the status,
/// and a new one was refused, meanwhile).
#[test]
fn a_throttled_scrub_stops_at_once_when_told() {
    let (_dir, members, _data) = written_and_closed(Level::Raid5, 4);
    let a = open(&members);
    // Each chunk (16 KiB) scrubbed owes 16 s of rest.
    a.set_rebuild_speed(Some(1 << 10), Some(1 << 10));
    a.start_scrub(true).unwrap();
    std::thread::scope(|s| {
        let run = s.spawn(|| a.recover_all());
        let t0 = std::time::Instant::now();
        while a.recovery_status().is_none_or(|r| r.bytes_done == 0) {
            assert!(t0.elapsed().as_secs() < 60, "the scrub made no step");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(a.stop_scrub().unwrap());
        let t = std::time::Instant::now();
        run.join().unwrap().unwrap();
        let waited = t.elapsed();
        assert!(
            waited < std::time::Duration::from_secs(4),
            "the scrub went on for {waited:?} after it was told to stop"
        );
    });
    assert_eq!(a.last_scrub().expect("a scrub ran").result, "stopped");
    // A new scrub may start now.
    a.start_scrub(true).unwrap();
    assert!(a.stop_scrub().unwrap());
    a.close().unwrap();
}
