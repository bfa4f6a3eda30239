//! The commands: each turns parsed flags into library calls and prints.

use crate::arrays::{layout_json, open_array, open_array_with, parse_specs};
use crate::cli::{
    Cli, Command, CreateArgs, DetailArgs, ExamineArgs, PolicyArgs, ReadArgs, WriteArgs,
};
use crate::units::human;
use anyhow::{bail, Context, Result};
use raidkit_array::assemble::{assemble, Absence, Assembly};
use raidkit_array::create::CreateOptions;
use raidkit_array::create::Policy;
use raidkit_array::superblock::{read_superblock, Role, Superblock};
use raidkit_layout::{Layout, Level};
use raidkit_open::spec::{self, Spec};
use serde_json::{json, Value};
use std::io::{Read, Write};

pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Create(a) => cmd_create(a),
        Command::Examine(a) => cmd_examine(a),
        Command::Scan(a) => crate::scan::scan(a),
        Command::Detail(a) => cmd_detail(a),
        Command::Policy(a) => cmd_policy(a),
        Command::Read(a) => cmd_read(a),
        Command::Write(a) => cmd_write(a),
        Command::Serve(a) => crate::serve::serve(*a),
        Command::Export(a) => crate::export::export(a),
        Command::Status(a) => crate::admin::status(a),
        Command::List(a) => crate::admin::list(a),
        Command::Stop(a) => crate::admin::stop(a),
        Command::Check(a) => cmd_check(a),
        Command::Fail(a) => crate::admin::fail(a),
        Command::Remove(a) => crate::admin::remove(a),
        Command::Add(a) => crate::admin::add(a),
        Command::Replace(a) => crate::admin::replace(a),
        Command::Grow(a) => crate::admin::grow(a),
        Command::Wait(a) => crate::admin::wait(a),
        Command::Speed(a) => crate::admin::speed(a),
        Command::Scrub(a) => crate::admin::scrub(a),
        Command::Monitor(a) => crate::monitor::monitor(a),
        Command::Bench(b) => match b.command {
            Some(crate::cli::BenchCommand::Parity(a)) => crate::bench::parity(a),
            Some(crate::cli::BenchCommand::Engine(a)) => crate::bench::engine::engine(a),
            Some(crate::cli::BenchCommand::Sweep(a)) => crate::bench::sweep::sweep(a),
            Some(crate::cli::BenchCommand::StreamWorker(a)) => {
                crate::bench::storage::clients::stream_worker(a)
            }
            Some(crate::cli::BenchCommand::Members(a)) => {
                crate::bench::storage::members::members(a)
            }
            Some(crate::cli::BenchCommand::Compare(a)) => {
                crate::bench::storage::record::compare(&a.records, a.json)
            }
            Some(crate::cli::BenchCommand::Report(a)) => {
                let p = crate::bench::storage::record::report(&a.dir, a.output.as_deref())?;
                println!("{}", p.display());
                Ok(())
            }
            None => crate::bench::storage::run(b.storage),
        },
    }
}

/// An array's default name, from its first member: the file name without
/// its extension; for a nested array, `over-` and its first member's.
fn default_name(first: &str) -> String {
    let (prefix, spec) = match first.strip_prefix("array[") {
        Some(inner) => ("over-", inner.split([',', ']']).next().unwrap_or("")),
        None => ("", first),
    };
    // A spec may carry a scheme and options (fault:d.img?delay=1ms).
    let path = spec.split('?').next().unwrap_or("");
    let path = path.rsplit(':').next().unwrap_or(path);
    let stem = std::path::Path::new(path)
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("");
    let clean: String = stem
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || "._-".contains(*c))
        .take(56)
        .collect();
    if clean.is_empty() {
        "raidkit".to_string()
    } else {
        format!("{prefix}{clean}")
    }
}

