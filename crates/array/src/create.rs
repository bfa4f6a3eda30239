//! Creating an array: checking every member before touching any, then
//! writing superblocks and making redundancy consistent.

use crate::engine::Array;
use crate::error::{Error, Result};
use crate::superblock::{
    data_offset_for, member_layout_with, probe, write_superblock, ArrayState, BitmapArea,
    ChecksumArea, JournalArea, Role, RoleEntry, RoleState, Superblock,
};
use crate::{assemble, bitmap, journal, SB_SIZE};
use raidkit_layout::{Geometry, Layout, Level};
use raidkit_member::{IoMode, Member};
use std::sync::Arc;
use uuid::Uuid;

const MIB: u64 = 1 << 20;

/// What to create.
#[derive(Debug, Clone)]
pub struct CreateOptions {
    pub level: Level,
    pub layout: Layout,
    pub chunk: u64,
    /// Size of each member (files that do not exist are created this big).
    pub size: Option<u64>,
    pub name: String,
    /// Overwrite members that hold data or another array's superblock.
    pub force: bool,
    /// Skip the initial sync of existing members (their redundancy is
    /// trusted to be consistent already, e.g. they are known to be zero).
    pub assume_clean: bool,
    /// Leave the initial sync of existing members to the server: create
    /// records it as pending (from the start) and returns; `serve` runs it
    /// in the background, as md does after mdadm --create.
    pub background_sync: bool,
    /// Write-intent bitmap region size in bytes (0: no bitmap).
    pub bitmap_region: u64,
    /// What keeps redundancy consistent across crashes (see [`Policy`]).
    pub policy: Policy,
    /// Hot spares.
    pub spares: Vec<CreateMember>,
    /// Keep a checksum of every 4 KiB block of every member (see
    /// `checksums`): reads verified, bad blocks rebuilt from redundancy.
    pub checksums: bool,
    /// Write md's metadata (v1.2) instead of raidkit's, so that the Linux
    /// kernel assembles the array (see `metadata::md`).
    pub md: bool,
    /// Each member's failure domain label, in member order (spares after
    /// the roles); empty or shorter: none given for the rest.
    pub domains: Vec<String>,
    /// Where each member's data begins (the metadata area before it holds
    /// the superblocks, bitmap, journal and checksums); None: raidkit's
    /// default for the member's size (`superblock::data_offset_for`).
    pub data_offset: Option<u64>,
}

/// How redundancy is kept consistent across crashes, as md's
/// consistency_policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Nothing recorded: after an unclean shutdown every stripe is resynced.
    None,
    /// The write-intent bitmap: after an unclean shutdown only the regions
    /// being written are resynced. A member lost before that resync can
    /// come back wrong where writes were torn (the RAID-5/6 write hole).
    Bitmap,
    /// Bitmap, plus a journal of every parity stripe update, replayed after
    /// an unclean shutdown: no write hole. The default for parity levels.
    Journal,
}

