//! `raidkit scan`: which arrays are on these disks? The superblock of
//! every file or block device given (the entries of a directory; every
//! block device when nothing is given) is read, read-only, and members are
//! grouped by array UUID, as `mdadm --examine --scan` does. For each array:
//! its members by role, the roles nobody holds, the members whose event
//! counter is behind the others' (stale: never trusted by assembly), and
//! the command that serves it.

use crate::cli::ScanArgs;
use anyhow::{bail, Context, Result};
use raidkit_array::superblock::{read_superblock, Role, Superblock};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Every block device the kernel lists (partitions too).
fn block_devices() -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/sys/class/block").context("listing /sys/class/block")? {
        let name = e?.file_name();
        let dev = Path::new("/dev").join(&name);
        if dev.exists() {
            out.push(dev);
        }
    }
    out.sort();
    Ok(out)
}

/// The paths to look at: files and devices as given, a directory's
/// entries (not its subdirectories).
pub fn candidates(given: &[PathBuf]) -> Result<Vec<PathBuf>> {
    if given.is_empty() {
        return block_devices();
    }
    let mut out = Vec::new();
    for p in given {
        let meta = std::fs::metadata(p).with_context(|| format!("{}", p.display()))?;
        if meta.is_dir() {
            let mut inside: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("listing {}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|e| std::fs::metadata(e).is_ok_and(|m| !m.is_dir()))
                .collect();
            inside.sort();
            out.extend(inside);
        } else {
            out.push(p.clone());
        }
    }
    // One path per file or device: a directory such as /dev/disk/by-id
    // holds several links to each disk (ata-..., wwn-...), and a member
    // listed twice would be opened twice (the second open refused by the
    // first's lock).
    let mut seen = std::collections::HashSet::new();
    out.retain(|p| {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        std::fs::metadata(p).map_or(true, |m| {
            seen.insert(match m.file_type().is_block_device() {
                true => (0, m.rdev()),
                false => (m.dev(), m.ino()),
            })
        })
    });
    Ok(out)
}

pub struct Found {
    pub path: String,
    pub sb: Superblock,
    /// Its size in bytes.
    pub len: u64,
}

impl Found {
    /// Shorter than its data area: it cannot hold its role (a start leaves
    /// it out).
    pub fn truncated(&self) -> bool {
        self.sb.data_offset + self.sb.data_size > self.len
    }
}

/// What a search found: the members of each array by UUID, how many paths
/// were looked at, those that could not be read and why, and how many
/// held no superblock.
pub struct Findings {
    pub arrays: BTreeMap<String, Vec<Found>>,
    pub scanned: usize,
    pub unreadable: Vec<(String, String)>,
    pub others: usize,
}

/// Read the superblock of every path `given` names (every block device
/// when none is), read-only.
pub fn find(given: &[PathBuf]) -> Result<Findings> {
    let paths = candidates(given)?;
    let mut arrays: BTreeMap<String, Vec<Found>> = BTreeMap::new();
    let mut unreadable = Vec::new();
    let mut others = 0usize;
    for p in &paths {
        let path = std::path::absolute(p)
            .unwrap_or_else(|_| p.clone())
            .display()
            .to_string();
        let member = match raidkit_member::FileMember::open(&path, true) {
            Ok(m) => m,
            Err(e) => {
                unreadable.push((path, e.to_string()));
                continue;
            }
        };
        let len = raidkit_member::Member::len(&member);
        match read_superblock(&member) {
            Ok(r) => arrays
                .entry(r.sb.array_uuid.to_string())
                .or_default()
                .push(Found {
                    path,
                    sb: r.sb,
                    len,
                }),
            Err(_) => others += 1,
        }
    }
    Ok(Findings {
        arrays,
        scanned: paths.len(),
        unreadable,
        others,
    })
}

pub fn scan(a: ScanArgs) -> Result<()> {
    let Findings {
        arrays,
        scanned,
        unreadable,
        others,
    } = find(&a.paths)?;
    // Export names: the arrays' names, told apart by their UUIDs where two
    // share one.
    let mut names: BTreeMap<String, usize> = BTreeMap::new();
    for found in arrays.values() {
        if let Some(f) = found.first() {
            *names.entry(f.sb.name.clone()).or_default() += 1;
        }
    }
    let mut list = Vec::new();
    for (uuid, mut found) in arrays {
        found.sort_by_key(|f| match f.sb.role {
            Role::Active(r) => (0, r),
            _ => (1, 0),
        });
        let newest = found.iter().map(|f| f.sb.events).max().unwrap_or(0);
        let fresh = found.iter().find(|f| f.sb.events == newest).expect("one");
        let sb = &fresh.sb;
        let n = sb.raid_disks();
        let mut members = Vec::new();
        let mut held = vec![false; n];
        // Two copies of one member (a disk and an image of it): a start
        // takes one; the first found is the one the command below names.
        let mut seen = std::collections::HashSet::new();
        let mut copies: Vec<&str> = Vec::new();
        for f in &found {
            // A spare's superblock is written when it joins, not at every
            // update after: behind the others, and still the array's spare
            // (a start takes it as one).
            let stale = f.sb.events < newest && f.sb.role != Role::Spare;
            let copy = !f.truncated() && !seen.insert(f.sb.member_uuid);
            if copy {
                copies.push(&f.path);
            }
            let usable = !stale && !f.truncated() && !copy;
            let role = match f.sb.role {
                Role::Active(r) => {
                    // A replacement does not hold its role yet.
                    if usable && !f.sb.replacing && (r as usize) < n {
                        held[r as usize] = true;
                    }
                    json!(r)
                }
                _ => Value::Null,
            };
            members.push(json!({
                "path": f.path,
                "role": role,
                "member_uuid": f.sb.member_uuid.to_string(),
                "events": f.sb.events,
                "stale": stale,
                // Shorter than its data area: left out.
                "truncated": f.truncated(),
                // Another copy of a member listed before it: left out.
                "copy": copy,
                "replacing": f.sb.replacing,
                // In its role but rebuilt only this far (a rebuild cut
                // short): the array serves degraded until it is done.
                "recovery_offset": f.sb.recovery_offset,
            }));
        }
        let missing: Vec<usize> = (0..n).filter(|&r| !held[r]).collect();
        // Whether what was found can serve at all (degraded included):
        // more roles missing than the level survives cannot.
        let survives = |missing: &[usize]| {
            raidkit_layout::Geometry::new(
                sb.level,
                sb.layout,
                sb.chunk,
                sb.roles.iter().map(|r| r.data_size).collect(),
            )
            .is_ok_and(|g| g.survives(missing))
        };
        let startable = survives(&missing);
        // Roles held once the stale members are taken back (`--force`).
        let missing_forced: Vec<usize> = missing
            .iter()
            .copied()
            .filter(|&r| {
                !found.iter().any(|f| {
                    f.sb.role == Role::Active(r as u32) && !f.sb.replacing && f.sb.events < newest
                })
            })
            .collect();
        let forcible = !startable && survives(&missing_forced);
        let state = if missing.is_empty() {
            "complete"
        } else {
            "incomplete"
        };
        let paths: Vec<&str> = found
            .iter()
            .filter(|f| f.sb.events == newest || f.sb.role == Role::Spare)
            .filter(|f| !f.truncated() && !copies.contains(&f.path.as_str()))
            .map(|f| f.path.as_str())
            .collect();
        // A command that starts it: with what is up to date; from the
        // stale members too where only they make up the level's minimum
        // (`--force`); none where even they do not.
        let all: Vec<&str> = found
            .iter()
            .filter(|f| !f.truncated() && !copies.contains(&f.path.as_str()))
            .map(|f| f.path.as_str())
            .collect();
        let (flags, paths) = if startable {
            (if missing.is_empty() { "" } else { " --run" }, paths)
        } else if forcible {
            (
                if missing_forced.is_empty() {
                    " --force"
                } else {
                    " --force --run"
                },
                all,
            )
        } else {
            ("", Vec::new())
        };
        let serve = (!paths.is_empty()).then(|| {
            format!(
                "raidkit serve --daemon{flags} {}",
                paths
                    .iter()
                    .map(|p| shell_word(p))
                    .collect::<Vec<_>>()
                    .join(" ")
            )
        });
        let export = if names.get(&sb.name).copied().unwrap_or(0) > 1 || sb.name.is_empty() {
            format!("{}-{}", sb.name, &uuid[..8])
        } else {
            sb.name.clone()
        };
        let config = format!(
            "{} = {{ uuid = {}{}{} }}",
            crate::config::key(&export),
            crate::config::string(&uuid),
            if forcible { ", force = true" } else { "" },
            if (startable && !missing.is_empty()) || (forcible && !missing_forced.is_empty()) {
                ", run = true"
            } else {
                ""
            }
        );
        list.push(json!({
            "metadata": crate::commands::metadata_name(sb),
            "uuid": uuid,
            "name": sb.name,
            "level": sb.level.to_string(),
            "raid_disks": n,
            "size": sb.array_size,
            "state": state,
            "missing_roles": missing,
            "startable": startable,
            // Not startable as it is, but from its stale members
            // (`serve --force`: what they missed is lost).
            "forcible": forcible,
            "members": members,
            "serve": serve,
            "config": config,
        }));
    }
    if a.config {
        print_config(&a.paths, &list);
        for (p, e) in &unreadable {
            eprintln!("raidkit: skipped {p}: {e}");
        }
        if list.is_empty() {
            bail!("no raidkit arrays among {scanned} path(s) looked at");
        }
        return Ok(());
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "arrays": list,
                "scanned": scanned,
                "not_members": others,
                "unreadable": unreadable
                    .iter()
                    .map(|(p, e)| json!({"path": p, "error": e}))
                    .collect::<Vec<_>>(),
            }))?
        );
        return Ok(());
    }
    if list.is_empty() {
        if !unreadable.is_empty() && others == 0 {
            bail!(
                "no superblock could be read: {}",
                unreadable
                    .iter()
                    .map(|(p, e)| format!("{p}: {e}"))
                    .collect::<Vec<_>>()
                    .join("; ")
            );
        }
        println!("raidkit: no raidkit arrays among {scanned} path(s) looked at");
    }
    for arr in &list {
        println!(
            "ARRAY {} name={} level={} metadata={} members={}/{} {}",
            arr["uuid"].as_str().unwrap_or(""),
            arr["name"].as_str().unwrap_or(""),
            arr["level"].as_str().unwrap_or(""),
            arr["metadata"].as_str().unwrap_or(""),
            arr["raid_disks"].as_u64().unwrap_or(0) as usize
                - arr["missing_roles"].as_array().map_or(0, Vec::len),
            arr["raid_disks"],
            arr["state"].as_str().unwrap_or(""),
        );
        for m in arr["members"].as_array().into_iter().flatten() {
            let role = match m["role"].as_u64() {
                Some(r) if m["replacing"] == true => format!("role {r} (replacement)"),
                Some(r) => format!("role {r}"),
                None => "spare".into(),
            };
            println!(
                "   {role:>7}  {}  events {}{}",
                m["path"].as_str().unwrap_or(""),
                m["events"],
                match m["recovery_offset"].as_u64() {
                    _ if m["copy"] == true =>
                        "  COPY (of a member listed above: not used)".to_string(),
                    _ if m["truncated"] == true =>
                        "  TRUNCATED (shorter than its data area: not used)".to_string(),
                    _ if m["stale"] == true => "  STALE (behind the others: not used)".to_string(),
                    Some(at) => format!("  REBUILDING (in sync up to {at} bytes of its data)"),
                    None => String::new(),
                }
            );
        }
        for r in arr["missing_roles"].as_array().into_iter().flatten() {
            println!("   role {r:>2}  (no up-to-date member found)");
        }
        if arr["forcible"] == true {
            println!(
                "   cannot start as it is: {} lacks more up-to-date members than it survives; `serve --force` takes the stale ones back (what they missed is lost), or find the missing ones",
                arr["level"].as_str().unwrap_or("")
            );
        } else if arr["startable"] == false {
            println!(
                "   cannot start: {} lacks more members than it survives, stale ones included (find the missing ones)",
                arr["level"].as_str().unwrap_or("")
            );
        }
        match arr["serve"].as_str() {
            Some(cmd) => println!("   serve: {cmd}"),
            None => println!("   serve: none"),
        }
        println!("   config: {}", arr["config"].as_str().unwrap_or(""));
    }
    for (p, e) in &unreadable {
        eprintln!("raidkit: skipped {p}: {e}");
    }
    Ok(())
}

