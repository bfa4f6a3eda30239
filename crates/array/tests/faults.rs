//! Member faults through the library: failing, spares, rebuild, re-add by
//! bitmap, read errors cured or failed, members that vanish, and starting a
//! failed array by force. Data is checked against a model after each step,
//! and redundancy against the slow reference code.

use raidkit_array::assemble::assemble;
use raidkit_array::create::CreateOptions;
use raidkit_array::{Added, Array, Health, OpenOptions};
use raidkit_layout::Level;
use raidkit_open::spec::{self, Spec};
use rand::{Rng, SeedableRng};
use std::path::Path;

const CHUNK: u64 = 16 << 10;
const MEMBER: u64 = (2 << 20) + 64 * CHUNK;
const REGION: u64 = 64 << 10;

fn tmp() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

fn path(dir: &Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

fn make(dir: &Path, level: Level, n: usize, spares: usize) -> Vec<String> {
    let members: Vec<String> = (0..n).map(|i| path(dir, &format!("m{i}.img"))).collect();
    let opts = CreateOptions {
        level,
        layout: level.default_layout(),
        chunk: CHUNK,
        size: Some(MEMBER),
        name: "f".into(),
        force: false,
        assume_clean: false,
        background_sync: false,
        bitmap_region: REGION,
        policy: raidkit_array::create::Policy::Bitmap,
        spares: Vec::new(),
        checksums: false,
        md: false,
        data_offset: None,
        domains: Vec::new(),
    };
    let spares: Vec<Spec> = (0..spares)
        .map(|i| Spec::File(path(dir, &format!("s{i}.img"))))
        .collect();
    let specs: Vec<Spec> = members.iter().map(|m| Spec::File(m.clone())).collect();
    raidkit_open::create(&specs, &spares, &opts, |_, _| {}).unwrap();
    members
}

fn open(specs: &[String]) -> Array {
    try_open(specs, false).unwrap()
}

fn try_open(specs: &[String], force: bool) -> raidkit_array::Result<Array> {
    let parsed: Vec<Spec> = specs.iter().map(|s| Spec::parse(s).unwrap()).collect();
    let mut asm = assemble(spec::open_all(&parsed, false)?)?;
    if force {
        asm.force();
    }
    Array::open_with(
        asm,
        "f",
        OpenOptions {
            readd_stale: true,
            force,
            // The tests start without members on purpose.
            run: true,
            ..OpenOptions::default()
        },
    )
}

fn fill(a: &Array, model: &mut Vec<u8>, seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    model.resize(a.capacity() as usize, 0);
    rng.fill(&mut model[..]);
    a.write(model, 0).unwrap();
}

fn scribble(a: &Array, model: &mut [u8], seed: u64, count: usize, span: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for _ in 0..count {
        let len = rng.gen_range(1..=3 * CHUNK);
        let off = rng.gen_range(0..=span.min(model.len() as u64) - len);
        let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        a.write(&data, off).unwrap();
        model[off as usize..(off + len) as usize].copy_from_slice(&data);
    }
}

fn check(a: &Array, model: &[u8]) {
    let mut buf = vec![0u8; model.len()];
    a.read(&mut buf, 0).unwrap();
    assert!(buf == model, "array data differs from the model");
}

fn a_geometry(members: &[String]) -> raidkit_layout::Geometry {
    let a = open(members);
    let g = (*a.geometry()).clone();
    done(a);
    g
}

/// Stop an array and let go of its members.
fn done(a: Array) {
    a.close().unwrap();
}

fn state(a: &Array, role: usize) -> &'static str {
    a.members_status()
        .into_iter()
        .find(|m| m.role == Some(role) && m.state != "faulty")
        .map(|m| m.state)
        .unwrap_or("none")
}

/// The array is whole, its redundancy agrees and it holds `model`; and so
/// once closed and opened again from `now`, its members after the rebuild.
fn whole_and_again_from(a: Array, model: &[u8], now: &[String]) {
    assert_eq!(a.health(), Health::Optimal);
    assert_eq!(a.count_mismatches().unwrap(), 0);
    check(&a, model);
    done(a);
    let b = open(now);
    assert_eq!(b.health(), Health::Optimal);
    check(&b, model);
    assert_eq!(b.count_mismatches().unwrap(), 0);
    done(b);
}

