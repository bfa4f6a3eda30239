//! Growing arrays by members (`Array::grow`) and changing their chunk
//! (`Array::change_chunk`): the data afterwards equals the model and lies
//! on the members exactly where the new geometry (md's placement) puts it;
//! clients read and write throughout; power cuts at any point of a
//! reshape lose nothing that was flushed, and the next start goes on from
//! the checkpoint.

use raidkit_array::assemble::assemble;
use raidkit_array::create::{CreateOptions, Policy};
use raidkit_array::{Array, OpenOptions};
use raidkit_layout::{Geometry, Layout, Level, ParityLayout};
use raidkit_member::{CutRng, Member, MemberError, Op, PowerCutMember};
use raidkit_open::spec::Spec;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

const CHUNK: u64 = 16 << 10;
const MEMBER: u64 = (1 << 20) + 40 * CHUNK;

fn options(level: Level, policy: Policy, checksums: bool) -> CreateOptions {
    CreateOptions {
        level,
        layout: level.default_layout(),
        chunk: CHUNK,
        size: Some(MEMBER),
        name: "grow".into(),
        force: false,
        assume_clean: false,
        background_sync: false,
        bitmap_region: if level.has_redundancy() { 64 << 10 } else { 0 },
        policy: if level.has_redundancy() {
            policy
        } else {
            Policy::None
        },
        spares: Vec::new(),
        checksums,
        md: false,
        data_offset: None,
        domains: Vec::new(),
    }
}

/// Member images of a freshly created array, and blank ones to add.
fn images(level: Level, n: usize, add: usize, policy: Policy, checksums: bool) -> Vec<Vec<u8>> {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap());
    let paths: Vec<String> = (0..n)
        .map(|i| dir.path().join(format!("m{i}")).display().to_string())
        .collect();
    let specs: Vec<Spec> = paths.iter().map(|p| Spec::File(p.clone())).collect();
    raidkit_open::create(&specs, &[], &options(level, policy, checksums), |_, _| {}).unwrap();
    let mut out: Vec<Vec<u8>> = paths.iter().map(|p| std::fs::read(p).unwrap()).collect();
    let len = out[0].len();
    out.extend((0..add).map(|_| vec![0u8; len]));
    out
}

fn open(imgs: &[Vec<u8>]) -> raidkit_array::Result<(Array, Vec<Arc<PowerCutMember>>)> {
    let pcs: Vec<Arc<PowerCutMember>> = imgs
        .iter()
        .enumerate()
        .map(|(i, b)| Arc::new(PowerCutMember::new(&format!("m{i}"), b.clone())))
        .collect();
    let ms: Vec<Arc<dyn Member>> = pcs.iter().map(|p| p.clone() as Arc<dyn Member>).collect();
    let a = Array::open_with(
        assemble(ms)?,
        "grow",
        OpenOptions {
            run: true,
            ..OpenOptions::default()
        },
    )?;
    Ok((a, pcs))
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = CutRng::new(seed);
    let mut v = vec![0u8; len];
    for c in v.chunks_mut(8) {
        let x = rng.next_u64().to_le_bytes();
        c.copy_from_slice(&x[..c.len()]);
    }
    v
}

fn read_all(a: &Array) -> Vec<u8> {
    let mut b = vec![0u8; a.capacity() as usize];
    a.read(&mut b, 0).unwrap();
    b
}

/// Every byte of `data` (the array's first bytes) lies on the members
/// where geometry `g` places it, and every stripe's P and Q are what the
/// reference code computes from its data.
fn placed_as(g: &Geometry, members: &[Vec<u8>], data_offsets: &[u64], data: &[u8]) {
    for p in g.pieces(0, data.len() as u64) {
        let (role, dev) = p.copies[0];
        let at = (data_offsets[role] + dev) as usize;
        assert!(
            members[role][at..at + p.len as usize]
                == data[p.logical as usize..(p.logical + p.len) as usize],
            "array offset {} is not where the new geometry puts it (role {role}, member offset {dev})",
            p.logical
        );
    }
}

fn data_offsets(imgs: &[Vec<u8>]) -> Vec<u64> {
    imgs.iter()
        .map(|b| {
            let m = PowerCutMember::new("sb", b.clone());
            raidkit_array::superblock::read_superblock(&m)
                .unwrap()
                .sb
                .data_offset
        })
        .collect()
}

