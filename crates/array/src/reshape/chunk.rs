//! Changing the chunk (`raidkit grow --chunk`): see [`Array::change_chunk`].

use super::Reshaping;
use crate::engine::Array;
use crate::error::{Error, Result};
use crate::superblock::ReshapePos;
use raidkit_layout::{Geometry, Level};
use raidkit_member::Locked;
use std::sync::Arc;

/// Where each member sets a batch's old bytes aside: member offset and
/// length of its metadata space, and whether that space is the journal's.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Slot {
    pub at: u64,
    pub len: u64,
    pub journal: bool,
}

/// The header of a member's slot (see [`Array::change_chunk`]).
pub(super) const SLOT_HEADER: u64 = 4096;
const SLOT_MAGIC: [u8; 8] = *b"RKCHUNK\0";

/// A slot's header: which array, which batch (its first new row), how
/// many bytes of the member follow, and their crc32c; the header's own
/// crc32c last.
fn slot_header(uuid: uuid::Uuid, row: u64, data: &[u8]) -> Vec<u8> {
    use crate::superblock::{put_u32, put_u64};
    let mut h = vec![0u8; SLOT_HEADER as usize];
    h[..8].copy_from_slice(&SLOT_MAGIC);
    h[8..24].copy_from_slice(uuid.as_bytes());
    put_u64(&mut h, 24, row);
    put_u64(&mut h, 32, data.len() as u64);
    put_u32(&mut h, 40, crate::checksums::crc32c(data));
    let crc = crate::checksums::crc32c(&h);
    put_u32(&mut h, 44, crc);
    h
}

/// The length of the bytes a slot header announces, if it is intact and
/// of this array's batch at `row`.
fn slot_len(h: &[u8], uuid: uuid::Uuid, row: u64) -> Option<u64> {
    use crate::superblock::{get_u32, get_u64};
    let mut z = h.to_vec();
    z[44..48].fill(0);
    (h[..8] == SLOT_MAGIC
        && h[8..24] == *uuid.as_bytes()
        && get_u64(h, 24) == row
        && get_u32(h, 44) == crate::checksums::crc32c(&z))
    .then(|| get_u64(h, 32))
}

/// A change of chunk (`raidkit grow --chunk`), md's chunk reshape without
/// a backup file.
///
/// # Why it needs room of its own, and where it is
///
/// With the same members and level, array data `[u * U * D, (u + 1) * U *
/// D)` (`U` the larger of the two chunks, `D` the data members) lies in
/// member bytes `[u * U, (u + 1) * U)` in both geometries: every unit of
/// `U` bytes is rearranged within itself, nothing crosses into another.
/// But a unit's new bytes overwrite its old ones, so a crash in the
/// middle of writing them would leave a unit neither placement describes.
/// Each batch of units is therefore first set aside: every member writes
/// its own old bytes of the batch (with a header naming the batch and
/// their crc32c) into a *slot* in its metadata area, all are flushed,
/// and the superblocks record the batch as set aside (`backup`) before
/// the new placement is written. A start that finds a batch set aside
/// writes each member's old bytes back (the old placement, which the
/// checkpoint says is there) and does the batch again; a member's own old
/// bytes, parity included, keep the level's redundancy meanwhile.
///
/// The slot is the space the journal takes when the array has one (every
/// record is known applied before a batch, and every client write waits
/// while it runs, since it would log a record there) and otherwise the
/// same space, which is then unused. Reads, and on arrays without a
/// journal writes, wait only if they touch the batch's array data: other
/// units are neither read nor written by it. md does the same with its
/// backup file when it cannot move `data_offset`.
impl Array {
    /// Where each member's slot lies, or None if the metadata area has
    /// no room for one.
    pub(super) fn chunk_slot(&self) -> Option<Slot> {
        let meta = self.core.meta.locked();
        let sb = &meta.sb;
        if sb.journal.size > 0 {
            return Some(Slot {
                at: sb.journal.offset,
                len: sb.journal.size,
                journal: true,
            });
        }
        let data_size = sb.roles.iter().map(|r| r.data_size).max().unwrap_or(0);
        let bitmap = if sb.bitmap.region > 0 {
            crate::bitmap::bytes_for(data_size.div_ceil(sb.bitmap.region))
        } else {
            0
        };
        let start = (crate::bitmap::BITMAP_OFFSET + bitmap).next_multiple_of(64 << 10);
        let v = self.core.view.load_full();
        let end = v
            .roles
            .iter()
            .filter_map(|r| r.disk.as_ref())
            .chain(v.spares.iter())
            .map(|d| {
                let own = d.sb.locked();
                if own.checksums.enabled() {
                    own.checksums.offset.min(d.data_offset)
                } else {
                    d.data_offset
                }
            })
            .min()?;
        (end > start + SLOT_HEADER).then(|| Slot {
            at: start,
            len: end - start,
            journal: false,
        })
    }

