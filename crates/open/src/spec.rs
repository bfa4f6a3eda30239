//! Member specifications: how a user names a member on the command line.
//!
//! - `PATH`: a file or block device.
//! - `array[SPEC,SPEC,...]`: the array assembled from those members, used as
//!   one member of another array (RAID-50: `raidkit create --level 0
//!   'array[a,b,c]' 'array[d,e,f]'`). Specs nest.
//! - `fault:SPEC?FAULTS`: SPEC with faults injected (see
//!   [`raidkit_member::fault`]), e.g. `fault:d2.img?read-error-at=4M&delay=5ms`.
//! - `sim:SPEC?TIMING`: SPEC with a simulated disk's timing (see
//!   [`raidkit_member::sim`]), e.g. `sim:d0.img?bw=150M&seek=8ms`.

use raidkit_array::assemble::assemble;
use raidkit_array::{Array, Error, Result};
use raidkit_member::{open_member, FaultConfig, FaultMember, Member, SimConfig, SimDisk};
use std::sync::Arc;
use std::time::Duration;

/// A parsed member specification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spec {
    File(String),
    /// An NBD export on another host or socket: `nbd://HOST[:PORT]/EXPORT`
    /// or `nbd+unix:///EXPORT?socket=PATH` (the NBD URI specification).
    Nbd(String),
    Array(Vec<Spec>),
    Fault(Box<Spec>, FaultConfig, String),
    Sim(Box<Spec>, SimConfig, String),
}

impl Spec {
    pub fn parse(s: &str) -> Result<Spec> {
        let t = s.trim();
        if let Some(rest) = t.strip_prefix("fault:") {
            let (inner, query) = rest.rsplit_once('?').ok_or_else(|| {
                Error::Invalid(format!("member spec '{s}': expected fault:MEMBER?FAULTS"))
            })?;
            let config = FaultConfig::parse(query)
                .map_err(|e| Error::Invalid(format!("member spec '{s}': {e}")))?;
            return Ok(Spec::Fault(
                Box::new(Spec::parse(inner)?),
                config,
                query.to_string(),
            ));
        }
        if let Some(rest) = t.strip_prefix("sim:") {
            let (inner, query) = rest.rsplit_once('?').unwrap_or((rest, ""));
            let config = SimConfig::parse(query)
                .map_err(|e| Error::Invalid(format!("member spec '{s}': {e}")))?;
            return Ok(Spec::Sim(
                Box::new(Spec::parse(inner)?),
                config,
                query.to_string(),
            ));
        }
        if let Some(inner) = t.strip_prefix("array[") {
            let inner = inner.strip_suffix(']').ok_or_else(|| {
                Error::Invalid(format!("member spec '{s}': 'array[' without closing ']'"))
            })?;
            let parts = split_top_level(inner)
                .map_err(|e| Error::Invalid(format!("member spec '{s}': {e}")))?;
            if parts.is_empty() {
                return Err(Error::Invalid(format!(
                    "member spec '{s}' names no members"
                )));
            }
            return Ok(Spec::Array(
                parts
                    .iter()
                    .map(|p| Spec::parse(p))
                    .collect::<Result<_>>()?,
            ));
        }
        if ["nbd://", "nbd+unix://", "nbds://", "nbds+unix://"]
            .iter()
            .any(|p| t.starts_with(p))
        {
            return Ok(Spec::Nbd(t.to_string()));
        }
        if t.is_empty() {
            return Err(Error::Invalid("empty member name".into()));
        }
        Ok(Spec::File(t.to_string()))
    }

    /// The same spec with every file path absolute (joined to the working
    /// directory, symbolic links kept: /dev/disk/by-id names stay), so that
    /// a server's status and log name members unambiguously.
    pub fn absolute(self) -> Spec {
        match self {
            Spec::File(p) => Spec::File(
                std::path::absolute(&p)
                    .map(|a| a.display().to_string())
                    .unwrap_or(p),
            ),
            Spec::Array(v) => Spec::Array(v.into_iter().map(Spec::absolute).collect()),
            Spec::Nbd(u) => Spec::Nbd(u),
            Spec::Fault(inner, c, q) => Spec::Fault(Box::new(inner.absolute()), c, q),
            Spec::Sim(inner, c, q) => Spec::Sim(Box::new(inner.absolute()), c, q),
        }
    }

