//! `raidkit serve` and `raidkit status`: wiring the array, the NBD server
//! and the control socket together.

use crate::arrays::{layout_json, open_array_with};
use crate::cli::ServeArgs;
use crate::units::human;
use anyhow::{bail, Context, Result};
use raidkit_array::Array;
use raidkit_control::{ControlServer, Handler};
use raidkit_member::Locked;
use raidkit_nbd::{Config, Export, Server, Stats, ZeroCopy};
use serde_json::{json, Map, Value};
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod control;
mod plan;
mod shutdown;
use control::{control_handler, status_fields, Served};
pub(crate) use plan::listen_of;
use plan::{plan_of_args, plans_of_config, Plan, Settings};

pub const DEFAULT_LISTEN: &str = "127.0.0.1:10809";

/// `serve --daemon`: the same command run again as a server in a session
/// of its own; its start-up report is passed on until it says it serves,
/// then this process exits 0. A server that fails to start exits with its
/// own error (on the shared stderr) and status.
fn start_daemon() -> Result<()> {
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().context("finding the raidkit executable")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(std::env::args_os().skip(1))
        .env(DAEMON_CHILD, "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped());
    // SAFETY: setsid() in the child between fork and exec is
    // async-signal-safe; it detaches the server from this terminal, so that
    // closing it (SIGHUP) or Ctrl-C there does not stop the array.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("starting the server")?;
    let out = child.stdout.take().expect("piped stdout");
    for line in std::io::BufReader::new(out).lines() {
        let line = line.context("reading the server's start-up report")?;
        crate::say::report!("{line}");
        if line.starts_with(DAEMON_READY) {
            return Ok(());
        }
    }
    // Its stdout closed before it said it serves: it has failed.
    let st = child.wait().context("waiting for the server")?;
    std::process::exit(st.code().unwrap_or(1).max(1));
}

/// An export name or socket path as a part of an NBD URI: percent-encoded
/// (the NBD URI specification, RFC 3986), so that a name such as `a b/c`
/// reaches the server as it is.
pub(crate) fn uri_part(s: &str) -> String {
    use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
    const KEEP: &percent_encoding::AsciiSet = &NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~');
    utf8_percent_encode(s, KEEP).to_string()
}

fn default_control(uuid: &str) -> PathBuf {
    std::env::temp_dir().join(format!("raidkit-{uuid}.ctl"))
}

/// A link at an array's default control path to the socket `--control`
/// (or a config file) put elsewhere: `raidkit list` and names given to
/// `--control` find running servers by the default paths. Removed when
/// the server stops; one left by a killed server leads nowhere, and is
/// replaced by the next.
struct ControlLink(PathBuf);

impl ControlLink {
    fn new(uuid: &str, control: &std::path::Path) -> Option<ControlLink> {
        let link = default_control(uuid);
        let target = std::path::absolute(control).ok()?;
        if link == target {
            return None;
        }
        if let Ok(m) = std::fs::symlink_metadata(&link) {
            use std::os::unix::fs::FileTypeExt;
            // A link (left by a killed server: this array cannot be served
            // twice) or a socket nobody answers is replaced; a live
            // server's socket, or a file that is no socket, is kept.
            let kind = m.file_type();
            let stale = kind.is_symlink()
                || (kind.is_socket() && std::os::unix::net::UnixStream::connect(&link).is_err());
            if !stale {
                return None;
            }
            std::fs::remove_file(&link).ok()?;
        }
        match std::os::unix::fs::symlink(&target, &link) {
            Ok(()) => Some(ControlLink(link)),
            Err(e) => {
                tracing::debug!("no link to the control socket at {}: {e}", link.display());
                None
            }
        }
    }
}

impl Drop for ControlLink {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Set in the environment of the server a `serve --daemon` starts.
const DAEMON_CHILD: &str = "RAIDKIT_SERVE_DAEMON_CHILD";
/// The last line of a daemon's start-up report: its parent may go.
const DAEMON_READY: &str = "raidkit: serving in the background";

/// The URI scheme of this server's endpoints: `nbds` when every client
/// must use TLS (the scheme libnbd and qemu take as "TLS required"),
/// `nbd` otherwise; `+unix` is added for a Unix socket.
pub(crate) fn scheme(a: &crate::cli::AccessArgs) -> &'static str {
    if a.tls == "require" {
        "nbds"
    } else {
        "nbd"
    }
}

/// TLS and the peers let in, from the command line; a server listening
/// beyond loopback without TLS is said to be so.
pub(crate) fn secure(
    server: &Server,
    a: &crate::cli::AccessArgs,
    listen: Option<&str>,
) -> Result<()> {
    let tls = match a.tls.as_str() {
        "off" => {
            if a.tls_cert.is_some()
                || a.tls_key.is_some()
                || a.tls_ca.is_some()
                || a.tls_psk.is_some()
            {
                bail!(
                    "--tls-cert, --tls-key, --tls-ca and --tls-psk need --tls on or --tls require"
                );
            }
            None
        }
        mode if a.tls_psk.is_some() => {
            if a.tls_cert.is_some() || a.tls_key.is_some() || a.tls_ca.is_some() {
                bail!("--tls-psk or --tls-cert/--tls-key (with --tls-ca): one kind of TLS credentials, not both");
            }
            let file = a.tls_psk.as_deref().expect("given");
            Some(raidkit_nbd::ServerTls::psk(file, mode == "require").context("TLS")?)
        }
        mode => {
            let (Some(cert), Some(key)) = (&a.tls_cert, &a.tls_key) else {
                bail!("--tls {mode} needs --tls-cert FILE and --tls-key FILE (PEM), or --tls-psk FILE");
            };
            Some(
                raidkit_nbd::ServerTls::x509(cert, key, a.tls_ca.as_deref(), mode == "require")
                    .context("TLS")?,
            )
        }
    };
    let allow = match &a.allow {
        Some(list) => raidkit_nbd::Allow::parse(list).map_err(anyhow::Error::msg)?,
        None => raidkit_nbd::Allow::default(),
    };
    let beyond_loopback = listen
        .and_then(|l| l.parse::<std::net::SocketAddr>().ok())
        .is_some_and(|a| !a.ip().is_loopback());
    if beyond_loopback && !tls.as_ref().is_some_and(|t| t.require) {
        crate::say::warning(&format!(
            "listening on {} without --tls require: anyone who can reach it reads and writes the data in clear{}",
            listen.unwrap_or("?"),
            if allow.is_empty() { ", from anywhere (no --allow)" } else { "" }
        ));
    }
    server
        .secure(raidkit_nbd::Security { tls, allow })
        .context("setting up the server's access")?;
    Ok(())
}

/// An array started and about to be served.
struct Started {
    plan: Plan,
    array: Arc<Array>,
    export: String,
    /// How each member was opened (said at start-up).
    opened: Vec<(String, String)>,
    endpoints: Vec<String>,
    stats: Option<Arc<Stats>>,
    control: PathBuf,
    /// The write-behind in front of the array, if any: drained before the
    /// array is closed.
    behind: Option<Arc<raidkit_member::WriteBehind>>,
}

/// The listeners of one server: the arrays that share a listen address
/// and socket are the exports of one NBD server.
pub(crate) struct Listeners {
    key: (Option<String>, Option<PathBuf>),
    pub(crate) tcp: Option<TcpListener>,
    pub(crate) unix: Option<UnixListener>,
    arrays: Vec<usize>,
}

pub(crate) fn bind(listen: &Option<String>, socket: &Option<PathBuf>) -> Result<Listeners> {
    let tcp = match listen {
        Some(addr) => {
            Some(TcpListener::bind(addr).with_context(|| format!("cannot listen on {addr}"))?)
        }
        None => None,
    };
    let unix = match socket {
        Some(p) => {
            if p.exists() {
                if std::os::unix::net::UnixStream::connect(p).is_ok() {
                    bail!("{} is in use by a running server", p.display());
                }
                std::fs::remove_file(p)
                    .with_context(|| format!("cannot remove stale socket {}", p.display()))?;
            }
            Some(
                UnixListener::bind(p)
                    .with_context(|| format!("cannot listen on {}", p.display()))?,
            )
        }
        None => None,
    };
    Ok(Listeners {
        key: (listen.clone(), socket.clone()),
        tcp,
        unix,
        arrays: Vec::new(),
    })
}

/// The read-ahead `serve` puts in front of an array whose members wait
/// for devices: blocks of whole stripes, about 1 MiB, four in flight.
/// `array`'s geometry sets the blocks; they are read through `through`
/// (the array, or a wrapper of it).
pub(crate) fn read_ahead(
    array: &Arc<Array>,
    through: Arc<dyn raidkit_member::Member>,
) -> Result<raidkit_member::ReadAhead> {
    let g = array.geometry();
    let stripe = (g.chunk * g.data_members().max(1) as u64).max(4096);
    let block = (1u64 << 20).div_ceil(stripe) * stripe;
    raidkit_member::ReadAhead::new(through, block, 4).context("starting the read-ahead threads")
}

/// The write-behind `serve` puts in front of an array whose members wait
/// for devices: four requests of a sequential writer at queue depth 1, at
/// most 32 MiB, so that two of the largest requests a client is likely to
/// send at that depth fit (with 16 MiB, requests of 10 MiB and more went one
/// at a time, and the disks idled between them as without write-behind).
pub(crate) fn write_behind(array: &Arc<Array>) -> Result<Arc<raidkit_member::WriteBehind>> {
    Ok(Arc::new(
        raidkit_member::WriteBehind::new(array.clone(), 4, 32 << 20)
            .context("starting the write-behind threads")?,
    ))
}

/// What the NBD server serves of `array`: the array, behind write-behind
/// and read-ahead where its members wait on devices, tuned for its
/// geometry; and the write-behind, to be drained before the array closes.
fn export_of(
    array: &Arc<Array>,
    name: &str,
    read_only: bool,
    a: &ServeArgs,
    max_connections: u32,
) -> Result<(Export, Config, Option<Arc<raidkit_member::WriteBehind>>)> {
    let sb = array.superblock();
    let devices = array.waits_on_devices();
    let behind = if devices && !a.no_write_behind && !read_only {
        Some(write_behind(array)?)
    } else {
        None
    };
    let under: Arc<dyn raidkit_member::Member> = match &behind {
        Some(b) => b.clone(),
        None => array.clone(),
    };
    let device: Arc<dyn raidkit_member::Member> = if devices && !a.no_read_ahead {
        Arc::new(read_ahead(array, under)?)
    } else {
        under
    };
    Ok((
        Export {
            name: name.to_string(),
            description: format!("raidkit {} array '{}'", sb.level, sb.name),
            device,
            read_only,
            preferred_block: preferred_block(array),
        },
        Config {
            workers_per_connection: a
                .workers
                .unwrap_or(if array.waits_on_devices() { 32 } else { 8 })
                .max(1),
            merge_writes: sb.level.is_parity(),
            merge_align: if sb.level.is_parity() {
                array.geometry().chunk * array.geometry().data_members() as u64
            } else {
                0
            },
            zero_copy: match a.zero_copy.as_str() {
                "always" => ZeroCopy::Always,
                "never" => ZeroCopy::Never,
                _ => ZeroCopy::Auto,
            },
            mapped_reads: !a.no_mapped_reads,
            mapped_writes: !a.no_mapped_writes,
            batch_replies: !a.no_batch_replies,
            max_connections: max_connections as usize,
        },
        behind,
    ))
}

/// Clients coming and going: events at debug level (the log and followers
/// have them; --program is not run for them).
fn client_events(array: &Arc<Array>, target: &raidkit_nbd::Target) {
    let array = array.clone();
    target.on_client(move |peer, left| {
        let (name, detail) = match left {
            None => ("ClientConnected", format!("{peer} connected")),
            Some("") => ("ClientDisconnected", format!("{peer} disconnected")),
            Some(why) => ("ClientDisconnected", format!("{peer}: {why}")),
        };
        array.emit(
            raidkit_array::NewEvent::new(name, raidkit_array::Severity::Debug, detail)
                .data(json!({ "peer": peer })),
        );
    });
}

pub fn serve(a: ServeArgs) -> Result<()> {
    let config = match &a.config {
        Some(p) => Some(crate::config::load(p)?),
        None => {
            if a.members.members.is_empty() {
                bail!("name the array's members, or serve the arrays of a config file with --config [FILE] (default {})", crate::config::DEFAULT_PATH);
            }
            None
        }
    };
    let mut set = Settings::of(&a, config.as_ref());
    if set.rebuild_max != 0 && set.rebuild_min > set.rebuild_max {
        let min_given = a.given.iter().any(|g| g == "rebuild_min")
            || config.as_ref().is_some_and(|c| c.rebuild_min.is_some());
        if min_given {
            bail!(
                "--rebuild-min ({}) is above --rebuild-max ({}): the speed while clients are busy is at most the idle one",
                set.rebuild_min,
                set.rebuild_max
            );
        }
        // The default floor comes down to a ceiling set below it.
        set.rebuild_min = set.rebuild_max;
    }
    if !(set.member_timeout > 0.0 && set.member_timeout.is_finite()) {
        bail!("--member-timeout must be a positive number of seconds");
    }
    if !(set.program_timeout > 0.0 && set.program_timeout.is_finite()) {
        bail!("--program-timeout must be a positive number of seconds");
    }
    if !(set.rejoin_timeout >= 0.0 && set.rejoin_timeout.is_finite()) {
        bail!("--rejoin-timeout must be a number of seconds (0: never rejoin by itself)");
    }
    let plans = match &config {
        Some(c) => plans_of_config(&a, c)?,
        None => plan_of_args(&a)?,
    };
    if a.daemon && std::env::var_os(DAEMON_CHILD).is_none() {
        return start_daemon();
    }
    // Every member opened from here on, at start-up and by add or replace
    // later, gets this mode.
    raidkit_open::set_io_mode(set.io);
    // A remote member's requests wait no longer than a local one may
    // stall: past that its connection counts as lost.
    raidkit_open::set_remote_timeout(Some(Duration::from_secs_f64(set.member_timeout)));
    let mut started: Vec<Started> = Vec::new();
    let total = config.as_ref().map_or(plans.len(), |c| c.arrays.len());
    for plan in plans {
        // The event sinks first: the start's own events (a degraded
        // array, a missing member) reach them too.
        let events = raidkit_array::Events::new();
        crate::events::attach(
            &events,
            set.program.as_deref(),
            set.events_log.as_deref(),
            Duration::from_secs_f64(set.program_timeout),
        )?;
        let opts = raidkit_array::OpenOptions {
            read_only: plan.read_only,
            readd_stale: !plan.read_only,
            member_timeout: Duration::from_secs_f64(set.member_timeout),
            force: plan.force,
            run: plan.run,
            events: Some(events),
            rejoin_timeout: Duration::from_secs_f64(set.rejoin_timeout),
        };
        let array = match open_array_with(&plan.members, opts, plan.force) {
            Ok(a) => Arc::new(a),
            // One array of a config file that cannot start leaves the
            // others served (as mdadm --assemble --scan).
            Err(e) if config.is_some() => {
                crate::say::warning(&format!(
                    "{}: not served: {}",
                    plan.label,
                    crate::say::causes(&e)
                ));
                continue;
            }
            Err(e) => return Err(e),
        };
        let sb = array.superblock();
        if plan.read_only {
            // Read-only opens take no lock (examining a member of a served
            // array works), but a second server reading members that
            // another one writes would serve torn data.
            if let Some((pid, endpoints)) = crate::admin::server_of(&sb.array_uuid.to_string()) {
                let why = format!(
                    "array '{}' is already served by the raidkit server with PID {pid}{}: a read-only server beside it would read members that one is writing; read through its export, or stop it first",
                    sb.name,
                    match endpoints.first() {
                        Some(e) => format!(" ({e})"),
                        None => String::new(),
                    }
                );
                if config.is_some() {
                    crate::say::warning(&format!("{}: not served: {why}", plan.label));
                    continue;
                }
                bail!("{why}");
            }
        }
        array.set_rebuild_speed(Some(set.rebuild_min), Some(set.rebuild_max));
        let export = plan.export.clone().unwrap_or_else(|| sb.name.clone());
        let control = plan
            .control
            .clone()
            .unwrap_or_else(|| default_control(&sb.array_uuid.to_string()));
        started.push(Started {
            plan,
            array,
            export,
            opened: raidkit_open::take_opened(),
            endpoints: Vec::new(),
            stats: None,
            control,
            behind: None,
        });
    }
    if started.is_empty() {
        bail!(
            "none of the {total} arrays named in {} could be served",
            config
                .as_ref()
                .map_or_else(String::new, |c| c.path.display().to_string())
        );
    }
    // Bind everything before announcing anything.
    let mut groups: Vec<Listeners> = Vec::new();
    let grouped = (|| -> Result<()> {
        for (i, s) in started.iter().enumerate() {
            let key = (s.plan.listen.clone(), s.plan.socket.clone());
            let g = match groups.iter().position(|g| g.key == key) {
                Some(g) => g,
                None => {
                    groups.push(bind(&key.0, &key.1)?);
                    groups.len() - 1
                }
            };
            if let Some(j) = groups[g]
                .arrays
                .iter()
                .find(|&&j| started[j].export == s.export)
            {
                bail!(
                    "{} and {} would both be the export '{}' of one server: give them different names",
                    started[*j].plan.label,
                    s.plan.label,
                    s.export
                );
            }
            groups[g].arrays.push(i);
        }
        Ok(())
    })();
    if let Err(e) = grouped {
        // Nothing served yet: the sockets bound so far (ours) go, and the
        // arrays close as they opened.
        for g in &groups {
            if let (Some(p), Some(_)) = (&g.key.1, &g.unix) {
                let _ = std::fs::remove_file(p);
            }
        }
        for s in &started {
            let _ = s.array.close();
        }
        return Err(e);
    }
    // Everything started from here on is stopped in order below, also when
    // a later step of the start-up fails: requests in flight finished,
    // writes answered early landed, arrays closed and marked clean.
    let mut servers = Vec::new();
    let mut controls = Vec::new();
    let mut links = Vec::new();
    let mut recovery = Vec::new();
    let stop = Arc::new(AtomicBool::new(false));
    let closings: Arc<Vec<Arc<control::Closing>>> = Arc::new(
        started
            .iter()
            .map(|s| Arc::new(control::Closing::new(s.array.superblock().name)))
            .collect(),
    );
    // The stall watch (every 200 ms) runs until the arrays are closed: a
    // member that hangs while they close is failed too.
    let watch = StallWatch::start(started.iter().map(|s| s.array.clone()).collect());
    let up = (|| -> Result<()> {
        for g in groups {
            let exports = g
                .arrays
                .iter()
                .map(|&i| {
                    let s = &started[i];
                    export_of(
                        &s.array,
                        &s.export,
                        s.plan.read_only,
                        &a,
                        set.max_connections,
                    )
                })
                .collect::<Result<Vec<_>>>()?;
            let mut exports = exports;
            for (&i, (_, _, behind)) in g.arrays.iter().zip(exports.iter_mut()) {
                started[i].behind = behind.take();
            }
            let exports = exports.into_iter().map(|(e, c, _)| (e, c)).collect();
            let server = Server::with_exports(exports, set.max_connections as usize);
            let tcp = match &g.tcp {
                Some(l) => Some(l.local_addr()?),
                None => None,
            };
            for &i in &g.arrays {
                let s = &mut started[i];
                let target = server.target(&s.export).expect("an export of its own");
                client_events(&s.array, target);
                s.stats = Some(target.stats());
                if let Some(addr) = tcp {
                    s.endpoints.push(format!(
                        "{}://{addr}/{}",
                        scheme(&a.access),
                        uri_part(&s.export)
                    ));
                }
                if let Some(p) = &s.plan.socket {
                    s.endpoints.push(format!(
                        "{}+unix:///{}?socket={}",
                        scheme(&a.access),
                        uri_part(&s.export),
                        uri_part(&p.display().to_string()).replace("%2F", "/")
                    ));
                }
            }
            secure(&server, &a.access, tcp.map(|t| t.to_string()).as_deref())?;
            // Listed before it serves: if its second listener fails, the
            // first is still shut down below with the others.
            servers.push(server);
            let server = servers.last().expect("just pushed");
            if let Some(l) = g.tcp {
                server.serve_tcp(l)?;
            }
            if let Some(l) = g.unix {
                server.serve_unix(l)?;
            }
        }
        let started_at = Instant::now();
        let all_stats: Vec<Arc<Stats>> = started
            .iter()
            .map(|s| s.stats.clone().expect("served"))
            .collect();
        let mut site = Vec::new();
        for s in &started {
            let served = Served {
                endpoints: s.endpoints.clone(),
                control: s.control.display().to_string(),
                started: started_at,
                stop: stop.clone(),
                all: all_stats.clone(),
                behind: s.behind.clone(),
                closings: closings.clone(),
            };
            let stats = s.stats.clone().expect("served");
            let handler = control_handler(s.array.clone(), stats.clone(), served.clone());
            controls.push(ControlServer::start(&s.control, handler)?);
            links.extend(ControlLink::new(
                &s.array.superblock().array_uuid.to_string(),
                &s.control,
            ));
            let arr = s.array.clone();
            let st = stats.clone();
            site.push(crate::http::SiteArray {
                export: s.export.clone(),
                array: s.array.clone(),
                stats,
                behind: s.behind.clone(),
                status: Box::new(move || Value::Object(status_fields(&arr, &st, &served))),
            });
        }
        let http = match &set.http {
            Some(addr) => Some(crate::http::start(
                addr,
                crate::http::Site { arrays: site },
            )?),
            None => None,
        };

        for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
            signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
        }
        if let Some(c) = &config {
            crate::say::report!(
                "raidkit: serving {} of the {} arrays of {}",
                started.len(),
                total,
                c.path.display()
            );
        }
        for s in &started {
            let sb = s.array.superblock();
            crate::say::report!(
                "raidkit: serving {} array '{}' ({}, {}) read-{}",
                sb.level,
                sb.name,
                human(s.array.capacity()),
                s.array.health().name(),
                if s.plan.read_only { "only" } else { "write" }
            );
            // Only the members it holds: a stale one given (or found by a
            // config file's UUID) was opened, then left out.
            let held: Vec<String> = s
                .array
                .members_status()
                .into_iter()
                .filter_map(|m| m.path)
                .collect();
            for (name, how) in s.opened.iter().filter(|(n, _)| held.contains(n)) {
                crate::say::report!("raidkit: member {name}: {how}");
            }
            for uri in &s.endpoints {
                crate::say::report!("raidkit: listening on {uri}");
            }
            crate::say::report!("raidkit: control socket {}", s.control.display());
        }
        if let Some(h) = http {
            crate::say::report!("raidkit: status page http://{h}/ (metrics at http://{h}/metrics)");
        }
        // Under systemd (Type=notify): ready once every listener is up.
        let status_line = started
            .iter()
            .map(|s| {
                format!(
                    "array '{}' ({})",
                    s.array.superblock().name,
                    s.array.health().name()
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        if let Err(e) = sd_notify::notify(&[
            sd_notify::NotifyState::Ready,
            sd_notify::NotifyState::Status(&format!("serving {status_line}")),
        ]) {
            tracing::warn!("telling systemd the server is ready: {e}");
        }
        if let Some(uri) = started[0].endpoints.first() {
            crate::say::report!("raidkit: try: nbdinfo '{uri}'");
            crate::say::report!("raidkit:      qemu-io -f raw -c 'read -P 0 0 4k' '{uri}'");
            crate::say::report!(
                "raidkit:      mkdir -p mnt && nbdfuse mnt/ '{uri}' &   (then: mkfs.ext4 mnt/nbd)"
            );
        }
        use std::io::Write;
        if a.daemon {
            crate::say::report!(
                "{DAEMON_READY} (PID {}); raidkit stop {} stops it",
                std::process::id(),
                started[0].array.superblock().name
            );
            let _ = std::io::stdout().flush();
            // The parent has read all it waits for and goes: nothing more is
            // printed to stdout, which is pointed away from its pipe so that a
            // later write cannot fail.
            if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
                use std::os::fd::AsRawFd;
                // SAFETY: dup2 onto descriptor 1, which this process owns; the
                // source stays open for the call.
                unsafe { libc::dup2(null.as_raw_fd(), 1) };
            }
        }
        let _ = std::io::stdout().flush();
        // Those whose members were not found, and those that could not
        // start (each said why above).
        let not_started = total - started.len();
        if not_started > 0 {
            tracing::warn!("{not_started} array(s) of the config file are not served");
        }

        for s in &started {
            let array = s.array.clone();
            recovery.push(
                std::thread::Builder::new()
                    .name("recovery".into())
                    .spawn(move || array.recovery_loop())
                    .context("starting the recovery thread")?,
            );
            // Remote members' links, on their own: an attempt to reach a host
            // that does not answer takes seconds.
            let array = s.array.clone();
            recovery.push(
                std::thread::Builder::new()
                    .name("links".into())
                    .spawn(move || array.links_loop())
                    .context("starting the link watch thread")?,
            );
        }
        // Housekeeping (bitmap bits of idle regions, journal checkpoints,
        // every 2 s) flushes members: on a thread of its own for each
        // array, so that a disk that hangs in it holds neither the stall
        // watch, nor the stop, nor the other arrays' housekeeping (the
        // hung system call cannot be taken back).
        for s in &started {
            let a = s.array.clone();
            let keep_stop = stop.clone();
            recovery.push(
                std::thread::Builder::new()
                    .name("housekeeping".into())
                    .spawn(move || {
                        let mut ticks = 0u64;
                        while !keep_stop.load(Ordering::Relaxed) {
                            std::thread::sleep(Duration::from_millis(50));
                            ticks += 1;
                            if ticks.is_multiple_of(40) {
                                a.housekeeping();
                            }
                        }
                    })
                    .context("starting the housekeeping thread")?,
            );
        }
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    })();
    let r = shutdown::stop_all(up, &servers, &started, &closings, recovery, controls);
    drop(watch);
    r
}

/// A thread that fails members with an operation outstanding past the
/// member timeout, whatever the other threads are waiting on; stopped
/// when dropped.
struct StallWatch(Arc<AtomicBool>, Option<std::thread::JoinHandle<()>>);

impl StallWatch {
    fn start(arrays: Vec<Arc<Array>>) -> StallWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        // Without the thread (the process at its limit), members are
        // still failed when their operation returns, past the timeout.
        let h = std::thread::Builder::new()
            .name("stall-watch".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(200));
                    for a in &arrays {
                        a.check_stalls();
                    }
                }
            })
            .ok();
        StallWatch(stop, h)
    }
}

impl Drop for StallWatch {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
        if let Some(h) = self.1.take() {
            let _ = h.join();
        }
    }
}

/// The request size to tell clients (NBD_INFO_BLOCK_SIZE): a whole stripe
/// of data for parity levels, where anything less costs a read-modify-write,
/// when that is a power of two (the protocol requires one; with three data
/// members it never is); otherwise the chunk, so that at least a request
/// does not update part of a chunk; 4 KiB for the other levels.
fn preferred_block(array: &raidkit_array::Array) -> u32 {
    let g = array.geometry();
    if !g.level.is_parity() {
        return raidkit_nbd::server::PREFERRED_BLOCK;
    }
    let stripe = g.chunk * g.data_members() as u64;
    let pick = if stripe.is_power_of_two() {
        stripe
    } else {
        g.chunk
    };
    if pick.is_power_of_two() {
        pick.clamp(4096, 32 << 20) as u32
    } else {
        raidkit_nbd::server::PREFERRED_BLOCK
    }
}
