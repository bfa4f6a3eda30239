//! Assembly: from members given in any order to a description of the array,
//! trusting nothing silently. Members of different arrays, duplicates,
//! corrupt superblocks and stale members are detected here.

use crate::error::{Error, Result};
use crate::superblock::{read_superblock, ArrayState, Role, RoleState, Superblock};
use raidkit_layout::Geometry;
use raidkit_member::Member;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Arc;

/// The health of an assembled array.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    Optimal,
    Degraded,
    Failed,
}

impl Health {
    pub fn name(self) -> &'static str {
        match self {
            Health::Optimal => "optimal",
            Health::Degraded => "degraded",
            Health::Failed => "failed",
        }
    }
}

/// Why a role has no usable member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Absence {
    /// No member for this role was given.
    Missing,
    /// A member was given but may not be trusted.
    Stale { member: String, reason: String },
}

/// One role of the array.
#[derive(Debug, Clone)]
pub struct Slot {
    pub member: Option<Arc<dyn Member>>,
    /// Set when `member` is None.
    pub absence: Option<Absence>,
    /// The member's own superblock (fresh members only).
    pub sb: Option<Superblock>,
    /// A fresh member in the middle of a rebuild: where to resume it.
    pub resume: Option<u64>,
    /// A stale member given for this role (never read; resynced if taken back).
    pub stale: Option<(Arc<dyn Member>, Superblock)>,
    /// The stale member still holds this role in the role table.
    pub stale_is_ours: bool,
    /// A member being built to replace this role's, which serves meanwhile
    /// (`raidkit replace`): where it got is its `recovery_offset`.
    pub replacement: Option<(Arc<dyn Member>, Superblock)>,
}

/// An assembled array description.
#[derive(Debug, Clone)]
pub struct Assembly {
    /// The freshest superblock (highest event counter).
    pub sb: Superblock,
    pub slots: Vec<Slot>,
    pub spares: Vec<(Arc<dyn Member>, Superblock)>,
    pub geometry: Geometry,
    /// Things the user should know that do not stop assembly.
    pub warnings: Vec<String>,
}

impl Assembly {
    pub fn missing_roles(&self) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|&r| self.slots[r].member.is_none())
            .collect()
    }

    /// Roles whose data cannot be read from their own member everywhere:
    /// missing ones, and members part-way through a rebuild.
    pub fn degraded_roles(&self) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|&r| self.slots[r].member.is_none() || self.slots[r].resume.is_some())
            .collect()
    }

    pub fn health(&self) -> Health {
        let missing = self.degraded_roles();
        if missing.is_empty() {
            Health::Optimal
        } else if self.geometry.survives(&missing) {
            Health::Degraded
        } else {
            Health::Failed
        }
    }

    /// md's `--force`: if the array cannot run, take back the most recent
    /// stale members as if in sync until it can. Returns what was forced.
    /// Their data may miss the last writes before they dropped out; the
    /// members still missing are rebuilt from them.
    pub fn force(&mut self) -> Vec<String> {
        let mut forced = Vec::new();
        while self.health() == Health::Failed {
            let best = (0..self.slots.len())
                .filter(|&r| self.slots[r].member.is_none())
                .filter_map(|r| self.slots[r].stale.as_ref().map(|(_, sb)| (r, sb.events)))
                .max_by_key(|&(_, e)| e);
            let Some((r, events)) = best else { break };
            let slot = &mut self.slots[r];
            let (m, mut sb) = slot.stale.take().expect("stale member");
            forced.push(format!(
                "{}: forced back into role {r} (event counter {events}, the array's is {})",
                m.name(),
                self.sb.events
            ));
            sb.events = self.sb.events;
            sb.recovery_offset = None;
            self.sb.roles[r].member_uuid = sb.member_uuid;
            self.sb.roles[r].state = RoleState::Active;
            slot.member = Some(m);
            slot.sb = Some(sb);
            slot.absence = None;
            slot.resume = None;
        }
        forced
    }

    /// A sentence naming each unavailable role and why.
    pub fn describe_missing(&self) -> String {
        self.degraded_roles()
            .iter()
            .map(|&r| self.describe_role(r))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Why role `r` cannot serve, as the assembly sees it.
    pub fn describe_role(&self, r: usize) -> String {
        match (&self.slots[r].member, &self.slots[r].absence) {
            (Some(m), _) => format!(
                "role {r} ({}: rebuilding, in sync up to {} bytes of its data area)",
                m.name(),
                self.slots[r].resume.unwrap_or(0)
            ),
            (None, Some(Absence::Stale { member, reason })) => {
                format!("role {r} ({member}: stale, {reason})")
            }
            _ => format!("role {r} (missing)"),
        }
    }
}