/// Grow `level` from `n` members by `add`, the array full of data: the
/// contents stay, the capacity grows, the members hold md's placement of
/// the new geometry, parity agrees, and a restart sees the same.
fn grows(level: Level, n: usize, add: usize, policy: Policy, checksums: bool) {
    let imgs = images(level, n, add, policy, checksums);
    let (a, pcs) = open(&imgs[..n]).unwrap();
    let old_cap = a.capacity();
    let data = pattern(old_cap as usize, n as u64 * 31 + add as u64);
    a.write(&data, 0).unwrap();
    let new: Vec<Arc<dyn Member>> = imgs[n..]
        .iter()
        .enumerate()
        .map(|(i, b)| {
            Arc::new(PowerCutMember::new(&format!("m{}", n + i), b.clone())) as Arc<dyn Member>
        })
        .collect();
    let news: Vec<Arc<dyn Member>> = new.clone();
    let g = a.grow(news, false).unwrap();
    assert!(a.reshape_in_progress());
    assert_eq!(a.capacity(), old_cap, "the new size is exported at the end");
    a.recover_all().unwrap();
    assert!(!a.reshape_in_progress());
    assert_eq!(a.capacity(), g.capacity());
    assert!(g.capacity() > old_cap);
    let got = read_all(&a);
    assert!(
        got[..old_cap as usize] == data[..],
        "{level} {n}+{add}: data changed"
    );
    assert!(
        got[old_cap as usize..].iter().all(|&x| x == 0),
        "{level} {n}+{add}: the new space does not read back zeroes"
    );
    // Writes of parts of stripes after the reshape, in the same run (the
    // journal's records now span the new member count).
    let mut data = got;
    for (i, off) in [
        5u64 << 10,
        g.capacity() / 2 + 3 * 512,
        g.capacity() - 100_000,
    ]
    .into_iter()
    .enumerate()
    {
        let bytes = pattern(70_000, 99 + i as u64);
        a.write(&bytes, off).unwrap();
        data[off as usize..off as usize + bytes.len()].copy_from_slice(&bytes);
    }
    a.flush().unwrap();
    assert!(
        read_all(&a) == data,
        "{level} {n}+{add}: writes after the reshape"
    );
    if level.has_redundancy() {
        assert_eq!(
            a.count_mismatches().unwrap(),
            0,
            "{level} {n}+{add}: parity"
        );
    }
    a.close().unwrap();
    let mut after: Vec<Vec<u8>> = pcs.iter().map(|p| p.durable()).collect();
    after.extend(new.iter().map(|m| {
        let mut b = vec![0u8; m.len() as usize];
        m.read_at(&mut b, 0).unwrap();
        b
    }));
    drop(a);
    placed_as(&g, &after, &data_offsets(&after), &data);
    let (b, _) = open(&after).unwrap();
    assert_eq!(b.capacity(), g.capacity());
    assert_eq!(b.geometry().members(), n + add);
    assert!(read_all(&b) == data);
}

#[test]
fn raid5_grows_by_one_and_by_two() {
    grows(Level::Raid5, 3, 1, Policy::Journal, false);
    grows(Level::Raid5, 4, 2, Policy::Bitmap, true);
}

#[test]
fn raid6_raid4_and_raid0_grow() {
    grows(Level::Raid6, 4, 1, Policy::Journal, true);
    grows(Level::Raid4, 3, 2, Policy::Journal, false);
    grows(Level::Raid0, 2, 1, Policy::None, false);
}

/// Change the chunk of a full `level` array of `n` members to `chunk`: the
/// contents stay, the members hold md's placement for the new chunk,
/// parity agrees, and a restart sees the same.
fn chunk_changes(level: Level, n: usize, policy: Policy, checksums: bool, chunk: u64) {
    let imgs = images(level, n, 0, policy, checksums);
    let (a, pcs) = open(&imgs).unwrap();
    let cap = a.capacity();
    let mut data = pattern(cap as usize, n as u64 * 7 + chunk);
    a.write(&data, 0).unwrap();
    let g = a.change_chunk(chunk).unwrap();
    assert_eq!(g.chunk, chunk);
    assert!(a.reshape_in_progress());
    a.recover_all().unwrap();
    assert!(!a.reshape_in_progress());
    assert_eq!(a.capacity(), cap);
    assert!(read_all(&a) == data, "{level} chunk {chunk}: data changed");
    let off = cap / 3 + 1536;
    let bytes = pattern(50_000, 5);
    a.write(&bytes, off).unwrap();
    data[off as usize..off as usize + bytes.len()].copy_from_slice(&bytes);
    a.flush().unwrap();
    if level.has_redundancy() {
        assert_eq!(
            a.count_mismatches().unwrap(),
            0,
            "{level} chunk {chunk}: parity"
        );
    }
    a.close().unwrap();
    let after: Vec<Vec<u8>> = pcs.iter().map(|p| p.durable()).collect();
    drop(a);
    placed_as(&g, &after, &data_offsets(&after), &data);
    let (b, _) = open(&after).unwrap();
    assert_eq!(b.geometry().chunk, chunk);
    assert!(!b.reshape_in_progress());
    assert!(read_all(&b) == data);
}

#[test]
fn the_chunk_changes_for_every_striped_level() {
    chunk_changes(Level::Raid5, 4, Policy::Journal, true, 4 << 10);
    chunk_changes(Level::Raid5, 3, Policy::Bitmap, false, 64 << 10);
    chunk_changes(Level::Raid6, 5, Policy::Journal, false, 32 << 10);
    chunk_changes(Level::Raid4, 3, Policy::None, true, 8 << 10);
    chunk_changes(Level::Raid0, 3, Policy::None, true, 128 << 10);
}