fn cmd_create(a: CreateArgs) -> Result<()> {
    raidkit_open::set_io_mode(a.io.io);
    let level: Level = a.level.parse()?;
    let layout = match &a.layout {
        Some(l) => Layout::parse(level, l)?,
        None => level.default_layout(),
    };
    let specs = parse_specs(&a.members.members)?;
    if !a.domain.is_empty() && a.domain.len() != specs.len() + a.spare.len() {
        bail!(
            "--domain gives {} labels for {} members: give one per member, in order (spares after the others)",
            a.domain.len(),
            specs.len() + a.spare.len()
        );
    }
    let md = match a.metadata.as_str() {
        "md" | "1.2" => true,
        "raidkit" => false,
        other => bail!("--metadata {other}: expected raidkit or md (md's v1.2)"),
    };
    // Asked for by name, the journal is refused where it has nothing to
    // do (as `raidkit policy journal` refuses it), not quietly made a
    // bitmap; the default falls back to the bitmap there.
    if a.consistency_policy.as_deref() == Some("journal") && !level.is_parity() {
        bail!("--consistency-policy journal: the journal closes the write hole of parity levels; {level} has none (use bitmap)");
    }
    let opts = CreateOptions {
        level,
        layout,
        chunk: a.chunk,
        size: a.size,
        name: a
            .name
            .clone()
            .unwrap_or_else(|| default_name(&a.members.members[0])),
        force: a.force,
        assume_clean: a.assume_clean,
        background_sync: a.background_sync,
        bitmap_region: a.bitmap_region,
        policy: match &a.consistency_policy {
            Some(p) => raidkit_array::create::Policy::parse(p)?,
            None if md => raidkit_array::create::Policy::None,
            None => raidkit_array::create::Policy::Journal,
        },
        spares: Vec::new(),
        // md's superblock has no place for them: off unless asked (and
        // then refused) with md metadata.
        checksums: a.checksums.unwrap_or(!md),
        md,
        domains: a.domain.clone(),
        data_offset: a.data_offset,
    };
    let spares = a
        .spare
        .iter()
        .map(|s| Spec::parse(s))
        .collect::<raidkit_array::Result<Vec<_>>>()?;
    let mut last_pct = u64::MAX;
    let report = raidkit_open::create(&specs, &spares, &opts, |done, total| {
        let pct = done * 100 / total.max(1);
        if pct != last_pct && pct % 10 == 0 {
            eprintln!("raidkit: initial sync {pct}%");
            last_pct = pct;
        }
    })?;
    if a.json {
        println!(
            "{}",
            json!({
                "uuid": report.uuid.to_string(),
                "name": opts.name,
                "level": level.to_string(),
                "layout": layout_json(layout),
                "chunk": a.chunk,
                "size": report.capacity,
                "members": a.members.members,
                "created_files": report.created_files,
                "initial_sync": report.synced,
                "initial_sync_pending": report.sync_pending,
            })
        );
    } else {
        println!(
            "raidkit: created {level} array '{}' ({}) on {} members: {} usable{}",
            opts.name,
            report.uuid,
            specs.len(),
            human(report.capacity),
            if report.synced {
                ", redundancy synced"
            } else if report.sync_pending {
                "; its initial sync runs in the background when it is served (raidkit serve; raidkit wait follows it)"
            } else {
                ""
            }
        );
    }
    Ok(())
}

/// Recompute redundancy from the data, offline, and count disagreements.
fn cmd_check(a: crate::cli::CheckArgs) -> Result<()> {
    match check_members(a).map_err(crate::say::Unfinished)? {
        Some(bad) => bail!("{bad}"),
        None => Ok(()),
    }
}

