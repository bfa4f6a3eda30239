//! Growing an array by members while it serves (`raidkit grow --add`):
//! RAID-0, 4, 5 and 6 gain members and capacity, and every byte ends
//! where md places it for the new member count.
//!
//! # How data moves
//!
//! The reshape walks the new geometry's stripes ("rows") from the start.
//! Below the *boundary* (`rows` new stripes of array data) the new
//! geometry serves; from it on, the old one. Each step (a batch of rows
//! `[p, q)`) holds every client request off (the fence), reads the array
//! data the new rows will hold through the old geometry (reconstructing
//! where a member is missing), writes it as whole new stripes (parity
//! computed, checksums recorded, as any write), flushes, and records `q`
//! in the superblocks before clients come back. A request never sees a
//! boundary that is not durable.
//!
//! # Why no backup file is needed (except for the first rows)
//!
//! New row `r` lies where old row `r` did (same data offset, same chunk),
//! and a new row holds more data than an old one. Old row `r` holds array
//! data `[r * W_old, (r + 1) * W_old)` chunks (`W`: data chunks per row).
//! Overwriting old rows `[p, q)` is safe if everything they held is
//! already durable below the checkpointed boundary, `p * W_new` chunks:
//! `q * W_old <= p * W_new`. A crash in the middle of the batch then
//! tears only rows whose data nobody reads from there any more, and the
//! next start redoes the batch from the checkpoint. The batch a position
//! allows grows with it (by a factor `W_new / W_old` per step), so after a
//! few steps batches are limited only by how long clients may wait.
//!
//! The first rows have no such room (at `p = 0` nothing is below the
//! boundary): the critical section, `p_min = ceil(W_old / (W_new - W_old))`
//! rows. Their old data (`p_min * W_old` chunks) is first written to the
//! tail of the new members' data areas (which the reshape writes last),
//! flushed, and recorded in the superblocks (length and crc32c) before the
//! first new row is written. A crash there: the next start reads the
//! backup, checks its crc, and redoes the first batch from it before
//! serving. md does the same with its backup file; the new members' unused
//! space makes the file unnecessary.
//!
//! # The rest
//!
//! - The journal: before a batch overwrites old rows, every record written
//!   so far is known applied in place (a flush, then `applied_seq` in the
//!   superblocks), so no replay can write old data over moved rows.
//! - After a crash, journal intents and bitmap regions are resynced by the
//!   geometry their row is in (`view_for_row`); rows between the boundary
//!   and the old data still to move hold nothing anybody reads and are
//!   skipped: the resumed reshape rewrites them.
//! - New stripes beyond the old data (the new capacity) are then written
//!   with zeroes, parity and checksums with them, in the same batches:
//!   the new space reads back zeroes, and is consistent before it is
//!   exported (md resyncs whatever the disks held there).
//! - A member lost during a reshape: it goes on degraded (as md's), reading
//!   through reconstruction. Spares wait until it ends.

mod chunk;

use crate::background::{Plan, Process};
use crate::core::View;
use crate::engine::Array;
use crate::error::{Error, Result};
use crate::superblock::ReshapePos;
use raidkit_layout::{Geometry, Layout, Level, ParityLayout, Piece};
use raidkit_member::{Locked, Member};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// Array data one batch moves at most: clients wait for a batch.
const MAX_BATCH: u64 = 32 << 20;

/// Bytes of each member one batch of a change of chunk rewrites at most
/// (or one unit, if larger; `MAX_BATCH` of array data bounds it too). A
/// batch reads its bytes, sets them aside, flushes, records that, writes
/// them in place and records that: a fixed cost of about six flushes and
/// as many seeks to the metadata area and back, which a batch of a few
/// MiB per member pays once for every MiB it moves (0.14 x a disk's
/// bandwidth per member with 1.5 MiB batches, see docs/performance.md).
/// Clients wait only for requests to the batch's data, and, when the slot
/// is the journal's space, for writes.
const CHUNK_BATCH: u64 = 16 << 20;

/// What a batch in motion holds off.
#[derive(Debug, Clone, Copy)]
struct Moving {
    /// The array data being moved: requests to it wait.
    lo: u64,
    hi: u64,
    /// Whether every write waits too (a change of chunk whose slot is the
    /// journal's space: any write would log a record over the batch's
    /// bytes set aside).
    writes: bool,
}

impl Moving {
    fn holds(&self, off: u64, len: u64, write: bool) -> bool {
        (write && self.writes) || (off < self.hi && self.lo < off + len.max(1))
    }
}

