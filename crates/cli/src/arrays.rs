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
    // With --run, remote members whose hosts do not answer are left out
    // (the array starts degraded and takes them back when they answer);
    // without it their absence is an error that says so.
    let (ms, unreached) = if opts.run {
        spec::open_reachable(&specs, opts.read_only)?
    } else {
        let ms = spec::open_all(&specs, opts.read_only).map_err(|e| match e {
            raidkit_array::Error::Unreachable { detail, .. } => anyhow::anyhow!(
                "{detail}; a member that cannot be reached cannot be assembled: give --run to \
                 start the array without it (it then takes its role back by itself once its \
                 host answers), or leave it off and `raidkit add` it once its host is back"
            ),
            e => e.into(),
        })?;
        (ms, Vec::new())
    };
    let not_reached = || {
        unreached
            .iter()
            .map(|(_, why)| why.as_str())
            .collect::<Vec<_>>()
            .join("; ")
    };
    for (_, why) in &unreached {
        crate::say::warning(&format!("{why}: starting without it (--run)"));
    }
    let started = (|| -> Result<Array> {
        let a = open_assembled(ms, opts, force)?;
        for (s, why) in &unreached {
            let (name, s) = (s.to_string(), s.clone());
            let reopen: raidkit_array::Reopen = Box::new(move |limit| {
                spec::open_limited(&s, false, limit).map_err(|e| e.to_string())
            });
            a.await_member(&name, why, reopen);
        }
        Ok(a)
    })();
    match started {
        Err(e) if !unreached.is_empty() => Err(anyhow::anyhow!(
            "{e:#}; left out, as they could not be reached: {}",
            not_reached()
        )),
        r => r,
    }
}

/// Start an array from the members opened.
fn open_assembled(
    ms: Vec<std::sync::Arc<dyn raidkit_member::Member>>,
    opts: raidkit_array::OpenOptions,
    force: bool,
) -> Result<Array> {
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
