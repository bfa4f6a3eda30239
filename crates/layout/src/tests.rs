use super::*;
use proptest::prelude::*;
use std::collections::HashSet;

const K: u64 = 4096;

fn geom(level: Level, layout: Layout, n: usize, chunks_per_member: u64) -> Geometry {
    Geometry::new(level, layout, K, vec![chunks_per_member * K; n]).unwrap()
}

/// The classic md pictures: row r lists, per member, "P", "Q" or the data chunk number.
fn picture(g: &Geometry, rows: u64) -> Vec<Vec<String>> {
    (0..rows)
        .map(|s| {
            let m = g.stripe_map(s);
            let mut row = vec![String::new(); g.members()];
            row[m.p] = "P".into();
            if let Some(q) = m.q {
                row[q] = "Q".into();
            }
            for (dd, &member) in m.data.iter().enumerate() {
                row[member] = (s * g.data_members() as u64 + dd as u64).to_string();
            }
            row
        })
        .collect()
}

fn rows(spec: &[&str]) -> Vec<Vec<String>> {
    spec.iter()
        .map(|r| r.split_whitespace().map(String::from).collect())
        .collect()
}

#[test]
fn raid5_pictures_match_md() {
    let cases = [
        (
            ParityLayout::LeftSymmetric,
            ["0 1 2 P", "4 5 P 3", "8 P 6 7", "P 9 10 11"],
        ),
        (
            ParityLayout::LeftAsymmetric,
            ["0 1 2 P", "3 4 P 5", "6 P 7 8", "P 9 10 11"],
        ),
        (
            ParityLayout::RightSymmetric,
            ["P 0 1 2", "5 P 3 4", "7 8 P 6", "9 10 11 P"],
        ),
        (
            ParityLayout::RightAsymmetric,
            ["P 0 1 2", "3 P 4 5", "6 7 P 8", "9 10 11 P"],
        ),
        (
            ParityLayout::ParityFirst,
            ["P 0 1 2", "P 3 4 5", "P 6 7 8", "P 9 10 11"],
        ),
        (
            ParityLayout::ParityLast,
            ["0 1 2 P", "3 4 5 P", "6 7 8 P", "9 10 11 P"],
        ),
    ];
    for (alg, want) in cases {
        let g = geom(Level::Raid5, Layout::Parity(alg), 4, 8);
        assert_eq!(picture(&g, 4), rows(&want), "{alg:?}");
    }
}

#[test]
fn raid6_pictures_match_md() {
    let cases = [
        (
            ParityLayout::LeftSymmetric,
            [
                "Q 0 1 2 P",
                "3 4 5 P Q",
                "7 8 P Q 6",
                "11 P Q 9 10",
                "P Q 12 13 14",
            ],
        ),
        (
            ParityLayout::LeftAsymmetric,
            [
                "Q 0 1 2 P",
                "3 4 5 P Q",
                "6 7 P Q 8",
                "9 P Q 10 11",
                "P Q 12 13 14",
            ],
        ),
        (
            ParityLayout::RightSymmetric,
            [
                "P Q 0 1 2",
                "5 P Q 3 4",
                "7 8 P Q 6",
                "9 10 11 P Q",
                "Q 12 13 14 P",
            ],
        ),
        (
            ParityLayout::RightAsymmetric,
            [
                "P Q 0 1 2",
                "3 P Q 4 5",
                "6 7 P Q 8",
                "9 10 11 P Q",
                "Q 12 13 14 P",
            ],
        ),
        (
            ParityLayout::ParityFirst,
            [
                "P Q 0 1 2",
                "P Q 3 4 5",
                "P Q 6 7 8",
                "P Q 9 10 11",
                "P Q 12 13 14",
            ],
        ),
        (
            ParityLayout::ParityLast,
            [
                "0 1 2 P Q",
                "3 4 5 P Q",
                "6 7 8 P Q",
                "9 10 11 P Q",
                "12 13 14 P Q",
            ],
        ),
    ];
    for (alg, want) in cases {
        let g = geom(Level::Raid6, Layout::Parity(alg), 5, 8);
        assert_eq!(picture(&g, 5), rows(&want), "{alg:?}");
    }
}