    /// Change the array's chunk to `chunk` bytes while it serves: every
    /// byte moves to md's placement for the new chunk, in the background.
    /// Refused, with nothing written, where it cannot be done.
    pub fn change_chunk(&self, chunk: u64) -> Result<Geometry> {
        let old = self.core.geom();
        match old.level {
            Level::Raid0 | Level::Raid4 | Level::Raid5 | Level::Raid6 => {}
            Level::Linear | Level::Raid1 => {
                return Err(Error::Invalid(format!(
                    "a {} array has no chunk to change",
                    old.level
                )))
            }
            Level::Raid10 => {
                return Err(Error::Invalid(
                    "changing the chunk of a RAID-10 is not supported yet".into(),
                ))
            }
        }
        raidkit_layout::check_chunk(chunk).map_err(|e| Error::Invalid(format!("--chunk: {e}")))?;
        if chunk == old.chunk {
            return Err(Error::Invalid(format!(
                "the chunk is already {chunk} bytes"
            )));
        }
        let used = old.member_sizes[0];
        if !used.is_multiple_of(chunk) {
            return Err(Error::Invalid(format!(
                "the array uses {used} bytes of each member, not a whole number of {chunk}-byte chunks: its size would change (md refuses this too)"
            )));
        }
        self.check_quiet("change the chunk")?;
        let new = Geometry::new(old.level, old.layout, chunk, old.member_sizes.clone())
            .map_err(|e| Error::Invalid(format!("--chunk: {e}")))?;
        debug_assert_eq!(new.capacity(), old.capacity());
        let unit = old.chunk.max(chunk);
        let slot = self.chunk_slot();
        let room = slot.map_or(0, |s| s.len.saturating_sub(SLOT_HEADER));
        if room < unit {
            return Err(Error::Invalid(format!(
                "changing the chunk sets {unit} bytes of each member aside at a time, and their metadata area has room for {room}: use a smaller chunk, or members with a larger metadata area"
            )));
        }
        let plan = Reshaping::new(old.clone(), Arc::new(new.clone()), 0, slot);
        let mut fence = self.reshape.write().unwrap_or_else(|e| e.into_inner());
        self.journal_applied()?;
        let pos = ReshapePos::starting(&old, Some(old.chunk));
        self.core.begin_chunk_change(Arc::new(new.clone()), pos)?;
        *fence = Some(Arc::new(plan));
        drop(fence);
        self.core.wake.kick();
        Ok(new)
    }

    /// One batch of a change of chunk, new rows `[p, q)`, with every
    /// request held off (the caller holds the fence): the old bytes set
    /// aside, the new placement written, flushed, the position recorded.
    pub(super) fn move_units(&self, r: &Reshaping, p: u64, q: u64) -> Result<()> {
        let width = r.width();
        let (lo, hi) = (p * width, q * width);
        self.journal_applied()?;
        let mut data = vec![0u8; (hi - lo) as usize];
        let v = self.core.view.load_full();
        self.read_view(&r.old_view(&v), &mut data, lo)?;
        let old_width = r.old.chunk * r.old.data_members() as u64;
        let (old_rows, _) = super::place_rows(&r.old, lo / old_width, hi / old_width, &data);
        self.write_slots(r, p, &old_rows)?;
        {
            let mut meta = self.core.meta.locked();
            let pos = meta.sb.reshape.get_or_insert_with(ReshapePos::default);
            pos.backup = hi - lo;
            self.core.write_superblocks(&mut meta)?;
        }
        self.write_rows(&r.new, p, q, &data)?;
        self.core.flush()?;
        let mut meta = self.core.meta.locked();
        let pos = meta.sb.reshape.get_or_insert_with(ReshapePos::default);
        pos.rows = q;
        pos.backup = 0;
        self.core.write_superblocks(&mut meta)?;
        drop(meta);
        self.core.ensure_alive(lo)
    }

