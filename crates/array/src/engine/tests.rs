//! The engine's own tests: races between a write and a rebuild, and
//! parity computed in place over member mappings, driven through the
//! seams (`crate::seams`).

use super::*;
use crate::create::{create, CreateMember, CreateOptions, Policy};
use raidkit_member::FileMember;

use crate::seams::{BEFORE_PARITY_IN_PLACE, BEFORE_STRIPE_LOCK, IN_PLACE};

#[test]
fn a_write_that_waited_for_its_stripe_writes_to_a_member_rebuilt_meanwhile() {
    // RAID-5: stripe 0's parity is on the last member; RAID-1: the
    // second copy.
    // A write of 4 KiB, and one of 1 MiB (RAID-1: each member's
    // copies by its own thread).
    for (level, n) in [(Level::Raid5, 4), (Level::Raid1, 2)] {
        for len in [4096, 1 << 20] {
            waited_write_reaches_a_member_rebuilt_meanwhile(level, n, len);
        }
    }
}

fn waited_write_reaches_a_member_rebuilt_meanwhile(level: Level, n: usize, len: usize) {
    let dir = tempfile::tempdir().unwrap();
    let chunk = 16u64 << 10;
    let (a, members, mut model) = file_array(
        dir.path(),
        level,
        n,
        chunk,
        (2 << 20) + 16 * chunk,
        Policy::Bitmap,
    );
    let last = (n - 1).to_string();
    if level == Level::Raid5 {
        assert_eq!(a.geometry().stripe_map(0).p, n - 1);
    }
    a.fail_member(&last, false).unwrap();
    a.remove_member(&last).unwrap();
    let (reached_tx, reached_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let new = vec![0xABu8; len];
    std::thread::scope(|sc| {
        let writer = sc.spawn(|| {
            BEFORE_STRIPE_LOCK.with(|h| {
                *h.borrow_mut() = Some(Box::new(move || {
                    reached_tx.send(()).unwrap();
                    go_rx.recv().unwrap();
                }))
            });
            a.write(&new, 4096)
        });
        // The write has seen the array without its last member and
        // waits at its stripe; meanwhile a new member is added and
        // rebuilt.
        reached_rx.recv().unwrap();
        let fresh = dir.path().join("fresh").display().to_string();
        std::fs::File::create(&fresh)
            .unwrap()
            .set_len(std::fs::metadata(&members[0]).unwrap().len())
            .unwrap();
        a.add_member(Arc::new(FileMember::open(&fresh, false).unwrap()), false)
            .unwrap();
        a.recover_all().unwrap();
        assert_eq!(a.health(), Health::Optimal);
        go_tx.send(()).unwrap();
        writer.join().unwrap().unwrap();
    });
    model[4096..4096 + len].copy_from_slice(&new);
    assert_eq!(
        a.count_mismatches().unwrap(),
        0,
        "{level}: redundancy left stale"
    );
    let mut back = vec![0u8; model.len()];
    a.read(&mut back, 0).unwrap();
    assert!(back == model);
    a.close().unwrap();
}

/// An array of `n` file members of `size` bytes each, holding a
/// pattern (returned), with every page of its members cached (just
/// written).
fn file_array(
    dir: &std::path::Path,
    level: Level,
    n: usize,
    chunk: u64,
    size: u64,
    policy: Policy,
) -> (Array, Vec<String>, Vec<u8>) {
    let members: Vec<String> = (0..n)
        .map(|i| dir.join(format!("m{i}")).display().to_string())
        .collect();
    let opts = CreateOptions {
        level,
        layout: level.default_layout(),
        chunk,
        size: Some(size),
        name: "r".into(),
        force: false,
        assume_clean: false,
        background_sync: false,
        bitmap_region: 64 << 10,
        policy,
        spares: Vec::new(),
        checksums: false,
        md: false,
        data_offset: None,
        domains: Vec::new(),
    };
    let new: Vec<CreateMember> = members
        .iter()
        .map(|m| CreateMember::New(m.clone(), raidkit_member::IoMode::Buffered))
        .collect();
    create(new, &opts, |_, _| {}).unwrap();
    let opened: Vec<Arc<dyn Member>> = members
        .iter()
        .map(|m| Arc::new(FileMember::open(m, false).unwrap()) as Arc<dyn Member>)
        .collect();
    let asm = crate::assemble::assemble(opened).unwrap();
    let a = Array::open(asm, "r", false).unwrap();
    let model: Vec<u8> = (0..a.capacity()).map(|i| (i * 131 % 251) as u8).collect();
    a.write(&model, 0).unwrap();
    (a, members, model)
}

/// Write `data` at `offset` through `with_write_extents`, the way the
/// server's mapped writes do (here with `pwrite` into the extents).
fn write_in_place(a: &Array, offset: u64, data: &[u8]) -> Option<std::io::Result<()>> {
    use std::os::unix::fs::FileExt;
    a.with_write_extents(offset, data.len() as u64, &mut |ext| {
        let mut at = 0;
        for e in ext {
            e.file
                .write_all_at(&data[at..at + e.len as usize], e.offset)?;
            at += e.len as usize;
        }
        Ok(())
    })
}

#[test]
fn whole_stripes_written_in_place_get_their_parity_from_the_mappings() {
    for (level, n) in [(Level::Raid5, 4), (Level::Raid6, 5)] {
        let dir = tempfile::tempdir().unwrap();
        let (a, _, mut model) =
            file_array(dir.path(), level, n, 16 << 10, 2 << 20, Policy::Journal);
        let width = a.geometry().chunk * a.geometry().data_members() as u64;
        // Not whole stripes: refused, nothing written.
        assert!(write_in_place(&a, width, &vec![1u8; width as usize + 4096]).is_none());
        assert!(write_in_place(&a, 4096, &vec![1u8; width as usize]).is_none());
        IN_PLACE.with(|c| c.set((0, 0)));
        let new: Vec<u8> = (0..3 * width).map(|i| (i * 7 % 253) as u8).collect();
        write_in_place(&a, 2 * width, &new).unwrap().unwrap();
        assert_eq!(IN_PLACE.with(|c| c.get()), (3, 0), "{level}");
        model[2 * width as usize..5 * width as usize].copy_from_slice(&new);
        assert_eq!(a.count_mismatches().unwrap(), 0, "{level}: parity");
        let mut back = vec![0u8; model.len()];
        a.read(&mut back, 0).unwrap();
        assert!(back == model, "{level}: data");
        a.close().unwrap();
    }
}

#[test]
fn a_member_truncated_under_parity_in_place_faults_without_killing_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let (a, members, _) = file_array(
        dir.path(),
        Level::Raid5,
        4,
        16 << 10,
        2 << 20,
        Policy::Journal,
    );
    let width = a.geometry().chunk * a.geometry().data_members() as u64;
    let stripe = 5;
    let p = a.geometry().stripe_map(stripe).p;
    let at = {
        let v = a.core.view.load();
        v.roles[p].disk.as_ref().unwrap().data_offset + stripe * a.geometry().chunk
    };
    // Once the mappings are set up, P's member loses its file from the
    // stripe's parity chunk on: computing into it faults (SIGBUS).
    let path = members[p].clone();
    BEFORE_PARITY_IN_PLACE.with(|h| {
        *h.borrow_mut() = Some(Box::new(move || {
            let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            f.set_len(at).unwrap();
        }))
    });
    IN_PLACE.with(|c| c.set((0, 0)));
    let new = vec![0x5Au8; width as usize];
    let r = write_in_place(&a, stripe * width, &new).unwrap();
    assert_eq!(IN_PLACE.with(|c| c.get()), (0, 1), "the fault was caught");
    // The ordinary path took over and wrote the parity (extending the
    // file again); the data is what was written.
    r.unwrap();
    let mut back = vec![0u8; width as usize];
    a.read(&mut back, stripe * width).unwrap();
    assert!(back == new);
    a.close().unwrap();
}

