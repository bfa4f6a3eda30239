//! Changing a stopped array's consistency policy (`raidkit policy`): the
//! bitmap and journal areas are laid out in the metadata area that every
//! member already reserves before its data, so a change rewrites metadata
//! only, never data.

use crate::assemble::{Assembly, Health};
use crate::bitmap;
use crate::create::{bitmap_bytes, journal_area, Policy};
use crate::error::{Error, Result};
use crate::superblock::{write_superblock, ArrayState, BitmapArea, JournalArea, Superblock};
use raidkit_member::Member;
use std::sync::Arc;

/// What a policy change did.
#[derive(Debug, Clone)]
pub struct PolicyChange {
    pub from: Policy,
    pub to: Policy,
    /// The bitmap's region size now (0: no bitmap).
    pub bitmap_region: u64,
    /// Bytes of each member's metadata area the journal now takes.
    pub journal_bytes: u64,
    /// Members whose superblocks were rewritten (spares included).
    pub members: usize,
    /// Bytes of checksum entries cleared where an earlier journal lay over
    /// them (see `journal_over_checksums`), over all members.
    pub cleared_checksums: u64,
}

/// Set the consistency policy of the stopped array `asm` to `to`.
/// `region`: the bitmap's region size for a policy that needs a bitmap
/// (None: keep the present one, or md's default of 64 MiB).
///
/// Refused unless every member is present and in sync and the array was
/// stopped cleanly: a bitmap dropped while a member is away would forget
/// what that member missed, and a journal dropped before it was replayed
/// would lose the stripes it protects.
pub fn set_policy(asm: &Assembly, to: Policy, region: Option<u64>) -> Result<PolicyChange> {
    if let Some(m) = &asm.sb.md {
        // md keeps its own bitmap and journal formats; raidkit's would be
        // invisible to the kernel, and md's superblock has no place for them.
        return Err(Error::Invalid(format!(
            "array '{}' has md {} metadata: its consistency policy is md's to change (mdadm --grow --bitmap=...); nothing was written",
            asm.sb.name,
            m.version.name()
        )));
    }
    let sb = &asm.sb;
    let from = Policy::of(sb);
    let name = &sb.name;
    if asm.health() != Health::Optimal {
        return Err(Error::Invalid(format!(
            "array '{name}' is not whole (missing or rebuilding: role(s) {}); its policy can change only with every member present and in sync",
            crate::engine::roles_list(asm.degraded_roles().into_iter())
        )));
    }
    if sb.state != ArrayState::Clean || sb.resync.is_some() {
        return Err(Error::Invalid(format!(
            "array '{name}' was not stopped cleanly{}: serve it until it is clean (raidkit wait), stop it, then change its policy",
            if sb.resync.is_some() {
                " (its initial sync has not finished)"
            } else {
                ""
            }
        )));
    }
    if to != Policy::None && !sb.level.has_redundancy() {
        return Err(Error::Invalid(format!(
            "{} has no redundancy to keep consistent: its only policy is none",
            sb.level
        )));
    }
    if to == Policy::Journal && !sb.level.is_parity() {
        return Err(Error::Invalid(format!(
            "the journal closes the write hole of parity levels; {} has none (use bitmap)",
            sb.level
        )));
    }
    let region = match to {
        Policy::None => 0,
        _ => region
            .filter(|&r| r > 0)
            .or((sb.bitmap.region > 0).then_some(sb.bitmap.region))
            .unwrap_or(bitmap::DEFAULT_REGION),
    };
    if region > 0 && !region.is_power_of_two() {
        return Err(Error::Invalid(format!(
            "bitmap region {region} bytes: give a power of two (e.g. 64M)"
        )));
    }
    let members: Vec<(Arc<dyn Member>, Superblock)> = asm
        .slots
        .iter()
        .filter_map(|s| Some((s.member.clone()?, s.sb.clone()?)))
        .chain(asm.spares.iter().cloned())
        .collect();
    let overlaps: Vec<(usize, (u64, u64))> = members
        .iter()
        .enumerate()
        .filter_map(|(i, (_, s))| Some((i, journal_over_checksums(s)?)))
        .collect();
    if to == from && region == sb.bitmap.region && overlaps.is_empty() {
        return Ok(PolicyChange {
            from,
            to,
            bitmap_region: region,
            journal_bytes: sb.journal.size,
            members: 0,
            cleared_checksums: 0,
        });
    }
    let n = asm.slots.len();
    let biggest = sb.roles.iter().map(|r| r.data_size).max().unwrap_or(0);
    // The bitmap and journal lie at the same offsets on every member and
    // end where the first checksum area (or data area) begins, as `create`
    // places them: a journal laid up to the data offset took the checksum
    // area's first blocks, blanked them here and overwrote them with every
    // record, and the blocks they covered then read as rot.
    let metadata_end = members
        .iter()
        .map(|(_, s)| {
            if s.checksums.enabled() {
                s.checksums.offset
            } else {
                s.data_offset
            }
        })
        .min()
        .unwrap_or(0);
    let bitmap_len = bitmap_bytes(region, biggest, metadata_end)?;
    let journal = match to {
        Policy::Journal => journal_area(bitmap_len, metadata_end, n)?,
        _ => JournalArea::default(),
    };
    let events = sb.events + 1;
    let now = crate::core::unix_now();
    // The array is clean: its old areas hold nothing still needed (no dirty
    // region, every journal record applied). The new areas are blanked
    // first (nothing from an earlier policy is ever replayed), then the
    // superblocks point at them; a crash in between leaves the old policy
    // over blank areas, which is consistent.
    for (m, _) in &members {
        blank(m.as_ref(), bitmap::BITMAP_OFFSET, bitmap_len)?;
        blank(m.as_ref(), journal.offset, journal.size)?;
        m.flush()?;
    }
    // A journal an earlier `policy` laid over the checksums left records
    // (or zeroes) where checksums belong: those entries say "no checksum
    // yet" from now on, so that the blocks they cover are read again and
    // their checksums taken anew, not failed as rot. A scrub then checks
    // them against redundancy.
    for &(i, (at, len)) in &overlaps {
        blank(members[i].0.as_ref(), at, len)?;
        members[i].0.flush()?;
    }
    for (m, own) in &members {
        let mut s = own.clone();
        s.events = events;
        s.utime = now;
        s.bitmap = if region > 0 {
            BitmapArea {
                offset: bitmap::BITMAP_OFFSET,
                region,
                events_cleared: events,
            }
        } else {
            BitmapArea::default()
        };
        s.journal = journal;
        write_superblock(m.as_ref(), &mut s)?;
    }
    for (m, _) in &members {
        m.close()?;
    }
    Ok(PolicyChange {
        from,
        to,
        bitmap_region: region,
        journal_bytes: journal.size,
        members: members.len(),
        cleared_checksums: overlaps.iter().map(|(_, (_, len))| len).sum(),
    })
}

/// The bytes of `sb`'s checksum area that the journal's area covers, if
/// any: `raidkit policy` laid journals up to the data before it kept them
/// below the checksums (as `create` does), and every record then
/// overwrote checksums.
pub fn journal_over_checksums(sb: &Superblock) -> Option<(u64, u64)> {
    let (j, c) = (&sb.journal, &sb.checksums);
    if j.size == 0 || !c.enabled() {
        return None;
    }
    let from = j.offset.max(c.offset);
    let to = (j.offset + j.size).min(c.offset + c.size);
    (from < to).then_some((from, to - from))
}

/// Zero `len` bytes at `offset`, a megabyte at a time.
fn blank(m: &dyn Member, offset: u64, len: u64) -> Result<()> {
    const STEP: u64 = 1 << 20;
    let zeros = vec![0u8; STEP.min(len) as usize];
    let mut at = 0;
    while at < len {
        let n = STEP.min(len - at);
        m.write_at(&zeros[..n as usize], offset + at)?;
        at += n;
    }
    Ok(())
}