/// md's ALGORITHM_*_6 (raid5_compute_sector): the RAID-5 layout over the
/// first n - 1 members (stripe modulo n - 1), Q always on the last. Drawn
/// from the RAID-5 pictures above with a Q column added.
#[test]
fn raid6_q_last_pictures_match_md() {
    let cases = [
        (
            ParityLayout::LeftSymmetric6,
            [
                "0 1 2 P Q",
                "4 5 P 3 Q",
                "8 P 6 7 Q",
                "P 9 10 11 Q",
                "12 13 14 P Q",
            ],
        ),
        (
            ParityLayout::LeftAsymmetric6,
            [
                "0 1 2 P Q",
                "3 4 P 5 Q",
                "6 P 7 8 Q",
                "P 9 10 11 Q",
                "12 13 14 P Q",
            ],
        ),
        (
            ParityLayout::RightSymmetric6,
            [
                "P 0 1 2 Q",
                "5 P 3 4 Q",
                "7 8 P 6 Q",
                "9 10 11 P Q",
                "P 12 13 14 Q",
            ],
        ),
        (
            ParityLayout::RightAsymmetric6,
            [
                "P 0 1 2 Q",
                "3 P 4 5 Q",
                "6 7 P 8 Q",
                "9 10 11 P Q",
                "P 12 13 14 Q",
            ],
        ),
        (
            ParityLayout::ParityFirst6,
            [
                "P 0 1 2 Q",
                "P 3 4 5 Q",
                "P 6 7 8 Q",
                "P 9 10 11 Q",
                "P 12 13 14 Q",
            ],
        ),
    ];
    for (alg, want) in cases {
        let g = geom(Level::Raid6, Layout::Parity(alg), 5, 8);
        assert_eq!(picture(&g, 5), rows(&want), "{alg:?}");
        // Q's sources in member order from the first (raid6_d0: Q is last).
        let sm = g.stripe_map(1);
        let mut by_member: Vec<(usize, usize)> = sm
            .data
            .iter()
            .zip(&sm.syndrome)
            .map(|(&m, &slot)| (m, slot))
            .collect();
        by_member.sort();
        assert!(by_member
            .iter()
            .enumerate()
            .all(|(i, &(_, slot))| slot == i));
        // The RAID-5 it came from: the same bytes on the first n - 1.
        let base = alg.raid5_part().unwrap();
        assert_eq!(ParityLayout::with_q_last(base), Some(alg));
        let g5 = geom(Level::Raid5, Layout::Parity(base), 4, 8);
        for s in 0..g5.stripes() {
            let (a, b) = (g5.stripe_map(s), g.stripe_map(s));
            assert_eq!((a.p, &a.data), (b.p, &b.data), "{alg:?} stripe {s}");
        }
    }
    // RAID-5 has no "-6" layouts.
    assert!(Layout::from_md_number(Level::Raid5, 18).is_none());
    assert!(Layout::parse(Level::Raid5, "left-symmetric-6").is_err());
    assert_eq!(
        Layout::parse(Level::Raid6, "ls-6").unwrap(),
        Layout::Parity(ParityLayout::LeftSymmetric6)
    );
}

