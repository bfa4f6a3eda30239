//! What `raidkit serve` is to start: the arrays (from the command line or
//! a config file) and the server-wide settings.

use super::DEFAULT_LISTEN;
use crate::cli::ServeArgs;
use anyhow::{bail, Result};
use std::path::PathBuf;

/// One array to serve: where its members are, how to start it and how to
/// export it.
pub(super) struct Plan {
    /// Says which array it is in messages about one that cannot start.
    pub(super) label: String,
    pub(super) members: Vec<String>,
    pub(super) read_only: bool,
    pub(super) run: bool,
    pub(super) force: bool,
    pub(super) export: Option<String>,
    pub(super) control: Option<PathBuf>,
    pub(super) listen: Option<String>,
    pub(super) socket: Option<PathBuf>,
}

/// The server-wide settings: the command line's, or a config file's where
/// it sets them.
pub(super) struct Settings {
    pub(super) http: Option<String>,
    pub(super) program: Option<PathBuf>,
    pub(super) program_timeout: f64,
    pub(super) events_log: Option<PathBuf>,
    pub(super) member_timeout: f64,
    pub(super) rejoin_timeout: f64,
    pub(super) rebuild_min: u64,
    pub(super) rebuild_max: u64,
    pub(super) io: raidkit_open::IoMode,
    pub(super) max_connections: u32,
}

impl Settings {
    /// The command line's settings where given there, else the file's
    /// where it sets them, else the command line's defaults.
    pub(super) fn of(a: &ServeArgs, c: Option<&crate::config::Config>) -> Settings {
        let cli = |id: &str| a.given.iter().any(|g| g == id);
        fn pick<T>(cli: bool, arg: T, file: Option<T>) -> T {
            match file {
                Some(f) if !cli => f,
                _ => arg,
            }
        }
        Settings {
            http: pick(
                cli("http"),
                a.http.clone(),
                c.and_then(|c| c.http.clone()).map(Some),
            ),
            program: pick(
                cli("program"),
                a.program.clone(),
                c.and_then(|c| c.program.clone()).map(Some),
            ),
            program_timeout: pick(
                cli("program_timeout"),
                a.program_timeout,
                c.and_then(|c| c.program_timeout),
            ),
            events_log: pick(
                cli("events_log"),
                a.events_log.clone(),
                c.and_then(|c| c.events_log.clone()).map(Some),
            ),
            member_timeout: pick(
                cli("member_timeout"),
                a.member_timeout,
                c.and_then(|c| c.member_timeout),
            ),
            rejoin_timeout: pick(
                cli("rejoin_timeout"),
                a.rejoin_timeout,
                c.and_then(|c| c.rejoin_timeout),
            ),
            rebuild_min: pick(
                cli("rebuild_min"),
                a.rebuild_min,
                c.and_then(|c| c.rebuild_min),
            ),
            rebuild_max: pick(
                cli("rebuild_max"),
                a.rebuild_max,
                c.and_then(|c| c.rebuild_max),
            ),
            io: pick(cli("io"), a.io.io, c.and_then(|c| c.io)),
            max_connections: pick(
                cli("max_connections"),
                a.max_connections,
                c.and_then(|c| c.max_connections),
            ),
        }
    }
}

/// The TCP address to listen on, if any: the one given, else the default
/// unless only a Unix socket is.
pub(crate) fn listen_of(listen: Option<&String>, socket: Option<&PathBuf>) -> Option<String> {
    match (listen, socket) {
        (Some(l), _) => Some(l.clone()),
        (None, Some(_)) => None,
        (None, None) => Some(DEFAULT_LISTEN.to_string()),
    }
}

/// The one array of the command line.
pub(super) fn plan_of_args(a: &ServeArgs) -> Result<Vec<Plan>> {
    // A server names its members by absolute path (status, logs), whatever
    // directory the command that asks about them runs in.
    let members = crate::arrays::parse_specs(&a.members.members)?
        .into_iter()
        .map(|s| s.absolute().to_string())
        .collect::<Vec<_>>();
    Ok(vec![Plan {
        label: "the array".into(),
        members,
        read_only: a.read_only,
        run: a.run,
        force: a.force,
        export: a.export.clone(),
        control: a.control.clone(),
        listen: listen_of(a.listen.as_ref(), a.socket.as_ref()),
        socket: a.socket.clone(),
    }])
}

/// The arrays of a config file, their members found by UUID. An array
/// none of whose members is found is reported and left out.
pub(super) fn plans_of_config(a: &ServeArgs, c: &crate::config::Config) -> Result<Vec<Plan>> {
    if !a.members.members.is_empty() {
        bail!("--config serves the arrays its file names: give no members");
    }
    for (flag, given) in [
        ("--export", a.export.is_some()),
        ("--control", a.control.is_some()),
    ] {
        if given {
            bail!("{flag} names one array's; with --config set it per array in the file");
        }
    }
    let found = crate::scan::find(&c.search)?;
    for (p, e) in &found.unreadable {
        tracing::debug!("looking for members: skipped {p}: {e}");
    }
    let mut plans = Vec::new();
    for (export, e) in &c.arrays {
        // One path per member: a second copy of one (a disk and an image
        // of it) would make the start refuse both; one cut short cannot
        // serve.
        let mut seen = std::collections::HashSet::new();
        let members: Vec<String> = found
            .arrays
            .get(&e.uuid)
            .map(|f| {
                f.iter()
                    .filter(|f| !f.truncated() && seen.insert(f.sb.member_uuid))
                    .map(|f| f.path.clone())
                    .collect()
            })
            .unwrap_or_default();
        let label = format!("array {} ({export})", e.uuid);
        if members.is_empty() {
            crate::say::warning(&format!(
                "{label}: no member found among {} path(s) looked at ({}): not served",
                found.scanned,
                if c.search.is_empty() {
                    "every block device".to_string()
                } else {
                    c.search
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ));
            continue;
        }
        let listen = e
            .listen
            .clone()
            .or_else(|| a.listen.clone())
            .or(c.listen.clone());
        let socket = e
            .socket
            .clone()
            .or_else(|| a.socket.clone())
            .or(c.socket.clone());
        plans.push(Plan {
            label,
            members,
            read_only: e.read_only || a.read_only,
            run: e.run || a.run,
            force: e.force || a.force,
            export: Some(export.clone()),
            control: e.control.clone(),
            listen: listen_of(listen.as_ref(), socket.as_ref()),
            socket,
        });
    }
    Ok(plans)
}
