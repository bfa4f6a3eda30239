//! The array engine against a model: every level and layout written at
//! random, read back whole, checked member by member (data where md puts
//! it, parity recomputed by the slow reference), and read degraded with
//! every member (and for RAID-6 every pair) missing.

use raidkit_array::assemble::{assemble, Absence};
use raidkit_array::create::CreateOptions;
use raidkit_array::superblock::read_superblock;
use raidkit_array::{Array, Error};
use raidkit_layout::{Layout, Level, ParityLayout};
use raidkit_member::{FileMember, Member};
use raidkit_open::spec::{self, Spec};
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const CHUNK: u64 = 4096;
const MEMBER: u64 = (1 << 20) + 48 * CHUNK;

fn tmp() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

fn shapes() -> Vec<(Level, Layout, usize)> {
    let mut v = vec![
        (Level::Linear, Layout::None, 3),
        (Level::Raid0, Layout::None, 3),
        (Level::Raid1, Layout::None, 3),
        (Level::Raid4, Level::Raid4.default_layout(), 4),
        (Level::Raid10, Layout::Near(2), 4),
        (Level::Raid10, Layout::Near(2), 3),
        (Level::Raid10, Layout::Near(3), 4),
        (Level::Raid10, Layout::Far(2), 3),
        (Level::Raid10, Layout::Far(2), 4),
        (Level::Raid10, Layout::Offset(2), 3),
        (Level::Raid10, Layout::Offset(3), 4),
    ];
    for alg in ParityLayout::ALL {
        v.push((Level::Raid5, Layout::Parity(alg), 4));
        v.push((Level::Raid6, Layout::Parity(alg), 5));
    }
    v.push((Level::Raid5, Level::Raid5.default_layout(), 3));
    v.push((Level::Raid6, Level::Raid6.default_layout(), 4));
    v.push((
        Level::Raid6,
        Layout::Parity(ParityLayout::LeftAsymmetric),
        7,
    ));
    v
}

fn paths(dir: &Path, n: usize) -> Vec<PathBuf> {
    (0..n).map(|i| dir.join(format!("m{i}.img"))).collect()
}

fn specs(p: &[PathBuf]) -> Vec<Spec> {
    p.iter()
        .map(|x| Spec::File(x.display().to_string()))
        .collect()
}

fn make(level: Level, layout: Layout, paths: &[PathBuf]) {
    make_sized(level, layout, paths, MEMBER)
}

fn make_sized(level: Level, layout: Layout, paths: &[PathBuf], member: u64) {
    if level == Level::Linear {
        // Linear members may differ in size.
        for (i, p) in paths.iter().enumerate() {
            let f = std::fs::File::create(p).unwrap();
            f.set_len(member + i as u64 * 3 * CHUNK).unwrap();
        }
    }
    let opts = CreateOptions {
        level,
        layout,
        chunk: CHUNK,
        size: (level != Level::Linear).then_some(member),
        name: "t".into(),
        force: false,
        assume_clean: false,
        background_sync: false,
        bitmap_region: 0,
        policy: raidkit_array::create::Policy::None,
        spares: Vec::new(),
        checksums: false,
        md: false,
        data_offset: None,
        domains: Vec::new(),
    };
    raidkit_open::create(&specs(paths), &[], &opts, |_, _| {}).unwrap();
}

/// The members with the roles in `gone` left out.
fn without<'a>(ps: &'a [PathBuf], gone: &[usize]) -> Vec<Option<&'a PathBuf>> {
    ps.iter()
        .enumerate()
        .map(|(i, p)| (!gone.contains(&i)).then_some(p))
        .collect()
}

/// Open the array from the members present (None = absent).
fn open_ro(paths: &[Option<&PathBuf>]) -> Result<Array, Error> {
    open_as(paths, true)
}

fn open(paths: &[Option<&PathBuf>]) -> Result<Array, Error> {
    open_as(paths, false)
}