#[test]
fn raid6_syndrome_order_follows_member_order_after_q() {
    // Left-asymmetric, 5 members, stripe 2: "6 7 P Q 8": md's syndrome walk
    // starts after Q (member 4, chunk 8), then members 0 and 1 (chunks 6, 7).
    let g = geom(
        Level::Raid6,
        Layout::Parity(ParityLayout::LeftAsymmetric),
        5,
        8,
    );
    let m = g.stripe_map(2);
    assert_eq!(m.data.to_vec(), vec![0, 1, 4]);
    assert_eq!(m.syndrome.to_vec(), vec![1, 2, 0]);
    // Left-symmetric: syndrome order is the logical order.
    let g = geom(
        Level::Raid6,
        Layout::Parity(ParityLayout::LeftSymmetric),
        5,
        8,
    );
    for s in 0..10 {
        assert_eq!(g.stripe_map(s).syndrome.to_vec(), vec![0, 1, 2]);
    }
}

#[test]
fn raid10_near2_matches_md() {
    // 4 members n2: chunk 0 on members 0,1; chunk 1 on 2,3; chunk 2 on 0,1 row 1.
    let g = geom(Level::Raid10, Layout::Near(2), 4, 8);
    let p = g.pieces(0, 3 * K);
    assert_eq!(p[0].copies.to_vec(), vec![(0, 0), (1, 0)]);
    assert_eq!(p[1].copies.to_vec(), vec![(2, 0), (3, 0)]);
    assert_eq!(p[2].copies.to_vec(), vec![(0, K), (1, K)]);
    // 3 members n2: copies rotate: chunk 1 on member 2 (row 0) and member 0 (row 1).
    let g = geom(Level::Raid10, Layout::Near(2), 3, 8);
    let p = g.pieces(K, K);
    assert_eq!(p[0].copies.to_vec(), vec![(2, 0), (0, K)]);
    assert_eq!(g.capacity(), 12 * K);
}

#[test]
fn raid0_and_linear() {
    let g = geom(Level::Raid0, Layout::None, 3, 4);
    let p = g.pieces(4 * K + 10, 100);
    assert_eq!(p[0].copies.to_vec(), vec![(1, K + 10)]);
    let g = Geometry::new(Level::Linear, Layout::None, K, vec![2 * K, 3 * K + 100]).unwrap();
    assert_eq!(g.capacity(), 5 * K);
    let p = g.pieces(K, 2 * K);
    assert_eq!(p.len(), 2);
    assert_eq!(p[0].copies.to_vec(), vec![(0, K)]);
    assert_eq!(p[1].copies.to_vec(), vec![(1, 0)]);
}

#[test]
fn shape_errors() {
    assert!(matches!(
        Geometry::new(
            Level::Raid5,
            Level::Raid5.default_layout(),
            3000,
            vec![1 << 20; 3]
        ),
        Err(LayoutError::BadChunk(3000))
    ));
    assert!(matches!(
        Geometry::new(
            Level::Raid5,
            Level::Raid5.default_layout(),
            2048,
            vec![1 << 20; 3]
        ),
        Err(LayoutError::BadChunk(2048))
    ));
    // Above 1 GiB: an intent record's window could not hold a stripe's.
    assert!(matches!(
        Geometry::new(
            Level::Raid5,
            Level::Raid5.default_layout(),
            4 << 30,
            vec![16 << 30; 3]
        ),
        Err(LayoutError::BadChunk(c)) if c == 4 << 30
    ));
    assert!(Geometry::new(
        Level::Raid5,
        Level::Raid5.default_layout(),
        1 << 30,
        vec![4 << 30; 3]
    )
    .is_ok());
    assert!(matches!(
        Geometry::new(
            Level::Raid6,
            Level::Raid6.default_layout(),
            K,
            vec![1 << 20; 3]
        ),
        Err(LayoutError::TooFewMembers { min: 4, got: 3, .. })
    ));
    assert!(matches!(
        Geometry::new(Level::Raid0, Layout::Near(2), K, vec![1 << 20; 3]),
        Err(LayoutError::LayoutNotForLevel { .. })
    ));
    assert!(matches!(
        Geometry::new(Level::Raid0, Layout::None, 1 << 20, vec![1000; 3]),
        Err(LayoutError::MemberTooSmall { .. })
    ));
    assert!("raid7".parse::<Level>().is_err());
    assert!(Layout::parse(Level::Raid5, "n2").is_err());
    assert!(Layout::parse(Level::Raid5, "sideways").is_err());
    // RAID-4's parity is on its last member, whatever a layout would say.
    assert_eq!(
        Layout::parse(Level::Raid4, "parity-last").unwrap(),
        Layout::Parity(ParityLayout::ParityLast)
    );
    for other in ["parity-first", "left-symmetric", "ra"] {
        assert!(Layout::parse(Level::Raid4, other).is_err(), "{other}");
    }
    assert!(Layout::parse(Level::Raid5, "parity-first").is_ok());
    assert_eq!(
        Layout::parse(Level::Raid6, "ls").unwrap(),
        Layout::Parity(ParityLayout::LeftSymmetric)
    );
}

