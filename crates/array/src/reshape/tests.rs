//! The reshape's batch plans, without an array.

use super::*;
use raidkit_layout::{Layout, ParityLayout};

fn plan(level: Level, n_old: usize, n_new: usize) -> Reshaping {
    let layout = if level.is_parity() {
        Layout::Parity(ParityLayout::LeftSymmetric)
    } else {
        Layout::None
    };
    let g = |n| Arc::new(Geometry::new(level, layout, 64 << 10, vec![64 << 20; n]).unwrap());
    Reshaping::new(g(n_old), g(n_new), 0, None)
}

fn chunk_plan(level: Level, n: usize, old: u64, new: u64, slot: u64) -> Reshaping {
    let g = |c| {
        Arc::new(
            Geometry::new(
                level,
                Layout::Parity(ParityLayout::LeftSymmetric),
                c,
                vec![64 << 20; n],
            )
            .unwrap(),
        )
    };
    let slot = chunk::Slot {
        at: 64 << 10,
        len: slot,
        journal: true,
    };
    Reshaping::new(g(old), g(new), 0, Some(slot))
}

/// A change of chunk: every batch is whole units of the larger chunk,
/// no larger than a member's slot; a new stripe above the checkpoint
/// maps to exactly the old stripes over its member bytes.
#[test]
fn chunk_batches_fit_their_slot_and_units_map_to_the_old_stripes() {
    for (old, new, slot) in [
        (512 << 10, 64 << 10, 1 << 20),
        (16 << 10, 256 << 10, 600 << 10),
        (4 << 10, 8 << 10, 8 << 20),
    ] {
        let r = chunk_plan(Level::Raid5, 4, old, new, slot);
        assert!(r.chunk_change() && r.critical_rows() == 0);
        let unit = old.max(new);
        let mut p = 0;
        while p < r.new.stripes() {
            let q = r.batch_end(p);
            let bytes = (q - p) * new;
            assert!(
                q > p && bytes.is_multiple_of(unit),
                "{old}->{new}: {p}..{q}"
            );
            assert!(
                bytes + chunk::SLOT_HEADER <= slot,
                "{old}->{new}: {bytes} bytes"
            );
            // The same array data, old and new.
            assert_eq!(p * r.width() % (old * 3), 0);
            p = q;
        }
        assert_eq!(p, r.new.stripes());
        r.rows.store(10 * unit / new, Ordering::Release);
        assert_eq!(r.old_units(0), None);
        let u = 10 * unit / new;
        let got = r.old_units(u).unwrap();
        // Exactly the old stripes that hold member bytes of stripe u.
        let (a, b) = (u * new, (u + 1) * new);
        assert!(
            got.start * old <= a && (got.start + 1) * old > a,
            "{old}->{new}"
        );
        assert!(
            got.end * old >= b && (got.end - 1) * old < b,
            "{old}->{new}"
        );
        assert!(r.placed_new(u * new - 1) && !r.placed_new(u * new));
    }
}

/// Every batch from the start overwrites only old rows whose data is
/// below the checkpoint, or (the first) what the backup holds; the
/// batches cover every row of old data.
#[test]
fn batches_never_overwrite_data_not_yet_safe() {
    for (level, a, b) in [
        (Level::Raid5, 3, 4),
        (Level::Raid5, 4, 6),
        (Level::Raid6, 4, 5),
        (Level::Raid6, 8, 9),
        (Level::Raid0, 2, 3),
        (Level::Raid4, 3, 5),
    ] {
        let r = plan(level, a, b);
        let (wo, wn) = (r.old.data_members() as u64, r.new.data_members() as u64);
        let chunk = r.old.chunk;
        let mut p = 0;
        let mut batches = 0;
        while p < r.new.stripes() {
            let q = r.batch_end(p);
            assert!(q > p);
            let overwritten_data_end = q * wo * chunk;
            let safe_end = (p * wn * chunk).max(if p == 0 { r.backup_len() } else { 0 });
            assert!(
                overwritten_data_end.min(r.old.capacity()) <= safe_end,
                "{level} {a}->{b}: batch {p}..{q} overwrites data up to {overwritten_data_end}, safe only to {safe_end}"
            );
            p = q;
            batches += 1;
        }
        assert_eq!(p, r.new.stripes());
        assert!(r.data_rows() * r.width() >= r.old.capacity());
        // The backup lies beyond the rows the first batch writes.
        let (at, share) = r.backup_place();
        assert!(at >= r.critical_rows() * chunk && at + share <= r.new.member_sizes[0]);
        assert!(batches < 200, "{level} {a}->{b}: {batches} batches");
    }
}