/// Check and print the findings; `Some` says what disagrees. An error is a
/// check that could not be made (a member missing or in use, unreadable
/// metadata), not a finding.
fn check_members(a: crate::cli::CheckArgs) -> Result<Option<String>> {
    // Members a server holds change under the check: writes in flight
    // would be counted as mismatches.
    for spec in parse_specs(&a.members.members)? {
        for f in spec.files() {
            if let Ok(Some(holder)) = raidkit_member::FileMember::holder(f) {
                let who = holder
                    .pid
                    .and_then(|pid| {
                        crate::admin::server_array(pid)
                            .map(|a| format!("the raidkit server of array '{a}' (PID {pid})"))
                    })
                    .unwrap_or_else(|| match (holder.pid, &holder.program) {
                        (Some(pid), Some(prog)) => format!("{prog} (PID {pid})"),
                        (Some(pid), None) => format!("process {pid}"),
                        (None, _) => "another process".to_string(),
                    });
                bail!(
                    "{f} is in use by {who}: a check of members being written counts writes in flight as mismatches; stop the server first"
                );
            }
        }
    }
    let array = open_array(&a.members.members, true)?;
    if let Some(at) = array.superblock().resync {
        bail!(
            "array '{}' has not finished its initial sync (pending from unit {at}): redundancy there is not made consistent yet, so a check would count it; serve the array until `raidkit wait` returns, then check",
            array.superblock().name
        );
    }
    let geom = array.geometry();
    let unit = if geom.level.is_parity() {
        "stripes"
    } else {
        "chunks"
    };
    // The first ones are named (a junk array disagrees everywhere).
    const NAMED: usize = 100;
    let mut found = Vec::new();
    let mut blocks = Vec::new();
    let bad = array.scan_findings(
        &mut |m| {
            if found.len() < NAMED {
                found.push(m);
            }
        },
        &mut |f| {
            if blocks.len() < NAMED {
                blocks.push(f);
            }
        },
    )?;
    let total = if geom.level.is_parity() || geom.level == raidkit_layout::Level::Raid1 {
        geom.stripes()
    } else {
        array.capacity() / geom.chunk
    };
    if a.json {
        println!(
            "{}",
            json!({"level": geom.level.to_string(), "checked": total, "unit": unit,
                   "mismatches": bad, "found": found, "checksums": array.checksums(),
                   "findings": blocks})
        );
    } else if array.checksums() {
        // Each block found wrong, by member: the one to replace if it
        // keeps rotting.
        for f in &blocks {
            println!(
                "{} (role {}), member offset {}, {} bytes (array offset {}): {}",
                f.member,
                f.role,
                f.member_offset,
                f.length,
                f.array_offset,
                match f.kind {
                    "checksum" => "disagrees with its checksum",
                    "read-error" => "could not be read",
                    "parity" => "parity disagrees with data that checks out",
                    "lost" => "a rebuild could not make it (an error until written)",
                    _ => "copies that check out differ",
                }
            );
        }
        if blocks.len() >= NAMED {
            println!("(and perhaps more)");
        }
        println!("{total} {unit} checked, {bad} with blocks that disagree");
    } else {
        let what = if geom.level.is_parity() {
            "parity disagrees with the data on role"
        } else {
            "copies differ on roles"
        };
        for m in &found {
            println!(
                "{} {}: array offset {}, member offset {}: {what} {}",
                if geom.level.is_parity() || geom.level == raidkit_layout::Level::Raid1 {
                    "stripe"
                } else {
                    "chunk"
                },
                m.unit,
                m.array_offset,
                m.member_offset,
                m.roles
                    .iter()
                    .map(|r| r.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        if (bad as usize) > found.len() {
            println!("(and {} more)", bad as usize - found.len());
        }
        println!(
            "{} {unit} checked, {bad} with redundancy that disagrees with the data",
            total
        );
    }
    Ok((bad > 0).then(|| format!("{bad} {unit} have inconsistent redundancy")))
}

fn role_str(r: Role) -> Value {
    match r {
        Role::Active(n) => json!(n),
        Role::Spare => json!("spare"),
    }
}

fn cmd_examine(a: ExamineArgs) -> Result<()> {
    let s = Spec::parse(&a.member)?;
    let m = spec::open(&s, true)?;
    let r = read_superblock(m.as_ref())?;
    let sb = &r.sb;
    let roles: Vec<Value> = sb
        .roles
        .iter()
        .enumerate()
        .map(|(i, e)| {
            json!({"role": i, "member_uuid": e.member_uuid.to_string(),
                   "state": e.state.name(), "data_size": e.data_size})
        })
        .collect();
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "member": a.member,
                "array_uuid": sb.array_uuid.to_string(),
                "member_uuid": sb.member_uuid.to_string(),
                "name": sb.name,
                "level": sb.level.to_string(),
                "layout": layout_json(sb.layout),
                "chunk": sb.chunk,
                "raid_disks": sb.raid_disks(),
                "role": role_str(sb.role),
                "data_offset": sb.data_offset,
                "data_size": sb.data_size,
                "array_size": sb.array_size,
                "events": sb.events,
                "state": sb.state,
                "seq": sb.seq,
                "ctime": sb.ctime,
                "utime": sb.utime,
                "recovery_offset": sb.recovery_offset,
                "replacing": sb.replacing,
                // As `detail --json` has them (without the sizes, which
                // need the whole array).
                "resync_offset": sb.resync,
                "reshape": sb.reshape.map(|r| json!({
                    "old_raid_disks": r.old_disks,
                    "rows_done": r.rows,
                    "old_chunk": (r.old_chunk != 0).then_some(r.old_chunk),
                })),
                "consistency_policy": Policy::of(sb).name(),
                "bitmap": (sb.bitmap.region > 0).then(|| json!({
                    "offset": sb.bitmap.offset,
                    "region": sb.bitmap.region,
                    "events_cleared": sb.bitmap.events_cleared,
                })),
                "journal": (sb.journal.size > 0).then(|| json!({
                    "offset": sb.journal.offset,
                    "size": sb.journal.size,
                    "applied_seq": sb.journal.applied_seq,
                })),
                "checksums": sb.checksums.enabled().then(|| json!({
                    "algorithm": "crc32c",
                    "block": raidkit_array::checksums::BLOCK,
                    "offset": sb.checksums.offset,
                    "size": sb.checksums.size,
                })),
                "superblock_copies_valid": r.copies_valid,
                "metadata": metadata_name(sb),
                "roles": roles,
            }))?
        );
        return Ok(());
    }
    println!("{}:", a.member);
    print_sb_common(sb);
    println!("     Member UUID : {}", sb.member_uuid);
    println!(
        "            Role : {}",
        match sb.role {
            Role::Active(n) if sb.replacing => format!(
                "{n} (replacing its member, {} bytes done)",
                sb.recovery_offset.unwrap_or(0)
            ),
            Role::Active(n) => n.to_string(),
            Role::Spare => "spare".into(),
        }
    );
    println!(
        "     Data Offset : {} ({})",
        sb.data_offset,
        human(sb.data_offset)
    );
    println!(
        "       Data Size : {} ({})",
        sb.data_size,
        human(sb.data_size)
    );
    // What this member says of a reshape or an initial sync under way,
    // so that one member of a stopped array tells it (`detail` gives the
    // totals, from every member).
    match sb.reshape {
        Some(r) if r.old_chunk != 0 && r.old_chunk != sb.chunk => println!(
            "         Reshape : chunk from {} to {}, {} stripes done (serve resumes it)",
            human(r.old_chunk),
            human(sb.chunk),
            r.rows
        ),
        Some(r) => println!(
            "         Reshape : from {} to {} members, {} stripes done (serve resumes it)",
            r.old_disks,
            sb.raid_disks(),
            r.rows
        ),
        None => {}
    }
    if let Some(at) = sb.resync {
        println!("          Resync : pending from unit {at} (redundancy not yet consistent there)");
    }
    match &sb.md {
        Some(m) => println!(
            "        Metadata : {}{}",
            metadata_name(sb),
            match raidkit_array::metadata::md::unwritable(m) {
                Some(why) => format!(" (read-only: {why})"),
                None => String::new(),
            }
        ),
        None => println!(
            "     Superblocks : copy A {}, copy B {} (seq {})",
            if r.copies_valid[0] { "valid" } else { "BAD" },
            if r.copies_valid[1] { "valid" } else { "BAD" },
            sb.seq
        ),
    }
    println!("     Role table  :");
    for (i, e) in sb.roles.iter().enumerate() {
        println!("        {i:>4}  {}  {}", e.member_uuid, e.state.name());
    }
    Ok(())
}