fn open_as(paths: &[Option<&PathBuf>], read_only: bool) -> Result<Array, Error> {
    let ms: Vec<Arc<dyn Member>> = paths
        .iter()
        .flatten()
        .map(|p| Arc::new(FileMember::open(p, read_only).unwrap()) as Arc<dyn Member>)
        .collect();
    Array::open(assemble(ms)?, "t", read_only)
}

fn random_writes(a: &Array, model: &mut [u8], rng: &mut impl Rng, count: usize) {
    let cap = model.len() as u64;
    for _ in 0..count {
        let len = rng.gen_range(1..=(3 * 4 * CHUNK).min(cap));
        let off = rng.gen_range(0..=cap - len);
        let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        a.write(&data, off).unwrap();
        model[off as usize..(off + len) as usize].copy_from_slice(&data);
    }
}

fn read_all(a: &Array) -> Vec<u8> {
    let mut buf = vec![0u8; a.capacity() as usize];
    a.read(&mut buf, 0).unwrap();
    buf
}

/// Read through the zero-copy path: the member file ranges the array
/// offers, read straight from the files. None: the array declined.
fn read_by_extents(a: &Array, off: u64, len: u64) -> Option<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut out = Vec::new();
    let r = a.with_file_extents(off, len, &mut |ext| {
        for e in ext {
            let mut b = vec![0u8; e.len as usize];
            e.file.read_exact_at(&mut b, e.offset)?;
            out.extend_from_slice(&b);
        }
        Ok(())
    })?;
    r.unwrap();
    Some(out)
}

/// Random ranges read through the zero-copy path must match the model;
/// returns how many the array declined (it may, when a range needs
/// redundancy work).
fn declined_extent_reads(a: &Array, model: &[u8], rng: &mut impl Rng, what: &str) -> usize {
    let cap = model.len() as u64;
    let mut declined = 0;
    for i in 0..40 {
        let len = if i == 0 {
            cap
        } else {
            rng.gen_range(1..=(5 * 3 * CHUNK).min(cap))
        };
        let off = rng.gen_range(0..=cap - len);
        match read_by_extents(a, off, len) {
            Some(b) => assert!(
                b == model[off as usize..(off + len) as usize],
                "{what}: extents of {len} at {off}"
            ),
            None => declined += 1,
        }
    }
    declined
}

/// Every data byte sits where the layout (checked against md's pictures in
/// the layout crate) says, on the raw member files.
fn check_members(g: &raidkit_layout::Geometry, paths: &[PathBuf], model: &[u8]) {
    let files: Vec<FileMember> = paths
        .iter()
        .map(|p| FileMember::open(p, true).unwrap())
        .collect();
    let offs: Vec<u64> = files
        .iter()
        .map(|f| read_superblock(f).unwrap().sb.data_offset)
        .collect();
    let mut buf = vec![0u8; CHUNK as usize];
    for c in 0..g.capacity() / CHUNK {
        for p in g.pieces(c * CHUNK, CHUNK) {
            for &(m, dev) in &p.copies {
                let b = &mut buf[..p.len as usize];
                files[m].read_at(b, offs[m] + dev).unwrap();
                assert_eq!(
                    b,
                    &model[p.logical as usize..(p.logical + p.len) as usize],
                    "member {m} at {dev}"
                );
            }
        }
    }
}