fn all_shapes() -> Vec<(Level, Layout, usize)> {
    let mut v = Vec::new();
    for n in 1..=9 {
        v.push((Level::Linear, Layout::None, n));
        v.push((Level::Raid0, Layout::None, n));
        if n >= 2 {
            v.push((Level::Raid1, Layout::None, n));
            v.push((Level::Raid4, Level::Raid4.default_layout(), n));
            for alg in ParityLayout::ALL {
                v.push((Level::Raid5, Layout::Parity(alg), n));
                if n >= 4 {
                    v.push((Level::Raid6, Layout::Parity(alg), n));
                }
            }
            if n >= 4 {
                for alg in ParityLayout::Q_LAST {
                    v.push((Level::Raid6, Layout::Parity(alg), n));
                }
            }
            for c in 2..=3u8 {
                if n >= c as usize {
                    v.push((Level::Raid10, Layout::Near(c), n));
                    v.push((Level::Raid10, Layout::Far(c), n));
                    v.push((Level::Raid10, Layout::Offset(c), n));
                }
            }
        }
    }
    v
}

/// Every member chunk holds exactly one thing: one copy of one logical
/// chunk, or one stripe's P or Q. Checked over the whole array.
#[test]
fn every_chunk_placed_exactly_once() {
    for (level, layout, n) in all_shapes() {
        let mc = 2 * n as u64 + 3;
        let g = geom(level, layout, n, mc);
        let mut used = HashSet::new();
        let mut copies_total = 0u64;
        for c in 0..g.capacity() / K {
            let ps = g.pieces(c * K, K);
            assert_eq!(ps.len(), 1, "{level} {layout} n={n}");
            let p = &ps[0];
            for &(m, off) in &p.copies {
                assert_eq!(off % K, 0);
                assert!(off < g.member_sizes[m]);
                assert!(used.insert((m, off / K)), "{level} {layout} n={n}: reuse");
                copies_total += 1;
            }
        }
        if level.is_parity() {
            for s in 0..g.stripes() {
                let sm = g.stripe_map(s);
                for m in std::iter::once(sm.p).chain(sm.q) {
                    assert!(
                        used.insert((m, s)),
                        "{level} {layout} n={n}: parity collides"
                    );
                }
                let mut all: Vec<usize> = sm.data.to_vec();
                all.push(sm.p);
                all.extend(sm.q);
                all.sort_unstable();
                assert_eq!(all, (0..n).collect::<Vec<_>>());
                let mut syn = sm.syndrome.to_vec();
                syn.sort_unstable();
                assert_eq!(syn, (0..g.data_members()).collect::<Vec<_>>());
            }
        }
        // Capacity formulas.
        let chunks = g.capacity() / K;
        let want = match level {
            Level::Linear | Level::Raid0 => n as u64 * mc,
            Level::Raid1 => mc,
            Level::Raid4 | Level::Raid5 => (n as u64 - 1) * mc,
            Level::Raid6 => (n as u64 - 2) * mc,
            Level::Raid10 => match layout {
                Layout::Near(c) => n as u64 * mc / c as u64,
                Layout::Far(c) | Layout::Offset(c) => mc / c as u64 * n as u64,
                _ => unreachable!(),
            },
        };
        assert_eq!(chunks, want, "{level} {layout} n={n}");
        let copies = match (level, layout) {
            (Level::Raid1, _) => n as u64,
            (_, Layout::Near(c) | Layout::Far(c) | Layout::Offset(c)) => c as u64,
            _ => 1,
        };
        assert_eq!(copies_total, chunks * copies);
        if level.is_parity() || matches!(level, Level::Raid0 | Level::Linear | Level::Raid1) {
            // Every member chunk used: no waste.
            assert_eq!(used.len() as u64, n as u64 * mc, "{level} {layout} n={n}");
        }
    }
}