    /// Every member in service writes its own old bytes of the batch at
    /// new row `p` into its slot; all flushed. A member that cannot is
    /// failed (the level's redundancy decides whether the array goes on).
    fn write_slots(&self, r: &Reshaping, p: u64, per: &[Vec<u8>]) -> Result<()> {
        let at = r.slot.expect("a change of chunk has a slot").at;
        let uuid = self.core.meta.locked().sb.array_uuid;
        let v = self.core.view.load_full();
        crate::engine::in_parallel(per.iter().enumerate(), |(role, b)| {
            if !crate::core::Core::writable(&v, role) {
                return Ok(());
            }
            let mut slot = slot_header(uuid, p, b);
            slot.extend_from_slice(b);
            let rv = &v.roles[role];
            for d in rv.disk.iter().chain(rv.replacement.iter().map(|x| &x.0)) {
                if let Err(e) = d.member.write_at(&slot, at).and_then(|()| d.member.flush()) {
                    self.core.fail_disk_by_ptr(d, &e.to_string());
                }
            }
            Ok(())
        })?;
        self.core.ensure_alive(p * r.new.chunk)
    }

    /// At a start that finds the batch at new row `p` set aside: each
    /// member's old bytes written back where they were, flushed, and the
    /// batch recorded as no longer set aside (the reshape does it again).
    /// A member in service whose slot does not hold them intact: refused,
    /// since its bytes there may be neither placement's.
    pub(super) fn restore_slots(&self, r: &Reshaping, p: u64) -> Result<()> {
        let Slot { at, len, .. } = r.slot.expect("a change of chunk has a slot");
        let uuid = self.core.meta.locked().sb.array_uuid;
        // Every member's slot read and checked first: a member whose slot
        // does not give back its old bytes intact (rot, a read error) is
        // as good as lost for this batch, and is failed where the array
        // survives that (its bytes of the batch come back from the
        // others' through parity, as a missing member's do); refusing to
        // start kept an array from its data for one rotten sector.
        let v = self.core.view.load_full();
        let mut slots = Vec::new();
        let mut bad = Vec::new();
        for role in 0..r.new.members() {
            if !crate::core::Core::writable(&v, role) {
                continue;
            }
            let d = v.roles[role].disk.as_ref().expect("writable: a disk");
            let mut h = vec![0u8; SLOT_HEADER as usize];
            let n = d
                .member
                .read_at(&mut h, at)
                .ok()
                .and_then(|()| slot_len(&h, uuid, p))
                .filter(|&n| n > 0 && n <= len - SLOT_HEADER);
            let mut b = vec![0u8; n.unwrap_or(0) as usize];
            let intact = n.is_some()
                && d.member.read_at(&mut b, at + SLOT_HEADER).is_ok()
                && crate::superblock::get_u32(&h, 40) == crate::checksums::crc32c(&b);
            match intact {
                true => slots.push((role, b)),
                false => bad.push((role, d.clone())),
            }
        }
        if !bad.is_empty() {
            let mut gone = v.degraded_roles();
            gone.extend(bad.iter().map(|(role, _)| *role));
            let names: Vec<String> = bad
                .iter()
                .map(|(role, d)| format!("{} (role {role})", d.name()))
                .collect();
            if !r.new.survives(&gone) {
                return Err(Error::NotEnoughMembers {
                    name: self.core.name.clone(),
                    detail: format!(
                        "a change of chunk was cut in the batch at member offset {}, and {} {} not give back {} old bytes of it intact, more members than the array can do without: refusing to serve data that may be wrong",
                        p * r.new.chunk,
                        names.join(", "),
                        if names.len() == 1 { "does" } else { "do" },
                        if names.len() == 1 { "its" } else { "their" },
                    ),
                });
            }
            // Failed without taking spares in: a role is not rebuilt
            // while the reshape runs (the spare waits for its end).
            let mut meta = self.core.meta.locked();
            for (_, d) in &bad {
                self.core.fail_locked(
                    &mut meta,
                    d,
                    &format!(
                        "its copy of the change of chunk's batch at member offset {} is not intact",
                        p * r.new.chunk
                    ),
                );
            }
            self.core.write_superblocks(&mut meta)?;
        }
        let v = self.core.view.load_full();
        let mut restored = 0;
        for (role, b) in slots {
            if !crate::core::Core::writable(&v, role) {
                continue;
            }
            self.core.member_write(&v, role, &b, p * r.new.chunk)?;
            restored += b.len();
        }
        self.core.flush()?;
        let mut meta = self.core.meta.locked();
        if let Some(pos) = meta.sb.reshape.as_mut() {
            pos.backup = 0;
        }
        self.core.write_superblocks(&mut meta)?;
        drop(meta);
        self.recovery.note(vec![format!(
            "a change of chunk was cut in a batch: {restored} bytes of its members put back from their slots, and the batch is done again"
        )]);
        Ok(())
    }
}