/// A new member still rebuilding holds no redundancy: failing it (a bad
/// new disk) is allowed without --force. A role failed twice, its first
/// member never removed, shows its latest member, and the first one
/// without a role.
#[test]
fn a_rebuilding_member_can_be_failed_and_status_shows_the_roles_latest_member() {
    let d = tmp();
    let members = make(d.path(), Level::Raid5, 4, 0);
    let a = open(&members);
    let mut model = Vec::new();
    fill(&a, &mut model, 31);
    a.fail_member(&members[0], false).unwrap();
    let fresh = path(d.path(), "new.img");
    std::fs::File::create(&fresh)
        .unwrap()
        .set_len(MEMBER)
        .unwrap();
    raidkit_open::add_member(&a, &fresh, false).unwrap();
    assert_eq!(state(&a, 0), "rebuilding");
    a.fail_member(&fresh, false).unwrap();
    assert_eq!(a.health(), Health::Degraded);
    let st = a.members_status();
    let line = |p: &str| {
        st.iter()
            .find(|m| m.path.as_deref().is_some_and(|x| x.ends_with(p)))
            .map(|m| (m.role, m.state))
    };
    assert_eq!(line("new.img"), Some((Some(0), "faulty")), "{st:?}");
    assert_eq!(line("m0.img"), Some((None, "faulty")), "{st:?}");
    let e = a.fail_member("0", false).unwrap_err().to_string();
    assert!(e.contains("new.img"), "role 0 is new.img's now: {e}");
    // Its latest member removed, the role is missing: the one before it
    // does not come back into it.
    a.remove_member(&fresh).unwrap();
    let st = a.members_status();
    let role0: Vec<_> = st.iter().filter(|m| m.role == Some(0)).collect();
    assert!(
        role0.len() == 1 && role0[0].state == "missing" && role0[0].path.is_none(),
        "{st:?}"
    );
    let old = st
        .iter()
        .find(|m| m.path.as_deref().is_some_and(|x| x.ends_with("m0.img")));
    assert_eq!(
        old.map(|m| (m.role, m.state)),
        Some((None, "faulty")),
        "{st:?}"
    );
    check(&a, &model);
    done(a);
}

#[test]
fn raid6_fail_spare_rebuild_fail_again_add_rebuild() {
    let d = tmp();
    let members = make(d.path(), Level::Raid6, 5, 1);
    let mut all = members.clone();
    all.push(path(d.path(), "s0.img"));
    let a = open(&all);
    let mut model = Vec::new();
    fill(&a, &mut model, 1);

    a.fail_member(&members[1], false).unwrap();
    // The spare took role 1 at once and is being rebuilt.
    assert_eq!(state(&a, 1), "rebuilding");
    assert!(a.members_status().iter().any(|m| m.state == "faulty"));
    scribble(&a, &mut model, 2, 50, a.capacity());
    check(&a, &model);
    a.recover_all().unwrap();
    let last = a.last_recovery().unwrap();
    assert_eq!((last.kind, last.result.as_str()), ("rebuild", "done"));
    assert_eq!(a.health(), Health::Optimal);
    assert_eq!(a.count_mismatches().unwrap(), 0);
    check(&a, &model);

    // A second failure, then a brand-new member.
    a.fail_member("3", false).unwrap();
    assert_eq!(a.health(), Health::Degraded);
    scribble(&a, &mut model, 3, 50, a.capacity());
    a.remove_member("3").unwrap();
    let fresh = path(d.path(), "new.img");
    std::fs::File::create(&fresh)
        .unwrap()
        .set_len(MEMBER)
        .unwrap();
    assert_eq!(
        raidkit_open::add_member(&a, &fresh, false).unwrap(),
        Added::Role {
            role: 3,
            resync: false
        }
    );
    a.recover_all().unwrap();
    // The array assembles from its new members, clean.
    let now = vec![
        members[0].clone(),
        path(d.path(), "s0.img"),
        members[2].clone(),
        fresh,
        members[4].clone(),
    ];
    whole_and_again_from(a, &model, &now);
}