/// Members that wait for a device (not page-cache files) take other
/// paths: a member's chunks of consecutive stripes written as one request,
/// whole-stripe runs of parity levels with all their parity computed first
/// and each member written once. Simulated disks with no delay over the
/// files give those paths; the data must still read back, parity agree
/// and every byte lie where md puts it.
#[test]
fn every_level_against_a_model_on_members_that_wait_for_devices() {
    use raidkit_member::sim::{SimConfig, SimDisk};
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xd15c);
    for (level, layout, n) in shapes() {
        let dir = tmp();
        let ps = paths(dir.path(), n);
        // Data areas past 1 MiB: writes that large go to every member at
        // once (PARALLEL_IO), the paths this is about.
        make_sized(level, layout, &ps, MEMBER + (1 << 20));
        let ms: Vec<Arc<dyn Member>> = ps
            .iter()
            .map(|p| {
                let f: Arc<dyn Member> = Arc::new(FileMember::open(p, false).unwrap());
                // A seek of a nanosecond: no time to speak of, but the
                // members are spinning disks, so mirrors read by where
                // the heads are (a large read grouped by the copy chosen).
                let sim = SimConfig {
                    bandwidth: u64::MAX / 2,
                    seek: std::time::Duration::from_nanos(1),
                };
                Arc::new(SimDisk::new(f, sim)) as Arc<dyn Member>
            })
            .collect();
        assert!(ms.iter().all(|m| !m.buffered()));
        let a = Array::open(assemble(ms).unwrap(), "t", false).unwrap();
        let what = format!("{level} {layout}");
        let cap = a.capacity();
        let mut model = vec![0u8; cap as usize];
        let full: Vec<u8> = (0..model.len()).map(|_| rng.gen()).collect();
        a.write(&full, 0).unwrap();
        model.copy_from_slice(&full);
        // Large writes at any offset: runs of whole stripes with partial
        // ones on either side.
        for _ in 0..12 {
            let len = rng.gen_range(1..=(3 << 19).min(cap));
            let off = rng.gen_range(0..=cap - len);
            let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            a.write(&data, off).unwrap();
            model[off as usize..(off + len) as usize].copy_from_slice(&data);
        }
        random_writes(&a, &mut model, &mut rng, 20);
        assert!(read_all(&a) == model, "{what}: read-back");
        assert_eq!(a.count_mismatches().unwrap(), 0, "{what}");
        a.close().unwrap();
        let g = a.geometry().clone();
        drop(a);
        check_members(&g, &ps, &model);
    }
}

#[test]
fn every_level_against_a_model_with_every_member_missing() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    for (level, layout, n) in shapes() {
        let dir = tmp();
        let ps = paths(dir.path(), n);
        make(level, layout, &ps);
        let a = open(&without(&ps, &[])).unwrap();
        let mut model = vec![0u8; a.capacity() as usize];
        // A full-array write first, then scattered partial ones.
        let full: Vec<u8> = (0..model.len()).map(|_| rng.gen()).collect();
        a.write(&full, 0).unwrap();
        model.copy_from_slice(&full);
        random_writes(&a, &mut model, &mut rng, 60);
        assert!(read_all(&a) == model, "{level} {layout}: read-back");
        // All members present and in sync: every range is offered.
        let what = format!("{level} {layout}");
        assert_eq!(
            declined_extent_reads(&a, &model, &mut rng, &what),
            0,
            "{what}"
        );
        assert_eq!(a.count_mismatches().unwrap(), 0, "{level} {layout}");
        a.close().unwrap();
        let g = a.geometry().clone();
        drop(a); // releases the members' writer locks
        check_members(&g, &ps, &model);

        // Degraded reads: each member missing, and each pair for RAID-6.
        let mut sets: Vec<Vec<usize>> = (0..n).map(|i| vec![i]).collect();
        if level == Level::Raid6 {
            for i in 0..n {
                for j in i + 1..n {
                    sets.push(vec![i, j]);
                }
            }
        }
        for gone in sets {
            let present = without(&ps, &gone);
            // Read-only: a writable start is an event, and would leave the
            // members left out of earlier starts behind.
            match open_ro(&present) {
                Ok(d) => {
                    assert!(g.survives(&gone));
                    assert!(
                        md_survives(level, layout, n, &gone),
                        "{level} {layout} without {gone:?}: md would not run it"
                    );
                    assert!(read_all(&d) == model, "{level} {layout} without {gone:?}");
                    // Mirrors read the copy that is there; parity levels
                    // decline ranges that need the missing member rebuilt.
                    let what = format!("{level} {layout} without {gone:?}");
                    let declined = declined_extent_reads(&d, &model, &mut rng, &what);
                    let holds_data = g
                        .pieces(0, g.capacity())
                        .iter()
                        .any(|p| p.copies.iter().any(|(r, _)| gone.contains(r)));
                    if level.is_parity() && holds_data {
                        assert!(declined > 0, "{what}");
                    } else {
                        assert_eq!(declined, 0, "{what}");
                    }
                }
                Err(e) => {
                    assert!(!g.survives(&gone), "{level} {layout} without {gone:?}: {e}");
                    assert!(
                        !md_survives(level, layout, n, &gone),
                        "{level} {layout} without {gone:?}: md would run it: {e}"
                    );
                    assert!(matches!(e, Error::NotEnoughMembers { .. }), "{e}");
                    let msg = e.to_string();
                    for r in &gone {
                        assert!(msg.contains(&format!("role {r}")), "{msg}");
                    }
                }
            }
        }
    }
}