/// Which metadata a member carries: "raidkit", or md's with its version.
pub fn metadata_name(sb: &Superblock) -> String {
    match &sb.md {
        Some(m) => format!("md {}", m.version.name()),
        None => "raidkit".into(),
    }
}

fn print_sb_common(sb: &Superblock) {
    println!("      Array UUID : {}", sb.array_uuid);
    println!("            Name : {}", sb.name);
    println!("           Level : {}", sb.level);
    println!("          Layout : {}", sb.layout);
    println!("           Chunk : {}", human(sb.chunk));
    println!("    Raid Members : {}", sb.raid_disks());
    println!(
        "      Array Size : {} ({})",
        sb.array_size,
        human(sb.array_size)
    );
    println!("          Events : {}", sb.events);
    println!("     Consistency : {}", Policy::of(sb).name());
    println!(
        "       Checksums : {}",
        if sb.checksums.enabled() {
            format!(
                "crc32c per {} block ({} at offset {})",
                human(raidkit_array::checksums::BLOCK),
                human(sb.checksums.size),
                sb.checksums.offset
            )
        } else {
            "off".to_string()
        }
    );
    println!(
        "     Array State : {}",
        serde_json::to_value(sb.state)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default()
    );
}

fn member_rows(asm: &Assembly) -> Vec<Value> {
    use raidkit_array::domains::domain_of;
    let label = |sb: Option<&raidkit_array::superblock::Superblock>| {
        sb.map_or(String::new(), |s| s.domain.clone())
    };
    let mut rows: Vec<Value> = asm
        .slots
        .iter()
        .enumerate()
        .map(|(role, s)| match (&s.member, &s.absence) {
            (Some(m), _) => {
                let domain = domain_of(&label(s.sb.as_ref()), m.name());
                match s.resume {
                    Some(at) => json!({"path": m.name(), "role": role, "state": "rebuilding",
                                       "domain": domain, "recovery_offset": at,
                                       "reason": format!("rebuilt up to {at} bytes of its data area")}),
                    None => json!({"path": m.name(), "role": role, "state": "active", "domain": domain}),
                }
            }
            (None, Some(Absence::Stale { member, reason })) => {
                let domain = domain_of(&label(s.stale.as_ref().map(|x| &x.1)), member);
                json!({"path": member, "role": role, "state": "stale", "domain": domain, "reason": reason})
            }
            (None, _) => json!({"path": null, "role": role, "state": "missing", "domain": null}),
        })
        .collect();
    // Replacements after the roles (as `status` lists them).
    rows.extend(asm.slots.iter().enumerate().filter_map(|(role, s)| {
        let (m, sb) = s.replacement.as_ref()?;
        let at = sb.recovery_offset.unwrap_or(0);
        Some(
            json!({"path": m.name(), "role": role, "state": "rebuilding",
               "domain": domain_of(&sb.domain, m.name()), "recovery_offset": at,
               "reason": format!("replacing {}, rebuilt up to {at} bytes of its data area",
                                 s.member.as_ref().map_or("-", |x| x.name()))}),
        )
    }));
    rows.extend(asm.spares.iter().map(|(m, sb)| {
        json!({"path": m.name(), "role": "spare", "state": "spare",
               "domain": domain_of(&sb.domain, m.name())})
    }));
    rows
}