/// Two members of a RAID-6 to rebuild are rebuilt in one pass, as md
/// recovers every spare it has added at once: the sources are read once,
/// and the array holds no redundancy for half the time two passes would
/// take.
#[test]
fn raid6_rebuilds_two_members_in_one_pass() {
    let d = tmp();
    let members = make(d.path(), Level::Raid6, 6, 2);
    let mut all = members.clone();
    all.extend([path(d.path(), "s0.img"), path(d.path(), "s1.img")]);
    let a = open(&all);
    let mut model = Vec::new();
    fill(&a, &mut model, 7);
    a.fail_member(&members[1], false).unwrap();
    a.fail_member(&members[4], false).unwrap();
    assert_eq!((state(&a, 1), state(&a, 4)), ("rebuilding", "rebuilding"));
    scribble(&a, &mut model, 8, 60, a.capacity());
    check(&a, &model);
    a.recover_all().unwrap();
    let last = a.last_recovery().unwrap();
    assert_eq!((last.kind, last.result.as_str()), ("rebuild", "done"));
    assert_eq!(last.role, Some(1));
    let with: Vec<usize> = last.with.iter().map(|p| p.role).collect();
    assert_eq!(with, [4], "role 4 rebuilt in the same pass as role 1");
    // One pass over every stripe, not two.
    let g = a.geometry();
    assert_eq!(last.bytes, g.stripes() * g.chunk);
    let now = vec![
        members[0].clone(),
        path(d.path(), "s0.img"),
        members[2].clone(),
        members[3].clone(),
        path(d.path(), "s1.img"),
        members[5].clone(),
    ];
    whole_and_again_from(a, &model, &now);
}

/// Two members of a RAID-5 failed at the same moment by two
/// administrators: one is failed, the other refused, every time; never
/// both (the array would stop serving).
#[test]
fn two_members_failed_at_once_on_raid5_one_is_refused() {
    let d = tmp();
    let members = make(d.path(), Level::Raid5, 4, 0);
    for round in 0..20 {
        let a = open(&members);
        let step = std::sync::Barrier::new(2);
        let results: Vec<bool> = std::thread::scope(|s| {
            let runs: Vec<_> = [&members[1], &members[2]]
                .into_iter()
                .map(|m| {
                    let (a, step) = (&a, &step);
                    s.spawn(move || {
                        step.wait();
                        a.fail_member(m, false).is_ok()
                    })
                })
                .collect();
            runs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(
            results.iter().filter(|&&ok| ok).count(),
            1,
            "round {round}: {results:?}"
        );
        assert_eq!(a.health(), raidkit_array::Health::Degraded, "round {round}");
        done(a);
        // Both back in sync for the next round.
        let _ = std::fs::remove_dir_all(d.path());
        std::fs::create_dir_all(d.path()).unwrap();
        make(d.path(), Level::Raid5, 4, 0);
    }
}

#[test]
fn refusals_are_clear() {
    let d = tmp();
    let members = make(d.path(), Level::Raid5, 4, 0);
    let a = open(&members);
    let e = a.remove_member(&members[0]).unwrap_err().to_string();
    assert!(e.contains("fail it first"), "{e}");
    a.fail_member(&members[0], false).unwrap();
    let e = a.fail_member(&members[1], false).unwrap_err().to_string();
    assert!(e.contains("--force"), "{e}");
    let e = raidkit_open::add_member(&a, &members[0], false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("remove"), "{e}");
    let e = a.fail_member("9", false).unwrap_err().to_string();
    assert!(e.contains("no role 9"), "{e}");
    // A file that cannot be created is refused, naming it.
    let e = raidkit_open::add_member(&a, &path(d.path(), "no/such/dir/nope.img"), false)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("nope.img") && e.contains("could not be created"),
        "{e}"
    );
    // A member too small, and one holding data.
    let small = path(d.path(), "small.img");
    std::fs::File::create(&small)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let e = raidkit_open::add_member(&a, &small, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("too small"), "{e}");
    let full = path(d.path(), "full.img");
    std::fs::write(&full, vec![7u8; MEMBER as usize]).unwrap();
    let e = raidkit_open::add_member(&a, &full, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("holds data"), "{e}");
    // Refused members are left as they were, and nothing was created.
    assert!(!d.path().join("no").exists());
    // A file that does not exist is created, as large as the members, and
    // takes the missing role.
    let new = path(d.path(), "new.img");
    assert_eq!(
        raidkit_open::add_member(&a, &new, false).unwrap(),
        Added::Role {
            role: 0,
            resync: false
        }
    );
    assert_eq!(std::fs::metadata(&new).unwrap().len(), MEMBER);
    done(a);
}

#[test]
fn readd_resyncs_only_regions_written_while_away() {
    let d = tmp();
    let members = make(d.path(), Level::Raid5, 4, 0);
    let a = open(&members);
    let mut model = Vec::new();
    fill(&a, &mut model, 4);
    // Let the bitmap settle: everything written so far is on every member.
    a.housekeeping();
    a.housekeeping();
    a.fail_member(&members[2], false).unwrap();
    a.remove_member(&members[2]).unwrap();
    // A few writes in the first 256 KiB of the array only.
    scribble(&a, &mut model, 5, 20, 256 << 10);
    assert_eq!(
        raidkit_open::add_member(&a, &members[2], false).unwrap(),
        Added::Role {
            role: 2,
            resync: true
        }
    );
    a.recover_all().unwrap();
    let last = a.last_recovery().unwrap();
    assert_eq!((last.kind, last.result.as_str()), ("resync", "done"));
    let data_size = a.geometry().member_sizes[2];
    // 256 KiB over 3 data members touches at most two 64 KiB regions per member.
    assert!(
        last.bytes > 0 && last.bytes <= 2 * REGION,
        "resynced {} of {data_size} bytes",
        last.bytes
    );
    assert_eq!(a.count_mismatches().unwrap(), 0);
    check(&a, &model);
    done(a);

    // The same on assembly: a member left out while the array was written
    // comes back stale and is resynced by bitmap.
    let without: Vec<String> = members
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 1)
        .map(|(_, m)| m.clone())
        .collect();
    let b = open(&without);
    b.housekeeping(); // degraded: must not clear anything
    scribble(&b, &mut model, 6, 10, 128 << 10);
    done(b);
    let c = open(&members);
    assert_eq!(state(&c, 1), "rebuilding");
    c.recover_all().unwrap();
    let last = c.last_recovery().unwrap();
    assert_eq!(last.kind, "resync");
    assert!(last.bytes <= 2 * REGION, "{}", last.bytes);
    assert_eq!(c.count_mismatches().unwrap(), 0);
    check(&c, &model);
    done(c);
}