/// A reshape in progress.
#[derive(Debug)]
pub(crate) struct Reshaping {
    pub old: Arc<Geometry>,
    pub new: Arc<Geometry>,
    /// New stripes written and recorded durable: the checkpoint.
    pub rows: AtomicU64,
    /// Roles that joined (the new members: `old.members()..new.members()`).
    pub first_new_role: usize,
    /// A change of chunk: where each member sets the old bytes of a batch
    /// aside.
    slot: Option<chunk::Slot>,
    /// What the batch under way holds off.
    moving: Mutex<Option<Moving>>,
    moved: Condvar,
}

impl Reshaping {
    fn new(
        old: Arc<Geometry>,
        new: Arc<Geometry>,
        rows: u64,
        slot: Option<chunk::Slot>,
    ) -> Reshaping {
        Reshaping {
            first_new_role: old.members(),
            old,
            new,
            rows: AtomicU64::new(rows),
            slot,
            moving: Mutex::new(None),
            moved: Condvar::new(),
        }
    }

    /// Whether this reshape changes the chunk (same members, same level).
    pub fn chunk_change(&self) -> bool {
        self.old.chunk != self.new.chunk
    }

    /// For a change of chunk: bytes of each member in which both
    /// geometries place the same array data (whole old and new rows).
    fn unit(&self) -> u64 {
        self.old.chunk.max(self.new.chunk)
    }

    /// For a change of chunk: whether member data offset `dev` is placed
    /// by the new chunk (below the checkpoint) or still by the old.
    fn placed_new(&self, dev: u64) -> bool {
        dev < self.rows.load(Ordering::Acquire) * self.new.chunk
    }

    /// For a change of chunk: the old stripes over the member bytes of new
    /// stripe `u`, or None if `u` is below the checkpoint (placed new).
    fn old_units(&self, u: u64) -> Option<std::ops::Range<u64>> {
        let (c, o) = (self.new.chunk, self.old.chunk);
        (!self.placed_new(u * c)).then(|| u * c / o..((u + 1) * c).div_ceil(o))
    }

    /// Data bytes of one new stripe.
    fn width(&self) -> u64 {
        self.new.chunk * self.new.data_members() as u64
    }

    /// New stripes that hold the old array's data (the last in part).
    pub fn data_rows(&self) -> u64 {
        self.old.capacity().div_ceil(self.width())
    }

    /// Array data below this offset is placed by the new geometry.
    pub fn boundary(&self) -> u64 {
        (self.rows.load(Ordering::Acquire) * self.width()).min(self.old.capacity())
    }

    /// Rows of the critical section: until then a batch overwrites old
    /// rows whose data is not yet below the boundary.
    fn critical_rows(&self) -> u64 {
        if self.chunk_change() {
            return 0;
        }
        let (wo, wn) = (
            self.old.data_members() as u64,
            self.new.data_members() as u64,
        );
        wo.div_ceil(wn - wo).min(self.data_rows())
    }

    /// Bytes of array data the critical section's backup holds.
    pub fn backup_len(&self) -> u64 {
        (self.critical_rows() * self.old.chunk * self.old.data_members() as u64)
            .min(self.old.capacity())
    }

    /// Where on each new member its copy of the backup lies (data-area
    /// offset) and how long it is. Every new member holds all of it, so
    /// that any one of them gives it back.
    fn backup_place(&self) -> (u64, u64) {
        let len = self.backup_len().next_multiple_of(4096);
        let at = self.new.member_sizes[0].saturating_sub(len) / self.new.chunk * self.new.chunk;
        (at, len)
    }

    /// The next batch from row `p`: its end.
    fn batch_end(&self, p: u64) -> u64 {
        if self.chunk_change() {
            // Whole units, as many as a member's slot holds; the first
            // batches small (one unit, then as many as are done), so that
            // the first waits clients see are short.
            let unit = self.unit();
            let per_unit = unit / self.new.chunk;
            let room = self
                .slot
                .map_or(0, |s| s.len.saturating_sub(chunk::SLOT_HEADER));
            let units = (p / per_unit)
                .min(room / unit)
                .min(CHUNK_BATCH / unit)
                .min(MAX_BATCH / (unit * self.new.data_members() as u64))
                .max(1);
            return (p + units * per_unit).min(self.new.stripes());
        }
        let (wo, wn) = (
            self.old.data_members() as u64,
            self.new.data_members() as u64,
        );
        let safe = if p == 0 {
            self.critical_rows()
        } else {
            p * wn / wo
        };
        let most = p + (MAX_BATCH / self.width()).max(1);
        safe.min(most).min(self.new.stripes()).max(p + 1)
    }

    /// A batch from row `p` that `batch_end` ends at `q`, cut to about
    /// `bytes` of array data (one row at least; whole units of a chunk
    /// change).
    fn paced_end(&self, p: u64, q: u64, bytes: u64) -> u64 {
        if self.chunk_change() {
            let unit = self.unit();
            let units = (bytes / (unit * self.new.data_members() as u64)).max(1);
            q.min(p + units * (unit / self.new.chunk))
        } else {
            q.min(p + (bytes / self.width()).max(1))
        }
    }

