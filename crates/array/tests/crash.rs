//! Crash consistency against a model, over members that lose power: random
//! workloads of partial-stripe writes and flushes, power cut at a random
//! point (each member drops, keeps or tears each unflushed write), restart,
//! (the workloads include whole-stripe writes, which log their intent only),
//! and check that
//!   (a) every write flushed before the cut reads back,
//!   (b) every sector not written since the last flush holds its old contents,
//!   (c) parity is consistent after recovery,
//!   (d) with any one member (any two on RAID-6) then removed, (a) and (b)
//!       still hold, and also when that member is missing at the restart
//!       itself (crash and member loss together: the write hole),
//!   (e) with every member back, every sector written since the last flush
//!       holds its old contents or what one of those writes put there,
//!       never a mix put together at recovery (journal replay, a bitmap
//!       resync, a rebuild or initial sync resumed).
//! With the bitmap policy and a member missing at restart, the same checks
//! must find the write hole: that is what the journal is for.
//! Each runs without checksums and with them (the default for new arrays):
//! with them, a block torn from its checksum by the cut must never count
//! as a checksum error nor be "repaired" from redundancy (it is adopted).

use raidkit_array::assemble::assemble;
use raidkit_array::create::{CreateOptions, Policy};
use raidkit_array::{Array, OpenOptions};
use raidkit_layout::Level;
use raidkit_member::{CutRng, Member, PowerCutMember};
use raidkit_open::spec::Spec;
use std::sync::Arc;

const CHUNK: u64 = 16 << 10;
const MEMBER: u64 = (1 << 20) + 24 * CHUNK;
const SECTOR: usize = 512;