#[test]
fn read_errors_are_cured_or_fail_the_member() {
    let d = tmp();
    let members = make(d.path(), Level::Raid5, 4, 0);
    let a = open(&members);
    let mut model = Vec::new();
    fill(&a, &mut model, 7);
    done(a);
    // Member 1 returns read errors at two offsets: whatever is rewritten
    // there keeps failing, so it is failed; data stays correct.
    let off = 1 << 20; // data offset of these members: 1 MiB
    let mut specs = members.clone();
    specs[1] = format!(
        "fault:{}?read-error-at={},{}",
        members[1],
        off + 5 * CHUNK + 100,
        off + 40 * CHUNK
    );
    let a = open(&specs);
    check(&a, &model);
    assert_eq!(a.health(), Health::Degraded);
    let st = a.members_status();
    let bad = st.iter().find(|m| m.state == "faulty").unwrap();
    assert_eq!(bad.role, Some(1));
    assert!(bad.reason.as_ref().unwrap().contains("read"), "{bad:?}");
    scribble(&a, &mut model, 8, 30, a.capacity());
    check(&a, &model);
    done(a);
}

#[test]
fn a_sector_that_reads_on_a_retry_is_counted_once_and_the_member_kept() {
    let d = tmp();
    for level in [Level::Raid5, Level::Raid6] {
        let members = make(d.path(), level, 4, 0);
        let a = open(&members);
        let mut model = Vec::new();
        fill(&a, &mut model, 21);
        done(a);
        // Member 1's first read of a block in the middle fails; a large
        // read asks it for several runs at once, and reads them again
        // one by one when that fails: the retry succeeds, the error is
        // still the disk's, counted once.
        let off = 1 << 20; // the data offset of these members
        let mut specs = members.clone();
        specs[1] = format!("fault:{}?flaky-at={}", members[1], off + 9 * CHUNK + 512);
        let a = open(&specs);
        check(&a, &model);
        let read_errors = |a: &Array| {
            a.members_status()
                .into_iter()
                .find(|m| m.role == Some(1))
                .and_then(|m| m.errors)
                .map(|e| e.read)
        };
        assert_eq!(read_errors(&a), Some(1), "{level}");
        assert_eq!(a.health(), Health::Optimal, "{level}: the member was kept");
        check(&a, &model);
        assert_eq!(read_errors(&a), Some(1), "{level}: read at the retry");
        done(a);
        for m in &members {
            std::fs::remove_file(m).unwrap();
        }
    }
}

