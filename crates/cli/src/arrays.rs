//! Arrays as the commands name them: member names parsed and opened
//! (through raidkit-open), the array assembled and started, with the
//! warnings a person should see.

use anyhow::{bail, Result};
use raidkit_array::assemble::assemble;
use raidkit_array::Array;
use raidkit_layout::Layout;
use raidkit_open::spec::{self, Spec};
use serde_json::{json, Value};

pub fn parse_specs(members: &[String]) -> Result<Vec<Spec>> {
    Ok(members
        .iter()
        .map(|m| Spec::parse(m))
        .collect::<Result<Vec<_>, _>>()?)
}

pub fn layout_json(l: Layout) -> Value {
    match l {
        Layout::None => Value::Null,
        other => json!(other.to_string()),
    }
}

pub fn open_array(members: &[String], read_only: bool) -> Result<Array> {
    open_array_with(
        members,
        raidkit_array::OpenOptions {
            read_only,
            ..Default::default()
        },
        false,
    )
}

/// Assemble and start an array; `force` starts a failed one from its most
/// recent stale members (md's --force).
pub fn open_array_with(
    members: &[String],
    opts: raidkit_array::OpenOptions,
    force: bool,
) -> Result<Array> {
    let specs = parse_specs(members)?;
    let ms = spec::open_all(&specs, opts.read_only)?;
    let mut asm = assemble(ms)?;
    for w in &asm.warnings {
        crate::say::warning(w);
    }
    if force {
        for f in asm.force() {
            crate::say::warning(&f);
        }
    }
    let name = asm.sb.name.clone();
    // The members' locks stop a second writer of the same paths; another
    // path to the same disks (a second loop device over one file, a
    // multipath device) escapes them. Two writers of one array diverge
    // its copies with each thinking itself clean, so an array a server on
    // this machine serves is refused by UUID, as mdadm refuses to
    // assemble an array that is already active. Nothing was written yet.
    if !opts.read_only {
        if let Some((pid, endpoints)) = crate::admin::server_of(&asm.sb.array_uuid.to_string()) {
            bail!(
                "array '{name}' ({}) is already served by the raidkit server with PID {pid}{}, perhaps through other paths to the same disks: two writers would diverge its copies; stop that server first (nothing was written)",
                asm.sb.array_uuid,
                match endpoints.first() {
                    Some(e) => format!(" ({e})"),
                    None => String::new(),
                }
            );
        }
    }
    let degraded = asm.describe_missing();
    let array = Array::open_with(asm, &name, opts)?;
    for n in array.notes() {
        crate::say::note(&n);
    }
    if !degraded.is_empty() {
        crate::say::warning(&format!("array '{name}' is degraded: {degraded}"));
    }
    Ok(array)
}