/// Whether md runs an array of `n` members with the roles in `missing`
/// absent, written here from md's own rules rather than from
/// `Geometry::survives`: RAID-1 needs one member, RAID-4/5 lose at most
/// one, RAID-6 two, linear and RAID-0 none; RAID-10 as md's `_enough()`
/// (drivers/md/raid10.c): the members taken in groups of `copies`
/// consecutive roles (wrapping around), a group starting at role 0 and
/// each next one `copies` roles further on until the start comes back to
/// 0, and every group must keep a member. (With near copies only, a group
/// is the set of members that hold copies of some chunk.)
fn md_survives(level: Level, layout: Layout, n: usize, missing: &[usize]) -> bool {
    let lost = |r: usize| missing.contains(&r);
    match level {
        _ if missing.is_empty() => true,
        Level::Linear | Level::Raid0 => false,
        Level::Raid1 => missing.len() < n,
        Level::Raid4 | Level::Raid5 => missing.len() <= 1,
        Level::Raid6 => missing.len() <= 2,
        Level::Raid10 => {
            // md's _enough: groups of `copies` members from `first`, which
            // moves on by the near copies (1 for far and offset layouts).
            let (copies, near) = match layout {
                Layout::Near(c) => (c as usize, c as usize),
                Layout::Far(c) | Layout::Offset(c) => (c as usize, 1),
                _ => panic!("RAID-10 layout {layout}"),
            };
            let mut first = 0;
            loop {
                if (0..copies).all(|j| lost((first + j) % n)) {
                    return false;
                }
                first = (first + near) % n;
                if first == 0 {
                    return true;
                }
            }
        }
    }
}

/// Every set of members of `n`, as lists of roles.
fn all_subsets(n: usize) -> Vec<Vec<usize>> {
    (0..1u32 << n)
        .map(|bits| (0..n).filter(|&i| bits & (1 << i) != 0).collect())
        .collect()
}