#[test]
fn a_bad_sector_is_rewritten_from_redundancy_and_the_member_kept() {
    let d = tmp();
    for level in [Level::Raid5, Level::Raid6, Level::Raid1, Level::Raid10] {
        let n = if level == Level::Raid1 { 2 } else { 4 };
        let members = make(d.path(), level, n, 0);
        let a = open(&members);
        let mut model = Vec::new();
        fill(&a, &mut model, 14);
        done(a);
        // Two bad sectors on member 0, in rows where it holds data that
        // reads go to (parity is only read when something is missing).
        let g = a_geometry(&members);
        let rows: Vec<u64> = [3u64, 50]
            .iter()
            .map(|&from| {
                (from..)
                    .find(|&s| {
                        if g.level.is_parity() {
                            return g.stripe_map(s).data.contains(&0);
                        }
                        // Mirrors take turns by chunk: member 0 must be the
                        // copy tried first for the chunk it holds in row s.
                        let Some(c) = g.mirror_chunk_at(0, s) else {
                            return false;
                        };
                        let copies = &g.pieces(c * CHUNK, CHUNK)[0].copies;
                        copies[c as usize % copies.len()] == (0, s * CHUNK)
                    })
                    .unwrap()
            })
            .collect();
        let off = 1 << 20; // the data offset of these members
        let mut specs = members.clone();
        specs[0] = format!(
            "fault:{}?bad-sector-at={},{}",
            members[0],
            off + rows[0] * CHUNK + 512,
            off + rows[1] * CHUNK
        );
        let a = open(&specs);
        check(&a, &model);
        assert_eq!(a.health(), Health::Optimal, "{level}: the member was kept");
        assert!(
            a.corrected_read_errors() >= 2,
            "{level}: {} corrected",
            a.corrected_read_errors()
        );
        let before = a.corrected_read_errors();
        check(&a, &model);
        assert_eq!(a.corrected_read_errors(), before, "{level}: cured for good");
        assert_eq!(a.count_mismatches().unwrap(), 0, "{level}");
        done(a);
        for m in &members {
            std::fs::remove_file(m).unwrap();
        }
    }
}

#[test]
fn a_member_that_vanishes_mid_stream_is_failed() {
    let d = tmp();
    for level in [Level::Raid1, Level::Raid5, Level::Raid6, Level::Raid10] {
        let n = if level == Level::Raid1 { 2 } else { 4 };
        let members = make(d.path(), level, n, 0);
        let mut specs = members.clone();
        specs[0] = format!("fault:{}?vanish-after=40", members[0]);
        let a = open(&specs);
        let mut model = Vec::new();
        fill(&a, &mut model, 9);
        scribble(&a, &mut model, 10, 40, a.capacity());
        check(&a, &model);
        assert_eq!(a.health(), Health::Degraded, "{level}");
        assert_eq!(state(&a, 0), "none", "{level}");
        done(a);
        // Reassembled from the real files: member 0 is stale, and taken
        // back in for a resync of what it missed, after which everything agrees.
        let b = open(&members);
        b.recover_all().unwrap();
        assert_eq!(b.health(), Health::Optimal, "{level}");
        check(&b, &model);
        assert_eq!(b.count_mismatches().unwrap(), 0, "{level}");
        done(b);
        for m in &members {
            std::fs::remove_file(m).unwrap();
        }
    }
}