fn cmd_policy(a: PolicyArgs) -> Result<()> {
    let to = Policy::parse(&a.policy)?;
    let members = spec::open_all(&parse_specs(&a.members.members)?, false)?;
    let asm = assemble(members)?;
    let c = raidkit_array::policy::set_policy(&asm, to, a.bitmap_region)?;
    let name = &asm.sb.name;
    if a.json {
        println!(
            "{}",
            json!({"name": name, "from": c.from.name(), "to": c.to.name(),
                   "changed": c.members > 0, "bitmap_region": c.bitmap_region,
                   "journal_bytes": c.journal_bytes, "members": c.members,
                   "cleared_checksums": c.cleared_checksums})
        );
    } else if c.members == 0 {
        println!(
            "raidkit: array '{name}' already has the {} policy; nothing changed",
            c.to.name()
        );
    } else {
        println!(
            "raidkit: array '{name}': consistency policy {} -> {}{}{} ({} members)",
            c.from.name(),
            c.to.name(),
            if c.bitmap_region > 0 {
                format!(", bitmap region {}", human(c.bitmap_region))
            } else {
                String::new()
            },
            if c.journal_bytes > 0 {
                format!(", journal {} per member", human(c.journal_bytes))
            } else {
                String::new()
            },
            c.members
        );
    }
    if c.cleared_checksums > 0 {
        crate::say::warning(&format!(
            "the journal lay over the checksum area (as `raidkit policy` laid it before it kept below the checksums); it was moved, and {} of checksums it had overwritten were cleared: the blocks they cover get new checksums when next read. Serve the array and run `raidkit scrub --wait` to check them against redundancy",
            human(c.cleared_checksums)
        ));
    }
    Ok(())
}