    /// The file path, for plain members.
    pub fn path(&self) -> Option<&str> {
        match self {
            Spec::File(p) => Some(p),
            Spec::Array(_) | Spec::Nbd(_) | Spec::Fault(..) | Spec::Sim(..) => None,
        }
    }

    /// Every file this spec reads, nested arrays included.
    pub fn files(&self) -> Vec<&str> {
        match self {
            Spec::File(p) => vec![p.as_str()],
            Spec::Nbd(_) => Vec::new(),
            Spec::Array(v) => v.iter().flat_map(|x| x.files()).collect(),
            Spec::Fault(inner, ..) | Spec::Sim(inner, ..) => inner.files(),
        }
    }

    /// The NBD URIs it names, nested ones included.
    pub fn exports(&self) -> Vec<&str> {
        match self {
            Spec::File(_) => Vec::new(),
            Spec::Nbd(u) => vec![u.as_str()],
            Spec::Array(v) => v.iter().flat_map(|x| x.exports()).collect(),
            Spec::Fault(inner, ..) | Spec::Sim(inner, ..) => inner.exports(),
        }
    }
}

impl std::fmt::Display for Spec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Spec::File(p) | Spec::Nbd(p) => f.write_str(p),
            Spec::Fault(inner, _, query) => write!(f, "fault:{inner}?{query}"),
            Spec::Sim(inner, _, query) => write!(f, "sim:{inner}?{query}"),
            Spec::Array(v) => {
                f.write_str("array[")?;
                for (i, s) in v.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{s}")?;
                }
                f.write_str("]")
            }
        }
    }
}

/// Split on commas that are not inside brackets.
fn split_top_level(s: &str) -> std::result::Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '[' => depth += 1,
            ']' => {
                depth -= 1;
                if depth < 0 {
                    return Err("unbalanced ']'".into());
                }
            }
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if depth != 0 {
        return Err("unbalanced '['".into());
    }
    if !cur.trim().is_empty() || !out.is_empty() {
        out.push(cur);
    }
    Ok(out)
}

/// Open the member a spec names; nested arrays are assembled and started.
/// Files and devices are opened in the process's I/O mode
/// ([`crate::set_io_mode`]), and what each got is logged. A remote member
/// whose host cannot be reached is [`Error::Unreachable`].
pub fn open(spec: &Spec, read_only: bool) -> Result<Arc<dyn Member>> {
    open_in(spec, read_only, None)
}

/// As [`open`], with connecting to a remote member limited to `connect`
/// (its requests get the usual remote timeout once it answers): for a
/// member tried again in the background.
pub fn open_limited(spec: &Spec, read_only: bool, connect: Duration) -> Result<Arc<dyn Member>> {
    open_in(spec, read_only, Some(connect))
}

fn open_in(spec: &Spec, read_only: bool, connect: Option<Duration>) -> Result<Arc<dyn Member>> {
    Ok(match spec {
        Spec::File(p) => {
            let o = open_member(p, read_only, crate::io_mode())?;
            tracing::debug!("member {p}: {o}");
            crate::note_opened(p, o.to_string());
            o.member
        }
        Spec::Nbd(uri) => {
            let c = match connect {
                None => raidkit_nbd::NbdClient::connect_with(uri, crate::remote_timeout()),
                Some(limit) => {
                    raidkit_nbd::NbdClient::connect_limited(uri, limit, crate::remote_timeout())
                }
            }
            .map_err(|e| {
                use std::io::ErrorKind as K;
                // The client's errors name the URI already: once is enough.
                let kind = e.kind();
                let e = e.to_string();
                let detail = match e.strip_prefix(uri.as_str()) {
                    Some(rest) => format!("member {uri}{rest}"),
                    None => format!("member {uri}: {e}"),
                };
                // A host that is down: its member's superblock cannot be
                // read, so it cannot be assembled, but the array may start
                // without it (see `serve --run`).
                if matches!(
                    kind,
                    K::ConnectionRefused
                        | K::TimedOut
                        | K::HostUnreachable
                        | K::NetworkUnreachable
                        | K::ConnectionReset
                ) {
                    Error::Unreachable {
                        member: uri.clone(),
                        detail,
                    }
                } else {
                    Error::Invalid(detail)
                }
            })?;
            if c.read_only() && !read_only {
                return Err(Error::Invalid(format!(
                    "member {uri}: the export is read-only"
                )));
            }
            crate::note_opened(uri, format!("NBD export, {} bytes", c.len()));
            Arc::new(c)
        }
        Spec::Array(_) => Arc::new(open_array(spec, read_only)?),
        Spec::Fault(inner, config, _) => Arc::new(FaultMember::new(
            open_in(inner, read_only, connect)?,
            config.clone(),
        )),
        Spec::Sim(inner, config, _) => {
            Arc::new(SimDisk::new(open_in(inner, read_only, connect)?, *config))
        }
    })
}