#[test]
fn parity_rotates_as_md() {
    for n in 2..=9usize {
        for alg in ParityLayout::ALL {
            for level in [Level::Raid5, Level::Raid6] {
                if level == Level::Raid6 && n < 4 {
                    continue;
                }
                let g = geom(level, Layout::Parity(alg), n, 3 * n as u64);
                let k = g.data_members();
                for s in 0..g.stripes() {
                    let sm = g.stripe_map(s);
                    let r = (s % n as u64) as usize;
                    let want_p = match alg {
                        ParityLayout::LeftAsymmetric | ParityLayout::LeftSymmetric => n - 1 - r,
                        ParityLayout::RightAsymmetric | ParityLayout::RightSymmetric => r,
                        ParityLayout::ParityFirst => 0,
                        ParityLayout::ParityLast => k,
                        other => unreachable!("{other:?} is not in ALL"),
                    };
                    assert_eq!(sm.p, want_p);
                    if let Some(q) = sm.q {
                        match alg {
                            ParityLayout::ParityFirst => assert_eq!(q, 1),
                            ParityLayout::ParityLast => assert_eq!(q, k + 1),
                            _ => assert_eq!(q, (sm.p + 1) % n),
                        }
                    }
                    // Symmetric layouts continue data right after the parity.
                    if matches!(
                        alg,
                        ParityLayout::LeftSymmetric | ParityLayout::RightSymmetric
                    ) {
                        let first = (sm.q.unwrap_or(sm.p) + 1) % n;
                        assert_eq!(sm.data[0], first);
                    }
                }
            }
        }
    }
}

proptest! {
    #[test]
    fn pieces_cover_range_in_order(
        shape in 0usize..200,
        chunk_shift in 12u32..17,
        a in 0u64..u64::MAX,
        b in 0u64..u64::MAX,
    ) {
        let shapes = all_shapes();
        let (level, layout, n) = shapes[shape % shapes.len()];
        let chunk = 1u64 << chunk_shift;
        let sizes: Vec<u64> = (0..n).map(|i| chunk * (5 + i as u64) + 123).collect();
        let g = Geometry::new(level, layout, chunk, sizes).unwrap();
        let cap = g.capacity();
        let off = a % cap;
        let len = b % (cap - off + 1);
        let ps = g.pieces(off, len);
        let mut pos = off;
        for p in &ps {
            prop_assert_eq!(p.logical, pos);
            prop_assert!(p.len > 0);
            for &(m, dev) in &p.copies {
                prop_assert!(dev + p.len <= g.member_sizes[m]);
                if level != Level::Linear {
                    prop_assert_eq!(dev % chunk, p.col);
                }
            }
            if level.is_parity() {
                // The piece lies in the chunk that stripe_data_offset names.
                let base = g.stripe_data_offset(p.stripe, p.dd);
                prop_assert_eq!(base + p.col, p.logical);
                let sm = g.stripe_map(p.stripe);
                prop_assert_eq!(p.copies[0], (sm.data[p.dd], p.stripe * chunk + p.col));
            }
            pos += p.len;
        }
        prop_assert_eq!(pos, off + len);
    }

    #[test]
    fn md_numbers_round_trip(shape in 0usize..200) {
        let shapes = all_shapes();
        let (level, layout, _) = shapes[shape % shapes.len()];
        prop_assert_eq!(Level::from_md_number(level.md_number()), Some(level));
        prop_assert_eq!(Layout::from_md_number(level, layout.md_number()), Some(layout));
    }

    #[test]
    fn survives_matches_redundancy(shape in 0usize..200, seed in any::<u64>()) {
        let shapes = all_shapes();
        let (level, layout, n) = shapes[shape % shapes.len()];
        let g = geom(level, layout, n, 4);
        // Any set of up to `redundancy()` members may go (worst case).
        let r = g.redundancy().min(n - 1);
        let mut missing: Vec<usize> = (0..n).collect();
        let mut s = seed;
        for i in (1..n).rev() {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            missing.swap(i, (s >> 33) as usize % (i + 1));
        }
        missing.truncate(r);
        prop_assert!(g.survives(&missing));
        if level != Level::Raid10 && n > r {
            let mut more: Vec<usize> = (0..n).collect();
            more.truncate(r + 1);
            prop_assert!(!g.survives(&more));
        }
    }
}