fn cmd_detail(a: DetailArgs) -> Result<()> {
    let specs = parse_specs(&a.members.members)?;
    let members = spec::open_all(&specs, true)?;
    let asm = assemble(members)?;
    let sb = &asm.sb;
    let health = asm.health();
    let rows = member_rows(&asm);
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "uuid": sb.array_uuid.to_string(),
                "name": sb.name,
                "level": sb.level.to_string(),
                "layout": layout_json(sb.layout),
                "chunk": sb.chunk,
                // During a reshape, the old shape's size (what is served
                // until it ends).
                "size": if sb.reshape.is_some() { sb.array_size } else { asm.geometry.capacity() },
                "state": health.name(),
                "array_state": sb.state,
                "raid_disks": sb.raid_disks(),
                "events": sb.events,
                "resync_offset": sb.resync,
                "reshape": sb.reshape.map(|r| json!({
                    "old_raid_disks": r.old_disks,
                    "rows_done": r.rows,
                    "new_size": asm.geometry.capacity(),
                    "old_chunk": (r.old_chunk != 0).then_some(r.old_chunk),
                })),
                "consistency_policy": Policy::of(sb).name(),
                "metadata": metadata_name(sb),
                "members": rows,
                "warnings": asm.warnings,
            }))?
        );
    } else {
        print_sb_common(sb);
        println!("           State : {}", health.name());
        if let Some(m) = &sb.md {
            // What md metadata cannot carry is off for such arrays.
            let bitmap = if sb.bitmap.region > 0 {
                "md's internal bitmap kept as md keeps it; no raidkit journal or checksums"
            } else {
                "no raidkit journal, checksums or bitmap"
            };
            println!(
                "        Metadata : md {} ({bitmap}: md's superblock has no place for them){}",
                m.version.name(),
                raidkit_array::metadata::md::unwritable(m)
                    .map(|w| format!("; read-only: {w}"))
                    .unwrap_or_default()
            );
        }
        if let Some(r) = sb
            .reshape
            .filter(|r| r.old_chunk != 0 && r.old_chunk != sb.chunk)
        {
            println!(
                "         Reshape : chunk from {} to {}, {} of {} stripes done ({} all along; serve resumes it)",
                crate::units::human(r.old_chunk),
                crate::units::human(sb.chunk),
                r.rows,
                asm.geometry.stripes(),
                crate::units::human(sb.array_size)
            );
        } else if let Some(r) = sb.reshape {
            println!(
                "         Reshape : from {} to {} members, {} of {} stripes done ({} now, {} when it ends; serve resumes it)",
                r.old_disks,
                sb.raid_disks(),
                r.rows,
                asm.geometry.stripes(),
                crate::units::human(sb.array_size),
                crate::units::human(asm.geometry.capacity())
            );
        }
        if let Some(at) = sb.resync {
            println!(
                "          Resync : pending from unit {at} of {} (redundancy not yet consistent there)",
                if sb.level.is_parity() {
                    asm.geometry.stripes()
                } else {
                    asm.geometry.capacity() / sb.chunk
                }
            );
        }
        println!();
        println!("    Role  State      Domain        Member");
        for r in &rows {
            let role = match &r["role"] {
                Value::String(s) => s.clone(),
                v => v.to_string(),
            };
            let path = r["path"].as_str().unwrap_or("-");
            let reason = r["reason"]
                .as_str()
                .map(|s| format!("  ({s})"))
                .unwrap_or_default();
            println!(
                "    {role:>4}  {:<10} {:<13} {path}{reason}",
                r["state"].as_str().unwrap_or("?"),
                r["domain"].as_str().unwrap_or("-")
            );
        }
        for w in &asm.warnings {
            println!("warning: {w}");
        }
    }
    Ok(())
}

