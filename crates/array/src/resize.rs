//! Growing an array into members that have grown (`raidkit grow --size
//! max`, md's `mdadm --grow --size=max`): a disk replaced by a larger one
//! one at a time, a logical volume or a virtual disk extended, a member
//! file made longer. No data moves: every level here but linear places a
//! chunk by its stripe (or row) number alone (RAID-10's near and offset
//! layouts too), so the stripes that exist keep their places and new
//! stripes follow them on every member. Linear is refused: a member that
//! grew in the middle would move everything after it; so is RAID-10's far
//! layout, whose far copies lie a share of the member apart (md refuses
//! it too).
//!
//! Online, under the fence that keeps requests out while the shape
//! changes: the members' lengths looked at anew (`Member::peek_len`; used,
//! `Member::refresh_len`, only once the grow is accepted),
//! the checksums of the new blocks cleared (none yet: each is sealed as
//! first written or read), the bitmap widened, then one superblock update
//! records the new data size of every member, the new array size and, for
//! redundant levels, a resync from the first new unit: the new stripes'
//! parity (or copies) is made consistent in the background, as an initial
//! sync does (and resumed after a restart from its checkpoint). Until it
//! passes, the new space reads what the disks held there, as md's does.

use crate::background::ParityResync;
use crate::engine::Array;
use crate::error::{Error, Result};
use raidkit_layout::{Geometry, Level};
use raidkit_member::Locked;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Array {
    /// Use the room every member has gained since the array was made or
    /// last grown. Returns the capacity before and after.
    pub fn grow_size(&self) -> Result<(u64, u64)> {
        self.check_quiet("grow the size")?;
        let cur = self.core.geom();
        if cur.level == Level::Linear {
            return Err(Error::Invalid(
                "a linear array grows by members (--add): a member that grew in the middle would move everything after it".into(),
            ));
        }
        if let raidkit_layout::Layout::Far(_) = cur.layout {
            // Each far copy lies a section (a share of the member) below
            // the one before: longer members move every copy but the first.
            return Err(Error::Invalid(format!(
                "a RAID-10 of the far layout ({}) cannot grow into its members: every copy but the first would move (as md, which refuses it too)",
                cur.layout
            )));
        }
        if self.core.meta.locked().sb.resync.is_some() {
            return Err(Error::Invalid(
                "a resync is still to finish: grow the size after it (raidkit wait)".into(),
            ));
        }
        let v = self.core.view.load_full();
        let mut disks = Vec::with_capacity(v.roles.len());
        let mut room = u64::MAX;
        for rv in &v.roles {
            let d = rv.disk.as_ref().ok_or_else(|| {
                Error::Invalid("a member is missing: grow the size once the array is whole".into())
            })?;
            // Looked at, not yet used: a grow refused below leaves every
            // member's length in use as it was.
            let len = d
                .member
                .peek_len()
                .map_err(|e| Error::Invalid(format!("looking at the size of {e}")))?;
            room = room.min(len.saturating_sub(d.data_offset));
            disks.push(d.clone());
        }
        let new = Geometry::new(cur.level, cur.layout, cur.chunk, vec![room; cur.members()])
            .map_err(|e| Error::Invalid(format!("--size max: {e}")))?;
        let (old_size, new_size) = (cur.member_sizes[0], new.member_sizes[0]);
        if new.capacity() <= cur.capacity() {
            return Err(Error::Invalid(format!(
                "no room to grow into: the smallest member has {room} bytes after its metadata, and the array uses {old_size} of each (whole {}-byte chunks); grow every member's device or file first",
                cur.chunk
            )));
        }
        // A spare too small for the grown array could never take a role.
        for sp in &v.spares {
            let len = sp.member.peek_len().unwrap_or(sp.member.len());
            if len.saturating_sub(sp.data_offset) < new_size {
                return Err(Error::Invalid(format!(
                    "spare {} has room for {} bytes of data, the grown array needs {new_size} on every member: grow it too, or remove it first (raidkit remove)",
                    sp.member.name(),
                    len.saturating_sub(sp.data_offset)
                )));
            }
        }
        for d in &disks {
            if let Some(c) = &d.checked {
                if !c.covers(new_size) {
                    return Err(Error::Invalid(format!(
                        "the checksum area of {} has entries for {} bytes of data, less than the {new_size} the members' room would give each (it was sized for the member as it was made, in steps of 64 KiB that cover 64 MiB, and lies before the data, where it cannot grow online)",
                        d.member.name(),
                        c.covered()
                    )));
                }
            }
        }
        if let Some(b) = &self.core.bitmap {
            if !b.grow(new_size) {
                return Err(Error::Invalid(format!(
                    "the write-intent bitmap has no bits for {new_size} bytes of data per member at its region size ({} bytes)",
                    b.region()
                )));
            }
        }
        // Accepted: the members' new lengths used from now on (spares'
        // too: one taking a role needs the grown room).
        for d in &disks {
            let len = d
                .member
                .refresh_len()
                .map_err(|e| Error::Invalid(format!("looking at the size of {e}")))?;
            if len.saturating_sub(d.data_offset) < new_size {
                return Err(Error::Invalid(format!(
                    "{} shrank while the array grew into it: it has room for {} bytes of data, the grown array needs {new_size}",
                    d.member.name(),
                    len.saturating_sub(d.data_offset)
                )));
            }
        }
        for sp in &v.spares {
            let _ = sp.member.refresh_len();
        }
        // The new blocks have no checksum yet, on the members before the
        // superblocks say they hold data.
        for d in &disks {
            if let Some(c) = &d.checked {
                c.forget(d.data_offset + old_size, d.data_offset + new_size)
                    .map_err(|e| Error::Invalid(format!("clearing checksums: {e}")))?;
            }
        }
        self.flush()?;
        // Units (stripes, or chunks of a mirror) below the old size keep
        // their places: the resync starts at the first new one.
        let first_new = self.level().units(self);
        let redundant = cur.level.has_redundancy();
        let fence = self.reshape.write().unwrap_or_else(|e| e.into_inner());
        let mut meta = self.core.meta.locked();
        let before = meta.sb.clone();
        for (role, r) in meta.sb.roles.iter_mut().enumerate() {
            if role < cur.members() {
                r.data_size = new_size;
            }
        }
        meta.sb.array_size = new.capacity();
        if redundant {
            meta.sb.resync = Some(first_new);
        }
        let sizes: Vec<u64> = disks.iter().map(|d| d.sb.locked().data_size).collect();
        for d in &disks {
            d.sb.locked().data_size = new_size;
        }
        self.core.view.store(Arc::new(crate::core::View {
            geom: Arc::new(new.clone()),
            ..(*v).clone()
        }));
        if let Err(e) = self.core.write_superblocks(&mut meta) {
            // Not recorded: the size the members say.
            self.core.view.store(v);
            for (d, s) in disks.iter().zip(sizes) {
                d.sb.locked().data_size = s;
            }
            meta.sb.roles = before.roles;
            meta.sb.array_size = before.array_size;
            meta.sb.resync = before.resync;
            return Err(e);
        }
        drop(meta);
        self.core.set_capacity(new.capacity());
        if redundant {
            self.unsynced_from.store(first_new, Ordering::Release);
            *self.recovery.pending_parity.locked() = Some(ParityResync {
                from: Some(first_new),
                marked: None,
            });
        }
        drop(fence);
        self.core.emit(
            crate::events::NewEvent::new(
                "CapacityChanged",
                crate::events::Severity::Info,
                format!(
                    "grown into its members' new room: {} to {} bytes",
                    cur.capacity(),
                    new.capacity()
                ),
            )
            .data(serde_json::json!({
                "members": new.members(),
                "size": new.capacity(),
                "old_size": cur.capacity(),
            })),
        );
        self.core.wake.kick();
        Ok((cur.capacity(), new.capacity()))
    }
}