#[test]
fn failed_array_fails_safe_and_force_brings_it_back() {
    let d = tmp();
    let members = make(d.path(), Level::Raid5, 4, 0);
    let a = open(&members);
    let mut model = Vec::new();
    fill(&a, &mut model, 11);
    a.fail_member(&members[0], false).unwrap();
    a.fail_member(&members[3], true).unwrap();
    assert_eq!(a.health(), Health::Failed);
    let mut b = vec![0u8; 4096];
    assert!(a.read(&mut b, 0).is_err());
    assert!(a.write(&b, 0).is_err());
    // Stopping a failed array says so (and does not mark it clean).
    assert!(a.close().is_err());
    drop(a);
    let files: Vec<Vec<u8>> = members.iter().map(|m| std::fs::read(m).unwrap()).collect();
    let e = try_open(&members, false).unwrap_err().to_string();
    assert!(e.contains("cannot run") && e.contains("--force"), "{e}");
    // Nothing was written by the refusal.
    for (m, before) in members.iter().zip(&files) {
        assert!(std::fs::read(m).unwrap() == *before, "{m} changed");
    }
    // Forced: the most recent stale member (3, failed last) is taken as in
    // sync; member 0 is rebuilt from the others.
    let f = try_open(&members, true).unwrap();
    f.recover_all().unwrap();
    assert_eq!(f.health(), Health::Optimal);
    check(&f, &model);
    assert_eq!(f.count_mismatches().unwrap(), 0);
    done(f);
}

#[test]
fn replace_copies_a_member_while_it_serves() {
    let d = tmp();
    let members = make(d.path(), Level::Raid6, 4, 0);
    let a = open(&members);
    let mut model = Vec::new();
    fill(&a, &mut model, 12);
    let new = path(d.path(), "r.img");
    std::fs::File::create(&new)
        .unwrap()
        .set_len(MEMBER)
        .unwrap();
    assert_eq!(
        raidkit_open::replace_member(&a, &members[2], &new, false).unwrap(),
        2
    );
    assert_eq!(a.health(), Health::Optimal);
    scribble(&a, &mut model, 13, 30, a.capacity());
    a.recover_all().unwrap();
    assert_eq!(a.last_recovery().unwrap().kind, "replace");
    let st = a.members_status();
    assert_eq!(st[2].path.as_deref(), Some(new.as_str()));
    assert_eq!(st[2].state, "active");
    check(&a, &model);
    assert_eq!(a.count_mismatches().unwrap(), 0);
    done(a);
    let mut now = members.clone();
    now[2] = new;
    let b = open(&now);
    assert_eq!(b.health(), Health::Optimal);
    check(&b, &model);
    done(b);
}

/// md's failfast for mirrors: once a copy's member is much slower than its
/// peers (a remote member behind a congested link, a dying disk), reads go
/// to the other copy while it is fine, instead of waiting on the slow one.
#[test]
fn mirror_reads_skip_a_slow_copy_while_another_is_fine() {
    let dir = tmp();
    let ms = make(dir.path(), Level::Raid1, 2, 0);
    let slow = format!("fault:{}?delay=5ms", ms[1]);
    let array = open(&[ms[0].clone(), slow]);
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 + 3) as u8).collect();
    array.write(&data, 0).unwrap();
    // Two streams in turn, half the data apart: on members that spin (a
    // file system on a disk that says so), each keeps a copy; on others
    // the copies take turns by chunk. Either way both serve a pass.
    let read_all = || {
        let mut got = vec![0u8; CHUNK as usize];
        let chunks: Vec<&[u8]> = data.chunks(CHUNK as usize).collect();
        let half = chunks.len() / 2;
        for i in (0..half).flat_map(|i| [i, i + half]) {
            array.read(&mut got, i as u64 * CHUNK).unwrap();
            assert!(got == chunks[i], "chunk {i} read wrong");
        }
    };
    let reads = |role: usize| array.members_status()[role].io.as_ref().unwrap().read_ops;
    read_all();
    assert!(reads(1) > 8, "{}", reads(1));
    array.housekeeping();
    assert!(
        array.members_status()[1].slow.is_some(),
        "{:?}",
        array.members_status()[1]
    );
    // Now the fast copy serves every read, right.
    let (fast, slowed) = (reads(0), reads(1));
    read_all();
    assert_eq!(reads(1), slowed, "a read waited on the slow copy");
    assert!(reads(0) >= fast + (1 << 20) / CHUNK);
    array.close().unwrap();
}

/// A RAID-5 of four members and a spare, filled with data from `seed`:
/// its directory, members, the array and the data.
fn raid5_with_a_spare(seed: u64) -> (tempfile::TempDir, Vec<String>, Array, Vec<u8>) {
    let d = tmp();
    let members = make(d.path(), Level::Raid5, 4, 1);
    let mut all = members.clone();
    all.push(path(d.path(), "s0.img"));
    let a = open(&all);
    let mut model = Vec::new();
    fill(&a, &mut model, seed);
    (d, members, a, model)
}