impl Policy {
    pub fn parse(s: &str) -> Result<Policy> {
        Ok(match s {
            "none" => Policy::None,
            "bitmap" => Policy::Bitmap,
            "journal" => Policy::Journal,
            _ => {
                return Err(Error::Invalid(format!(
                    "consistency policy '{s}': use none, bitmap or journal"
                )))
            }
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Policy::None => "none",
            Policy::Bitmap => "bitmap",
            Policy::Journal => "journal",
        }
    }

    /// The policy a superblock describes.
    pub fn of(sb: &Superblock) -> Policy {
        if sb.journal.size > 0 {
            Policy::Journal
        } else if sb.bitmap.region > 0 {
            Policy::Bitmap
        } else {
            Policy::None
        }
    }
}

/// Bytes of the metadata area a bitmap of `region`-byte regions over data
/// areas of `biggest` bytes takes (0 for no bitmap), refused if it does not
/// fit before `metadata_end` (the smallest data offset).
pub(crate) fn bitmap_bytes(region: u64, biggest: u64, metadata_end: u64) -> Result<u64> {
    if region == 0 {
        return Ok(0);
    }
    let b = bitmap::bytes_for(biggest.div_ceil(region));
    let room = metadata_end.saturating_sub(bitmap::BITMAP_OFFSET);
    if b > room {
        return Err(Error::Invalid(format!(
            "a bitmap with {region}-byte regions needs {b} bytes, but the metadata area holds {room}; give a larger --bitmap-region"
        )));
    }
    Ok(b)
}

/// The journal's place: from the end of the bitmap (64 KiB aligned) to
/// the data (`metadata_end`, the smallest data offset), refused where that
/// holds too small a window for `n` members.
pub(crate) fn journal_area(bitmap_bytes: u64, metadata_end: u64, n: usize) -> Result<JournalArea> {
    let start = (bitmap::BITMAP_OFFSET + bitmap_bytes).div_ceil(64 << 10) * (64 << 10);
    let size = metadata_end.saturating_sub(start);
    if journal::window_for(size, n) < 4096 {
        return Err(Error::Invalid(format!(
            "the metadata area of these members ({metadata_end} bytes) is too small for a journal over {n} members; use larger members or the bitmap policy"
        )));
    }
    Ok(JournalArea {
        offset: start,
        size,
        applied_seq: 0,
    })
}

/// What create did.
#[derive(Debug, Clone)]
pub struct CreateReport {
    pub uuid: Uuid,
    pub capacity: u64,
    pub created_files: Vec<String>,
    pub synced: bool,
    /// The initial sync is left to the server (`background_sync`).
    pub sync_pending: bool,
}

/// Name length the superblock holds.
pub const MAX_NAME: usize = 64;

/// A member of an array to be created, as the caller found it (opening
/// members is the caller's: see the raidkit-open crate).
#[derive(Clone)]
pub enum CreateMember {
    /// Opened, to be checked blank (unless forced) and written.
    Existing(Arc<dyn Member>),
    /// A file that does not exist yet: created of `--size`, then used with
    /// the I/O engine the mode gives (direct, buffered, or auto).
    New(String, IoMode),
    /// `missing`: the role is created empty, as mdadm's (the array starts
    /// degraded; `add` fills it).
    Missing,
}

impl std::fmt::Debug for CreateMember {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&prepared_name(self))
    }
}

use CreateMember as Prepared;

/// The member name that stands for an absent member, as in mdadm.
pub const MISSING: &str = "missing";

