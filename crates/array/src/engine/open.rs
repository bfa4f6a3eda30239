//! Starting an array: the view of its members from an assembly, stale
//! members taken back, the bitmap gathered, refusals before anything is
//! written, recovery of an unclean shutdown, and the start event.

use super::*;

impl Array {
    /// Start an array from an assembly, degraded if members are missing
    /// (as with `run`). Fails if too many members are unavailable, naming them.
    pub fn open(asm: Assembly, name: &str, read_only: bool) -> Result<Array> {
        Self::open_with(
            asm,
            name,
            OpenOptions {
                read_only,
                run: true,
                ..OpenOptions::default()
            },
        )
    }

    /// Start an array with options (see [`OpenOptions`]).
    pub fn open_with(asm: Assembly, name: &str, opts: OpenOptions) -> Result<Array> {
        if let (Some(why), false) = (
            asm.sb.md.as_ref().and_then(crate::metadata::md::unwritable),
            opts.read_only,
        ) {
            // Every change of state writes superblocks, which raidkit
            // cannot write for this array as md would: refused before
            // anything is written, rather than failing each member at its
            // first update.
            return Err(Error::Invalid(format!(
                "array '{name}' has {why}: open it read-only (serve --read-only; read, check and examine never write)"
            )));
        }
        // The thread pools, made now rather than in the middle of a request
        // (a process at its thread limit then does member I/O one at a time).
        let _ = io_pool();
        let _ = rayon::current_num_threads();
        let geom = asm.geometry.clone();
        let mut sb = asm.sb.clone();
        let dev_size = geom.member_sizes.iter().copied().max().unwrap_or(0);
        let bitmap_region = sb.bitmap.region;
        // The bitmap: the union of every fresh member's copy.
        let bitmap = if bitmap_region > 0 && geom.level.has_redundancy() {
            let place = crate::bitmap::Place::of(&sb);
            // md's bitmap out of date: nothing it says can be trusted.
            let stale = sb
                .md
                .as_ref()
                .and_then(|m| m.bitmap.as_ref())
                .is_some_and(|b| b.stale);
            let mut set: Option<RegionSet> = stale
                .then(|| RegionSet::all(bitmap_region, dev_size.div_ceil(bitmap_region).max(1)));
            for s in &asm.slots {
                if let Some(m) = &s.member {
                    // A member that cannot give its copy is failed on its
                    // first I/O; the other copies hold every bit.
                    let Ok(b) = Bitmap::read(m.as_ref(), place, bitmap_region, dev_size) else {
                        continue;
                    };
                    set = Some(match set {
                        None => b,
                        Some(mut a) => {
                            a.words.iter_mut().zip(&b.words).for_each(|(x, y)| *x |= y);
                            a
                        }
                    });
                }
            }
            Some(Bitmap::new(place, bitmap_region, dev_size, set.as_ref()))
        } else {
            None
        };
        let mut roles = Vec::with_capacity(asm.slots.len());
        let mut notes = Vec::new();
        for (r, s) in asm.slots.iter().enumerate() {
            let mut rv = RoleView::default();
            match (&s.member, &s.sb) {
                (Some(m), Some(msb)) => {
                    rv.disk = Some(Arc::new(Disk::new(m.clone(), msb.clone(), !opts.read_only)));
                    if let Some(at) = s.resume {
                        rv.sync = Some(SyncState::new(at, None));
                    }
                    if let Some((m, rsb)) = &s.replacement {
                        // After an unclean stop the blocks being written at
                        // the crash may differ between the member and its
                        // replacement (and disagree with the replacement's
                        // checksums, which were in memory): the copy starts
                        // over. A resync makes the role's copies agree, not
                        // the replacement with them.
                        let at = match sb.state {
                            ArrayState::Dirty => 0,
                            ArrayState::Clean => rsb.recovery_offset.unwrap_or(0),
                        };
                        notes.push(format!(
                            "{}: goes on replacing {} in role {r}, from {at} bytes in",
                            m.name(),
                            rv.disk.as_ref().map_or("", |d| d.name())
                        ));
                        rv.replacement = Some((
                            Arc::new(Disk::new(m.clone(), rsb.clone(), !opts.read_only)),
                            SyncState::new(at, None),
                        ));
                    }
                }
                _ => rv.absence = s.absence.clone(),
            }
            if rv.disk.is_none() && opts.readd_stale && !opts.read_only {
                if let Some((m, msb)) = &s.stale {
                    if msb.member_uuid == sb.roles[r].member_uuid || s.stale_is_ours {
                        let dirty = match &bitmap {
                            Some(b)
                                if msb.member_uuid == sb.roles[r].member_uuid
                                    && msb.recovery_offset.is_none()
                                    && msb.events >= sb.bitmap.events_cleared
                                    && sb.bitmap.events_cleared > 0 =>
                            {
                                Some(b.snapshot())
                            }
                            _ => None,
                        };
                        notes.push(format!(
                            "{}: stale, taken back in for {}",
                            m.name(),
                            if dirty.is_some() {
                                "a resync of the regions written without it"
                            } else {
                                "a full rebuild"
                            }
                        ));
                        let mut own = msb.clone();
                        own.recovery_offset = Some(0);
                        own.events = sb.events;
                        rv.disk = Some(Arc::new(Disk::new(m.clone(), own, true)));
                        rv.sync = Some(SyncState::new(0, dirty));
                        rv.absence = None;
                        sb.roles[r].member_uuid = msb.member_uuid;
                        sb.roles[r].state = RoleState::Rebuilding;
                    }
                }
            }
            roles.push(rv);
        }
        let spares = asm
            .spares
            .iter()
            .map(|(m, s)| Arc::new(Disk::new(m.clone(), s.clone(), !opts.read_only)))
            .collect();
        let view = View {
            geom: Arc::new(geom.clone()),
            roles,
            spares,
            failed: Vec::new(),
        };
        let missing = view.degraded_roles();
        if !geom.survives(&missing) {
            let limit = match geom.level {
                Level::Linear | Level::Raid0 => "it has no redundancy".to_string(),
                Level::Raid10 => "RAID-10 can lose at most one member of each mirror set".into(),
                l => format!("{l} can lose at most {} member(s)", geom.redundancy()),
            };
            // Every role that cannot serve, with why: missing, stale, or
            // taken back but still resyncing (which the assembly alone
            // does not know).
            let why: Vec<String> = missing
                .iter()
                .map(|&r| match (&view.roles[r].disk, &view.roles[r].sync) {
                    (Some(d), Some(s)) if s.dirty.is_some() => format!(
                        "role {r} ({}: back after an absence, the regions written meanwhile not resynced yet)",
                        d.name()
                    ),
                    (Some(d), Some(s)) => format!(
                        "role {r} ({}: rebuilding, in sync up to {} bytes of its data area)",
                        d.name(),
                        s.cursor.load(std::sync::atomic::Ordering::Relaxed)
                    ),
                    _ => asm.describe_role(r),
                })
                .collect();
            let mut detail = format!("unavailable: {}; {limit}", why.join(", "));
            if asm.slots.iter().any(|s| s.stale.is_some()) {
                detail.push_str(
                    "; if the stale members hold the data, `--force` starts the array from them",
                );
            }
            return Err(Error::NotEnoughMembers {
                name: asm.sb.name.clone(),
                detail,
            });
        }
        if !opts.read_only && !opts.run {
            let unexpected: Vec<usize> = (0..view.roles.len())
                // A stale member given in its place (the one a `replace`
                // retired, an old copy of a disk) does not stand for it.
                .filter(|&r| {
                    view.roles[r].disk.is_none()
                        && view.roles[r].absence.is_some()
                        && sb.roles[r].state == RoleState::Active
                })
                .collect();
            if !unexpected.is_empty() {
                let stale: Vec<String> = unexpected
                    .iter()
                    .filter_map(|&r| match &view.roles[r].absence {
                        Some(Absence::Stale { member, reason }) => {
                            Some(format!("; {member} is stale ({reason})"))
                        }
                        _ => None,
                    })
                    .collect();
                return Err(Error::NotEnoughMembers {
                    name: asm.sb.name.clone(),
                    detail: format!(
                        "role(s) {} missing (member {}){}, and the array was not degraded when it stopped; give every member, or --run to start it degraded (the missing members then need a rebuild)",
                        roles_list(unexpected.iter().copied()),
                        unexpected
                            .iter()
                            .map(|&r| sb.roles[r].member_uuid.to_string())
                            .collect::<Vec<_>>()
                            .join(", "),
                        stale.concat()
                    ),
                });
            }
        }
        // A journal an earlier `raidkit policy` laid over a checksum area:
        // each record would overwrite checksums, and the blocks they cover
        // would read as rot (EIO on every copy). Moving it is `policy`'s
        // work, on the stopped array; a dirty one must first replay it.
        if !opts.read_only {
            let over = asm
                .slots
                .iter()
                .filter_map(|s| s.sb.as_ref().zip(s.member.as_ref()))
                .chain(asm.spares.iter().map(|(m, s)| (s, m)))
                .find_map(|(s, m)| {
                    Some((
                        m.name().to_string(),
                        crate::policy::journal_over_checksums(s)?,
                    ))
                });
            if let Some((member, (at, len))) = over {
                let what = format!(
                    "array '{}': its journal overlaps the checksum area of {member} ({len} bytes at offset {at}), as `raidkit policy journal` laid it before it kept journals below the checksums",
                    asm.sb.name
                );
                if sb.state == ArrayState::Clean {
                    return Err(Error::Invalid(format!(
                        "{what}; journal records would overwrite checksums and the blocks they cover would read as rot. Nothing was written: run `raidkit policy journal` with every member to move it (metadata only), then serve"
                    )));
                }
                tracing::warn!(
                    "{what}: started to replay it; stop the array cleanly, then run `raidkit policy journal` with every member to move it"
                );
            }
        }
        let journal = (sb.journal.size > 0 && geom.level.is_parity()).then(|| {
            Journal::new(
                sb.journal.offset,
                sb.journal.size,
                geom.members(),
                sb.journal.applied_seq,
            )
        });
        let unclean = sb.state == ArrayState::Dirty;
        let resync_from = sb
            .resync
            .filter(|_| geom.level.has_redundancy() || sb.checksums.enabled());
        // Members of roles the array did not know to be gone: the ones a
        // remote member not reached at start may turn out to be.
        let expected: Vec<_> = (0..view.roles.len())
            .filter(|&r| {
                view.roles[r].disk.is_none()
                    && matches!(view.roles[r].absence, Some(Absence::Missing))
                    && sb.roles[r].state == RoleState::Active
            })
            .map(|r| sb.roles[r].member_uuid)
            .collect();
        let a = Array {
            core: Core::new(name, view, sb, bitmap, &opts),
            journal,
            recovery: Recovery::default(),
            fg_ops: AtomicU64::new(0),
            unsynced_from: AtomicU64::new(resync_from.unwrap_or(u64::MAX)),
            edges: std::sync::RwLock::new(()),
            reshape: std::sync::RwLock::new(None),
        };
        a.core.expect_back(expected);
        a.recovery.note(notes);
        if let Some(l) = &a.core.meta.locked().sb.last_scrub {
            *a.recovery.last_scrub.locked() = Some(crate::scrub::LastScrub::from_summary(l));
        }
        if let Some((from, check_only)) = a.core.meta.locked().sb.scrub {
            if !opts.read_only {
                *a.recovery.pending_scrub.locked() =
                    Some(crate::scrub::ScrubRequest { from, check_only });
                a.core.wake.kick();
            }
        }
        let reshape = a.core.meta.locked().sb.reshape;
        if let Some(pos) = reshape {
            // Before recovery: journal records and marked regions are
            // resynced by the geometry of their row.
            a.resume_reshape(pos, false)?;
        }
        if !opts.read_only {
            // Recovery first: a start it refuses (the write hole, no
            // readable journal) must leave every member as it was.
            a.recover_unclean(unclean, opts.force)?;
            if let Some(pos) = reshape {
                // Then the first rows of a reshape cut in its critical
                // section, from their backup, before anything is served.
                a.resume_reshape(pos, true)?;
            }
            // Every start is an event: a copy of a member taken before it
            // is one behind, and any later update makes it stale.
            a.core.write_superblocks(&mut a.core.meta.locked())?;
            a.core.use_spares()?;
        }
        a.start_events();
        Ok(a)
    }

    /// What a person should hear of at the start: roles without a member
    /// (DeviceDisappeared, one each) and a degraded array (DegradedArray).
    fn start_events(&self) {
        use crate::events::{NewEvent, Severity};
        let v = self.core.view.load();
        for (r, rv) in v.roles.iter().enumerate() {
            if rv.disk.is_some() {
                continue;
            }
            let why = match &rv.absence {
                Some(Absence::Stale { member, reason }) => {
                    format!("role {r}: {member} is not trusted ({reason})")
                }
                _ => format!("role {r} has no member"),
            };
            let mut e = NewEvent::new("DeviceDisappeared", Severity::Warning, why);
            if let Some(Absence::Stale { member, .. }) = &rv.absence {
                e = e.member(member.clone(), Some(r));
            } else {
                e.role = Some(r);
            }
            self.core.emit(e);
        }
        self.core.emit_degraded(&v);
    }
}