/// Wait for the background process of `a` to have done a first step.
fn first_step(a: &Array) {
    let t0 = std::time::Instant::now();
    while a.recovery_status().is_none_or(|r| r.bytes_done == 0) {
        assert!(t0.elapsed().as_secs() < 60, "the process made no step");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// A throttled rebuild rests with no stripe locked: a degraded read of a
/// stripe ahead of it is answered at once, not after the pace's sleep
/// (it waited seconds when the rebuild slept on the steps it had locked
/// ahead: 24 reads a second at QD1 during a 2 MiB/s rebuild, against
/// 12,000 idle).
#[test]
fn a_throttled_rebuild_does_not_hold_reads_ahead_of_it() {
    let (d, members, a, model) = raid5_with_a_spare(9);
    // One step of the rebuild (64 KiB of the member, the least) owes 4 s
    // of rest.
    a.set_rebuild_speed(Some(16 << 10), Some(16 << 10));
    a.fail_member(&members[1], false).unwrap();
    assert_eq!(state(&a, 1), "rebuilding");
    let g = a.geometry();
    let width = g.chunk * (g.members() as u64 - 1);
    std::thread::scope(|s| {
        let rebuild = s.spawn(|| a.recover_all());
        first_step(&a);
        // The time left is told at the limit, not at the speed of the
        // first step (which ran at once).
        let r = a.recovery_status().unwrap();
        let at_limit = (r.bytes_total - r.bytes_done) as f64 / (16 << 10) as f64;
        let left = r.seconds_left.unwrap();
        assert!(
            left >= at_limit * 0.99,
            "{left} s left, {at_limit} s at the limit"
        );
        // Stripes 5 and 6: in the second step (of 4 stripes: 64 KiB of
        // the member in chunks of 16 KiB), which a pipeline that slept
        // with steps locked ahead held; degraded (role 1 holds data in
        // one of them, read through parity).
        let at = 5 * width;
        let mut buf = vec![0u8; 2 * width as usize];
        let t = std::time::Instant::now();
        a.read(&mut buf, at).unwrap();
        let waited = t.elapsed();
        assert!(buf[..] == model[at as usize..(at + 2 * width) as usize]);
        // Let the rebuild end before judging, so a failure leaves no
        // thread behind.
        a.set_rebuild_speed(Some(0), Some(0));
        rebuild.join().unwrap().unwrap();
        assert!(
            waited < std::time::Duration::from_secs(2),
            "a read ahead of a throttled rebuild waited {waited:?}"
        );
    });
    let last = a.last_recovery().unwrap();
    assert_eq!((last.kind, last.result.as_str()), ("rebuild", "done"));
    let now = vec![
        members[0].clone(),
        path(d.path(), "s0.img"),
        members[2].clone(),
        members[3].clone(),
    ];
    whole_and_again_from(a, &model, &now);
}

/// A member change ends a throttled rest at once: the member being
/// rebuilt failed during a rest of many seconds stops the rebuild then,
/// not when the rest is over (status named the failed member, and a new
/// one waited, for the rest of it).
#[test]
fn a_member_failed_during_a_throttled_rest_stops_the_rebuild_at_once() {
    let (d, members, a, model) = raid5_with_a_spare(11);
    // One step (64 KiB of the member) owes 16 s of rest.
    a.set_rebuild_speed(Some(4 << 10), Some(4 << 10));
    a.fail_member(&members[2], false).unwrap();
    std::thread::scope(|s| {
        let rebuild = s.spawn(|| a.recover_all());
        first_step(&a);
        a.fail_member(&path(d.path(), "s0.img"), false).unwrap();
        let t = std::time::Instant::now();
        while a.recovery_status().is_some() && t.elapsed().as_secs() < 30 {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let waited = t.elapsed();
        rebuild.join().unwrap().unwrap();
        assert!(
            waited < std::time::Duration::from_secs(4),
            "the rebuild went on for {waited:?} after its member failed"
        );
    });
    let last = a.last_recovery().unwrap();
    assert_ne!(last.result, "done", "{last:?}");
    assert_eq!(a.health(), Health::Degraded);
    check(&a, &model);
    done(a);
}