#[test]
fn mirror_chunk_at_inverts_placement() {
    for (level, layout, n) in [
        (Level::Raid1, Layout::None, 3),
        (Level::Raid10, Layout::Near(2), 3),
        (Level::Raid10, Layout::Near(2), 4),
        (Level::Raid10, Layout::Near(3), 5),
        (Level::Raid10, Layout::Far(2), 2),
        (Level::Raid10, Layout::Far(2), 3),
        (Level::Raid10, Layout::Far(3), 4),
        (Level::Raid10, Layout::Offset(2), 3),
        (Level::Raid10, Layout::Offset(3), 5),
    ] {
        let g = geom(level, layout, n, 8);
        let chunks = g.capacity() / K;
        let mut seen = 0;
        for role in 0..n {
            for row in 0..8 {
                let Some(c) = g.mirror_chunk_at(role, row) else {
                    continue;
                };
                seen += 1;
                let p = g.pieces(c * K, K);
                assert!(
                    p[0].copies.contains(&(role, row * K)),
                    "{level} n{n}: role {role} row {row} -> chunk {c}: {:?}",
                    p[0].copies
                );
            }
        }
        let copies = if level == Level::Raid1 {
            n as u64
        } else {
            let m = layout.md_number() as u64;
            (m & 0xff) * (m >> 8 & 0xff)
        };
        assert_eq!(seen, chunks * copies, "{level} n{n}");
    }
}

/// md's raid10 placement, transcribed from drivers/md/raid10.c with chunk
/// rows for sectors: calc_sectors (the rows each member uses, and the
/// stride between far copies) and __raid10_find_phys (every copy of a
/// chunk, as (member, row)), for far sets of every member (mdadm's).
fn md_raid10_find_phys(
    layout: u32,
    disks: u64,
    dev_chunks: u64,
    chunk_no: u64,
) -> Vec<(usize, u64)> {
    let nc = (layout & 0xff) as u64;
    let fc = (layout >> 8 & 0xff) as u64;
    let far_offset = layout & (1 << 16) != 0;
    let mut size = dev_chunks / fc * disks / nc;
    size = (size * nc * fc).div_ceil(disks);
    let stride = if far_offset { 1 } else { size / fc };
    let chunk = chunk_no * nc;
    let mut stripe = chunk / disks;
    let mut dev = chunk % disks;
    if far_offset {
        stripe *= fc;
    }
    let mut sector = stripe;
    let mut out = Vec::new();
    for _ in 0..nc {
        let mut d = dev;
        let mut s = sector;
        out.push((d as usize, s));
        for _ in 1..fc {
            d = (d + nc) % disks;
            s += stride;
            out.push((d as usize, s));
        }
        dev += 1;
        if dev >= disks {
            dev = 0;
            sector += 1;
        }
    }
    out
}