/// Assemble and start the array whose members `spec` (an `array[...]`) lists.
pub fn open_array(spec: &Spec, read_only: bool) -> Result<Array> {
    let Spec::Array(members) = spec else {
        return Err(Error::Invalid(format!("{spec} is not an array spec")));
    };
    let ms = members
        .iter()
        .map(|m| open(m, read_only))
        .collect::<Result<Vec<_>>>()?;
    Array::open(assemble(ms)?, &spec.to_string(), read_only)
}

/// Open every spec in a list.
pub fn open_all(specs: &[Spec], read_only: bool) -> Result<Vec<Arc<dyn Member>>> {
    // Named twice, the second open would find the file locked by the
    // first and blame this very process.
    if let Some((first, p)) = crate::first_repeat(specs) {
        return Err(Error::Invalid(format!(
            "{first} and {p} are the same member; give each member once"
        )));
    }
    specs.iter().map(|s| open(s, read_only)).collect()
}

/// How long connecting to a remote member may take at a start that may
/// leave it out.
const START_CONNECT_LIMIT: Duration = Duration::from_secs(5);

/// As [`open_all`], but remote members whose hosts do not answer
/// ([`Error::Unreachable`]) are left out and returned, each with why, for
/// a start without them (`serve --run`).
#[allow(clippy::type_complexity)]
pub fn open_reachable(
    specs: &[Spec],
    read_only: bool,
) -> Result<(Vec<Arc<dyn Member>>, Vec<(Spec, String)>)> {
    if let Some((first, p)) = crate::first_repeat(specs) {
        return Err(Error::Invalid(format!(
            "{first} and {p} are the same member; give each member once"
        )));
    }
    let mut opened = Vec::new();
    let mut unreached = Vec::new();
    for s in specs {
        // A host that takes the connection but never answers holds the
        // start only briefly: it is tried again in the background anyway.
        match open_limited(s, read_only, START_CONNECT_LIMIT) {
            Ok(m) => opened.push(m),
            Err(Error::Unreachable { detail, .. }) => unreached.push((s.clone(), detail)),
            Err(e) => return Err(e),
        }
    }
    Ok((opened, unreached))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nested_specs() {
        let s = Spec::parse("array[a.img,array[b,c],d]").unwrap();
        assert_eq!(
            s,
            Spec::Array(vec![
                Spec::File("a.img".into()),
                Spec::Array(vec![Spec::File("b".into()), Spec::File("c".into())]),
                Spec::File("d".into()),
            ])
        );
        assert_eq!(s.to_string(), "array[a.img,array[b,c],d]");
        assert!(Spec::parse("array[a,b").is_err());
        assert!(Spec::parse("array[]").is_err());
        assert!(Spec::parse("array[a]]").is_err());
        assert!(Spec::parse("").is_err());
        let f = Spec::parse("fault:array[a,b]?read-error-at=4K&delay=1ms").unwrap();
        assert!(matches!(&f, Spec::Fault(inner, c, _)
            if **inner == Spec::Array(vec![Spec::File("a".into()), Spec::File("b".into())])
                && c.read_error_at == vec![4096]));
        assert_eq!(f.to_string(), "fault:array[a,b]?read-error-at=4K&delay=1ms");
        assert!(Spec::parse("fault:a.img").is_err());
        assert!(Spec::parse("fault:a.img?boom=1").is_err());
        let d = Spec::parse("sim:a.img?bw=100M&seek=4ms").unwrap();
        assert!(matches!(&d, Spec::Sim(inner, c, _)
            if **inner == Spec::File("a.img".into()) && c.bandwidth == 100 << 20));
        assert_eq!(d.to_string(), "sim:a.img?bw=100M&seek=4ms");
        assert!(Spec::parse("sim:a.img?bw=0").is_err());
    }
}