    /// Whether a request to `[off, off + len)` (a `write` or not) must
    /// wait for the batch under way.
    fn in_motion(&self, off: u64, len: u64, write: bool) -> bool {
        self.moving
            .locked()
            .is_some_and(|m| m.holds(off, len, write))
    }

    /// Wait until the batch under way no longer holds such a request off.
    fn wait_moved(&self, off: u64, len: u64, write: bool) {
        let mut m = self.moving.locked();
        while m.is_some_and(|m| m.holds(off, len, write)) {
            m = self
                .moved
                .wait(m)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// A view placing requests by the old geometry.
    pub fn old_view(&self, v: &View) -> Arc<View> {
        Arc::new(View {
            geom: self.old.clone(),
            ..v.clone()
        })
    }
}

/// What `grow` can do for an array of `level` now, or why not.
fn check_growable(level: Level) -> Result<()> {
    match level {
        Level::Raid0 | Level::Raid4 | Level::Raid5 | Level::Raid6 => Ok(()),
        Level::Linear => Err(Error::Invalid(
            "growing a linear array by members is not supported yet (its data would not move: only appended)".into(),
        )),
        Level::Raid1 => Err(Error::Invalid(
            "a RAID-1 gains copies, not capacity: add the member as a spare or convert with --level 5 (not supported yet)".into(),
        )),
        Level::Raid10 => Err(Error::Invalid(
            "growing RAID-10 by members is not supported yet".into(),
        )),
    }
}

impl Array {
    /// The reshape in progress, if any.
    pub(crate) fn reshaping(&self) -> Option<Arc<Reshaping>> {
        self.reshape
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Held by every client request to `[off, off + len)` (a `write`, or
    /// a read) for its whole run: a reshape takes it alone for a moment to
    /// change the boundary or to start moving data, so a request sees one
    /// boundary from start to end and never data in motion (it waits for
    /// that, unheld).
    pub(crate) fn fence(
        &self,
        off: u64,
        len: u64,
        write: bool,
    ) -> std::sync::RwLockReadGuard<'_, Option<Arc<Reshaping>>> {
        loop {
            let g = self.reshape.read().unwrap_or_else(|e| e.into_inner());
            match g.as_ref() {
                Some(r) if r.in_motion(off, len, write) => {
                    let r = r.clone();
                    drop(g);
                    r.wait_moved(off, len, write);
                }
                _ => return g,
            }
        }
    }

    /// Whether a reshape is in progress.
    pub fn reshape_in_progress(&self) -> bool {
        self.reshaping().is_some()
    }

    /// The capacity the array will have once its reshape ends.
    pub fn reshape_target(&self) -> Option<u64> {
        self.reshaping().map(|r| r.new.capacity())
    }

    /// The chunk before and after the reshape in progress, if any.
    pub fn reshape_chunks(&self) -> Option<(u64, u64)> {
        self.reshaping().map(|r| (r.old.chunk, r.new.chunk))
    }

    /// Grow the array by `members` (opened by the caller): they join as
    /// new roles and the data is moved to the new geometry in the
    /// background while the array serves. Refused, with nothing written,
    /// where it cannot be done.
    pub fn grow(&self, members: Vec<Arc<dyn Member>>, force: bool) -> Result<Geometry> {
        let old = self.core.geom();
        check_growable(old.level)?;
        if members.is_empty() {
            return Err(Error::Invalid("grow: no member to add".into()));
        }
        self.check_quiet("add members")?;
        let n = old.members() + members.len();
        let new = Geometry::new(
            old.level,
            old.layout,
            old.chunk,
            vec![old.member_sizes[0]; n],
        )
        .map_err(|e| Error::Invalid(format!("grow: {e}")))?;
        let plan = Reshaping::new(old.clone(), Arc::new(new.clone()), 0, None);
        let (at, _) = plan.backup_place();
        if at < plan.critical_rows() * old.chunk {
            return Err(Error::Invalid(format!(
                "grow: the members are too small to hold the reshape's first {} bytes aside",
                plan.backup_len()
            )));
        }
        // Clients held off while the members join: a request sees the old
        // view or the new one with its boundary, never a mix.
        let mut fence = self.reshape.write().unwrap_or_else(|e| e.into_inner());
        self.journal_applied()?;
        let pos = ReshapePos::starting(&old, None);
        self.core
            .join_for_reshape(members, Arc::new(new.clone()), pos, force)?;
        *fence = Some(Arc::new(plan));
        drop(fence);
        self.core.wake.kick();
        Ok(new)
    }

    /// Change the level where md does it without moving data (a
    /// takeover): RAID-4 to RAID-5 (md's parity-last layout, the same
    /// placement), and a two-member RAID-1 to a two-member RAID-5 (each
    /// stripe's parity is a copy of its one data chunk: the same bytes as
    /// the mirror). Every byte stays where it is; the superblocks record
    /// the new level and the one it came from. Other changes are refused,
    /// saying why.
    pub fn take_over(&self, level: Level) -> Result<Geometry> {
        let cur = self.core.geom();
        let new = match (cur.level, level) {
            (a, b) if a == b => {
                return Err(Error::Invalid(format!("the array is already {a}")));
            }
            (Level::Raid4, Level::Raid5) => Geometry::new(
                Level::Raid5,
                Layout::Parity(ParityLayout::ParityLast),
                cur.chunk,
                cur.member_sizes.clone(),
            ),
            (Level::Raid1, Level::Raid5) if cur.members() == 2 => Geometry::new(
                Level::Raid5,
                Layout::Parity(ParityLayout::LeftSymmetric),
                cur.chunk,
                cur.member_sizes.clone(),
            ),
            (Level::Raid1, Level::Raid5) => {
                return Err(Error::Invalid(format!(
                    "a RAID-1 becomes a RAID-5 with two members only (it has {}): fail and remove the others first",
                    cur.members()
                )));
            }
            (Level::Raid5, Level::Raid6) => {
                return Err(Error::Invalid(
                    "a RAID-5 becomes a RAID-6 with one new member for Q: give it (--add MEMBER)"
                        .into(),
                ));
            }
            (a, b) => {
                return Err(Error::Invalid(format!(
                    "changing {a} to {b} is not supported (raidkit converts RAID-4 and two-member RAID-1 to RAID-5)"
                )));
            }
        }
        .map_err(|e| Error::Invalid(format!("--level: {e}")))?;
        debug_assert_eq!(new.capacity(), cur.capacity());
        self.check_quiet("change the level")?;
        // No request under way while the level changes under them.
        let _fence = self.reshape.write().unwrap_or_else(|e| e.into_inner());
        let mut meta = self.core.meta.locked();
        meta.sb.converted_from = Some((meta.sb.level, meta.sb.layout, meta.sb.chunk));
        meta.sb.level = new.level;
        meta.sb.layout = new.layout;
        meta.sb.chunk = new.chunk;
        let v = self.core.view.load_full();
        self.core.view.store(Arc::new(View {
            geom: Arc::new(new.clone()),
            ..(*v).clone()
        }));
        if let Err(e) = self.core.write_superblocks(&mut meta) {
            // Not recorded: back to the level the members say.
            self.core.view.store(v);
            if let Some((l, lay, c)) = meta.sb.converted_from.take() {
                (meta.sb.level, meta.sb.layout, meta.sb.chunk) = (l, lay, c);
            }
            return Err(e);
        }
        drop(meta);
        self.level_changed(&cur, &new, "");
        Ok(new)
    }

    /// RAID-5 to RAID-6 with `m` (opened by the caller) as the new member,
    /// as md's takeover with `--layout=preserve`: the RAID-5 layout stays
    /// on the old members byte for byte and Q goes to the new last member
    /// (md's "-6" layouts), which is then built as a rebuild builds a
    /// member, online. The member joins as a spare first (an update of its
    /// own), then takes the new role with the new level in one superblock
    /// update; a crash between or during them starts the array at either
    /// level (see assembly's takeover rule).
    pub fn take_over_adding(
        &self,
        level: Level,
        m: Arc<dyn Member>,
        force: bool,
    ) -> Result<Geometry> {
        let cur = self.core.geom();
        let q_last = match (cur.level, level, cur.layout) {
            (Level::Raid5, Level::Raid6, Layout::Parity(p)) => p.with_q_last(),
            _ => None,
        };
        let Some(q_last) = q_last else {
            return Err(Error::Invalid(format!(
                "changing {} to {level} with a new member is not supported (raidkit converts RAID-5 to RAID-6 that way)",
                cur.level
            )));
        };
        let mut sizes = cur.member_sizes.clone();
        sizes.push(cur.member_sizes[0]);
        let new = Geometry::new(Level::Raid6, Layout::Parity(q_last), cur.chunk, sizes)
            .map_err(|e| Error::Invalid(format!("--level 6: {e}")))?;
        debug_assert_eq!(new.capacity(), cur.capacity());
        self.check_quiet("change the level")?;
        let name = m.name().to_string();
        match self.core.add_member(m, force)? {
            crate::core::Added::Spare => {}
            crate::core::Added::Role { role, .. } => {
                return Err(Error::Invalid(format!(
                    "{name} took role {role} of the array instead of becoming the new member for Q; the level is unchanged"
                )))
            }
        }
        let joined = {
            let _fence = self.reshape.write().unwrap_or_else(|e| e.into_inner());
            self.core.join_as_new_role(&name, Arc::new(new.clone()))
        };
        if let Err(e) = joined {
            // Nothing changed: the member does not stay behind as a spare
            // nobody asked for.
            let left = match self.core.remove_member(&name) {
                Ok(_) => format!("{name} was let go again"),
                Err(r) => format!("{name} was not let go: {r}"),
            };
            return Err(Error::Invalid(format!(
                "the level is unchanged: {name} could not take the role for Q ({e}); {left}"
            )));
        }
        self.core.wake.kick();
        self.level_changed(&cur, &new, &format!("; Q is being built on {name}"));
        Ok(new)
    }

    /// Announce a level change (event `LevelChanged`).
    fn level_changed(&self, cur: &Geometry, new: &Geometry, more: &str) {
        self.core.emit(
            crate::events::NewEvent::new(
                "LevelChanged",
                crate::events::Severity::Info,
                format!("now {} ({}), no data moved{more}", new.level, new.layout),
            )
            .data(serde_json::json!({
                "from": cur.level.to_string(),
                "to": new.level.to_string(),
                "layout": new.layout.to_string(),
            })),
        );
    }

    /// Refuse a change of shape while the array is not whole and quiet.
    pub(crate) fn check_quiet(&self, what: &str) -> Result<()> {
        if self.core.read_only {
            return Err(Error::Invalid("the array is open read-only".into()));
        }
        if self.core.meta.locked().sb.md.is_some() {
            return Err(Error::Invalid(format!(
                "cannot {what}: the array has md metadata (mdadm --grow does that under the kernel); nothing was written"
            )));
        }
        if self.reshape_in_progress() {
            return Err(Error::Invalid(
                "a reshape is already in progress; wait for it (raidkit wait)".into(),
            ));
        }
        let v = self.core.view.load_full();
        if !crate::core::Core::whole(&v) || !self.core.alive.load(Ordering::Acquire) {
            return Err(Error::Invalid(format!(
                "the array is degraded or rebuilding: {what} once every member is in sync (raidkit wait)"
            )));
        }
        if self.unsynced_from.load(Ordering::Acquire) != u64::MAX
            || self.recovery.pending_parity.locked().is_some()
            || self.recovery_status().is_some()
        {
            return Err(Error::Invalid(format!(
                "a resync, rebuild or scrub is running or pending: {what} once it has finished (raidkit wait)"
            )));
        }
        Ok(())
    }

    /// Every journal record written so far known applied in place (flushed,
    /// `applied_seq` recorded): none can be replayed over moved data.
    fn journal_applied(&self) -> Result<()> {
        let Some(j) = &self.journal else {
            return Ok(());
        };
        let seq = j.quiesce();
        if self.core.meta.locked().sb.journal.applied_seq >= seq {
            return Ok(());
        }
        self.core.flush()?;
        let mut meta = self.core.meta.locked();
        meta.sb.journal.applied_seq = meta.sb.journal.applied_seq.max(seq);
        self.core.write_superblocks(&mut meta)
    }

    /// At the start of an array whose superblocks record a reshape: the
    /// state to go on with (`redo` false, before the recovery of an
    /// unclean shutdown), then (`redo` true, after it) the first batch
    /// redone from the backup if it was cut in its critical section,
    /// before anything is served.
    pub(crate) fn resume_reshape(&self, pos: ReshapePos, redo: bool) -> Result<()> {
        if redo {
            let Some(r) = self.reshaping() else {
                return Ok(());
            };
            if pos.backup > 0 && !r.chunk_change() {
                let backup = self.read_backup(&r, pos)?;
                self.recovery.note(vec![format!(
                    "a reshape was cut in its first {} bytes: redone from their backup",
                    backup.len()
                )]);
                let q = r.batch_end(0);
                self.reshape_batch(&r, 0, q, Some(&backup))?;
            }
            return Ok(());
        }
        let new = self.core.geom();
        let n_old = pos.old_disks as usize;
        let chunk_change = pos.old_chunk != 0 && pos.old_chunk != new.chunk;
        if chunk_change && n_old != new.members() {
            return Err(Error::Invalid(format!(
                "the superblocks record a reshape from {n_old} to {} members and from chunk {} to {}, which raidkit cannot continue",
                new.members(),
                pos.old_chunk,
                new.chunk
            )));
        }
        if !chunk_change && (n_old == 0 || n_old >= new.members()) {
            return Err(Error::Invalid(format!(
                "the superblocks record a reshape from {n_old} to {} members, which raidkit cannot continue",
                new.members()
            )));
        }
        let old = Geometry::new(
            new.level,
            new.layout,
            if chunk_change {
                pos.old_chunk
            } else {
                new.chunk
            },
            new.member_sizes[..n_old].to_vec(),
        )
        .map_err(|e| Error::Invalid(format!("the reshape's old geometry: {e}")))?;
        let slot = if chunk_change {
            Some(self.chunk_slot().ok_or_else(|| {
                Error::Invalid(
                    "the superblocks record a change of chunk, but the members have no metadata space to set its batches aside".into(),
                )
            })?)
        } else {
            None
        };
        let r = Arc::new(Reshaping::new(Arc::new(old), new, pos.rows, slot));
        if pos.backup > 0 && self.core.read_only {
            return Err(Error::Invalid(
                "a reshape was cut in its critical section: start the array writable to redo it from its backup".into(),
            ));
        }
        if pos.backup > 0 && chunk_change {
            // Before recovery resyncs anything there: the batch cut short
            // gets its old bytes back on every member (the old placement,
            // where the checkpoint says it is), and is redone from them.
            self.restore_slots(&r, pos.rows)?;
        }
        self.core.set_capacity(r.old.capacity());
        *self.reshape.write().unwrap_or_else(|e| e.into_inner()) = Some(r);
        self.core.set_reshaping(true);
        self.core.wake.kick();
        Ok(())
    }

    /// The critical section's backup, from the first new member whose
    /// copy matches the crc32c recorded.
    fn read_backup(&self, r: &Reshaping, pos: ReshapePos) -> Result<Vec<u8>> {
        let (at, _) = r.backup_place();
        let v = self.core.view.load_full();
        let mut b = vec![0u8; pos.backup as usize];
        for role in r.first_new_role..r.new.members() {
            let Some(d) = v.roles[role].disk.as_ref() else {
                continue;
            };
            if self.core.disk_read(d, &mut b, at).is_ok()
                && crate::checksums::crc32c(&b) == pos.backup_crc
            {
                return Ok(b);
            }
        }
        Err(Error::NotEnoughMembers {
            name: self.core.name.clone(),
            detail: format!(
                "a reshape was cut in its critical section, and no new member (roles {} to {}) gives back the backup of its first {} bytes intact: refusing to serve data that may be wrong",
                r.first_new_role,
                r.new.members() - 1,
                pos.backup
            ),
        })
    }

    /// The view for member data offset `dev` while a reshape runs (as
    /// [`Self::view_for_row`]): for a change of chunk, the new geometry's
    /// below the checkpoint's member offset, the old one's from it on.
    pub(crate) fn view_for_dev(&self, dev: u64) -> Option<Arc<View>> {
        match self.reshaping() {
            Some(r) if r.chunk_change() => {
                let v = self.core.view.load_full();
                if r.placed_new(dev) {
                    Some(v)
                } else {
                    Some(r.old_view(&v))
                }
            }
            _ => self.view_for_row(dev / self.core.geom().chunk),
        }
    }

    /// The view, and its units (stripes of parity levels), that cover
    /// unit `u` of the array's geometry while a reshape runs: for a change
    /// of chunk, above the checkpoint the old stripes over the same member
    /// bytes. None: rows the reshape rewrites (see [`Self::view_for_row`]).
    pub(crate) fn units_for(&self, u: u64) -> Option<(Arc<View>, std::ops::Range<u64>)> {
        match self.reshaping() {
            Some(r) if r.chunk_change() => {
                let v = self.core.view.load_full();
                match r.old_units(u) {
                    None => Some((v, u..u + 1)),
                    Some(old) => Some((r.old_view(&v), old)),
                }
            }
            _ => self.view_for_row(u).map(|v| (v, u..u + 1)),
        }
    }

    /// The view requests to stripe `row` of the members' data areas go
    /// through while a reshape runs: the new geometry's below the
    /// checkpoint, the old one's where old data still lives, none between
    /// (rows whose old data has moved and whose new data is not written
    /// yet: the reshape rewrites them).
    pub(crate) fn view_for_row(&self, row: u64) -> Option<Arc<View>> {
        let v = self.core.view.load_full();
        let Some(r) = self.reshaping() else {
            return Some(v);
        };
        let p = r.rows.load(Ordering::Acquire);
        if row < p {
            return Some(v);
        }
        let old_width = r.old.chunk * r.old.data_members() as u64;
        (row >= r.boundary() / old_width).then(|| r.old_view(&v))
    }

    /// Run the reshape to its end (or until the array stops), batch by
    /// batch, paced by the rebuild limits.
    pub(crate) fn run_reshape(&self, r: Arc<Reshaping>) -> Result<()> {
        // Old data moved, then the new stripes beyond it written with
        // zeroes (parity and checksums with them): the whole new capacity.
        let width = r.width();
        let total = r.new.capacity();
        let start = (r.rows.load(Ordering::Acquire) * width).min(total);
        let mut process = Process::start(
            self,
            Plan {
                kind: "reshape",
                role: None,
                member: if r.chunk_change() {
                    format!("chunk {} to {}", r.old.chunk, r.new.chunk)
                } else {
                    format!("{} to {} members", r.old.members(), r.new.members())
                },
                with: Vec::new(),
                bytes_before: start,
                bytes_total: total - start,
                resumed_from: start,
            },
        );
        let result = (|| -> Result<String> {
            loop {
                let p = r.rows.load(Ordering::Acquire);
                if p >= r.new.stripes() {
                    break;
                }
                if process.stopped() {
                    return Ok("the array was stopped (resumed at the next start)".into());
                }
                if !self.core.alive.load(Ordering::Acquire) {
                    return Ok("the array has failed".into());
                }
                let mut q = r.batch_end(p);
                // Past the first batch (whose backup the restart after a
                // crash redoes as `batch_end(0)` says), smaller under a
                // low speed limit.
                if let Some(bytes) = self.paced_step().filter(|_| p > 0) {
                    q = r.paced_end(p, q, bytes);
                }
                self.reshape_batch(&r, p, q, None)?;
                let moved = ((q * width).min(total)).saturating_sub(p * width);
                process.advance(moved);
            }
            self.finish_reshape(&r)?;
            Ok("done".into())
        })();
        process.end(match &result {
            Ok(t) => t.clone(),
            Err(e) => e.to_string(),
        });
        result.map(|_| ())
    }

    /// Move new rows `[p, q)`: requests to the array data they take (and
    /// only those) held off, the data read by the old geometry (or, for
    /// the first rows after a crash, from `backup`), written by the new as
    /// whole rows, flushed, the position recorded, then published.
    fn reshape_batch(&self, r: &Reshaping, p: u64, q: u64, backup: Option<&[u8]>) -> Result<()> {
        if r.chunk_change() {
            // Units are rewritten in place: requests to the batch's data
            // wait, and every write if the slot is the journal's space.
            let (lo, hi) = (p * r.width(), (q * r.width()).min(r.old.capacity()));
            let writes = r.slot.is_some_and(|s| s.journal);
            return self.holding_off(r, Moving { lo, hi, writes }, q, || self.move_units(r, p, q));
        }
        let (wo, wn) = (r.old.data_members() as u64, r.new.data_members() as u64);
        let critical = q * wo > p * wn;
        debug_assert!(
            !critical || p == 0,
            "only the first batch overwrites live rows"
        );
        let width = r.width();
        let (lo, hi) = (p * width, (q * width).min(r.old.capacity()));
        let moving = Moving {
            lo,
            hi,
            writes: false,
        };
        self.holding_off(r, moving, q, || self.move_rows(r, p, q, backup, critical))
    }

    /// Run `step` (a batch ending at new row `q`) with the requests
    /// `moving` says held off, then publish `q` as the boundary if it
    /// succeeded and let them go.
    fn holding_off(
        &self,
        r: &Reshaping,
        moving: Moving,
        q: u64,
        step: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        // Taken alone for a moment: requests under way end, and those to
        // come wait if the batch holds them off.
        if moving.lo < moving.hi || moving.writes {
            let _w = self.reshape.write().unwrap_or_else(|e| e.into_inner());
            *r.moving.locked() = Some(moving);
        }
        let done = step();
        let _w = self.reshape.write().unwrap_or_else(|e| e.into_inner());
        if done.is_ok() {
            r.rows.store(q, Ordering::Release);
        }
        *r.moving.locked() = None;
        r.moved.notify_all();
        done
    }

    fn move_rows(
        &self,
        r: &Reshaping,
        p: u64,
        q: u64,
        backup: Option<&[u8]>,
        critical: bool,
    ) -> Result<()> {
        let width = r.width();
        let (lo, hi) = (p * width, q * width);
        let src_end = hi.min(r.old.capacity());
        self.journal_applied()?;
        let mut buf = vec![0u8; (hi - lo) as usize];
        let mut from = lo;
        if let Some(b) = backup {
            let n = (b.len() as u64).min(src_end) as usize;
            buf[..n].copy_from_slice(&b[..n]);
            from = n as u64;
        }
        if from < src_end {
            let v = self.core.view.load_full();
            let old = r.old_view(&v);
            let at = (from - lo) as usize;
            self.read_view(&old, &mut buf[at..(src_end - lo) as usize], from)?;
        }
        if critical && backup.is_none() {
            self.write_backup(r, &buf[..r.backup_len() as usize])?;
        }
        self.write_rows(&r.new, p, q, &buf)?;
        self.core.flush()?;
        let mut meta = self.core.meta.locked();
        let pos = meta.sb.reshape.get_or_insert_with(ReshapePos::default);
        pos.rows = q;
        pos.backup = 0;
        pos.backup_crc = 0;
        self.core.write_superblocks(&mut meta)?;
        drop(meta);
        self.core.ensure_alive(lo)
    }

    /// Write rows `[p, q)` of geometry `g` whole with `data` (the array
    /// data they hold), P and Q computed, one write per member. No journal:
    /// a crash before the rows are recorded done leaves them to be
    /// written again from the same source. The bitmap is marked only
    /// while a member is away, so that it gets these rows when it returns.
    fn write_rows(&self, g: &Geometry, p: u64, q: u64, data: &[u8]) -> Result<()> {
        let chunk = g.chunk;
        let (per, pieces) = place_rows(g, p, q, data);
        let v = self.core.view.load_full();
        let v = View {
            geom: Arc::new(g.clone()),
            ..(*v).clone()
        };
        let _bits = (!crate::core::Core::whole(&v))
            .then(|| self.mark_bitmap(&v, &pieces))
            .flatten();
        let _locks = self.core.lock_range(p, q);
        let v = self.core.view_under_lock(&v);
        crate::engine::in_parallel(per.iter().enumerate(), |(role, b)| {
            if crate::core::Core::writable(&v, role) {
                self.core.member_write(&v, role, b, p * chunk)
            } else {
                Ok(())
            }
        })
    }

    /// Write the critical section's old data to the new members' tails,
    /// make it durable, and record it in the superblocks.
    fn write_backup(&self, r: &Reshaping, data: &[u8]) -> Result<()> {
        let (at, _) = r.backup_place();
        let v = self.core.view.load_full();
        let mut kept = 0;
        let mut why = String::from("every new member is missing");
        for role in r.first_new_role..r.new.members() {
            let Some(d) = v.roles[role].disk.as_ref() else {
                continue;
            };
            match self
                .core
                .disk_write(d, data, at)
                .and_then(|()| d.member.flush())
            {
                Ok(()) => kept += 1,
                Err(e) => {
                    why = e.to_string();
                    self.core.fail_disk_by_ptr(d, &why);
                }
            }
        }
        if kept == 0 {
            return Err(Error::Invalid(format!(
                "the reshape's first rows could not be set aside on a new member: {why}"
            )));
        }
        let mut meta = self.core.meta.locked();
        let pos = meta.sb.reshape.get_or_insert_with(ReshapePos::default);
        pos.backup = data.len() as u64;
        pos.backup_crc = crate::checksums::crc32c(data);
        self.core.write_superblocks(&mut meta)
    }

    /// The last row written: the new geometry everywhere, the new
    /// capacity exported.
    fn finish_reshape(&self, r: &Reshaping) -> Result<()> {
        let mut fence = self.reshape.write().unwrap_or_else(|e| e.into_inner());
        {
            let mut meta = self.core.meta.locked();
            meta.sb.reshape = None;
            meta.sb.array_size = r.new.capacity();
            self.core.write_superblocks(&mut meta)?;
        }
        self.core.set_capacity(r.new.capacity());
        *fence = None;
        drop(fence);
        self.core.set_reshaping(false);
        // (A change of chunk keeps the size: ReshapeFinished says it ended.)
        if !r.chunk_change() {
            self.core.emit(
                crate::events::NewEvent::new(
                    "CapacityChanged",
                    crate::events::Severity::Info,
                    format!(
                        "grown to {} members, {} bytes",
                        r.new.members(),
                        r.new.capacity()
                    ),
                )
                .data(serde_json::json!({
                    "members": r.new.members(),
                    "size": r.new.capacity(),
                    "old_size": r.old.capacity(),
                })),
            );
        }
        let _ = self.core.use_spares();
        self.core.wake.kick();
        Ok(())
    }
}

/// Each member's bytes of rows `[p, q)` of geometry `g` holding `data`
/// (the array data of those rows): P and Q computed. With the pieces.
fn place_rows(g: &Geometry, p: u64, q: u64, data: &[u8]) -> (Vec<Vec<u8>>, raidkit_layout::Pieces) {
    let width = g.chunk * g.data_members() as u64;
    let lo = p * width;
    let c = g.chunk as usize;
    let rows = (q - p) as usize;
    let mut per: Vec<Vec<u8>> = (0..g.members()).map(|_| vec![0u8; rows * c]).collect();
    let pieces = g.pieces(lo, data.len() as u64);
    let src = |piece: &Piece| {
        let from = (piece.logical - lo) as usize;
        &data[from..from + piece.len as usize]
    };
    crate::levels::parity::member_rows(g, p, &pieces, &src, &mut per);
    (per, pieces)
}

#[cfg(test)]
mod tests;