const STEP: usize = 4 << 20;

fn cmd_read(a: ReadArgs) -> Result<()> {
    let array = open_array(&a.members.members, true)?;
    let cap = array.capacity();
    if a.offset.checked_add(a.length).is_none_or(|e| e > cap) {
        bail!(
            "range {}+{} lies beyond the end of the array ({cap} bytes)",
            a.offset,
            a.length
        );
    }
    let mut out: Box<dyn Write> = match &a.out {
        Some(p) => Box::new(
            std::fs::File::create(p).with_context(|| format!("cannot create {}", p.display()))?,
        ),
        None => Box::new(std::io::stdout().lock()),
    };
    let mut buf = vec![0u8; STEP.min(a.length as usize)];
    let mut pos = a.offset;
    let end = a.offset + a.length;
    while pos < end {
        let n = (end - pos).min(STEP as u64) as usize;
        array.read(&mut buf[..n], pos)?;
        out.write_all(&buf[..n]).context("writing output")?;
        pos += n as u64;
    }
    out.flush().context("writing output")?;
    Ok(())
}

fn cmd_write(a: WriteArgs) -> Result<()> {
    raidkit_open::set_io_mode(a.io.io);
    let opts = raidkit_array::OpenOptions {
        run: a.run,
        // A command that ends when its write does takes nothing back in
        // the background.
        rejoin_timeout: std::time::Duration::ZERO,
        ..Default::default()
    };
    // The size from the superblocks alone: bad input is refused before
    // the array is started (which writes the members' superblocks).
    let cap = {
        let ms = spec::open_all(&parse_specs(&a.members.members)?, true)?;
        assemble(ms)?.geometry.capacity()
    };
    let room = cap.saturating_sub(a.offset);
    if a.offset > cap {
        bail!(
            "offset {} lies beyond the end of the array ({cap} bytes)",
            a.offset
        );
    }
    // Know the whole length before writing anything, so that too much input
    // is refused without a partial write.
    let mut input: Box<dyn Read> = match &a.input {
        Some(p) => {
            let f =
                std::fs::File::open(p).with_context(|| format!("cannot open {}", p.display()))?;
            let len = f.metadata()?.len();
            if f.metadata()?.is_file() && len > room {
                bail!(
                    "{} holds {len} bytes but only {room} fit between offset {} and the end of the array ({cap} bytes); nothing written",
                    p.display(),
                    a.offset
                );
            }
            Box::new(f)
        }
        None => Box::new(std::io::stdin().lock()),
    };
    let mut data = Vec::new();
    (&mut input)
        .take(room + 1)
        .read_to_end(&mut data)
        .context("reading input")?;
    if data.len() as u64 > room {
        bail!(
            "input is longer than the {room} bytes between offset {} and the end of the array ({cap} bytes); nothing written",
            a.offset
        );
    }
    let array = open_array_with(&a.members.members, opts, false)?;
    for (i, part) in data.chunks(STEP).enumerate() {
        array.write(part, a.offset + (i * STEP) as u64)?;
    }
    array.close()?;
    if a.json {
        println!("{}", json!({"written": data.len(), "offset": a.offset}));
    } else {
        eprintln!("raidkit: wrote {} bytes at offset {}", data.len(), a.offset);
    }
    Ok(())
}