/// A config file for `raidkit serve --config` serving every array found,
/// looking for members where this scan looked. An incomplete array is
/// started degraded (`run = true`), said in a comment beside it.
fn print_config(given: &[PathBuf], list: &[Value]) {
    println!("# raidkit serve --config: the arrays `raidkit scan` found.");
    println!("# Members are found by the array UUID in their superblocks, wherever they are.");
    println!("listen = \"{}\"", crate::serve::DEFAULT_LISTEN);
    if given.is_empty() {
        println!("# search: every block device");
    } else {
        let paths: Vec<String> = given
            .iter()
            .map(|p| {
                crate::config::string(
                    &std::path::absolute(p)
                        .unwrap_or_else(|_| p.clone())
                        .display()
                        .to_string(),
                )
            })
            .collect();
        println!("search = [{}]", paths.join(", "));
    }
    println!();
    println!("[arrays]");
    for arr in list {
        if arr["forcible"] == true {
            // Started from stale members only when a person says so.
            println!(
                "# {}: cannot start as it is (roles {} have no up-to-date member); uncomment to start it from its stale members, losing what they missed",
                arr["name"].as_str().unwrap_or(""),
                arr["missing_roles"]
            );
            println!("# {}", arr["config"].as_str().unwrap_or(""));
            continue;
        }
        if arr["startable"] == false {
            // One array that cannot start would stop the whole server.
            println!(
                "# {}: cannot start (roles {} have no up-to-date member, more than {} survives)",
                arr["name"].as_str().unwrap_or(""),
                arr["missing_roles"],
                arr["level"].as_str().unwrap_or("")
            );
            println!("# {}", arr["config"].as_str().unwrap_or(""));
            continue;
        }
        if arr["state"] != "complete" {
            println!(
                "# {}: incomplete (roles {} have no up-to-date member); run = true starts it degraded",
                arr["name"].as_str().unwrap_or(""),
                arr["missing_roles"]
            );
        }
        println!("{}", arr["config"].as_str().unwrap_or(""));
    }
}

/// `p` as one shell word.
fn shell_word(p: &str) -> String {
    if p.chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+:=@%".contains(c))
    {
        p.to_string()
    } else {
        format!("'{}'", p.replace('\'', r"'\''"))
    }
}