#[test]
fn raid10_runs_exactly_when_mds_rule_says_every_chunk_keeps_a_copy() {
    // Every set of lost members, on near, far and offset layouts, with
    // members a multiple of the copies and not: the array opens exactly when md's rule says
    // so, and then reads every byte right.
    let mut rng = rand::rngs::StdRng::seed_from_u64(10);
    let mut seen = (0, 0, 0); // (runs with more lost than copies - 1, runs, refused)
    for (layout, n) in [
        (Layout::Near(2), 3),
        (Layout::Near(2), 4),
        (Layout::Near(2), 5),
        (Layout::Near(2), 6),
        (Layout::Near(3), 4),
        (Layout::Near(3), 5),
        (Layout::Near(3), 6),
        (Layout::Far(2), 3),
        (Layout::Far(2), 4),
        (Layout::Far(2), 5),
        (Layout::Offset(2), 4),
        (Layout::Offset(3), 5),
    ] {
        let copies = match layout {
            Layout::Near(c) | Layout::Far(c) | Layout::Offset(c) => c as usize,
            _ => unreachable!(),
        };
        let dir = tmp();
        let ps = paths(dir.path(), n);
        make(Level::Raid10, layout, &ps);
        let a = open(&without(&ps, &[])).unwrap();
        let mut model = vec![0u8; a.capacity() as usize];
        random_writes(&a, &mut model, &mut rng, 40);
        a.close().unwrap();
        drop(a);
        for gone in all_subsets(n) {
            let expect = md_survives(Level::Raid10, layout, n, &gone);
            // Read-only: a writable start is an event, and would leave the
            // members left out of earlier starts behind.
            match open_ro(&without(&ps, &gone)) {
                Ok(d) => {
                    assert!(expect, "{layout} x{n} without {gone:?}: runs, md refuses");
                    assert!(read_all(&d) == model, "{layout} x{n} without {gone:?}");
                    seen.1 += 1;
                    if gone.len() >= copies {
                        seen.0 += 1;
                    }
                }
                Err(e) => {
                    assert!(
                        !expect,
                        "{layout} x{n} without {gone:?}: refused, md runs it: {e}"
                    );
                    seen.2 += 1;
                }
            }
        }
    }
    // Both outcomes were tried, and arrays that lost more members than
    // there are copies (but no whole group) ran.
    assert!(seen.0 > 0 && seen.1 > 0 && seen.2 > 0, "{seen:?}");
}

#[test]
fn degraded_writes_then_the_stale_member_is_never_trusted() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for (level, layout, n) in shapes() {
        if matches!(level, Level::Linear | Level::Raid0) {
            continue;
        }
        for gone in 0..n {
            let dir = tmp();
            let ps = paths(dir.path(), n);
            make(level, layout, &ps);
            let a = open(&without(&ps, &[])).unwrap();
            let mut model = vec![0u8; a.capacity() as usize];
            random_writes(&a, &mut model, &mut rng, 10);
            a.close().unwrap();
            drop(a);
            // Write with one member away.
            let present = without(&ps, &[gone]);
            let d = open(&present).unwrap();
            random_writes(&d, &mut model, &mut rng, 30);
            assert!(read_all(&d) == model, "{level} {layout} -{gone}");
            d.close().unwrap();
            drop(d);
            // The member comes back: it is stale and ignored, data stays right.
            let asm = assemble(spec::open_all(&specs(&ps), true).unwrap()).unwrap();
            match &asm.slots[gone].absence {
                Some(Absence::Stale { reason, .. }) => {
                    assert!(reason.contains("behind"), "{reason}")
                }
                other => panic!("{level} {layout}: member {gone} not stale: {other:?}"),
            }
            let back = Array::open(asm, "t", true).unwrap();
            assert!(read_all(&back) == model, "{level} {layout} stale {gone}");
        }
    }
}