/// A member that says whether it spins, and notes where it is read.
#[derive(Debug)]
struct Spinning {
    inner: FileMember,
    spins: bool,
    reads: Mutex<Vec<u64>>,
    /// The runs of each `read_runs` call, as (offset, length).
    batches: Mutex<Vec<Vec<(u64, usize)>>>,
}

impl Member for Spinning {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> raidkit_member::Result<()> {
        self.reads.lock().unwrap().push(offset);
        self.inner.read_at(buf, offset)
    }
    fn read_runs(&self, runs: &mut [(u64, &mut [u8])]) -> raidkit_member::Result<()> {
        let asked = runs.iter().map(|r| (r.0, r.1.len())).collect();
        self.batches.lock().unwrap().push(asked);
        self.inner.read_runs(runs)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> raidkit_member::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> raidkit_member::Result<()> {
        self.inner.flush()
    }
    fn rotational(&self) -> Option<bool> {
        Some(self.spins)
    }
}

/// A RAID-1 of two members holding a pattern, opened again over
/// `Spinning` members: the array, the members, the pattern.
fn mirror_of(dir: &std::path::Path, spins: bool) -> (Array, Vec<Arc<Spinning>>, Vec<u8>) {
    spinning_array(dir, Level::Raid1, 2, spins)
}

/// An array of `level` over `n` members holding a pattern, opened again
/// over `Spinning` members (chunks of 16 KiB).
fn spinning_array(
    dir: &std::path::Path,
    level: Level,
    n: usize,
    spins: bool,
) -> (Array, Vec<Arc<Spinning>>, Vec<u8>) {
    let chunk = 16u64 << 10;
    let (a, paths, model) = file_array(dir, level, n, chunk, 4 << 20, Policy::Bitmap);
    a.close().unwrap();
    drop(a);
    let ms: Vec<Arc<Spinning>> = paths
        .iter()
        .map(|p| {
            Arc::new(Spinning {
                inner: FileMember::open(p, false).unwrap(),
                spins,
                reads: Mutex::new(Vec::new()),
                batches: Mutex::new(Vec::new()),
            })
        })
        .collect();
    let opened: Vec<Arc<dyn Member>> = ms.iter().map(|m| m.clone() as Arc<dyn Member>).collect();
    let a = Array::open(crate::assemble::assemble(opened).unwrap(), "r", false).unwrap();
    for m in &ms {
        m.reads.lock().unwrap().clear();
    }
    (a, ms, model)
}

#[test]
fn a_members_pieces_of_a_large_read_are_asked_of_it_together() {
    // RAID-5 and RAID-6 place parity chunks between a member's data
    // chunks, RAID-10 the chunks the other copy serves: a read of whole
    // stripes needs several runs of each member, asked in one call so that
    // a disk's queue holds them all. (The RAID-10's members do not spin,
    // so that its copies take turns by chunk and each serves some.)
    for (level, n) in [(Level::Raid5, 4), (Level::Raid6, 5), (Level::Raid10, 3)] {
        let dir = tempfile::tempdir().unwrap();
        let spins = level != Level::Raid10;
        let (a, ms, model) = spinning_array(dir.path(), level, n, spins);
        let len = 1 << 20;
        let off = 3 * (16 << 10);
        let mut got = vec![0u8; len];
        a.read(&mut got, off as u64).unwrap();
        assert!(got == model[off..off + len], "{level:?}: the read is wrong");
        for (i, m) in ms.iter().enumerate() {
            let batches = m.batches.lock().unwrap();
            assert_eq!(batches.len(), 1, "{level:?} member {i}: {batches:?}");
            let runs = &batches[0];
            assert!(runs.len() > 1, "{level:?} member {i}: {runs:?}");
            assert!(
                runs.windows(2).all(|w| w[0].0 + (w[0].1 as u64) < w[1].0),
                "{level:?} member {i}: runs apart and in order: {runs:?}"
            );
        }
        a.close().unwrap();
    }
}

#[test]
fn mirrors_on_spinning_disks_keep_a_sequential_reader_on_one_copy() {
    // md's read balancing where a seek costs milliseconds: one disk reads
    // the stream at its full rate. Mirrors that do not seek take turns,
    // so one reader gets both copies' bandwidth.
    for spins in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let (a, ms, model) = mirror_of(dir.path(), spins);
        let mut buf = vec![0u8; 16 << 10];
        for i in 0..64u64 {
            let at = i * buf.len() as u64;
            a.read(&mut buf, at).unwrap();
            assert_eq!(buf, model[at as usize..at as usize + buf.len()]);
        }
        let counts: Vec<usize> = ms.iter().map(|m| m.reads.lock().unwrap().len()).collect();
        if spins {
            assert!(
                counts.contains(&0) && counts.contains(&64),
                "one copy reads the whole stream: {counts:?}"
            );
        } else {
            assert_eq!(counts, [32, 32], "the copies take turns by chunk");
        }
        a.close().unwrap();
    }
}

