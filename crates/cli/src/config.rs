//! The config file of `raidkit serve --config` (TOML; default
//! /etc/raidkit/raidkit.toml): the arrays a host serves, named by UUID as
//! mdadm.conf's ARRAY lines, each with its export name and options, and
//! the server's settings. Members are not named: they are found by the
//! UUID in their superblocks among the paths of `search` (every block
//! device by default), wherever they are now, as `mdadm --assemble --scan`
//! finds them. `raidkit scan --config` writes such a file.
//!
//! ```toml
//! listen = "127.0.0.1:10809"        # every array an export of this server
//! search = ["/dev/disk/by-id"]      # where members are looked for
//! http = "127.0.0.1:10810"
//! program = "/usr/local/sbin/raidkit-alert"
//!
//! [arrays]
//! data = { uuid = "0b6f5a0e-..." }
//! scratch = { uuid = "9d0c...", read_only = true }
//! ```
//!
//! Options given on the command line win over the file's settings,
//! which win over the defaults. Unknown keys are errors (a misspelt
//! option must not be ignored in silence).

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::path::{Path, PathBuf};

pub const DEFAULT_PATH: &str = "/etc/raidkit/raidkit.toml";

/// A rate as the command line takes it ("16M", "100M/s") or a number of
/// bytes per second.
#[derive(Debug, Deserialize, Clone)]
#[serde(untagged)]
pub enum Rate {
    Bytes(u64),
    Text(String),
}

impl Rate {
    fn bytes(&self, key: &str) -> Result<u64> {
        match self {
            Rate::Bytes(n) => Ok(*n),
            Rate::Text(s) => {
                crate::units::parse_rate(s).map_err(|e| anyhow::anyhow!("{key} = \"{s}\": {e}"))
            }
        }
    }
}

/// The file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    listen: Option<String>,
    socket: Option<PathBuf>,
    http: Option<String>,
    program: Option<PathBuf>,
    program_timeout: Option<f64>,
    events_log: Option<PathBuf>,
    member_timeout: Option<f64>,
    rejoin_timeout: Option<f64>,
    rebuild_min: Option<Rate>,
    rebuild_max: Option<Rate>,
    io: Option<String>,
    max_connections: Option<u32>,
    search: Option<Vec<PathBuf>>,
    /// Export name = { uuid, options }, in the file's order (the first is
    /// the server's default export).
    #[serde(default)]
    arrays: toml::Table,
}

/// One array's entry.
#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct ArrayEntry {
    pub uuid: String,
    /// Serve it read-only.
    #[serde(default)]
    pub read_only: bool,
    /// Start it degraded although members are missing that it did not
    /// know to be gone (mdadm's --run).
    #[serde(default)]
    pub run: bool,
    /// Start it from its most recent stale members (mdadm's --force).
    #[serde(default)]
    pub force: bool,
    /// Its control socket (default: raidkit-<uuid>.ctl in the temp directory).
    pub control: Option<PathBuf>,
    /// Served on its own listener rather than the server's.
    pub listen: Option<String>,
    pub socket: Option<PathBuf>,
}

/// A config file read and checked.
#[derive(Debug)]
pub struct Config {
    pub path: PathBuf,
    pub listen: Option<String>,
    pub socket: Option<PathBuf>,
    pub http: Option<String>,
    pub program: Option<PathBuf>,
    pub program_timeout: Option<f64>,
    pub events_log: Option<PathBuf>,
    pub member_timeout: Option<f64>,
    pub rejoin_timeout: Option<f64>,
    pub rebuild_min: Option<u64>,
    pub rebuild_max: Option<u64>,
    pub io: Option<raidkit_open::IoMode>,
    pub max_connections: Option<u32>,
    /// Where members are looked for (empty: every block device).
    pub search: Vec<PathBuf>,
    /// (export name, entry), in the file's order.
    pub arrays: Vec<(String, ArrayEntry)>,
}

pub fn load(path: &Path) -> Result<Config> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the config file {}", path.display()))?;
    parse(&text, path).with_context(|| format!("config file {}", path.display()))
}