#[test]
fn raid50_nests_arrays_as_members() {
    let dir = tmp();
    let a_paths = paths(&dir.path().join("a"), 3);
    let b_paths = paths(&dir.path().join("b"), 3);
    std::fs::create_dir_all(dir.path().join("a")).unwrap();
    std::fs::create_dir_all(dir.path().join("b")).unwrap();
    let big = 4 * MEMBER;
    for ps in [&a_paths, &b_paths] {
        let opts = CreateOptions {
            level: Level::Raid5,
            layout: Level::Raid5.default_layout(),
            chunk: CHUNK,
            size: Some(big),
            name: "inner".into(),
            force: false,
            assume_clean: false,
            background_sync: false,
            bitmap_region: 0,
            policy: raidkit_array::create::Policy::None,
            spares: Vec::new(),
            checksums: false,
            md: false,
            data_offset: None,
            domains: Vec::new(),
        };
        raidkit_open::create(&specs(ps), &[], &opts, |_, _| {}).unwrap();
    }
    let outer = vec![Spec::Array(specs(&a_paths)), Spec::Array(specs(&b_paths))];
    let opts = CreateOptions {
        level: Level::Raid0,
        layout: Layout::None,
        chunk: 2 * CHUNK,
        size: None,
        name: "raid50".into(),
        force: false,
        assume_clean: false,
        background_sync: false,
        bitmap_region: 0,
        policy: raidkit_array::create::Policy::None,
        spares: Vec::new(),
        checksums: false,
        md: false,
        data_offset: None,
        domains: Vec::new(),
    };
    raidkit_open::create(&outer, &[], &opts, |_, _| {}).unwrap();
    let top = Spec::Array(outer.clone());
    let arr = spec::open_array(&top, false).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(50);
    let mut model = vec![0u8; arr.capacity() as usize];
    random_writes(&arr, &mut model, &mut rng, 40);
    arr.close().unwrap();
    // Lose one member of each inner RAID-5: still every byte.
    let degraded = Spec::Array(vec![
        Spec::Array(specs(&a_paths[1..])),
        Spec::Array(specs(&[b_paths[0].clone(), b_paths[2].clone()])),
    ]);
    let arr = spec::open_array(&degraded, true).unwrap();
    assert!(read_all(&arr) == model);
    // Two from one inner set: that inner array, and so the outer, cannot run.
    let failed = Spec::Array(vec![
        Spec::Array(specs(&a_paths[2..])),
        Spec::Array(specs(&b_paths)),
    ]);
    let e = spec::open_array(&failed, true).unwrap_err();
    assert!(e.to_string().contains("cannot run"), "{e}");
}

#[test]
fn out_of_range_and_read_only() {
    let dir = tmp();
    let ps = paths(dir.path(), 3);
    make(Level::Raid5, Level::Raid5.default_layout(), &ps);
    let a = open(&without(&ps, &[])).unwrap();
    let cap = a.capacity();
    assert!(matches!(
        a.write(&[1, 2, 3], cap - 2),
        Err(Error::OutOfRange { .. })
    ));
    let mut b = [0u8; 4];
    assert!(matches!(
        a.read(&mut b, u64::MAX - 1),
        Err(Error::OutOfRange { .. })
    ));
    let ro = Array::open(
        assemble(spec::open_all(&specs(&ps), true).unwrap()).unwrap(),
        "t",
        true,
    )
    .unwrap();
    assert!(ro.write(&[1], 0).is_err());
}

#[test]
fn full_stripe_writes_with_large_chunks() {
    // Chunks of 512 KiB take the column-by-column full-stripe path.
    let mut rng = rand::rngs::StdRng::seed_from_u64(512);
    for (level, n) in [(Level::Raid5, 4), (Level::Raid6, 5), (Level::Raid6, 6)] {
        let dir = tmp();
        let ps = paths(dir.path(), n);
        let chunk = 512 * 1024;
        let opts = CreateOptions {
            level,
            layout: level.default_layout(),
            chunk,
            size: Some((1 << 20) + 6 * chunk),
            name: "big".into(),
            force: false,
            assume_clean: false,
            background_sync: false,
            bitmap_region: 0,
            policy: raidkit_array::create::Policy::None,
            spares: Vec::new(),
            checksums: false,
            md: false,
            data_offset: None,
            domains: Vec::new(),
        };
        raidkit_open::create(&specs(&ps), &[], &opts, |_, _| {}).unwrap();
        let a = open(&without(&ps, &[])).unwrap();
        let stripe = a.geometry().data_members() as u64 * chunk;
        let mut model = vec![0u8; a.capacity() as usize];
        // Two full stripes at once, one full stripe, then partial writes on top.
        for (off, len) in [(0, 2 * stripe), (3 * stripe, stripe)] {
            let d: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            a.write(&d, off).unwrap();
            model[off as usize..(off + len) as usize].copy_from_slice(&d);
        }
        // Full stripes from several threads at once (the path a busy
        // server takes does its member I/O in the writing thread).
        let stripes = a.capacity() / stripe;
        let threads = 4u64;
        let data: Vec<Vec<u8>> = (0..stripes)
            .map(|_| (0..stripe).map(|_| rng.gen()).collect())
            .collect();
        std::thread::scope(|sc| {
            for t in 0..threads {
                let (a, data) = (&a, &data);
                sc.spawn(move || {
                    for round in 0..3 {
                        for s in (t..stripes).step_by(threads as usize) {
                            let d = &data[((s + round) % stripes) as usize];
                            a.write(d, s * stripe).unwrap();
                        }
                    }
                });
            }
        });
        for s in 0..stripes {
            let at = (s * stripe) as usize;
            model[at..at + stripe as usize].copy_from_slice(&data[((s + 2) % stripes) as usize]);
        }
        assert!(read_all(&a) == model, "{level}: concurrent full stripes");
        assert_eq!(a.count_mismatches().unwrap(), 0, "{level}");
        random_writes(&a, &mut model, &mut rng, 20);
        assert!(read_all(&a) == model, "{level}");
        assert_eq!(a.count_mismatches().unwrap(), 0, "{level}");
        a.close().unwrap();
        drop(a);
        for gone in 0..n {
            let present = without(&ps, &[gone]);
            assert!(
                read_all(&open(&present).unwrap()) == model,
                "{level} -{gone}"
            );
        }
    }
}