/// Create an array over `members` (in role order) with `opts.spares`.
/// Nothing is written until every member has been checked;
/// `progress(done, total)` reports the initial sync.
pub fn create(
    members: Vec<CreateMember>,
    opts: &CreateOptions,
    progress: impl FnMut(u64, u64),
) -> Result<CreateReport> {
    if opts.name.len() > MAX_NAME {
        return Err(Error::Invalid(format!(
            "array name is {} bytes long; at most {MAX_NAME} fit",
            opts.name.len()
        )));
    }
    if opts.name.is_empty() || opts.name.chars().any(char::is_control) {
        return Err(Error::Invalid(format!(
            "array name {:?}: a name must be non-empty and printable (it names the export and the control socket)",
            opts.name
        )));
    }
    // Before any size is worked out from it (a chunk of 0 would divide by
    // zero, a huge one would be reported as members too small).
    raidkit_layout::check_chunk(opts.chunk)?;
    let n_roles = members.len();
    if opts.bitmap_region != 0 && !opts.bitmap_region.is_power_of_two() {
        return Err(Error::Invalid(format!(
            "bitmap region {} is not a power of two",
            opts.bitmap_region
        )));
    }
    if !opts.spares.is_empty() && !opts.level.has_redundancy() {
        return Err(Error::Invalid(format!(
            "{} has no redundancy: a spare could never be used",
            opts.level
        )));
    }
    let prepared: Vec<Prepared> = members.into_iter().chain(opts.spares.clone()).collect();
    // Every member looked at at once: on spinning disks each look costs
    // about a second of seeks. (Where no thread can be had, the member is
    // looked at here.)
    std::thread::scope(|sc| {
        let looks: Vec<_> = prepared
            .iter()
            .filter_map(|p| match p {
                Prepared::Existing(m) => Some(m),
                _ => None,
            })
            .map(|m| {
                let look = move || check_blank(m.as_ref(), opts.force);
                std::thread::Builder::new()
                    .spawn_scoped(sc, look)
                    .map_err(|_| look())
            })
            .collect();
        looks.into_iter().try_for_each(|h| match h {
            Ok(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
            Err(done) => done,
        })
    })?;
    for (i, p) in prepared.iter().enumerate() {
        match p {
            Prepared::Existing(_) => {}
            Prepared::New(path, _) if opts.size.is_none() => {
                return Err(Error::Invalid(format!(
                    "{path} does not exist; give --size to create it"
                )))
            }
            Prepared::Missing if i >= n_roles => {
                return Err(Error::Invalid("a spare cannot be 'missing'".into()))
            }
            Prepared::New(..) | Prepared::Missing => {}
        }
    }

    // Sizes: what each member contributes.
    let mut sizes = Vec::with_capacity(prepared.len());
    for p in &prepared {
        let size = match (p, opts.size) {
            (Prepared::Existing(m), Some(want)) if m.len() < want => {
                return Err(Error::Invalid(format!(
                    "{} has {} bytes, less than --size {want}",
                    m.name(),
                    m.len()
                )))
            }
            (Prepared::Existing(_), Some(want)) => want,
            (Prepared::Existing(m), None) => m.len(),
            (Prepared::New(..), Some(want)) => want,
            (Prepared::New(..), None) => unreachable!("checked above"),
            // As big as the others (set below).
            (Prepared::Missing, want) => want.unwrap_or(0),
        };
        sizes.push(size);
    }
    let n_missing = prepared
        .iter()
        .filter(|p| matches!(p, Prepared::Missing))
        .count();
    if n_missing > 0 {
        if n_missing == n_roles {
            return Err(Error::Invalid("every member is 'missing'".into()));
        }
        let like = (0..n_roles)
            .filter(|&i| !matches!(prepared[i], Prepared::Missing))
            .map(|i| sizes[i])
            .max()
            .unwrap_or(0);
        for i in 0..n_roles {
            if matches!(prepared[i], Prepared::Missing) && sizes[i] == 0 {
                sizes[i] = like;
            }
        }
    }
    if let Some(off) = opts.data_offset {
        if opts.md {
            return Err(Error::Invalid(
                "--data-offset with md metadata: md's data offset is mdadm's, set by the member's size".into(),
            ));
        }
        // Whole MiB, as raidkit's own offsets: the journal and checksum
        // areas inside are aligned to 64 KiB, and a disk's erase blocks
        // and RAID chunks to far less than a MiB.
        if off < MIB || !off.is_multiple_of(MIB) {
            return Err(Error::Invalid(format!(
                "--data-offset {off}: give a whole number of MiB, at least 1M (the superblocks, bitmap, journal and checksums live before the data)"
            )));
        }
    }
    if opts.md {
        // md's superblock has no place for raidkit's checksums, bitmap or
        // journal, nor for a role created empty.
        if opts.checksums || opts.policy != Policy::None {
            return Err(Error::Invalid(format!(
                "md metadata keeps no raidkit checksums, bitmap or journal: create with --checksums off and --consistency-policy none (asked: checksums {}, policy {})",
                if opts.checksums { "on" } else { "off" },
                opts.policy.name()
            )));
        }
        if n_missing > 0 {
            return Err(Error::Invalid(
                "md metadata: 'missing' members are not supported by raidkit's md create".into(),
            ));
        }
    }
    let layouts: Vec<(u64, ChecksumArea)> = sizes
        .iter()
        .map(|&s| {
            if opts.md {
                (
                    crate::metadata::md::md_data_offset(s),
                    ChecksumArea::default(),
                )
            } else {
                let meta = opts.data_offset.unwrap_or_else(|| data_offset_for(s));
                member_layout_with(s, opts.checksums, meta)
            }
        })
        .collect();
    let offsets: Vec<u64> = layouts.iter().map(|l| l.0).collect();
    for ((p, &s), &o) in prepared.iter().zip(&sizes).zip(&offsets) {
        if s < o + opts.chunk {
            return Err(Error::Invalid(match opts.size {
                // The size asked for, not the member, is what is short.
                Some(want) => format!(
                    "--size {want} is too small: each member needs {o} bytes of metadata plus at least one {}-byte chunk",
                    opts.chunk
                ),
                None => format!(
                    "{} is too small: {s} bytes, but {o} bytes of metadata plus one {}-byte chunk are needed",
                    prepared_name(p),
                    opts.chunk
                ),
            }));
        }
    }
    let n = n_roles;
    if opts.level != Level::Linear && sizes[..n].iter().any(|&s| s != sizes[0]) {
        let list = prepared
            .iter()
            .zip(&sizes[..n])
            .map(|(p, s)| format!("{} ({s} bytes)", prepared_name(p)))
            .collect::<Vec<_>>()
            .join(", ");
        return Err(Error::Invalid(format!(
            "members differ in size: {list}; give --size to use the same amount of each"
        )));
    }
    let data_sizes: Vec<u64> = sizes[..n]
        .iter()
        .zip(&offsets)
        .map(|(s, o)| (s - o) / opts.chunk * opts.chunk)
        .collect();
    let geom = Geometry::new(opts.level, opts.layout, opts.chunk, data_sizes.clone())?;
    // Spread over hosts: no one host may hold more than the level can lose.
    let domains: Vec<Option<String>> = prepared[..n]
        .iter()
        .enumerate()
        .map(|(i, p)| {
            (!matches!(p, Prepared::Missing)).then(|| {
                crate::domains::domain_of(
                    opts.domains.get(i).map_or("", String::as_str),
                    &prepared_name(p),
                )
            })
        })
        .collect();
    for (d, roles) in crate::domains::crowded(&geom, &domains) {
        let what = format!(
            "failure domain '{d}' holds roles {roles:?}: {} cannot lose them all at once, so losing '{d}' would lose the array",
            opts.level
        );
        if !opts.force {
            return Err(Error::Invalid(format!(
                "{what}; spread the members (--domain labels them) or use --force"
            )));
        }
        tracing::warn!("{what} (created anyway: --force)");
    }
    if opts
        .domains
        .iter()
        .any(|d| d.len() > crate::superblock::MAX_DOMAIN)
    {
        return Err(Error::Invalid(format!(
            "a failure domain label takes at most {} bytes",
            crate::superblock::MAX_DOMAIN
        )));
    }
    let biggest = data_sizes.iter().copied().max().unwrap_or(0);
    for i in n..prepared.len() {
        if sizes[i] < offsets[i] + biggest {
            return Err(Error::Invalid(format!(
                "spare {} is too small: {} bytes, but {} are needed",
                prepared_name(&prepared[i]),
                sizes[i],
                offsets[i] + biggest
            )));
        }
    }
    let bitmap_region = if opts.level.has_redundancy() && opts.policy != Policy::None {
        if opts.bitmap_region == 0 {
            return Err(Error::Invalid(format!(
                "the {} policy needs a write-intent bitmap: give a --bitmap-region",
                opts.policy.name()
            )));
        }
        opts.bitmap_region
    } else {
        0
    };
    // The bitmap and journal end where the checksum area (or the data) begins.
    let metadata_end = layouts[..n]
        .iter()
        .map(|(o, c)| if c.enabled() { c.offset } else { *o })
        .min()
        .unwrap_or(0);
    let bitmap_bytes = bitmap_bytes(bitmap_region, biggest, metadata_end)?;

    let journal = if opts.level.is_parity() && opts.policy == Policy::Journal {
        journal_area(bitmap_bytes, metadata_end, n)?
    } else {
        JournalArea::default()
    };

    let missing_roles: Vec<usize> = (0..n_roles)
        .filter(|&i| matches!(prepared[i], Prepared::Missing))
        .collect();
    if !missing_roles.is_empty() && !geom.survives(&missing_roles) {
        return Err(Error::Invalid(format!(
            "{} cannot run without role(s) {}: too many members are 'missing'",
            opts.level,
            crate::engine::roles_list(missing_roles.iter().copied())
        )));
    }
    let existing = prepared
        .iter()
        .filter(|p| matches!(p, Prepared::Existing(_)))
        .count();
    let needs_sync = !opts.assume_clean
        && existing > 0
        && !matches!(opts.level, Level::Linear | Level::Raid0)
        // With members missing, only the redundancy left needs a sync.
        && geom.redundancy() > missing_roles.len();
    if needs_sync && !missing_roles.is_empty() {
        return Err(Error::Invalid(format!(
            "the redundancy left with role(s) {} missing needs an initial sync, which runs only with every member present: give every member, or --assume-clean if the members are known to be zero",
            crate::engine::roles_list(missing_roles.iter().copied())
        )));
    }

    // Everything checked: now create files and write.
    let mut created = Vec::new();
    let mut members: Vec<Option<Arc<dyn Member>>> = Vec::with_capacity(prepared.len());
    for (p, &size) in prepared.into_iter().zip(&sizes) {
        members.push(match p {
            Prepared::Existing(m) => Some(m),
            Prepared::New(path, io) => {
                let m = match raidkit_member::create_member(&path, size, io) {
                    Ok(m) => m,
                    Err(e) => {
                        // The files made before it go too: a create that
                        // fails leaves nothing behind.
                        for p in &created {
                            let _ = std::fs::remove_file(p);
                        }
                        return Err(e.into());
                    }
                };
                created.push(path);
                Some(m.member)
            }
            Prepared::Missing => None,
        });
    }
    let uuid = Uuid::new_v4();
    let now = crate::core::unix_now();
    let member_uuids: Vec<Uuid> = members
        .iter()
        .enumerate()
        .map(|(i, m)| match m {
            None => Uuid::nil(),
            // md names members by device number.
            Some(_) if opts.md => crate::metadata::md::member_uuid(uuid, i as u32),
            Some(_) => Uuid::new_v4(),
        })
        .collect();
    let devices = members.len() as u32;
    let spare_members: Vec<Arc<dyn Member>> = members.split_off(n).into_iter().flatten().collect();
    let roles: Vec<RoleEntry> = member_uuids[..n]
        .iter()
        .zip(&geom.member_sizes)
        .map(|(&u, &size)| RoleEntry {
            member_uuid: u,
            // A role created empty is recorded as such: the array was
            // degraded from the start, so it starts without --run.
            state: if u.is_nil() {
                RoleState::Removed
            } else {
                RoleState::Active
            },
            data_size: size,
        })
        .collect();
    let members: Vec<Arc<dyn Member>> = members.into_iter().flatten().collect();
    let present: Vec<usize> = (0..n).filter(|&i| !member_uuids[i].is_nil()).collect();
    let placed = present.iter().copied().chain(n..n + spare_members.len());
    for (i, m) in placed.zip(members.iter().chain(&spare_members)) {
        // Blank the metadata area's reserved part so that nothing stale
        // from an earlier use is ever mistaken for a bitmap or journal.
        let blank =
            vec![0u8; (offsets[i] - 2 * SB_SIZE as u64).min((1 << 20).max(bitmap_bytes)) as usize];
        m.write_at(&blank, 2 * SB_SIZE as u64)?;
        // No block has a checksum yet: each gets one when first written,
        // synced or scrubbed.
        let area = layouts[i].1;
        raidkit_member::write_zeroes(m.as_ref(), area.offset, area.size)?;
        let mut sb = Superblock {
            seq: 0,
            array_uuid: uuid,
            member_uuid: member_uuids[i],
            name: opts.name.clone(),
            level: opts.level,
            layout: opts.layout,
            chunk: opts.chunk,
            role: if i < n {
                Role::Active(i as u32)
            } else {
                Role::Spare
            },
            ctime: now,
            utime: now,
            events: 1,
            data_offset: offsets[i],
            data_size: geom.member_sizes.get(i).copied().unwrap_or(biggest),
            array_size: geom.capacity(),
            state: ArrayState::Clean,
            recovery_offset: None,
            bitmap: if bitmap_region > 0 {
                BitmapArea {
                    offset: bitmap::BITMAP_OFFSET,
                    region: bitmap_region,
                    events_cleared: 1,
                }
            } else {
                BitmapArea::default()
            },
            journal,
            // The initial sync's position: `serve` resumes it if this
            // process dies before it completes.
            resync: needs_sync.then_some(0),
            checksums: area,
            scrub: None,
            domain: opts.domains.get(i).cloned().unwrap_or_default(),
            reshape: None,
            converted_from: None,
            replacing: false,
            last_scrub: None,
            roles: roles.clone(),
            md: opts.md.then(|| {
                crate::metadata::md::new_v12(&crate::metadata::md::NewMember {
                    array_uuid: uuid,
                    name: &opts.name,
                    level: opts.level,
                    layout: opts.layout,
                    chunk: opts.chunk,
                    raid_disks: n as u32,
                    devices,
                    used: geom.member_sizes[0],
                    dev_number: i as u32,
                    data_offset: offsets[i],
                    data_size: sizes[i] - offsets[i],
                    ctime: now,
                })
            }),
        };
        write_superblock(m.as_ref(), &mut sb)?;
    }
    if needs_sync && !opts.background_sync {
        let array = Array::open(assemble::assemble(members.clone())?, &opts.name, false)?;
        array.finish_resync(progress)?;
        array.close()?;
    } else {
        // Closed, not only flushed: a member that is itself an array
        // records its clean shutdown.
        for m in &members {
            m.close()?;
        }
    }
    for m in &spare_members {
        m.close()?;
    }
    Ok(CreateReport {
        uuid,
        capacity: geom.capacity(),
        created_files: created,
        synced: needs_sync && !opts.background_sync,
        sync_pending: needs_sync && opts.background_sync,
    })
}

fn prepared_name(p: &Prepared) -> String {
    match p {
        Prepared::Existing(m) => m.name().to_string(),
        Prepared::New(path, _) => path.clone(),
        Prepared::Missing => MISSING.to_string(),
    }
}

/// Refuse, unless forced, a member that belongs to an array or holds data.
pub(crate) fn check_blank(m: &dyn Member, force: bool) -> Result<()> {
    if force {
        return Ok(());
    }
    match probe(m)? {
        Some(Ok(sb)) => {
            return Err(Error::InUse {
                member: m.name().to_string(),
                uuid: sb.array_uuid.to_string(),
                name: sb.name,
            })
        }
        Some(Err(e)) => {
            return Err(Error::Invalid(format!(
                "{e}; it looks like a raidkit member: use --force to overwrite it"
            )))
        }
        None => {}
    }
    if let Some(offset) = data_seen(m)? {
        return Err(Error::HoldsData {
            member: m.name().to_string(),
            offset,
        });
    }
    Ok(())
}

/// Where a member shows data (a byte not zero), looking where data of a
/// disk's past life is found and where this program writes first: the
/// whole metadata area it would get (a partition table, a file system's
/// superblocks, an md or LVM label), the last MiB (md's 0.90 and 1.0
/// superblocks, a backup GPT), and 4 KiB at 128 places spread over the
/// rest, so that a disk that was in use is found without reading all of
/// it (a disk of 16 TB takes hours to read; this reads at most 130 MiB,
/// and the places cost a spinning disk about a second of seeks). A disk
/// blank in every place looked at is taken as blank.
fn data_seen(m: &dyn Member) -> Result<Option<u64>> {
    const MIB: u64 = 1 << 20;
    const SAMPLES: u64 = 128;
    const SAMPLE: u64 = 4096;
    let len = m.len();
    let head = crate::superblock::data_offset_for(len).min(len);
    let mut places: Vec<(u64, u64)> = (0..head)
        .step_by(MIB as usize)
        .map(|at| (at, MIB.min(head - at)))
        .collect();
    let tail = len.saturating_sub(MIB).max(head);
    if tail < len {
        places.push((tail, len - tail));
    }
    let middle = tail.saturating_sub(head);
    if middle >= SAMPLE {
        let step = (middle / SAMPLES).max(SAMPLE);
        let mut at = head;
        while at + SAMPLE <= tail {
            places.push((at / SAMPLE * SAMPLE, SAMPLE));
            at += step;
        }
    }
    let mut buf = vec![0u8; MIB as usize];
    for (at, n) in places {
        let b = &mut buf[..n as usize];
        m.read_at(b, at)?;
        if let Some(i) = b.iter().position(|&x| x != 0) {
            return Ok(Some(at + i as u64));
        }
    }
    Ok(None)
}