#[test]
fn chunk_changes_that_cannot_be_done_are_refused_with_nothing_changed() {
    let imgs = images(Level::Raid5, 3, 0, Policy::Journal, false);
    let (a, _) = open(&imgs).unwrap();
    let before = a.geometry();
    for (chunk, why) in [
        (CHUNK, "already"),
        (3000, "chunk"),
        // Each member uses 40 chunks of 16 KiB: not whole 2 MiB chunks.
        (2 << 20, "whole number"),
    ] {
        let e = a.change_chunk(chunk).unwrap_err().to_string();
        assert!(e.contains(why), "{chunk}: {e}");
    }
    assert!(!a.reshape_in_progress());
    assert_eq!(a.geometry(), before);
}

/// `n` cuts, times `RAIDKIT_CRASH_SCALE` (default 1) for a longer run.
fn scaled(n: u64) -> u64 {
    let k = std::env::var("RAIDKIT_CRASH_SCALE")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(1);
    n * k.max(1)
}

const SECTOR: usize = 512;

/// Cuts the power of every member at once, at the `budget`-th write or
/// flush any of them sees: cut points spread over every step of a
/// reshape (its first rows and their backup included) by count, not by
/// timing luck.
struct Tripwire {
    budget: AtomicI64,
    /// Set first: no operation starts after the cut (those under way land
    /// before it, or not, as the cut decides for unflushed writes).
    dead: std::sync::atomic::AtomicBool,
    members: Mutex<Vec<Arc<PowerCutMember>>>,
    rng: Mutex<CutRng>,
}

impl Tripwire {
    fn tick(&self) {
        if self.budget.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.cut();
        }
    }

    fn cut(&self) {
        self.dead.store(true, Ordering::Release);
        let mut rng = self.rng.lock().unwrap();
        for m in self.members.lock().unwrap().iter() {
            m.cut(&mut rng);
        }
    }
}

#[derive(Debug)]
struct Wired {
    inner: Arc<PowerCutMember>,
    wire: Arc<Tripwire>,
}

impl std::fmt::Debug for Tripwire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tripwire")
    }
}

impl Wired {
    fn gone(&self, op: Op) -> MemberError {
        MemberError::new(self.name(), op, 0, 0, std::io::Error::from_raw_os_error(5))
    }
}