/// An array no write has come to for a second is marked clean in its
/// superblocks (as md's safe mode does), and dirty again by the next
/// write: a crash after an idle spell leaves nothing to resync, and a
/// degraded array without a journal then starts without `--force`.
#[test]
fn an_idle_array_is_marked_clean_so_a_crash_after_it_starts_without_force() {
    use raidkit_array::superblock::ArrayState;
    let dir = tmp();
    let ps = paths(dir.path(), 4);
    make(
        Level::Raid5,
        Layout::Parity(ParityLayout::LeftSymmetric),
        &ps,
    );
    let states_of = |ps: &[PathBuf]| -> Vec<ArrayState> {
        ps.iter()
            .map(|p| {
                read_superblock(&FileMember::open(p, true).unwrap())
                    .unwrap()
                    .sb
                    .state
            })
            .collect()
    };
    let states = || states_of(&ps);
    let all: Vec<Option<&PathBuf>> = ps.iter().map(Some).collect();
    let a = open(&all).unwrap();
    let data: Vec<u8> = (0..(3 * CHUNK) as u32).map(|i| (i % 251) as u8).collect();
    a.write(&data, 0).unwrap();
    assert!(!a.mark_clean_if_idle(), "marked clean right after a write");
    assert!(states().iter().all(|s| *s == ArrayState::Dirty));
    std::thread::sleep(std::time::Duration::from_millis(1100));
    assert!(a.mark_clean_if_idle());
    assert!(states().iter().all(|s| *s == ArrayState::Clean));
    // Degraded, written, idle again.
    a.fail_member("1", false).unwrap();
    a.write(&data, 3 * CHUNK).unwrap();
    let live: Vec<PathBuf> = without(&ps, &[1]).into_iter().flatten().cloned().collect();
    let live_states = || states_of(&live);
    assert!(live_states().iter().all(|s| *s == ArrayState::Dirty));
    std::thread::sleep(std::time::Duration::from_millis(1100));
    assert!(a.mark_clean_if_idle());
    assert!(live_states().iter().all(|s| *s == ArrayState::Clean));
    // A crash: the array is never closed (dropping it writes nothing).
    drop(a);
    let a = open(&without(&ps, &[1])).expect("a degraded array idle at a crash starts");
    let mut got = vec![0u8; data.len()];
    a.read(&mut got, 0).unwrap();
    assert!(got == data);
    a.read(&mut got, 3 * CHUNK).unwrap();
    assert!(got == data);
    a.close().unwrap();
}