fn parse(text: &str, path: &Path) -> Result<Config> {
    let f: File = toml::from_str(text)?;
    let mut arrays = Vec::new();
    let mut uuids = std::collections::HashSet::new();
    for (name, v) in f.arrays {
        if name.is_empty() || name.chars().any(char::is_control) {
            bail!("[arrays]: an export name must be a non-empty printable name");
        }
        let entry: ArrayEntry = v.try_into().with_context(|| format!("[arrays] {name}"))?;
        let uuid = uuid::Uuid::parse_str(&entry.uuid)
            .map_err(|e| anyhow::anyhow!("[arrays] {name}: uuid \"{}\": {e}", entry.uuid))?;
        if !uuids.insert(uuid) {
            bail!("[arrays] {name}: array {uuid} is named twice");
        }
        let entry = ArrayEntry {
            uuid: uuid.to_string(),
            ..entry
        };
        // Each array's control socket is its own: a second array on one
        // path would find it taken by its own server.
        if let Some(c) = &entry.control {
            if let Some((other, _)) = arrays
                .iter()
                .find(|(_, e): &&(String, ArrayEntry)| e.control.as_ref() == Some(c))
            {
                bail!(
                    "[arrays] {name}: control socket {} is also array {other}'s: give each array its own (or leave it out: each gets raidkit-<uuid>.ctl)",
                    c.display()
                );
            }
        }
        arrays.push((name, entry));
    }
    if arrays.is_empty() {
        bail!("no arrays: add an [arrays] table with one line per array, as `raidkit scan --config` prints");
    }
    for (key, v) in [
        ("program_timeout", f.program_timeout),
        ("member_timeout", f.member_timeout),
    ] {
        if let Some(v) = v {
            if !(v > 0.0 && v.is_finite()) {
                bail!("{key} must be a positive number of seconds");
            }
        }
    }
    if let Some(v) = f.rejoin_timeout {
        if !(v >= 0.0 && v.is_finite()) {
            bail!("rejoin_timeout must be a number of seconds (0: never rejoin by itself)");
        }
    }
    if f.max_connections == Some(0) {
        bail!("max_connections must be at least 1");
    }
    Ok(Config {
        path: path.to_path_buf(),
        listen: f.listen,
        socket: f.socket,
        http: f.http,
        program: f.program,
        program_timeout: f.program_timeout,
        events_log: f.events_log,
        member_timeout: f.member_timeout,
        rejoin_timeout: f.rejoin_timeout,
        rebuild_min: f.rebuild_min.map(|r| r.bytes("rebuild_min")).transpose()?,
        rebuild_max: f.rebuild_max.map(|r| r.bytes("rebuild_max")).transpose()?,
        io: f
            .io
            .map(|s| s.parse().map_err(|e| anyhow::anyhow!("io = \"{s}\": {e}")))
            .transpose()?,
        max_connections: f.max_connections,
        search: f.search.unwrap_or_default(),
        arrays,
    })
}

/// A TOML key: bare when it can be, quoted otherwise.
pub fn key(name: &str) -> String {
    if !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        name.to_string()
    } else {
        toml::Value::String(name.to_string()).to_string()
    }
}

/// A TOML string.
pub fn string(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(t: &str) -> Result<Config> {
        parse(t, Path::new("t.toml"))
    }

    #[test]
    fn reads_arrays_in_order_with_their_options() {
        let c = p(r#"
listen = "127.0.0.1:0"
search = ["/var/tmp/disks"]
rebuild_min = "32M"
rebuild_max = 1000
[arrays]
zeta = { uuid = "0b6f5a0e-1111-4222-8333-944445555666" }
"a b" = { uuid = "0B6F5A0E-1111-4222-8333-944445555667", read_only = true }
"#)
        .unwrap();
        assert_eq!(c.arrays.len(), 2);
        assert_eq!(c.arrays[0].0, "zeta", "the file's order, not sorted");
        assert_eq!(c.arrays[1].0, "a b");
        assert!(c.arrays[1].1.read_only && !c.arrays[0].1.read_only);
        assert_eq!(c.arrays[1].1.uuid, "0b6f5a0e-1111-4222-8333-944445555667");
        assert_eq!(c.rebuild_min, Some(32 << 20));
        assert_eq!(c.rebuild_max, Some(1000));
        assert_eq!(c.search, vec![PathBuf::from("/var/tmp/disks")]);
    }

    #[test]
    fn refuses_what_it_cannot_honour() {
        let u = "0b6f5a0e-1111-4222-8333-944445555666";
        for (bad, why) in [
            (
                format!("lisen = \"x\"\n[arrays]\na = {{ uuid = \"{u}\" }}"),
                "lisen",
            ),
            (
                format!("[arrays]\na = {{ uuid = \"{u}\", raed_only = true }}"),
                "raed_only",
            ),
            ("[arrays]\na = { uuid = \"nope\" }".to_string(), "uuid"),
            (
                format!("[arrays]\na = {{ uuid = \"{u}\" }}\nb = {{ uuid = \"{u}\" }}"),
                "twice",
            ),
            ("listen = \"x\"\n".to_string(), "no arrays"),
            (
                format!("member_timeout = -1\n[arrays]\na = {{ uuid = \"{u}\" }}"),
                "member_timeout",
            ),
            (
                format!("rebuild_min = \"fast\"\n[arrays]\na = {{ uuid = \"{u}\" }}"),
                "rebuild_min",
            ),
            ("[arrays]\na = { read_only = true }".to_string(), "uuid"),
            (
                format!(
                    "[arrays]\na = {{ uuid = \"{u}\", control = \"/run/x.ctl\" }}\nb = {{ uuid = \"{}\", control = \"/run/x.ctl\" }}",
                    u.replace('0', "1")
                ),
                "also array a's",
            ),
            (
                format!("rejoin_timeout = -1\n[arrays]\na = {{ uuid = \"{u}\" }}"),
                "rejoin_timeout",
            ),
            ("[arrays\n".to_string(), "TOML"),
        ] {
            let e = p(&bad).expect_err(&bad);
            let msg = format!("{e:#}");
            assert!(
                msg.contains(why) || (why == "TOML" && msg.contains("expected")),
                "{bad}: {msg}"
            );
        }
    }

    #[test]
    fn keys_are_quoted_when_they_must_be() {
        assert_eq!(key("data-1_x"), "data-1_x");
        assert_eq!(key("a b"), "\"a b\"");
        let t: toml::Table = toml::from_str(&format!("{} = 1", key("é\"x"))).unwrap();
        assert!(t.contains_key("é\"x"));
    }
}