#[test]
fn raid10_near_far_and_offset_place_every_chunk_as_md() {
    for layout in [
        Layout::Near(2),
        Layout::Near(3),
        Layout::Far(2),
        Layout::Far(3),
        Layout::Offset(2),
        Layout::Offset(3),
    ] {
        let copies = (layout.md_number() & 0xff) * (layout.md_number() >> 8 & 0xff);
        for n in 2..=7usize {
            if (n as u32) < copies.max(2) {
                continue;
            }
            for mc in [7u64, 8, 17, 30] {
                let g = geom(Level::Raid10, layout, n, mc);
                // md's raid10_size.
                let near = (layout.md_number() & 0xff) as u64;
                let far = (layout.md_number() >> 8 & 0xff) as u64;
                assert_eq!(
                    g.capacity() / K,
                    mc / far * n as u64 / near,
                    "{layout} x{n} {mc}"
                );
                for c in 0..g.capacity() / K {
                    let want: Vec<(usize, u64)> =
                        md_raid10_find_phys(layout.md_number(), n as u64, mc, c)
                            .into_iter()
                            .map(|(m, row)| (m, row * K))
                            .collect();
                    let got = g.pieces(c * K + 100, 200);
                    assert_eq!(got.len(), 1);
                    let got: Vec<(usize, u64)> =
                        got[0].copies.iter().map(|&(m, d)| (m, d - 100)).collect();
                    assert_eq!(got, want, "{layout} x{n} members of {mc} chunks: chunk {c}");
                    assert!(got.iter().all(|&(_, d)| d < mc * K));
                }
            }
        }
    }
}

#[test]
fn raid10_far_two_on_three_members_is_mds_picture() {
    // md(4)'s far picture for 3 members, 2 copies: the array as RAID-0 in
    // the first half of each member, then again one member on.
    let g = geom(Level::Raid10, Layout::Far(2), 3, 4);
    let at = |c: u64| g.pieces(c * K, K)[0].copies.to_vec();
    assert_eq!(at(0), vec![(0, 0), (1, 2 * K)]);
    assert_eq!(at(1), vec![(1, 0), (2, 2 * K)]);
    assert_eq!(at(2), vec![(2, 0), (0, 2 * K)]);
    assert_eq!(at(3), vec![(0, K), (1, 3 * K)]);
    // Offset: each row followed by its copy one member on.
    let g = geom(Level::Raid10, Layout::Offset(2), 3, 4);
    let at = |c: u64| g.pieces(c * K, K)[0].copies.to_vec();
    assert_eq!(at(0), vec![(0, 0), (1, K)]);
    assert_eq!(at(2), vec![(2, 0), (0, K)]);
    assert_eq!(at(3), vec![(0, 2 * K), (1, 3 * K)]);
    assert_eq!(g.capacity(), 6 * K);
}

#[test]
fn raid10_layout_names_and_md_numbers() {
    for (name, layout, md) in [
        ("n2", Layout::Near(2), 0x102),
        ("f2", Layout::Far(2), 0x201),
        ("o2", Layout::Offset(2), 0x10201),
        ("f3", Layout::Far(3), 0x301),
    ] {
        assert_eq!(Layout::parse(Level::Raid10, name).unwrap(), layout);
        assert_eq!(layout.to_string(), name);
        assert_eq!(layout.md_number(), md);
        assert_eq!(Layout::from_md_number(Level::Raid10, md), Some(layout));
    }
    // Near and far copies both above 1, and md's far sets: not read.
    for md in [0x202, 0x20201, 0x101, 0x10102] {
        assert_eq!(Layout::from_md_number(Level::Raid10, md), None, "{md:#x}");
    }
    assert!(Layout::parse(Level::Raid5, "f2").is_err());
    assert!(Layout::parse(Level::Raid10, "f1").is_err());
}