thread_local! {
    /// Whether the arrays this test's thread creates keep checksums.
    static CHECKSUMS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Run `f` with arrays created with checksums.
fn with_checksums(f: impl FnOnce()) {
    CHECKSUMS.with(|c| c.set(true));
    f();
}

/// `n` cuts, times `RAIDKIT_CRASH_SCALE` (default 1) for a longer run.
fn scaled(n: u64) -> u64 {
    let k = std::env::var("RAIDKIT_CRASH_SCALE")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(1);
    n * k.max(1)
}

/// Checksum errors counted on an array's members.
fn checksum_errors(a: &Array) -> u64 {
    a.members_status()
        .iter()
        .filter_map(|m| m.errors)
        .map(|e| e.checksum)
        .sum()
}

/// Blank member images of a freshly created array.
fn template(level: Level, n: usize, policy: Policy) -> Vec<Vec<u8>> {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap());
    let paths: Vec<String> = (0..n)
        .map(|i| dir.path().join(format!("m{i}")).display().to_string())
        .collect();
    let opts = CreateOptions {
        level,
        layout: level.default_layout(),
        chunk: CHUNK,
        size: Some(MEMBER),
        name: "crash".into(),
        force: false,
        assume_clean: false,
        background_sync: false,
        bitmap_region: 64 << 10,
        policy,
        spares: Vec::new(),
        checksums: CHECKSUMS.with(|c| c.get()),
        md: false,
        data_offset: None,
        domains: Vec::new(),
    };
    let specs: Vec<Spec> = paths.iter().map(|p| Spec::File(p.clone())).collect();
    raidkit_open::create(&specs, &[], &opts, |_, _| {}).unwrap();
    paths.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

fn open(
    images: &[Option<Vec<u8>>],
    force: bool,
) -> raidkit_array::Result<(Array, Vec<Arc<PowerCutMember>>)> {
    let pcs: Vec<Arc<PowerCutMember>> = images
        .iter()
        .enumerate()
        .filter_map(|(i, m)| {
            m.as_ref()
                .map(|b| Arc::new(PowerCutMember::new(&format!("m{i}"), b.clone())))
        })
        .collect();
    let ms: Vec<Arc<dyn Member>> = pcs.iter().map(|p| p.clone() as Arc<dyn Member>).collect();
    let a = Array::open_with(
        assemble(ms)?,
        "crash",
        OpenOptions {
            force,
            readd_stale: true,
            // The tests start without members on purpose.
            run: true,
            ..OpenOptions::default()
        },
    )?;
    Ok((a, pcs))
}

/// The model: what was durable at the last flush, and which sectors were
/// written after it.
struct Model {
    durable: Vec<u8>,
    current: Vec<u8>,
    dirty: Vec<bool>,
    /// Sectors written at all by the workload.
    written: Vec<bool>,
    /// Whether anything was written at all (else the array stayed clean).
    wrote: bool,
    /// Per sector written since the last flush, what those writes put there
    /// (hashes): after a cut it holds its durable contents or one of these.
    since: std::collections::HashMap<usize, Vec<u64>>,
}

fn sector_hash(b: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    b.hash(&mut h);
    h.finish()
}

impl Model {
    /// Sectors that must hold their durable contents, and whether they do.
    fn violations(&self, got: &[u8]) -> usize {
        got.chunks(SECTOR)
            .zip(self.durable.chunks(SECTOR))
            .zip(&self.dirty)
            .filter(|((g, d), &dirty)| !dirty && g != d)
            .count()
    }

    /// Sectors written since the last flush that hold neither their
    /// durable contents nor what one of those writes put there (a block
    /// put together wrongly at recovery).
    fn garbled(&self, got: &[u8]) -> Vec<usize> {
        self.since
            .iter()
            .filter(|&(&i, hashes)| {
                let g = &got[i * SECTOR..(i + 1) * SECTOR];
                g != &self.durable[i * SECTOR..(i + 1) * SECTOR]
                    && !hashes.contains(&sector_hash(g))
            })
            .map(|(&i, _)| i)
            .collect()
    }
}

/// Check (e): nothing written since the last flush reads back garbled.
fn assert_not_garbled(m: &Model, got: &[u8], what: &str) {
    let g = m.garbled(got);
    assert!(
        g.is_empty(),
        "{what}: sectors {g:?} hold neither their old contents nor a write's"
    );
}

fn read_all(a: &Array) -> Vec<u8> {
    let mut b = vec![0u8; a.capacity() as usize];
    a.read(&mut b, 0).unwrap();
    b
}

/// A random workload, then a power cut. Returns the model and the images
/// that survived.
fn workload(tpl: &[Vec<u8>], rng: &mut CutRng) -> (Model, Vec<Vec<u8>>) {
    workload_with(tpl, rng, false)
}

/// The workload, optionally while a member is rebuilt in the background
/// (slowly, so that the cut lands in the middle of it).
fn workload_with(tpl: &[Vec<u8>], rng: &mut CutRng, rebuild: bool) -> (Model, Vec<Vec<u8>>) {
    workload_ops(tpl, rng, rebuild, 24)
}

/// As `workload_with`, with 1 to `max_ops` operations.
fn workload_ops(
    tpl: &[Vec<u8>],
    rng: &mut CutRng,
    rebuild: bool,
    max_ops: u64,
) -> (Model, Vec<Vec<u8>>) {
    workload_pattern(tpl, rng, rebuild, max_ops, Pattern::Random)
}

/// Where a workload's writes go.
#[derive(Clone, Copy)]
enum Pattern {
    /// Mostly partial-stripe writes, sector aligned, some across chunks;
    /// one in four rewrites one or two whole stripes (logged as intent
    /// only when every member is in service).
    Random,
    /// A sequential stream of whole-stripe writes (one or two stripes at a
    /// time, wrapping at the end), whose intents are logged ahead of it,
    /// with partial-stripe writes just ahead of the stream and rewrites of
    /// stripes it just passed: a later whole-stripe write must never be
    /// undone at replay by the record of an earlier partial one.
    Stream,
}

/// One operation: a flush (None) or a write of `len` bytes at `off`.
fn next_op(
    pattern: Pattern,
    rng: &mut CutRng,
    cap: usize,
    stripe: usize,
    pos: &mut usize,
) -> Option<(usize, usize)> {
    let partial = |rng: &mut CutRng, lo: usize, hi: usize| {
        let len = SECTOR * (1 + rng.below(3 * CHUNK / SECTOR as u64) as usize);
        let hi = hi.min(cap - len).max(lo);
        (
            lo + SECTOR * rng.below(((hi - lo) / SECTOR + 1) as u64) as usize,
            len,
        )
    };
    let stripes = cap / stripe;
    match pattern {
        _ if rng.below(5) == 0 => None,
        Pattern::Random if rng.below(4) == 0 => {
            let n = 1 + rng.below(2) as usize;
            Some((
                stripe * rng.below((stripes - n + 1) as u64) as usize,
                n * stripe,
            ))
        }
        Pattern::Random => Some(partial(rng, 0, cap)),
        Pattern::Stream => match rng.below(8) {
            0 | 1 => Some(partial(rng, *pos * stripe, (*pos + 8) * stripe)),
            2 => {
                let back = (*pos).min(1 + rng.below(4) as usize);
                Some(((*pos - back) * stripe, stripe))
            }
            _ => {
                let n = (1 + rng.below(2) as usize).min(stripes - *pos);
                let at = *pos * stripe;
                *pos = if *pos + n >= stripes { 0 } else { *pos + n };
                Some((at, n * stripe))
            }
        },
    }
}

/// As `workload_ops`, writing by `pattern`.
fn workload_pattern(
    tpl: &[Vec<u8>],
    rng: &mut CutRng,
    rebuild: bool,
    max_ops: u64,
    pattern: Pattern,
) -> (Model, Vec<Vec<u8>>) {
    let imgs: Vec<Option<Vec<u8>>> = tpl.iter().cloned().map(Some).collect();
    let (a, pcs) = open(&imgs, false).unwrap();
    let a = Arc::new(a);
    let rebuilder = rebuild.then(|| {
        assert!(a.needs_recovery(), "nothing to rebuild");
        a.set_rebuild_speed(Some(4 << 20), Some(4 << 20));
        let a = a.clone();
        std::thread::spawn(move || {
            let _ = a.recover_all();
        })
    });
    let cap = a.capacity() as usize;
    let mut m = Model {
        durable: read_all(&a),
        current: Vec::new(),
        dirty: vec![false; cap / SECTOR],
        written: vec![false; cap / SECTOR],
        wrote: false,
        since: Default::default(),
    };
    m.current = m.durable.clone();
    let ops = 1 + rng.below(max_ops);
    let stripe = CHUNK as usize * a.geometry().data_members();
    let mut pos = 0;
    for _ in 0..ops {
        let Some((off, len)) = next_op(pattern, rng, cap, stripe, &mut pos) else {
            a.flush().unwrap();
            m.durable.clone_from(&m.current);
            m.since.clear();
            m.dirty.iter_mut().for_each(|d| *d = false);
            continue;
        };
        let byte = (rng.next_u64() & 0xff) as u8;
        let data: Vec<u8> = (0..len).map(|i| byte ^ (i / SECTOR) as u8).collect();
        a.write(&data, off as u64).unwrap();
        m.wrote = true;
        m.current[off..off + len].copy_from_slice(&data);
        for (i, sector) in data.chunks(SECTOR).enumerate() {
            m.since
                .entry(off / SECTOR + i)
                .or_default()
                .push(sector_hash(sector));
        }
        m.dirty[off / SECTOR..(off + len) / SECTOR]
            .iter_mut()
            .for_each(|d| *d = true);
        m.written[off / SECTOR..(off + len) / SECTOR]
            .iter_mut()
            .for_each(|d| *d = true);
    }
    // One instant for every member, even while the sync thread writes.
    PowerCutMember::cut_all(&pcs.iter().map(|p| &**p).collect::<Vec<_>>(), rng);
    if let Some(t) = rebuilder {
        a.stop_background();
        t.join().unwrap();
    }
    let imgs = pcs.iter().map(|p| p.durable()).collect();
    drop(a);
    (m, imgs)
}

/// Every subset of `k` members out of `n`.
fn subsets(n: usize, k: usize) -> Vec<Vec<usize>> {
    if k == 0 {
        return vec![vec![]];
    }
    let mut out = Vec::new();
    for i in 0..n {
        for mut rest in subsets(n, k - 1) {
            if rest.iter().all(|&r| r > i) {
                rest.insert(0, i);
                out.push(rest);
            }
        }
    }
    out
}

fn without(imgs: &[Vec<u8>], gone: &[usize]) -> Vec<Option<Vec<u8>>> {
    imgs.iter()
        .enumerate()
        .map(|(i, b)| (!gone.contains(&i)).then(|| b.clone()))
        .collect()
}

fn journal_survives_cuts(level: Level, n: usize, cuts: u64, seed: u64) {
    journal_survives_cuts_in(level, n, cuts, seed, Pattern::Random, 24);
}

fn journal_survives_cuts_in(
    level: Level,
    n: usize,
    cuts: u64,
    seed: u64,
    pattern: Pattern,
    max_ops: u64,
) {
    let tpl = template(level, n, Policy::Journal);
    let lose = level.parity_count();
    let gone_sets = subsets(n, lose);
    for c in 0..scaled(cuts) {
        let mut rng = CutRng::new(seed * 1_000_003 + c);
        let (m, imgs) = workload_pattern(&tpl, &mut rng, false, max_ops, pattern);

        // Restart with every member: recovery replays the journal.
        let all: Vec<Option<Vec<u8>>> = imgs.iter().cloned().map(Some).collect();
        let (a, pcs) = open(&all, false).unwrap();
        let got = read_all(&a);
        assert_eq!(
            m.violations(&got),
            0,
            "{level} cut {c}: (a)/(b) after restart"
        );
        assert_not_garbled(&m, &got, &format!("{level} cut {c}"));
        assert_eq!(checksum_errors(&a), 0, "{level} cut {c}: torn, not rotten");
        assert_eq!(
            a.count_mismatches().unwrap(),
            0,
            "{level} cut {c}: (c) parity"
        );
        a.close().unwrap();
        let recovered: Vec<Vec<u8>> = pcs.iter().map(|p| p.durable()).collect();
        drop(a);
        // (d) members removed after recovery: what is left still reads right.
        let gone = &gone_sets[(c as usize) % gone_sets.len()];
        let (b, _) = open(&without(&recovered, gone), false).unwrap();
        assert!(
            read_all(&b) == got,
            "{level} cut {c}: roles {gone:?} removed after recovery"
        );
        drop(b);

        // Crash and member loss together: restart without them.
        let (d, _) = open(&without(&imgs, gone), false).unwrap();
        let degraded = read_all(&d);
        assert_eq!(
            m.violations(&degraded),
            0,
            "{level} cut {c}: restarted without roles {gone:?} (write hole)"
        );
    }
}

#[test]
fn raid5_journal_survives_power_cuts() {
    journal_survives_cuts(Level::Raid5, 4, 1000, 1);
}

#[test]
fn raid6_journal_survives_power_cuts() {
    journal_survives_cuts(Level::Raid6, 5, 550, 2);
}

#[test]
fn raid5_journal_with_checksums_survives_power_cuts() {
    with_checksums(|| journal_survives_cuts(Level::Raid5, 4, 600, 3));
}

#[test]
fn raid6_journal_with_checksums_survives_power_cuts() {
    with_checksums(|| journal_survives_cuts(Level::Raid6, 5, 300, 4));
}

#[test]
fn raid5_journal_survives_power_cuts_in_sequential_streams() {
    journal_survives_cuts_in(Level::Raid5, 4, 400, 5, Pattern::Stream, 60);
}

#[test]
fn raid6_journal_with_checksums_survives_power_cuts_in_sequential_streams() {
    with_checksums(|| journal_survives_cuts_in(Level::Raid6, 5, 200, 6, Pattern::Stream, 60));
}

/// Blocks that rot while nothing writes them, in stripes whose intents
/// were logged ahead of a sequential writer (records not yet
/// checkpointed): after a power cut, replay recomputes those stripes'
/// parity from their data, and must first put the rotten blocks back from
/// redundancy (each checked against its own checksum), never take them as
/// they are.
#[test]
fn raid5_blocks_rotten_in_stripes_logged_ahead_are_healed_at_replay() {
    with_checksums(|| rot_in_stripes_logged_ahead(Level::Raid5, 4, 1));
}

/// As above, two rotten data blocks in one column of each stripe on RAID-6.
#[test]
fn raid6_two_blocks_rotten_in_stripes_logged_ahead_are_healed_at_replay() {
    with_checksums(|| rot_in_stripes_logged_ahead(Level::Raid6, 5, 2));
}

/// A new array of `level` with every block written once (a block never
/// written since create has no checksum yet: it is sealed as first read)
/// and made durable: the array, its members, the bytes of a stripe, the
/// stripes and what was written.
#[allow(clippy::type_complexity)]
fn written_once(
    level: Level,
    n: usize,
    policy: Policy,
) -> (Array, Vec<Arc<PowerCutMember>>, usize, usize, Vec<u8>) {
    let tpl = template(level, n, policy);
    let imgs: Vec<Option<Vec<u8>>> = tpl.iter().cloned().map(Some).collect();
    let (a, pcs) = open(&imgs, false).unwrap();
    let stripe = CHUNK as usize * a.geometry().data_members();
    let stripes = a.capacity() as usize / stripe;
    let cap = a.capacity() as usize;
    let first: Vec<u8> = (0..cap).map(|i| (i / SECTOR) as u8 ^ 0x33).collect();
    a.write(&first, 0).unwrap();
    a.flush().unwrap();
    (a, pcs, stripe, stripes, first)
}

/// Cut the power to every member of `a`: the images that survived, and
/// where the members' data starts.
fn power_cut(a: Array, pcs: &[Arc<PowerCutMember>], seed: u64) -> (Vec<Vec<u8>>, usize) {
    PowerCutMember::cut_all(
        &pcs.iter().map(|p| &**p).collect::<Vec<_>>(),
        &mut CutRng::new(seed),
    );
    let imgs: Vec<Vec<u8>> = pcs.iter().map(|p| p.durable()).collect();
    drop(a);
    let m = PowerCutMember::new("m0", imgs[0].clone());
    let data_offset = raidkit_array::superblock::read_superblock(&m)
        .unwrap()
        .sb
        .data_offset as usize;
    (imgs, data_offset)
}

fn rot_in_stripes_logged_ahead(level: Level, n: usize, per_stripe: usize) {
    let (a, pcs, stripe, stripes, _) = written_once(level, n, Policy::Journal);
    let g = a.geometry();
    // Then a sequential writer of whole stripes, two at a time: from its
    // second run on, intents are logged ahead of it.
    let written = 8;
    for s in (0..written).step_by(2) {
        a.write(&vec![s as u8 + 1; 2 * stripe], (s * stripe) as u64)
            .unwrap();
    }
    a.flush().unwrap();
    let want = read_all(&a);
    let (mut imgs, data_offset) = power_cut(a, &pcs, 7);
    // In every stripe after the stream, data blocks of one column rot.
    let blocks = CHUNK as usize / 4096;
    for s in written..stripes {
        let sm = g.stripe_map(s as u64);
        let at = data_offset + s * CHUNK as usize + (s % blocks) * 4096 + 100;
        for k in 0..per_stripe {
            imgs[sm.data[(s + k) % sm.data.len()]][at] ^= 0x5a;
        }
    }
    let all: Vec<Option<Vec<u8>>> = imgs.into_iter().map(Some).collect();
    let (a, _) = open(&all, false).unwrap();
    let got = read_all(&a);
    let bad: Vec<usize> = (0..stripes)
        .filter(|&s| got[s * stripe..(s + 1) * stripe] != want[s * stripe..(s + 1) * stripe])
        .collect();
    assert!(
        bad.is_empty(),
        "{level}: rotten data served from stripes {bad:?}"
    );
    assert_eq!(a.count_mismatches().unwrap(), 0, "{level}: parity");
}

/// With the bitmap policy a crash leaves the regions being written open:
/// until the resync has passed them, a block there that disagrees with its
/// checksum may be torn by a write in flight, or may have rotted. A read
/// there, and the resync, must put rot back from redundancy (a rebuild
/// that agrees with the block's own checksum), and take as it is only
/// what cannot be rebuilt so.
#[test]
fn raid5_rot_in_a_bitmap_crash_window_is_healed_by_reads_and_the_resync() {
    with_checksums(|| rot_in_bitmap_window(Level::Raid5, 4, 1));
}

/// As above, two rotten data blocks in one column of each stripe on RAID-6.
#[test]
fn raid6_two_blocks_rotten_in_a_bitmap_crash_window_are_healed() {
    with_checksums(|| rot_in_bitmap_window(Level::Raid6, 5, 2));
}

/// As above, one copy of a block rotten in every chunk row of a RAID-1 and
/// of a RAID-10: put back from the other copy.
#[test]
fn mirrors_rot_in_a_bitmap_crash_window_is_healed_by_reads_and_the_resync() {
    with_checksums(|| {
        rot_in_bitmap_window(Level::Raid1, 2, 1);
        rot_in_bitmap_window(Level::Raid10, 4, 1);
    });
}

fn rot_in_bitmap_window(level: Level, n: usize, per_stripe: usize) {
    let (a, pcs, stripe, stripes, first) = written_once(level, n, Policy::Bitmap);
    let g = a.geometry();
    // The first block of every stripe rewritten, not flushed: every
    // region of the bitmap is marked when the power goes.
    const NEW: u8 = 0xee;
    for s in 0..stripes {
        a.write(&[NEW; 4096], (s * stripe) as u64).unwrap();
    }
    let (mut imgs, data_offset) = power_cut(a, &pcs, 11);
    // In every stripe, data blocks of a column those writes did not touch
    // rot.
    let blocks = CHUNK as usize / 4096;
    for s in 0..stripes {
        let col = 1 + s % (blocks - 1);
        let at = data_offset + s * CHUNK as usize + col * 4096 + 100;
        if level.is_parity() {
            let sm = g.stripe_map(s as u64);
            for k in 0..per_stripe {
                imgs[sm.data[(s + k) % sm.data.len()]][at] ^= 0x5a;
            }
        } else {
            // A mirror: one copy of a chunk of member row `s`.
            imgs[s % n][at] ^= 0x5a;
        }
    }
    let check_against = |got: &[u8], want: &[u8], what: &str| {
        let mut bad = Vec::new();
        for s in 0..stripes {
            let base = s * stripe;
            // The block being written at the cut: each sector old or new.
            let torn = (base..base + 4096).step_by(SECTOR).any(|x| {
                let sec = &got[x..x + SECTOR];
                sec != &first[x..x + SECTOR] && sec.iter().any(|&b| b != NEW)
            });
            if torn || got[base + 4096..base + stripe] != want[base + 4096..base + stripe] {
                bad.push(s);
            }
        }
        assert!(
            bad.is_empty(),
            "{level}, {what}: wrong data served from stripes {bad:?}"
        );
    };
    let check = |got: &[u8], what: &str| check_against(got, &first, what);
    let all: Vec<Option<Vec<u8>>> = imgs.into_iter().map(Some).collect();
    // Read before the resync has run...
    let (a, _) = open(&all, false).unwrap();
    check(&read_all(&a), "read in the crash window");
    assert_eq!(checksum_errors(&a), 0, "{level}: the window counts nothing");
    a.recover_all().unwrap();
    check(&read_all(&a), "after the resync");
    drop(a);
    // ...and the resync alone: it must write every rotten block back (a
    // read after it, outside the window, would count the rot it finds).
    let (a, _) = open(&all, false).unwrap();
    a.recover_all().unwrap();
    assert_eq!(a.last_recovery().unwrap().kind, "parity-resync");
    check(&read_all(&a), "after the resync alone");
    assert_eq!(checksum_errors(&a), 0, "{level}: rot left after the resync");
    assert_eq!(a.count_mismatches().unwrap(), 0, "{level}: parity");
    drop(a);
    // Reads put rot back in memory, a client then writes the blocks that
    // rotted in every other stripe (each chunk's block of the column):
    // the resync's write-back of what the reads put back must not undo
    // those writes.
    let (a, _) = open(&all, false).unwrap();
    check(&read_all(&a), "read in the crash window");
    let mut want = first.clone();
    for s in (0..stripes).step_by(2) {
        let col = 1 + s % (blocks - 1);
        for dd in 0..g.data_members() {
            let at = s * stripe + dd * CHUNK as usize + col * 4096;
            want[at..at + 4096].fill(0xc4);
            a.write(&want[at..at + 4096], at as u64).unwrap();
        }
    }
    a.recover_all().unwrap();
    check_against(&read_all(&a), &want, "written after a read put rot back");
    assert_eq!(checksum_errors(&a), 0, "{level}: rot left after the resync");
    assert_eq!(a.count_mismatches().unwrap(), 0, "{level}: parity");
}

/// After an unclean stop with a bitmap, mirror copies may differ in the
/// marked regions (a write reached one copy and not the other). Until the
/// resync has passed, reads there take the first copy, the one the resync
/// copies to the others: what a read returns before the resync, it returns
/// after it too (taking turns by chunk, or by head position, a reader
/// would see a block change under it with no write).
#[test]
fn mirror_reads_before_the_resync_give_what_the_resync_keeps() {
    for (level, n) in [(Level::Raid1, 2), (Level::Raid10, 4)] {
        let (a, pcs, stripe, stripes, _) = written_once(level, n, Policy::Bitmap);
        for s in 0..stripes {
            a.write(&[0xee; 4096], (s * stripe) as u64).unwrap();
        }
        let (mut imgs, data_offset) = power_cut(a, &pcs, 7);
        // Every copy but the first differs in the first block of every
        // chunk (near layouts over an even count: the first copy is on the
        // even member of each pair).
        let rows = (MEMBER as usize - data_offset) / CHUNK as usize;
        for (i, img) in imgs.iter_mut().enumerate().filter(|(i, _)| i % 2 == 1) {
            for r in 0..rows {
                let at = data_offset + r * CHUNK as usize;
                img[at..at + 4096].fill(0xa0 + i as u8);
            }
        }
        let all: Vec<Option<Vec<u8>>> = imgs.into_iter().map(Some).collect();
        let (a, _) = open(&all, false).unwrap();
        let before = read_all(&a);
        a.recover_all().unwrap();
        assert_eq!(a.last_recovery().unwrap().kind, "parity-resync");
        let after = read_all(&a);
        let changed: Vec<usize> = (0..before.len() / CHUNK as usize)
            .filter(|&c| {
                let r = c * CHUNK as usize..(c + 1) * CHUNK as usize;
                before[r.clone()] != after[r]
            })
            .collect();
        assert!(
            changed.is_empty(),
            "{level}: chunks read differently before and after the resync: {changed:?}"
        );
        assert_eq!(a.count_mismatches().unwrap(), 0, "{level}: copies equal");
    }
}

/// Every stripe of `a` (written with `first`) written again in its first
/// block, unflushed, so that the bitmap marks every region; then the
/// power cut (`power_cut`).
fn marked_and_cut(
    a: Array,
    pcs: &[Arc<PowerCutMember>],
    first: &[u8],
    seed: u64,
) -> (Vec<Vec<u8>>, usize) {
    let stripe = CHUNK as usize * a.geometry().data_members();
    for s in 0..first.len() / stripe {
        a.write(&first[s * stripe..s * stripe + 4096], (s * stripe) as u64)
            .unwrap();
    }
    power_cut(a, pcs, seed)
}

/// The array of member images `imgs`, member `which` wrapped in a fault
/// member configured by `faults` (`fault:` query syntax).
fn open_with_fault(imgs: &[Vec<u8>], which: usize, faults: &str) -> Array {
    let members: Vec<Arc<dyn Member>> = imgs
        .iter()
        .enumerate()
        .map(|(i, img)| {
            let m: Arc<dyn Member> = Arc::new(PowerCutMember::new(&format!("m{i}"), img.clone()));
            if i != which {
                return m;
            }
            let cfg = raidkit_member::FaultConfig::parse(faults).unwrap();
            Arc::new(raidkit_member::FaultMember::new(m, cfg)) as Arc<dyn Member>
        })
        .collect();
    let opts = OpenOptions {
        run: true,
        ..OpenOptions::default()
    };
    Array::open_with(assemble(members).unwrap(), "crash", opts).unwrap()
}

/// Blocks put back by reads are kept for the resync to write back, a
/// bounded number: reads of the same blocks again and again, and more
/// blocks than are kept, must not leave the resync unable to keep (and
/// write back) what its own reads put back. Four kept at most here; the
/// rotten blocks of the last four stripes read three times each before the
/// resync, which must then leave no rot behind anywhere.
#[test]
fn more_heals_than_are_kept_still_leave_no_rot_after_the_resync() {
    with_checksums(|| {
        let (a, pcs, stripe, stripes, first) = written_once(Level::Raid5, 4, Policy::Bitmap);
        let g = a.geometry();
        let (mut imgs, data_offset) = marked_and_cut(a, &pcs, &first, 3);
        // Block 1 of each stripe's second data chunk rots.
        for s in 0..stripes {
            let at = data_offset + s * CHUNK as usize + 4096 + 9;
            imgs[g.stripe_map(s as u64).data[1]][at] ^= 0x5a;
        }
        let all: Vec<Option<Vec<u8>>> = imgs.into_iter().map(Some).collect();
        let (a, _) = open(&all, false).unwrap();
        a.set_window_kept_max(4);
        let mut blk = vec![0u8; 4096];
        for _ in 0..3 {
            for s in stripes - 4..stripes {
                let at = s * stripe + CHUNK as usize + 4096;
                a.read(&mut blk, at as u64).unwrap();
                assert!(blk == first[at..at + 4096], "stripe {s} read wrong");
            }
        }
        a.recover_all().unwrap();
        assert!(read_all(&a) == first, "wrong data after the resync");
        assert_eq!(checksum_errors(&a), 0, "rot left after the resync");
        assert_eq!(a.count_mismatches().unwrap(), 0, "parity");
    });
}

/// A read in a crash window heals a rotten block from its column while a
/// client writes another block of that column: halfway through the
/// write (the data written, the parity not yet, its member slow to
/// write) the column does not rebuild the rotten block, which would then
/// be taken as it is, rot served and its checksum replaced. The heal waits
/// for the write (the stripe's lock): every read gives the data written.
#[test]
fn a_heal_racing_a_write_of_its_column_never_takes_the_rot() {
    with_checksums(|| {
        let (a, pcs, _, _, first) = written_once(Level::Raid5, 4, Policy::Bitmap);
        let sm = a.geometry().stripe_map(0);
        let (mut imgs, data_offset) = marked_and_cut(a, &pcs, &first, 9);
        // Block 1 of stripe 0's first data chunk rots.
        imgs[sm.data[0]][data_offset + 4096 + 9] ^= 0x5a;
        let a = open_with_fault(&imgs, sm.p, "write-delay=300ms");
        let rotten = 4096usize;
        let want = &first[rotten..rotten + 4096];
        let done = std::sync::atomic::AtomicBool::new(false);
        let mut wrong = 0;
        let mut reads = 0;
        std::thread::scope(|sc| {
            sc.spawn(|| {
                // Block 1 of the second data chunk: the same column.
                for k in 0..3u8 {
                    a.write(&[0xa0 + k; 4096], CHUNK + 4096).unwrap();
                }
                done.store(true, std::sync::atomic::Ordering::Release);
            });
            let mut blk = vec![0u8; 4096];
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                a.read(&mut blk, rotten as u64).unwrap();
                reads += 1;
                if blk != want {
                    wrong += 1;
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        });
        assert!(reads > 10, "the reads did not overlap the writes ({reads})");
        assert_eq!(wrong, 0, "rot served by {wrong} of {reads} reads");
        let mut blk = vec![0u8; 4096];
        a.read(&mut blk, rotten as u64).unwrap();
        assert!(blk == want, "rot served after the writes");
    });
}

/// A rebuild onto a new member while a crash window is still open (the
/// resync stopped when a member was lost) reads the other members from
/// threads of its own, for stripes it has locked: a block there that
/// disagrees with its checksum must not have them wait for those locks
/// (5 s each). Six such blocks; the rebuild must take well under one wait.
#[test]
fn a_rebuild_in_an_open_crash_window_does_not_wait_for_its_own_locks() {
    with_checksums(|| {
        let (a, pcs, _, _, first) = written_once(Level::Raid5, 4, Policy::Bitmap);
        let g = a.geometry();
        let (mut imgs, data_offset) = marked_and_cut(a, &pcs, &first, 3);
        for s in 0..6 {
            let r = g.stripe_map(s as u64).data[1];
            if r != 2 {
                imgs[r][data_offset + s * CHUNK as usize + 4096 + 9] ^= 0x5a;
            }
        }
        let len = imgs[2].len();
        let all: Vec<Option<Vec<u8>>> = imgs.into_iter().map(Some).collect();
        let (a, _) = open(&all, false).unwrap();
        a.fail_member("m2", true).unwrap();
        a.recover_all().unwrap();
        let fresh: Arc<dyn Member> = Arc::new(PowerCutMember::new("m9", vec![0u8; len]));
        a.add_member(fresh, true).unwrap();
        let t = std::time::Instant::now();
        a.recover_all().unwrap();
        let took = t.elapsed();
        assert_eq!(a.health().name(), "optimal");
        assert!(
            took < std::time::Duration::from_secs(4),
            "the rebuild took {took:?}: its readers waited for the locks it holds"
        );
    });
}

/// A read in a crash window that heals blocks reads the other members of
/// their columns: a slow one must not make the member read look stalled.
/// Only the member's own reads count against its timeout (1 s here): four
/// rotten blocks healed in one read, each reading a member that takes
/// 400 ms per operation, fail no member.
#[test]
fn a_slow_member_read_by_a_window_heal_does_not_fail_the_member_healed() {
    with_checksums(|| {
        let (a, pcs, stripe, _, first) = written_once(Level::Raid5, 4, Policy::Bitmap);
        let sm = a.geometry().stripe_map(0);
        // A write in stripe 1 marks the bitmap region that holds stripe 0.
        a.write(&[0xee; 4096], stripe as u64).unwrap();
        let (mut imgs, data_offset) = power_cut(a, &pcs, 5);
        // Every block of stripe 0's first data chunk rots.
        for b in 0..(CHUNK as usize / 4096) {
            imgs[sm.data[0]][data_offset + b * 4096 + 7] ^= 0x5a;
        }
        let slow = sm.data[1];
        let a = open_with_fault(&imgs, slow, "delay=400ms");
        a.set_member_timeout(std::time::Duration::from_secs(1));
        let mut got = vec![0u8; CHUNK as usize];
        a.read(&mut got, 0).unwrap();
        assert!(
            got == first[..CHUNK as usize],
            "the rotten chunk read wrong"
        );
        assert_eq!(a.health().name(), "optimal", "{:?}", a.members_status());
    });
}

/// The journal's `applied_seq` in a member image's superblock: above 0
/// once the log has been full and checkpointed.
fn applied_seq(img: &[u8]) -> u64 {
    let m = PowerCutMember::new("sb", img.to_vec());
    raidkit_array::superblock::read_superblock(&m)
        .unwrap()
        .sb
        .journal
        .applied_seq
}

#[test]
fn a_full_journal_is_checkpointed_and_power_cuts_after_it_lose_nothing() {
    full_journal_cuts();
}

#[test]
fn a_full_journal_with_checksums_is_checkpointed_and_loses_nothing() {
    with_checksums(full_journal_cuts);
}

fn full_journal_cuts() {
    // Long workloads (up to 400 operations, mostly partial-stripe writes
    // whose records carry their data): the log (960 KiB here) fills and
    // starts over many times, so it holds records of earlier rounds that
    // must not be replayed. Then a power cut, and the same checks as above.
    let tpl = template(Level::Raid5, 4, Policy::Journal);
    let mut wrapped = 0;
    let cuts = scaled(40);
    for c in 0..cuts {
        let mut rng = CutRng::new(91_000 + c);
        let (m, imgs) = workload_ops(&tpl, &mut rng, false, 400);
        if imgs.iter().all(|i| applied_seq(i) > 0) {
            wrapped += 1;
        }
        let all: Vec<Option<Vec<u8>>> = imgs.iter().cloned().map(Some).collect();
        let (a, _) = open(&all, false).unwrap();
        let got = read_all(&a);
        assert_eq!(m.violations(&got), 0, "cut {c}: after restart");
        assert_not_garbled(&m, &got, &format!("cut {c}: after restart"));
        assert_eq!(checksum_errors(&a), 0, "cut {c}: torn, not rotten");
        assert_eq!(a.count_mismatches().unwrap(), 0, "cut {c}: parity");
        drop(a);
        let gone = [(c % 4) as usize];
        let (d, _) = open(&without(&imgs, &gone), false).unwrap();
        assert_eq!(
            m.violations(&read_all(&d)),
            0,
            "cut {c}: restarted without role {gone:?}"
        );
    }
    assert!(
        wrapped >= cuts / 2,
        "the log was checkpointed before only {wrapped} of {cuts} cuts"
    );
}

#[test]
fn raid5_journal_survives_power_cuts_during_a_rebuild() {
    cuts_during_a_rebuild(150);
}

#[test]
fn raid5_journal_with_checksums_survives_power_cuts_during_a_rebuild() {
    with_checksums(|| cuts_during_a_rebuild(80));
}

fn cuts_during_a_rebuild(cuts: u64) {
    // Member 3 misses writes (the array runs without it), so it comes back
    // stale and is rebuilt while the workload runs and the power is cut.
    let mut tpl = template(Level::Raid5, 4, Policy::Journal);
    {
        let (a, pcs) = open(&without(&tpl, &[3]), false).unwrap();
        let fill: Vec<u8> = (0..a.capacity()).map(|i| (i * 7 % 251) as u8).collect();
        a.write(&fill, 0).unwrap();
        a.close().unwrap();
        for (i, p) in (0..3).zip(&pcs) {
            tpl[i] = p.durable();
        }
    }
    let mut mid_rebuild = 0;
    let cuts = scaled(cuts);
    for c in 0..cuts {
        let mut rng = CutRng::new(5_000 + c);
        let (m, imgs) = workload_with(&tpl, &mut rng, true);
        let all: Vec<Option<Vec<u8>>> = imgs.iter().cloned().map(Some).collect();
        let (a, pcs) = open(&all, false).unwrap();
        if a.needs_recovery() {
            mid_rebuild += 1;
        }
        assert_eq!(
            m.violations(&read_all(&a)),
            0,
            "cut {c}: before the rebuild resumes"
        );
        assert_eq!(checksum_errors(&a), 0, "cut {c}: torn, not rotten");
        a.recover_all().unwrap();
        let got = read_all(&a);
        assert_eq!(m.violations(&got), 0, "cut {c}: after the rebuild");
        assert_not_garbled(&m, &got, &format!("cut {c}: after the rebuild"));
        assert_eq!(a.count_mismatches().unwrap(), 0, "cut {c}: parity");
        a.close().unwrap();
        let recovered: Vec<Vec<u8>> = pcs.iter().map(|p| p.durable()).collect();
        drop(a);
        let gone = [(c % 4) as usize];
        let (b, _) = open(&without(&recovered, &gone), false).unwrap();
        assert!(
            read_all(&b) == got,
            "cut {c}: role {gone:?} removed after recovery"
        );
    }
    assert!(
        mid_rebuild > cuts / 15,
        "only {mid_rebuild} cuts landed mid-rebuild"
    );
}

#[test]
fn bitmap_policy_resyncs_after_a_cut_but_has_the_write_hole() {
    bitmap_cuts(300);
}

#[test]
fn bitmap_policy_with_checksums_resyncs_after_a_cut() {
    with_checksums(|| bitmap_cuts(200));
}

fn bitmap_cuts(cuts: u64) {
    let tpl = template(Level::Raid5, 4, Policy::Bitmap);
    let mut holes = 0;
    for c in 0..cuts {
        let mut rng = CutRng::new(77_000 + c);
        let (m, imgs) = workload(&tpl, &mut rng);
        // Every member back: reads are right at once, and the bitmap's
        // regions are resynced (as the server does in the background).
        let all: Vec<Option<Vec<u8>>> = imgs.iter().cloned().map(Some).collect();
        let (a, _) = open(&all, false).unwrap();
        let got = read_all(&a);
        assert_eq!(m.violations(&got), 0, "cut {c}");
        assert_not_garbled(&m, &got, &format!("cut {c}"));
        assert_eq!(checksum_errors(&a), 0, "cut {c}: torn, not rotten");
        a.recover_all().unwrap();
        if m.wrote {
            assert_eq!(a.last_recovery().unwrap().kind, "parity-resync");
        }
        let got = read_all(&a);
        assert_eq!(m.violations(&got), 0, "cut {c}");
        assert_not_garbled(&m, &got, &format!("cut {c}: after the resync"));
        assert_eq!(a.count_mismatches().unwrap(), 0, "cut {c}");
        drop(a);
        // A member missing at restart: refused without --force...
        let gone = [(c % 4) as usize];
        if m.wrote {
            let e = open(&without(&imgs, &gone), false)
                .map(|_| ())
                .unwrap_err()
                .to_string();
            assert!(e.contains("write hole"), "{e}");
        }
        // ...and with it, torn stripes rebuild wrong sometimes: the hole
        // the journal closes (and proof that these checks can fail).
        let (d, _) = open(&without(&imgs, &gone), true).unwrap();
        if m.violations(&read_all(&d)) > 0 {
            holes += 1;
        }
    }
    assert!(
        holes > 0,
        "no write hole seen in {cuts} cuts: the model cannot see it"
    );
}

/// Images of a clean array after a round of writes (the workload, its cut
/// recovered, then a clean close): a state an administrator may copy a
/// member in.
fn settled(tpl: &[Vec<u8>], rng: &mut CutRng) -> Vec<Vec<u8>> {
    let (_, imgs) = workload(tpl, rng);
    let all: Vec<Option<Vec<u8>>> = imgs.into_iter().map(Some).collect();
    let (a, pcs) = open(&all, false).unwrap();
    a.recover_all().unwrap();
    a.close().unwrap();
    let out = pcs.iter().map(|p| p.durable()).collect();
    drop(a);
    out
}

#[test]
fn an_old_copy_of_a_member_put_back_after_a_cut_is_never_read_as_current() {
    // A member is copied while the array is at rest; the array then runs
    // another workload and loses power; the old copy is put back in the
    // member's place (a restored backup, a disk swapped back). If the
    // workload wrote anything, the copy missed it: it must be recognised as
    // behind and never serve its old contents, neither at the restart nor
    // after the recovery that follows; the array's contents are then those
    // of the model, and parity is consistent.
    for (level, n) in [(Level::Raid5, 4), (Level::Raid6, 5)] {
        let tpl = template(level, n, Policy::Journal);
        let mut caught = 0;
        for c in 0..80u64 {
            let mut rng = CutRng::new(31_000 + c);
            let base = settled(&tpl, &mut rng);
            let k = (c as usize) % n;
            let (m, mut imgs) = workload(&base, &mut rng);
            imgs[k].clone_from(&base[k]);
            let all: Vec<Option<Vec<u8>>> = imgs.into_iter().map(Some).collect();
            let (a, _) = open(&all, false).unwrap();
            let role_k = a
                .members_status()
                .into_iter()
                .find(|s| s.role == Some(k))
                .unwrap();
            if m.wrote {
                assert_ne!(
                    role_k.state, "active",
                    "{level} cut {c}: the old copy of role {k} was taken as current"
                );
                caught += 1;
            }
            assert_eq!(
                m.violations(&read_all(&a)),
                0,
                "{level} cut {c}: old copy of role {k} in place, at the restart"
            );
            a.recover_all().unwrap();
            assert_eq!(
                m.violations(&read_all(&a)),
                0,
                "{level} cut {c}: old copy of role {k}, after recovery"
            );
            assert_eq!(a.count_mismatches().unwrap(), 0, "{level} cut {c}: parity");
        }
        assert!(caught > 20, "{level}: only {caught} rounds wrote anything");
    }
}

/// Images of an array whose initial sync has not run: members full of
/// junk (as `create --force` over used disks finds them), the superblocks
/// recording the sync pending from the start (as `create` leaves them
/// when it is killed before its first checkpoint).
fn unsynced_template(level: Level, n: usize) -> Vec<Vec<u8>> {
    let policy = if level.is_parity() {
        Policy::Journal
    } else {
        Policy::Bitmap
    };
    let mut rng = CutRng::new(4242);
    template(level, n, policy)
        .into_iter()
        .enumerate()
        .map(|(i, img)| {
            let m = PowerCutMember::new(&format!("m{i}"), img);
            let mut sb = raidkit_array::superblock::read_superblock(&m).unwrap().sb;
            let junk: Vec<u8> = (0..sb.data_size).map(|_| rng.next_u64() as u8).collect();
            m.write_at(&junk, sb.data_offset).unwrap();
            sb.resync = Some(0);
            raidkit_array::superblock::write_superblock(&m, &mut sb).unwrap();
            m.flush().unwrap();
            m.durable()
        })
        .collect()
}

#[test]
fn power_cuts_during_the_initial_sync_leave_it_to_be_finished() {
    cuts_during_the_initial_sync(1);
}

#[test]
fn power_cuts_during_the_initial_sync_with_checksums() {
    with_checksums(|| cuts_during_the_initial_sync(2));
}

/// `divide`: run a share of the cuts.
fn cuts_during_the_initial_sync(divide: u64) {
    // The initial sync runs (slowly) while writes come in and the power is
    // cut. After the restart the sync must still be pending where it had
    // not reached (the restart's recovery finishes it), flushed writes
    // read back, and once finished every stripe is consistent, so that a
    // member lost afterwards is rebuilt right. A member lost at the
    // restart itself, before the sync finished, must not make the array
    // return junk reconstructed from unsynced parity: those reads fail.
    for (level, n, cuts) in [
        (Level::Raid5, 4, 60u64),
        (Level::Raid6, 5, 40),
        (Level::Raid1, 2, 40),
    ] {
        let cuts = cuts / divide;
        let tpl = unsynced_template(level, n);
        let lose = level.parity_count().max(1);
        let gone_sets = subsets(n, lose);
        let mut mid_sync = 0;
        let mut refused = 0;
        for c in 0..cuts {
            let mut rng = CutRng::new(61_000 + c);
            let (m, imgs) = workload_with(&tpl, &mut rng, true);
            let all: Vec<Option<Vec<u8>>> = imgs.iter().cloned().map(Some).collect();
            let (a, pcs) = open(&all, false).unwrap();
            if a.needs_recovery() {
                mid_sync += 1;
            }
            assert_eq!(
                m.violations(&read_all(&a)),
                0,
                "{level} cut {c}: before the sync resumes"
            );
            a.recover_all().unwrap();
            let got = read_all(&a);
            assert_eq!(m.violations(&got), 0, "{level} cut {c}: after the sync");
            assert_not_garbled(&m, &got, &format!("{level} cut {c}: after the sync"));
            assert_eq!(a.count_mismatches().unwrap(), 0, "{level} cut {c}: parity");
            a.close().unwrap();
            let synced: Vec<Vec<u8>> = pcs.iter().map(|p| p.durable()).collect();
            drop(a);
            let gone = &gone_sets[(c as usize) % gone_sets.len()];
            let (b, _) = open(&without(&synced, gone), false).unwrap();
            assert!(
                read_all(&b) == got,
                "{level} cut {c}: roles {gone:?} removed after the sync"
            );
            drop(b);

            // Lost at the restart, before the sync resumed. Parity levels:
            // every chunk either reads as the model says or fails, never
            // junk reconstructed from parity that was never made right.
            // Mirrors: the surviving copy is whole, so every read succeeds;
            // what was written reads back, and what never was may show the
            // other copy's old contents.
            let (d, _) = open(&without(&imgs, gone), true).unwrap();
            for (i, want) in m.current.chunks(CHUNK as usize).enumerate() {
                let mut buf = vec![0u8; want.len()];
                match d.read(&mut buf, i as u64 * CHUNK) {
                    Err(e) => {
                        assert!(
                            level.is_parity(),
                            "{level} cut {c}: roles {gone:?} lost at the restart, chunk {i}: {e}"
                        );
                        refused += 1;
                    }
                    Ok(()) => {
                        let first = i * CHUNK as usize / SECTOR;
                        for (s, (g, w)) in buf.chunks(SECTOR).zip(want.chunks(SECTOR)).enumerate() {
                            let judged = level.is_parity() || m.written[first + s];
                            assert!(
                                !judged || m.dirty[first + s] || g == w,
                                "{level} cut {c}: roles {gone:?} lost at the restart, \
                                 sector {} read junk",
                                first + s
                            );
                        }
                    }
                }
            }
        }
        assert!(
            mid_sync > cuts / 4,
            "{level}: only {mid_sync} of {cuts} cuts landed mid-sync"
        );
        assert!(
            refused > 0 || !level.is_parity(),
            "{level}: no read of an unsynced stripe was refused with a member lost"
        );
    }
}

/// The regions an unclean stop left marked stay marked on the members
/// until the resync after it has passed them: the periodic clearing of
/// idle bits must not take them (they are idle: nothing wrote them in this
/// run). Cleared, a second crash before the resync ends leaves their torn
/// stripes with nothing saying where they are.
#[test]
fn regions_an_unclean_stop_marked_stay_marked_until_their_resync() {
    let (a, pcs, _, stripes, first) = written_once(Level::Raid5, 4, Policy::Bitmap);
    let (imgs, _) = marked_and_cut(a, &pcs, &first, 5);
    let all: Vec<Option<Vec<u8>>> = imgs.into_iter().map(Some).collect();
    let (a, pcs) = open(&all, false).unwrap();
    // The server's housekeeping runs every 2 s, the resync of a large
    // array for hours: it comes first.
    a.housekeeping();
    a.housekeeping();
    let (imgs, _) = power_cut(a, &pcs, 6);
    let all: Vec<Option<Vec<u8>>> = imgs.into_iter().map(Some).collect();
    let (a, _) = open(&all, false).unwrap();
    a.recover_all().unwrap();
    let last = a.last_recovery().unwrap();
    assert_eq!((last.kind, last.result.as_str()), ("parity-resync", "done"));
    assert_eq!(
        last.bytes,
        stripes as u64 * CHUNK,
        "the second start resynced less than every stripe the first crash marked"
    );
    assert_eq!(a.count_mismatches().unwrap(), 0);
}

/// Block `at` (member offset) of `m` rots: bits flipped behind the
/// array's back, durably.
fn rot(m: &PowerCutMember, at: u64) {
    let mut b = vec![0u8; 4096];
    m.read_at(&mut b, at).unwrap();
    b[9] ^= 0x5a;
    m.write_at(&b, at).unwrap();
    m.flush().unwrap();
}

/// Whether a read of `len` bytes at `off` fails or gives `want`: anything
/// but wrong data.
fn never_wrong(a: &Array, off: u64, want: &[u8]) -> bool {
    let mut got = vec![0u8; want.len()];
    a.read(&mut got, off).is_err() || got == want
}

/// A rebuild that cannot rebuild a block (its column rotted beyond what
/// the level survives) marks it lost: it reads as bad until written, as
/// does the rotten block beside it. A crash afterwards, with the crash
/// windows of the next start over that stripe (the fill's intents not yet
/// checkpointed, the bitmap's bits still set), must leave both unreadable:
/// the window's replay or resync takes blocks that disagree with their
/// checksums as torn writes, and would take these, returning the zeroes
/// written in place of the lost block and the rot beside it as data.
#[test]
fn blocks_a_rebuild_could_not_rebuild_stay_unreadable_after_a_crash() {
    with_checksums(|| {
        for policy in [Policy::Journal, Policy::Bitmap] {
            let (a, pcs, _, _, first) = written_once(Level::Raid5, 4, policy);
            let g = a.geometry();
            // Stripe 0: data on roles 0, 1, 2 (left-symmetric), parity on 3.
            let sm = g.stripe_map(0);
            assert_eq!(sm.data.to_vec(), vec![0, 1, 2]);
            let data_offset = raidkit_array::superblock::read_superblock(&*pcs[1])
                .unwrap()
                .sb
                .data_offset;
            rot(&pcs[1], data_offset + 4096);
            let (lost, rotten) = (4096u64, CHUNK + 4096);
            let want = |off: u64| &first[off as usize..off as usize + 4096];
            a.fail_member("m0", true).unwrap();
            let len = pcs[0].durable().len();
            let fresh = Arc::new(PowerCutMember::new("m9", vec![0u8; len]));
            a.add_member(fresh.clone(), true).unwrap();
            a.recover_all().unwrap();
            assert_eq!(a.health().name(), "optimal", "{policy:?}");
            let mut b = vec![0u8; 4096];
            assert!(a.read(&mut b, lost).is_err(), "{policy:?}: lost block read");
            assert!(a.read(&mut b, rotten).is_err(), "{policy:?}: rot read");
            let now = [fresh, pcs[1].clone(), pcs[2].clone(), pcs[3].clone()];
            let (imgs, _) = power_cut(a, &now, 17);
            let all: Vec<Option<Vec<u8>>> = imgs.into_iter().map(Some).collect();
            let (a, _) = open(&all, false).unwrap();
            for round in ["before the resync", "after it"] {
                assert!(
                    never_wrong(&a, lost, want(lost)),
                    "{policy:?}, {round}: the block the rebuild lost reads wrong"
                );
                assert!(
                    never_wrong(&a, rotten, want(rotten)),
                    "{policy:?}, {round}: the rotten block beside it reads wrong"
                );
                a.recover_all().unwrap();
            }
        }
    });
}

/// A degraded RAID-5 whose every write was flushed long before: rot found
/// then reads as an error (no redundancy left to heal it). A crash must
/// not change that: once the array has been idle, the journal's records
/// are known applied (the housekeeping's checkpoint), and the next start
/// has no crash window in which to take the rot as a torn write.
#[test]
fn rot_on_a_degraded_array_idle_before_a_crash_stays_unreadable() {
    with_checksums(|| {
        let (a, pcs, _, _, first) = written_once(Level::Raid5, 4, Policy::Journal);
        let data_offset = raidkit_array::superblock::read_superblock(&*pcs[1])
            .unwrap()
            .sb
            .data_offset;
        a.fail_member("m0", true).unwrap();
        // The server's housekeeping, every 2 s, on an idle array.
        a.housekeeping();
        rot(&pcs[1], data_offset + 4096);
        let rotten = CHUNK + 4096;
        let want = &first[rotten as usize..rotten as usize + 4096];
        let mut b = vec![0u8; 4096];
        assert!(a.read(&mut b, rotten).is_err(), "rot read before the crash");
        let now = [pcs[1].clone(), pcs[2].clone(), pcs[3].clone()];
        let (imgs, _) = power_cut(a, &now, 19);
        let all: Vec<Option<Vec<u8>>> = [None]
            .into_iter()
            .chain(imgs.into_iter().map(Some))
            .collect();
        let (a, _) = open(&all, false).unwrap();
        assert!(
            never_wrong(&a, rotten, want),
            "the rotten block reads wrong after the crash"
        );
        a.recover_all().unwrap();
        assert!(never_wrong(&a, rotten, want), "and after the recovery");
    });
}