impl Member for Wired {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> raidkit_member::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> raidkit_member::Result<()> {
        self.wire.tick();
        if self.wire.dead.load(Ordering::Acquire) {
            return Err(self.gone(Op::Write));
        }
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> raidkit_member::Result<()> {
        self.wire.tick();
        if self.wire.dead.load(Ordering::Acquire) {
            return Err(self.gone(Op::Flush));
        }
        self.inner.flush()
    }
}

type WiredSet = (
    Vec<Arc<PowerCutMember>>,
    Arc<Tripwire>,
    Vec<Arc<dyn Member>>,
);

/// Members with the images of `tpl`, behind one tripwire (disarmed).
fn wired(tpl: &[Vec<u8>], seed: u64) -> WiredSet {
    let pcs: Vec<Arc<PowerCutMember>> = tpl
        .iter()
        .enumerate()
        .map(|(i, b)| Arc::new(PowerCutMember::new(&format!("m{i}"), b.clone())))
        .collect();
    let wire = Arc::new(Tripwire {
        budget: AtomicI64::new(i64::MAX),
        dead: Default::default(),
        members: Mutex::new(pcs.clone()),
        rng: Mutex::new(CutRng::new(seed)),
    });
    let wired = pcs
        .iter()
        .map(|p| {
            Arc::new(Wired {
                inner: p.clone(),
                wire: wire.clone(),
            }) as Arc<dyn Member>
        })
        .collect();
    (pcs, wire, wired)
}

fn open_wired(ms: &[Arc<dyn Member>]) -> Array {
    Array::open_with(
        assemble(ms.to_vec()).unwrap(),
        "grow",
        OpenOptions {
            run: true,
            ..OpenOptions::default()
        },
    )
    .unwrap()
}

/// Grow while a client writes, flushes and reads back (every read checked
/// against the model), cut the power of every member at once at a random
/// write, restart, let the reshape finish: every write flushed before the
/// cut reads back, every sector not written since the last flush holds its
/// old contents, parity agrees, and the array has its new size.
/// What a reshape changes: members added, or the chunk.
#[derive(Debug, Clone, Copy)]
enum Change {
    Add(usize),
    Chunk(u64),
}

fn reshape_survives_cuts(
    level: Level,
    n: usize,
    change: Change,
    policy: Policy,
    cuts: u64,
    seed: u64,
) {
    let add = match change {
        Change::Add(k) => k,
        Change::Chunk(_) => 0,
    };
    let tpl = images(level, n, add, policy, seed.is_multiple_of(2));
    let mut resumed_critical = 0;
    let mut cut_during = 0;
    // Cuts inside a change of chunk's batch (set aside in each member's
    // slot, the journal's space), and how many of them had a slot rotted.
    let (mut in_batch, mut rotted) = (0, 0);
    for c in 0..scaled(cuts) {
        let mut rng = CutRng::new(seed * 1_000_003 + c);
        let (pcs, wire, wired) = wired(&tpl, rng.next_u64());
        let a = open_wired(&wired[..n]);
        let a = Arc::new(a);
        let cap = a.capacity() as usize;
        let old_data_members = a.geometry().data_members() as u64;
        let base = pattern(cap, seed + c);
        a.write(&base, 0).unwrap();
        a.flush().unwrap();
        let mut durable = base.clone();
        let mut current = base;
        let mut dirty = vec![false; cap / SECTOR];
        // The cut comes at one of the next writes or flushes: the grow's
        // own, the reshape's, the client's.
        wire.budget.store(
            1 + rng.below(200 * (n + add) as u64) as i64,
            Ordering::Release,
        );
        let started = match change {
            Change::Add(_) => a.grow(wired[n..].to_vec(), false),
            Change::Chunk(c) => a.change_chunk(c),
        };
        let g = match started {
            Ok(g) => g,
            // Cut while the members joined: the restart finds the array
            // as it was or already growing, and either is fine.
            Err(_) => {
                let _ = a.flush();
                drop(a);
                wire.cut();
                let imgs: Vec<Vec<u8>> = pcs.iter().map(|p| p.durable()).collect();
                let (b, _) = open(&imgs)
                    .or_else(|_| open(&imgs[..n]))
                    .unwrap_or_else(|e| panic!("{level} cut {c} in grow: restart: {e}"));
                b.recover_all().unwrap();
                let got = read_all(&b);
                assert!(got[..cap] == durable[..], "{level} cut {c} in grow: data");
                continue;
            }
        };
        let rate = (8 + rng.below(40)) << 20;
        a.set_rebuild_speed(Some(rate), Some(rate));
        let bg = {
            let a = a.clone();
            std::thread::spawn(move || {
                let _ = a.recover_all();
            })
        };
        loop {
            let op = rng.below(6);
            let r = match op {
                0 => a.flush().map(|()| {
                    durable.clone_from(&current);
                    dirty.iter_mut().for_each(|d| *d = false);
                }),
                1 => {
                    let len = SECTOR * (1 + rng.below(4 * CHUNK / SECTOR as u64) as usize);
                    let off = SECTOR * rng.below(((cap - len) / SECTOR + 1) as u64) as usize;
                    let mut b = vec![0u8; len];
                    a.read(&mut b, off as u64).map(|()| {
                        assert!(
                            b == current[off..off + len],
                            "{level} cut {c}: a read during the reshape at {off}+{len} differs from what was written"
                        );
                    })
                }
                2 => {
                    std::thread::sleep(std::time::Duration::from_micros(rng.below(500)));
                    Ok(())
                }
                op => {
                    let (len, off) = if op == 5 && rng.below(2) == 0 {
                        // Whole stripes of the old geometry (full-stripe
                        // writes, which log only their intent).
                        let stripe = (CHUNK * old_data_members) as usize;
                        let len = stripe * (1 + rng.below(2) as usize);
                        (
                            len,
                            stripe * rng.below(((cap - len) / stripe + 1) as u64) as usize,
                        )
                    } else {
                        let len = SECTOR * (1 + rng.below(3 * CHUNK / SECTOR as u64) as usize);
                        (
                            len,
                            SECTOR * rng.below(((cap - len) / SECTOR + 1) as u64) as usize,
                        )
                    };
                    let byte = (rng.next_u64() & 0xff) as u8;
                    let data: Vec<u8> = (0..len).map(|i| byte ^ (i / SECTOR) as u8).collect();
                    // Dirty before it is sent: a write the cut interrupts
                    // may have landed in part.
                    dirty[off / SECTOR..(off + len) / SECTOR]
                        .iter_mut()
                        .for_each(|d| *d = true);
                    a.write(&data, off as u64).map(|()| {
                        current[off..off + len].copy_from_slice(&data);
                    })
                }
            };
            if r.is_err() || wire.budget.load(Ordering::Acquire) <= 0 {
                break;
            }
            if !a.reshape_in_progress() {
                break;
            }
        }
        if a.reshape_in_progress() {
            cut_during += 1;
        }
        wire.budget.store(i64::MAX, Ordering::Release);
        wire.cut();
        a.stop_background();
        bg.join().unwrap();
        let mut imgs: Vec<Vec<u8>> = pcs.iter().map(|p| p.durable()).collect();
        drop(a);
        // Every other cut inside a batch, one member's slot rots: that
        // member is as good as lost for the batch, and the array must
        // start without it (failed), not refuse to start.
        // The newest superblock, the one the start goes by.
        let sb = imgs
            .iter()
            .filter_map(|img| {
                raidkit_array::superblock::read_superblock(&PowerCutMember::new("sb", img.clone()))
                    .ok()
            })
            .map(|r| r.sb)
            .max_by_key(|sb| sb.events)
            .unwrap();
        let rot = matches!(change, Change::Chunk(_))
            && policy == Policy::Journal
            && sb.reshape.is_some_and(|r| r.backup > 0)
            && {
                in_batch += 1;
                in_batch % 2 == 1
            };
        if rot {
            imgs[1][(sb.journal.offset + 4096 + 100) as usize] ^= 0x40;
            rotted += 1;
        }

        let (b, _) = open(&imgs).unwrap_or_else(|e| {
            for (i, img) in imgs.iter().enumerate() {
                let m = PowerCutMember::new("sb", img.clone());
                let r = raidkit_array::superblock::read_superblock(&m).unwrap();
                eprintln!(
                    "m{i}: events {} disks {} role {:?} reshape {:?} copies {:?}",
                    r.sb.events,
                    r.sb.roles.len(),
                    r.sb.role,
                    r.sb.reshape,
                    r.copies_valid
                );
            }
            panic!("{level} cut {c}: restart: {e}")
        });
        if b.notes()
            .iter()
            .any(|n| n.contains("backup") || n.contains("put back"))
        {
            resumed_critical += 1;
        }
        if rot {
            let st = b.members_status();
            let failed: Vec<_> = st.iter().filter(|m| m.state == "faulty").collect();
            assert!(
                failed.len() == 1 && failed[0].path.as_deref() == Some("m1"),
                "{level} cut {c}: the member with the rotten slot: {st:?}"
            );
        }
        b.recover_all().unwrap();
        assert!(
            !b.reshape_in_progress(),
            "{level} cut {c}: reshape not finished"
        );
        assert_eq!(b.capacity(), g.capacity(), "{level} cut {c}: new size");
        let got = read_all(&b);
        let bad = got[..cap]
            .chunks(SECTOR)
            .zip(durable.chunks(SECTOR))
            .zip(&dirty)
            .filter(|((g, d), &dirty)| !dirty && g != d)
            .count();
        assert_eq!(bad, 0, "{level} cut {c}: sectors lost or changed");
        // Degraded (a member failed for its rotten slot): the data read
        // above came through parity wherever that member held it.
        if level.has_redundancy() && !rot {
            let mut found = Vec::new();
            b.scan_mismatches(&mut |m| found.push(m)).unwrap();
            if !found.is_empty() {
                let m = PowerCutMember::new("sb", imgs[0].clone());
                let sb = raidkit_array::superblock::read_superblock(&m).unwrap().sb;
                eprintln!(
                    "at restart: {:?} state {:?} notes {:?} health {:?} last {:?} members {:?}",
                    sb.reshape,
                    sb.state,
                    b.notes(),
                    b.health(),
                    b.last_recovery(),
                    b.members_status()
                        .iter()
                        .map(|m| m.state)
                        .collect::<Vec<_>>()
                );
                eprintln!("mismatches: {found:?}");
                for (i, img) in imgs.iter().enumerate() {
                    let m = PowerCutMember::new("sb", img.clone());
                    let r = raidkit_array::superblock::read_superblock(&m).unwrap();
                    eprintln!(
                        "m{i}: events {} disks {} role {:?} reshape {:?} rec {:?} roles {:?}",
                        r.sb.events,
                        r.sb.roles.len(),
                        r.sb.role,
                        r.sb.reshape,
                        r.sb.recovery_offset,
                        r.sb.roles.iter().map(|e| e.state).collect::<Vec<_>>()
                    );
                }
            }
            assert_eq!(found.len(), 0, "{level} cut {c}: parity");
        }
    }
    // The cuts must have landed in the reshape, and some in its first rows.
    assert!(
        cut_during * 2 > scaled(cuts),
        "{level}: only {cut_during} cuts during a reshape"
    );
    assert!(
        resumed_critical > 0,
        "{level}: no cut in the critical section"
    );
    if matches!(change, Change::Chunk(_)) && policy == Policy::Journal {
        assert!(rotted > 0, "{level}: no cut in a batch had its slot rotted");
    }
}

#[test]
fn raid5_reshape_survives_power_cuts() {
    reshape_survives_cuts(Level::Raid5, 3, Change::Add(1), Policy::Journal, 150, 1);
    reshape_survives_cuts(Level::Raid5, 4, Change::Add(1), Policy::Bitmap, 100, 2);
}

#[test]
fn raid6_reshape_survives_power_cuts() {
    reshape_survives_cuts(Level::Raid6, 4, Change::Add(2), Policy::Journal, 100, 3);
}

#[test]
fn raid0_reshape_survives_power_cuts() {
    reshape_survives_cuts(Level::Raid0, 2, Change::Add(1), Policy::None, 100, 4);
}

#[test]
fn chunk_changes_survive_power_cuts() {
    reshape_survives_cuts(
        Level::Raid5,
        4,
        Change::Chunk(4 << 10),
        Policy::Journal,
        100,
        5,
    );
    reshape_survives_cuts(
        Level::Raid6,
        5,
        Change::Chunk(64 << 10),
        Policy::Bitmap,
        100,
        6,
    );
    reshape_survives_cuts(
        Level::Raid5,
        3,
        Change::Chunk(32 << 10),
        Policy::None,
        60,
        8,
    );
    reshape_survives_cuts(Level::Raid0, 3, Change::Chunk(8 << 10), Policy::None, 60, 7);
}

/// The data areas of member images (their bytes from the data offset on).
fn data_areas(imgs: &[Vec<u8>]) -> Vec<Vec<u8>> {
    imgs.iter()
        .zip(data_offsets(imgs))
        .map(|(b, off)| b[off as usize..].to_vec())
        .collect()
}

/// A takeover to RAID-5 (two-member RAID-1, RAID-4) moves no byte: the
/// members' data areas are what they were, the array reads the same,
/// parity agrees; then it grows by a member into md's placement.
fn taken_over_then_grown(level: Level, n: usize, policy: Policy, checksums: bool) {
    let imgs = images(level, n, 1, policy, checksums);
    let (a, pcs) = open(&imgs[..n]).unwrap();
    let cap = a.capacity();
    let data = pattern(cap as usize, 77 + n as u64);
    a.write(&data, 0).unwrap();
    a.flush().unwrap();
    let before: Vec<Vec<u8>> = pcs.iter().map(|p| p.durable()).collect();
    let g = a.take_over(Level::Raid5).unwrap();
    assert_eq!(g.level, Level::Raid5);
    assert_eq!(a.capacity(), cap);
    assert_eq!(a.geometry().level, Level::Raid5);
    a.flush().unwrap();
    let after: Vec<Vec<u8>> = pcs.iter().map(|p| p.durable()).collect();
    assert!(
        data_areas(&before) == data_areas(&after),
        "{level}: a takeover moved data"
    );
    assert!(read_all(&a) == data, "{level}: data after the takeover");
    assert_eq!(
        a.count_mismatches().unwrap(),
        0,
        "{level}: parity after the takeover"
    );
    let new = Arc::new(PowerCutMember::new(&format!("m{n}"), imgs[n].clone()));
    let g = a.grow(vec![new.clone() as Arc<dyn Member>], false).unwrap();
    a.recover_all().unwrap();
    assert_eq!(a.geometry().members(), n + 1);
    let mut all = data.clone();
    all.resize(g.capacity() as usize, 0);
    assert!(read_all(&a) == all, "{level}: data after the grow");
    assert_eq!(a.count_mismatches().unwrap(), 0);
    a.close().unwrap();
    let mut imgs: Vec<Vec<u8>> = pcs.iter().map(|p| p.durable()).collect();
    imgs.push(new.durable());
    drop(a);
    placed_as(&g, &imgs, &data_offsets(&imgs), &all);
    let (b, _) = open(&imgs).unwrap();
    assert_eq!(b.geometry().level, Level::Raid5);
    assert!(read_all(&b) == all);
}

#[test]
fn two_member_raid1_and_raid4_become_raid5_in_place_then_grow() {
    taken_over_then_grown(Level::Raid1, 2, Policy::Bitmap, true);
    taken_over_then_grown(Level::Raid1, 2, Policy::None, false);
    taken_over_then_grown(Level::Raid4, 3, Policy::Journal, false);
    taken_over_then_grown(Level::Raid4, 4, Policy::Bitmap, true);
}

#[test]
fn takeovers_that_would_move_data_are_refused() {
    let imgs = images(Level::Raid1, 3, 0, Policy::Bitmap, false);
    let (a, _) = open(&imgs).unwrap();
    let e = a.take_over(Level::Raid5).unwrap_err().to_string();
    assert!(e.contains("two members only"), "{e}");
    let e = a.take_over(Level::Raid6).unwrap_err().to_string();
    assert!(e.contains("not supported"), "{e}");
    assert_eq!(a.geometry().level, Level::Raid1);
    let imgs = images(Level::Raid5, 4, 0, Policy::Journal, false);
    let (a, _) = open(&imgs).unwrap();
    // RAID-5 to RAID-6 needs the member for Q.
    let e = a.take_over(Level::Raid6).unwrap_err().to_string();
    assert!(e.contains("new member for Q"), "{e}");
    assert_eq!(a.geometry().level, Level::Raid5);
}

#[test]
fn a_member_for_q_that_fails_to_join_is_not_left_behind_as_a_spare() {
    // The new member's writes fail after the k-th: early, its joining as a
    // spare is refused; later, its taking the role for Q. Either way the
    // array stays a RAID-5 and the member is not kept as a spare.
    let imgs = images(Level::Raid5, 4, 1, Policy::Journal, false);
    let mut after_spare = 0;
    let mut joined = false;
    for k in 0..40 {
        let (a, _) = open(&imgs[..4]).unwrap();
        let inner = Arc::new(PowerCutMember::new("m4", imgs[4].clone()));
        let cfg = raidkit_member::FaultConfig::parse(&format!("fail-writes-after={k}")).unwrap();
        let new = Arc::new(raidkit_member::FaultMember::new(inner, cfg));
        match a.take_over_adding(Level::Raid6, new as Arc<dyn Member>, false) {
            Ok(g) => {
                assert_eq!(g.level, Level::Raid6);
                joined = true;
                break;
            }
            Err(e) => {
                let e = e.to_string();
                assert_eq!(a.geometry().level, Level::Raid5, "k {k}: {e}");
                let kept: Vec<_> = a
                    .members_status()
                    .into_iter()
                    .filter(|m| m.path.as_deref().is_some_and(|p| p.contains("m4")))
                    .collect();
                assert!(kept.is_empty(), "k {k}: {e}; still there: {kept:?}");
                if e.contains("could not take the role for Q") {
                    after_spare += 1;
                }
            }
        }
    }
    assert!(joined, "no write budget let the member join");
    assert!(
        after_spare > 0,
        "no failure came after the member joined as a spare"
    );
}

/// RAID-5 to RAID-6 with a new member (md's takeover with
/// `--layout=preserve`): the old members' data areas are byte for byte what
/// they were, Q is built on the new one, parity (P and Q, in md's syndrome
/// order) agrees, every byte is where md's "-6" layout puts it, and a
/// restart is a RAID-6.
fn raid5_takes_a_member_for_q(n: usize, policy: Policy, checksums: bool) {
    let imgs = images(Level::Raid5, n, 1, policy, checksums);
    let (a, pcs) = open(&imgs[..n]).unwrap();
    let cap = a.capacity();
    let data = pattern(cap as usize, 91 + n as u64);
    a.write(&data, 0).unwrap();
    a.flush().unwrap();
    let before: Vec<Vec<u8>> = pcs.iter().map(|p| p.durable()).collect();
    let new = Arc::new(PowerCutMember::new(&format!("m{n}"), imgs[n].clone()));
    let g = a
        .take_over_adding(Level::Raid6, new.clone() as Arc<dyn Member>, false)
        .unwrap();
    assert_eq!(
        (g.level, g.layout, g.members()),
        (
            Level::Raid6,
            Layout::Parity(ParityLayout::LeftSymmetric6),
            n + 1
        )
    );
    assert_eq!(a.capacity(), cap);
    // Written while Q is being built.
    let mut data = data;
    let w = pattern(3 * CHUNK as usize + 777, 5);
    a.write(&w, CHUNK + 11).unwrap();
    data[(CHUNK + 11) as usize..(CHUNK + 11) as usize + w.len()].copy_from_slice(&w);
    a.recover_all().unwrap();
    a.flush().unwrap();
    assert!(read_all(&a) == data, "RAID-6 of {}: data", n + 1);
    assert_eq!(a.count_mismatches().unwrap(), 0, "P and Q");
    a.close().unwrap();
    let after: Vec<Vec<u8>> = pcs.iter().map(|p| p.durable()).collect();
    // Only the write above changed the old members' data areas: the rest
    // did not move.
    let (b4, af) = (data_areas(&before), data_areas(&after));
    let g5 = Geometry::new(
        Level::Raid5,
        Layout::Parity(ParityLayout::LeftSymmetric),
        g.chunk,
        g.member_sizes[..n].to_vec(),
    )
    .unwrap();
    let touched: std::collections::BTreeSet<u64> = g5
        .pieces(CHUNK + 11, w.len() as u64)
        .into_iter()
        .map(|p| p.copies[0].1 / g.chunk)
        .collect();
    for (r, (x, y)) in b4.iter().zip(&af).enumerate() {
        for (c, (cx, cy)) in x
            .chunks(g.chunk as usize)
            .zip(y.chunks(g.chunk as usize))
            .enumerate()
        {
            assert!(
                cx == cy || touched.contains(&(c as u64)),
                "member {r} chunk {c} moved"
            );
        }
    }
    let mut imgs = after;
    imgs.push(new.durable());
    drop(a);
    placed_as(&g, &imgs, &data_offsets(&imgs), &data);
    let (b, _) = open(&imgs).unwrap();
    assert_eq!(b.geometry().level, Level::Raid6);
    assert!(read_all(&b) == data);
    assert_eq!(b.count_mismatches().unwrap(), 0);
}

#[test]
fn raid5_becomes_raid6_with_a_new_member_for_q() {
    raid5_takes_a_member_for_q(3, Policy::Journal, true);
    raid5_takes_a_member_for_q(4, Policy::Bitmap, false);
    raid5_takes_a_member_for_q(3, Policy::None, false);
}

/// A crash while Q is being built on an array without a journal: every
/// data member and P are there, the member missing its Q holds no data, so
/// the next start resyncs what was being written and builds Q on, without
/// --force (the write hole needs a missing member that holds data).
#[test]
fn a_crash_while_q_is_built_without_a_journal_restarts_on_its_own() {
    for policy in [Policy::Bitmap, Policy::None] {
        let n = 3;
        let imgs = images(Level::Raid5, n, 1, policy, false);
        let (a, mut pcs) = open(&imgs[..n]).unwrap();
        let mut data = pattern(a.capacity() as usize, 17);
        a.write(&data, 0).unwrap();
        a.flush().unwrap();
        let new = Arc::new(PowerCutMember::new(&format!("m{n}"), imgs[n].clone()));
        a.take_over_adding(Level::Raid6, new.clone() as Arc<dyn Member>, false)
            .unwrap();
        pcs.push(new);
        // Written while Q is being built, then the crash: what is durable.
        let w = pattern(5 * CHUNK as usize + 123, 6);
        a.write(&w, 2 * CHUNK + 5).unwrap();
        data[(2 * CHUNK + 5) as usize..(2 * CHUNK + 5) as usize + w.len()].copy_from_slice(&w);
        a.flush().unwrap();
        let crashed: Vec<Vec<u8>> = pcs.iter().map(|p| p.durable()).collect();
        drop(a);
        let (b, _) = open(&crashed).unwrap_or_else(|e| panic!("{policy:?}: {e}"));
        assert_eq!(b.geometry().level, Level::Raid6);
        assert!(read_all(&b) == data, "{policy:?}: data");
        b.recover_all().unwrap();
        assert_eq!(b.health(), raidkit_array::Health::Optimal, "{policy:?}");
        assert!(read_all(&b) == data, "{policy:?}: data after recovery");
        assert_eq!(b.count_mismatches().unwrap(), 0, "{policy:?}: P and Q");
    }
}

/// A power cut at any write of a RAID-5 to RAID-6 change (the member
/// joining as a spare, the takeover's update, Q being built): the next
/// start finds a RAID-5 or a RAID-6, with every flushed byte, and ends
/// with P and Q right.
#[test]
fn raid5_to_raid6_cut_at_any_write_starts_at_either_level() {
    let n = 3;
    let tpl = images(Level::Raid5, n, 1, Policy::Journal, true);
    let mut levels = std::collections::BTreeSet::new();
    for budget in 1..=40 {
        let (pcs, wire, wired) = wired(&tpl, budget);
        let a = open_wired(&wired[..n]);
        let data = pattern(a.capacity() as usize, budget);
        a.write(&data, 0).unwrap();
        a.flush().unwrap();
        wire.budget.store(budget as i64, Ordering::Release);
        let _ = a.take_over_adding(Level::Raid6, wired[n].clone(), false);
        wire.budget.store(i64::MAX, Ordering::Release);
        wire.cut();
        drop(a);
        let imgs: Vec<Vec<u8>> = pcs.iter().map(|p| p.durable()).collect();
        // Cut before the new member had a superblock: it is a blank disk,
        // not one of the array's.
        let has_sb = raidkit_array::superblock::read_superblock(&PowerCutMember::new(
            "new",
            imgs[n].clone(),
        ))
        .is_ok();
        let imgs = &imgs[..if has_sb { n + 1 } else { n }];
        let (b, _) = open(imgs).unwrap_or_else(|e| panic!("cut at write {budget}: {e}"));
        levels.insert(b.geometry().level.to_string());
        assert!(read_all(&b) == data, "cut at write {budget}: data");
        b.recover_all().unwrap();
        assert!(
            read_all(&b) == data,
            "cut at write {budget}: data after recovery"
        );
        assert_eq!(b.count_mismatches().unwrap(), 0, "cut at write {budget}");
    }
    assert_eq!(levels.len(), 2, "{levels:?}");
}

/// A power cut anywhere in a takeover's superblock update: the next start
/// finds the array at one level or the other, with the same data.
#[test]
fn a_takeover_cut_at_any_write_starts_at_either_level() {
    let n = 2;
    let tpl = images(Level::Raid1, n, 0, Policy::Bitmap, true);
    let mut levels = std::collections::BTreeSet::new();
    for budget in 1..=24 {
        let (pcs, wire, wired) = wired(&tpl, budget);
        let a = open_wired(&wired);
        let data = pattern(a.capacity() as usize, budget);
        a.write(&data, 0).unwrap();
        a.flush().unwrap();
        wire.budget.store(budget as i64, Ordering::Release);
        let _ = a.take_over(Level::Raid5);
        wire.budget.store(i64::MAX, Ordering::Release);
        wire.cut();
        drop(a);
        let imgs: Vec<Vec<u8>> = pcs.iter().map(|p| p.durable()).collect();
        let (b, _) = open(&imgs).unwrap_or_else(|e| panic!("cut at write {budget}: {e}"));
        levels.insert(b.geometry().level.to_string());
        assert!(read_all(&b) == data, "cut at write {budget}: data");
        b.recover_all().unwrap();
        assert_eq!(b.count_mismatches().unwrap(), 0, "cut at write {budget}");
    }
    // Cuts before, inside and after the update.
    assert_eq!(levels.len(), 2, "{levels:?}");
}