/// Assemble the array that `members` belong to.
/// What start-up says of a member given but left out: a stale one whose
/// role another member holds (the one a `replace` retired, an old copy).
fn not_used(member: &str, reason: &str, instead: &str) -> String {
    format!("{member}: not used: stale ({reason}); {instead}")
}

const HELD: &str = "its role has a current member";

pub fn assemble(members: Vec<Arc<dyn Member>>) -> Result<Assembly> {
    if members.is_empty() {
        return Err(Error::Invalid("no members given".into()));
    }
    let mut warnings = Vec::new();
    let mut found = Vec::with_capacity(members.len());
    for m in members {
        let r = read_superblock(m.as_ref())?;
        if r.copies_valid != [true, true] {
            warnings.push(format!(
                "{}: one superblock copy is unreadable (interrupted update?); using the other",
                m.name()
            ));
        }
        found.push((m, r.sb));
    }

    // One array only.
    let first_uuid = found[0].1.array_uuid;
    if found.iter().any(|(_, sb)| sb.array_uuid != first_uuid) {
        let list = found
            .iter()
            .map(|(m, sb)| format!("  {}: array {} ('{}')", m.name(), sb.array_uuid, sb.name))
            .collect::<Vec<_>>()
            .join("\n");
        return Err(Error::MixedArrays(list));
    }

    // Each member once.
    let mut seen: HashMap<uuid::Uuid, String> = HashMap::new();
    for (m, sb) in &found {
        if let Some(first) = seen.insert(sb.member_uuid, m.name().to_string()) {
            return Err(Error::DuplicateMember {
                first,
                second: m.name().to_string(),
                uuid: sb.member_uuid.to_string(),
            });
        }
    }

    // The freshest superblock speaks for the array.
    let fresh = found
        .iter()
        .max_by_key(|(_, sb)| (sb.events, sb.seq))
        .map(|(_, sb)| sb.clone())
        .expect("non-empty");
    let n = fresh.raid_disks();
    let mut slots: Vec<Slot> = (0..n)
        .map(|_| Slot {
            member: None,
            absence: Some(Absence::Missing),
            sb: None,
            resume: None,
            stale: None,
            stale_is_ours: false,
            replacement: None,
        })
        .collect();
    let mut replacing = Vec::new();
    let mut spares = Vec::new();
    let mut dirty = false;
    // The update that starts a reshape changes the shape; a crash in the
    // middle of it leaves members one behind with the old one. Nothing has
    // moved yet (no row done, no backup), so they are current, and a new
    // member that still has the spare superblock it was given just before
    // takes the role the array gave it.
    let starting = fresh
        .reshape
        .filter(|r| r.rows == 0 && r.backup == 0)
        .map(|r| r.old_disks as usize);
    for (m, sb) in found {
        let missed_start = starting.is_some_and(|old| {
            sb.events + 1 == fresh.events && sb.reshape.is_none() && sb.raid_disks() == old
        });
        // Likewise a level takeover (no data moved): one behind with the
        // shape it was converted from is current.
        // RAID-5 to RAID-6 adds the member for Q as a new last role.
        let took_q = fresh.level == raidkit_layout::Level::Raid6
            && sb.level == raidkit_layout::Level::Raid5
            && sb.raid_disks() + 1 == n;
        let missed_takeover = sb.events + 1 == fresh.events
            && fresh.converted_from == Some((sb.level, sb.layout, sb.chunk))
            && (sb.raid_disks() == n || took_q);
        // (A change of chunk starts with the new chunk recorded.)
        let missed_chunk_start = missed_start
            && fresh
                .reshape
                .is_some_and(|r| r.old_chunk != 0 && r.old_chunk == sb.chunk);
        let shape_differs = !missed_takeover
            && (sb.level != fresh.level
                || sb.layout != fresh.layout
                || (sb.chunk != fresh.chunk && !missed_chunk_start)
                || (sb.raid_disks() != n && !missed_start));
        let role = match sb.role {
            Role::Spare => {
                match fresh
                    .roles
                    .iter()
                    .position(|e| e.member_uuid == sb.member_uuid)
                {
                    // (The new member of a RAID-5 to RAID-6 takeover cut
                    // short, still with its spare superblock, stays a
                    // spare here and takes its role as spares do.)
                    Some(r) if missed_start && starting.is_some_and(|old| r >= old) => r,
                    _ => {
                        spares.push((m, sb));
                        continue;
                    }
                }
            }
            Role::Active(r) => r as usize,
        };
        let entry = fresh.roles[role];
        if sb.replacing {
            // Placed once every role has its member (below). One that
            // missed an update (failed, which writes the others'
            // superblocks without it; an old copy) or that the role
            // already belongs to is not one: a spare. (No role table
            // entry records a replacement, so a crash in the middle of an
            // update, which leaves some members one behind, makes it a
            // spare too: the replacement starts over, nothing is lost.)
            if sb.events == fresh.events && sb.member_uuid != entry.member_uuid && !shape_differs {
                replacing.push((role, m, sb));
            } else {
                spares.push((m, sb));
            }
            continue;
        }
        // Every superblock update raises the event counter by one on every
        // member, so a crash in the middle of one leaves some members one
        // behind: those are current (md accepts them too, super_1_validate).
        // Anything further behind missed an update that data may have
        // followed: an old copy of the member, or one that dropped out.
        let current = sb.events + 1 >= fresh.events;
        let resuming =
            sb.member_uuid == entry.member_uuid && current && entry.state == RoleState::Rebuilding;
        let stale_reason = if resuming {
            None
        } else if sb.member_uuid != entry.member_uuid {
            Some(format!(
                "role {role} now belongs to member {}",
                entry.member_uuid
            ))
        } else if !current {
            Some(format!(
                "event counter {} is behind the array's {}",
                sb.events, fresh.events
            ))
        } else if entry.state != RoleState::Active {
            Some(format!("recorded as {}", entry.state.name()))
        } else if shape_differs {
            return Err(Error::CorruptSuperblock {
                member: m.name().to_string(),
                detail: "its level, layout, chunk or member count disagrees with the others at the same event count".into(),
            });
        } else {
            None
        };
        let slot = &mut slots[role];
        if let Some(reason) = stale_reason {
            // A fresh member for this role beats a stale one, and of two
            // stale ones the more recent.
            let newer = match &slot.stale {
                Some((_, old)) => sb.events > old.events,
                None => true,
            };
            if slot.member.is_none() && newer {
                if let Some(Absence::Stale { member, reason }) = &slot.absence {
                    warnings.push(not_used(member, reason, "a more recent one was given"));
                }
                slot.absence = Some(Absence::Stale {
                    member: m.name().to_string(),
                    reason,
                });
                slot.stale_is_ours = sb.member_uuid == entry.member_uuid;
                slot.stale = Some((m, sb));
            } else if slot.member.is_some() {
                warnings.push(not_used(m.name(), &reason, HELD));
            } else {
                warnings.push(not_used(m.name(), &reason, "a more recent one was given"));
            }
            continue;
        }
        if sb.state == ArrayState::Dirty {
            // An update from dirty to clean may have been cut short: the
            // array is clean only if every current member says so.
            dirty = true;
        }
        if let Some(Absence::Stale { member, reason }) = &slot.absence {
            warnings.push(not_used(member, reason, HELD));
        }
        slot.member = Some(m);
        slot.absence = None;
        slot.resume = resuming.then(|| sb.recovery_offset.unwrap_or(0));
        slot.sb = Some(sb);
        slot.stale = None;
    }
    let mut fresh = fresh;
    if dirty {
        fresh.state = ArrayState::Dirty;
    }
    for (role, m, mut sb) in replacing {
        let slot = &mut slots[role];
        if slot.replacement.is_some() || slot.resume.is_some() {
            // Two for one role, or a role itself being rebuilt: nothing to
            // go on replacing.
            spares.push((m, sb));
        } else if slot.member.is_some() {
            slot.replacement = Some((m, sb));
        } else {
            // The member it replaces is gone: it takes the role, rebuilt
            // from where it got, as a replacement whose source fails does.
            warnings.push(format!(
                "{}: the member it was replacing in role {role} is not here; it takes the role and is rebuilt from where it got",
                m.name()
            ));
            sb.replacing = false;
            fresh.roles[role].member_uuid = sb.member_uuid;
            fresh.roles[role].state = RoleState::Rebuilding;
            slot.resume = Some(sb.recovery_offset.unwrap_or(0));
            if let Some(Absence::Stale { member, reason }) = &slot.absence {
                warnings.push(not_used(member, reason, HELD));
            }
            slot.member = Some(m);
            slot.sb = Some(sb);
            slot.absence = None;
            slot.stale = None;
        }
    }
    let sizes: Vec<u64> = fresh.roles.iter().map(|r| r.data_size).collect();
    let geometry = Geometry::new(fresh.level, fresh.layout, fresh.chunk, sizes).map_err(|e| {
        Error::CorruptSuperblock {
            member: "array".into(),
            detail: format!("recorded shape is invalid: {e}"),
        }
    })?;
    // During a reshape the size recorded is the old shape's, exported until
    // the reshape ends.
    let expected = match fresh.reshape {
        Some(r) if (r.old_disks as usize) < geometry.members() && r.old_disks > 0 => Geometry::new(
            geometry.level,
            geometry.layout,
            geometry.chunk,
            geometry.member_sizes[..r.old_disks as usize].to_vec(),
        )
        .map_or(0, |g| g.capacity()),
        _ => geometry.capacity(),
    };
    if expected != fresh.array_size {
        return Err(Error::CorruptSuperblock {
            member: slots
                .iter()
                .find_map(|s| s.member.as_ref().map(|m| m.name().to_string()))
                .unwrap_or_default(),
            detail: format!(
                "array size {} does not match its shape ({})",
                fresh.array_size, expected
            ),
        });
    }
    // A member shorter than its data area (a copy cut short, a partition
    // that shrank) cannot hold its role: left out as a stale one is, so
    // that the others start without it (with --run) rather than not at all.
    for (r, s) in slots.iter_mut().enumerate() {
        if let (Some(m), Some(sb)) = (&s.member, &s.sb) {
            if sb.data_offset + sb.data_size > m.len() {
                let member = m.name().to_string();
                let reason = format!(
                    "truncated: its data area for role {r} ends at {} but it has {} bytes",
                    sb.data_offset + sb.data_size,
                    m.len()
                );
                warnings.push(format!("{member}: not used: {reason}"));
                s.member = None;
                s.sb = None;
                s.resume = None;
                s.absence = Some(Absence::Stale { member, reason });
            }
        }
    }
    Ok(Assembly {
        sb: fresh,
        slots,
        spares,
        geometry,
        warnings,
    })
}