#[test]
fn mirrors_on_spinning_disks_give_two_readers_a_disk_each() {
    // Two streams far apart, read in turn: each settles on the copy whose
    // head is where it reads, so neither disk seeks between them.
    let dir = tempfile::tempdir().unwrap();
    let (a, ms, model) = mirror_of(dir.path(), true);
    let half = a.capacity() / 2;
    let mut buf = vec![0u8; 16 << 10];
    for i in 0..32u64 {
        for base in [0, half] {
            let at = base + i * buf.len() as u64;
            a.read(&mut buf, at).unwrap();
            assert_eq!(buf, model[at as usize..at as usize + buf.len()]);
        }
    }
    let data_offset = ms[0].len() - a.capacity();
    for m in &ms {
        let reads = m.reads.lock().unwrap();
        // After the first reads of each stream, which place them.
        let regions: std::collections::BTreeSet<bool> = reads[2..]
            .iter()
            .map(|&off| off - data_offset >= half)
            .collect();
        assert_eq!(
            regions.len(),
            1,
            "{} reads both streams: {reads:?}",
            m.name()
        );
    }
    let counts: Vec<usize> = ms.iter().map(|m| m.reads.lock().unwrap().len()).collect();
    assert!(counts.iter().all(|&c| c >= 30), "a disk each: {counts:?}");
    a.close().unwrap();
}
