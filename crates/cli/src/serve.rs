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

const DEFAULT_LISTEN: &str = "127.0.0.1:10809";

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
        println!("{line}");
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
fn uri_part(s: &str) -> String {
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

/// Set in the environment of the server a `serve --daemon` starts.
const DAEMON_CHILD: &str = "RAIDKIT_SERVE_DAEMON_CHILD";
/// The last line of a daemon's start-up report: its parent may go.
const DAEMON_READY: &str = "raidkit: serving in the background";

pub fn serve(a: ServeArgs) -> Result<()> {
    if !(a.member_timeout > 0.0 && a.member_timeout.is_finite()) {
        bail!("--member-timeout must be a positive number of seconds");
    }
    if a.daemon && std::env::var_os(DAEMON_CHILD).is_none() {
        return start_daemon();
    }
    // Every member opened from here on, at start-up and by add or replace
    // later, gets this mode.
    raidkit_open::set_io_mode(a.io.io);
    if !(a.program_timeout > 0.0 && a.program_timeout.is_finite()) {
        bail!("--program-timeout must be a positive number of seconds");
    }
    // The event sinks first: the start's own events (a degraded array, a
    // missing member) reach them too.
    let events = raidkit_array::Events::new();
    crate::events::attach(
        &events,
        a.program.as_deref(),
        a.events_log.as_deref(),
        Duration::from_secs_f64(a.program_timeout),
    )?;
    let opts = raidkit_array::OpenOptions {
        read_only: a.read_only,
        readd_stale: !a.read_only,
        member_timeout: Duration::from_secs_f64(a.member_timeout),
        force: a.force,
        run: a.run,
        events: Some(events),
    };
    // A server names its members by absolute path (status, logs), whatever
    // directory the command that asks about them runs in.
    let members = crate::arrays::parse_specs(&a.members.members)?
        .into_iter()
        .map(|s| s.absolute().to_string())
        .collect::<Vec<_>>();
    let array = Arc::new(open_array_with(&members, opts, a.force)?);
    array.set_rebuild_speed(Some(a.rebuild_min), Some(a.rebuild_max));
    let sb = array.superblock();
    let export_name = a.export.clone().unwrap_or_else(|| sb.name.clone());
    let listen = match (&a.listen, &a.socket) {
        (Some(l), _) => Some(l.clone()),
        (None, Some(_)) => None,
        (None, None) => Some(DEFAULT_LISTEN.to_string()),
    };
    // Bind everything before announcing anything.
    let tcp = match &listen {
        Some(addr) => {
            Some(TcpListener::bind(addr).with_context(|| format!("cannot listen on {addr}"))?)
        }
        None => None,
    };
    let unix = match &a.socket {
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
    let device: Arc<dyn raidkit_member::Member> = if array.waits_on_devices() && !a.no_read_ahead {
        // Blocks of whole stripes, about 1 MiB, four in flight.
        let g = array.geometry();
        let stripe = (g.chunk * g.data_members().max(1) as u64).max(4096);
        let block = (1u64 << 20).div_ceil(stripe) * stripe;
        Arc::new(
            raidkit_member::ReadAhead::new(array.clone(), block, 4)
                .context("starting the read-ahead threads")?,
        )
    } else {
        array.clone()
    };
    let server = Server::new(
        Export {
            name: export_name.clone(),
            description: format!("raidkit {} array '{}'", sb.level, sb.name),
            device,
            read_only: a.read_only,
            preferred_block: preferred_block(&array),
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
            max_connections: a.max_connections as usize,
        },
    );
    {
        // Clients coming and going: events at debug level (the log and
        // followers have them; --program is not run for them).
        let array = array.clone();
        server.on_client(move |peer, left| {
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
    let mut endpoints = Vec::new();
    if let Some(l) = tcp {
        let addr = l.local_addr()?;
        endpoints.push(format!("nbd://{addr}/{}", uri_part(&export_name)));
        server.serve_tcp(l)?;
    }
    if let Some(l) = unix {
        let p = a
            .socket
            .as_ref()
            .expect("socket given")
            .display()
            .to_string();
        endpoints.push(format!(
            "nbd+unix:///{}?socket={}",
            uri_part(&export_name),
            uri_part(&p).replace("%2F", "/")
        ));
        server.serve_unix(l)?;
    }
    let control_path = a
        .control
        .clone()
        .unwrap_or_else(|| default_control(&sb.array_uuid.to_string()));
    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let served = Served {
        endpoints: endpoints.clone(),
        control: control_path.display().to_string(),
        started,
        stop: stop.clone(),
    };
    let handler = control_handler(array.clone(), server.stats(), served.clone());
    let mut control = ControlServer::start(&control_path, handler)?;
    let http = match &a.http {
        Some(addr) => {
            let (arr, stats) = (array.clone(), server.stats());
            Some(crate::http::start(
                addr,
                crate::http::Site {
                    array: array.clone(),
                    stats: server.stats(),
                    status: Box::new(move || Value::Object(status_fields(&arr, &stats, &served))),
                },
            )?)
        }
        None => None,
    };

    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    println!(
        "raidkit: serving {} array '{}' ({}, {}) read-{}",
        sb.level,
        sb.name,
        human(array.capacity()),
        array.health().name(),
        if a.read_only { "only" } else { "write" }
    );
    for (name, how) in raidkit_open::take_opened() {
        println!("raidkit: member {name}: {how}");
    }
    for e in &endpoints {
        let uri = e.clone();
        println!("raidkit: listening on {uri}");
    }
    println!("raidkit: control socket {}", control_path.display());
    if let Some(h) = http {
        println!("raidkit: status page http://{h}/ (metrics at http://{h}/metrics)");
    }
    // Under systemd (Type=notify): ready once every listener is up.
    let status_line = format!("serving array '{}' ({})", sb.name, array.health().name());
    if let Err(e) = sd_notify::notify(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(&status_line),
    ]) {
        tracing::warn!("telling systemd the server is ready: {e}");
    }
    if let Some(uri) = endpoints.first() {
        println!("raidkit: try: nbdinfo '{uri}'");
        println!("raidkit:      qemu-io -f raw -c 'read -P 0 0 4k' '{uri}'");
        println!(
            "raidkit:      mkdir -p mnt && nbdfuse mnt/ '{uri}' &   (then: mkfs.ext4 mnt/nbd)"
        );
    }
    use std::io::Write;
    if a.daemon {
        println!(
            "{DAEMON_READY} (PID {}); raidkit stop {} stops it",
            std::process::id(),
            sb.name
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

    let recovery = {
        let array = array.clone();
        std::thread::Builder::new()
            .name("recovery".into())
            .spawn(move || array.recovery_loop())
            .context("starting the recovery thread")?
    };
    // Housekeeping: stalled members every 200 ms, bitmap bits of idle
    // regions every 2 s.
    let mut ticks = 0u64;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(50));
        ticks += 1;
        if ticks.is_multiple_of(4) {
            array.check_stalls();
        }
        if ticks.is_multiple_of(40) {
            array.housekeeping();
        }
    }
    crate::say::note("stopping: finishing requests in flight");
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    server.shutdown();
    control.stop();
    array.stop_background();
    let _ = recovery.join();
    if let Some(p) = &a.socket {
        let _ = std::fs::remove_file(p);
    }
    array
        .close()
        .context("flushing members and marking the array clean")?;
    crate::say::note(&format!("stopped; array '{}' is clean", sb.name));
    Ok(())
}

/// What the control socket reports about the server itself, and the flag
/// that stops it.
#[derive(Clone)]
struct Served {
    endpoints: Vec<String>,
    control: String,
    started: Instant,
    stop: Arc<AtomicBool>,
}

fn control_handler(array: Arc<Array>, stats: Arc<Stats>, served: Served) -> Arc<Handler> {
    Arc::new(move |cmd: &str, args: &Map<String, Value>| {
        let text = |k: &str| -> Result<String, String> {
            args.get(k)
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| format!("'{cmd}' needs a \"{k}\" string"))
        };
        let flag = |k: &str| args.get(k).and_then(Value::as_bool).unwrap_or(false);
        let one = |k: &str, v: Value| -> Map<String, Value> {
            let mut m = Map::new();
            m.insert(k.to_string(), v);
            m
        };
        match cmd {
            "status" => Ok(status_fields(&array, &stats, &served)),
            // The events after `after` (all kept ones if absent), waiting
            // up to `wait_ms` (at most 30 s) for one: a follower's long poll.
            "events" => {
                let after = args.get("after").and_then(Value::as_u64);
                let wait = args.get("wait_ms").and_then(Value::as_u64).unwrap_or(0);
                let (list, last) = array.events().after(
                    after.unwrap_or(0),
                    Duration::from_millis(wait.min(30_000)),
                );
                let mut m = one("events", json!(list));
                m.insert("last".into(), json!(last));
                Ok(m)
            }
            "test-event" => {
                array.emit(raidkit_array::NewEvent::new(
                    "TestMessage",
                    raidkit_array::Severity::Info,
                    "a test event, sent by raidkit monitor --test",
                ));
                Ok(one("sent", json!(true)))
            }
            "stop" => {
                let peers = stats.peers.locked().clone();
                if !peers.is_empty() && !flag("force") {
                    return Err(format!(
                        "{} client(s) connected ({}): disconnect them first, or stop with --force to disconnect them",
                        peers.len(),
                        peers.join(", ")
                    ));
                }
                served.stop.store(true, Ordering::Release);
                let mut m = one("stopping", json!(true));
                m.insert("pid".into(), json!(std::process::id()));
                m.insert("disconnected".into(), json!(peers));
                Ok(m)
            }
            "fail" => array
                .fail_member(&text("member")?, flag("force"))
                .map(|m| one("member", json!(m)))
                .map_err(|e| e.to_string()),
            "remove" => array
                .remove_member(&text("member")?)
                .map(|m| one("member", json!(m)))
                .map_err(|e| e.to_string()),
            "add" => raidkit_open::add_member(&array, &text("member")?, flag("force"))
                .map(|added| match added {
                    raidkit_array::Added::Role { role, resync } => {
                        let mut m = one("role", json!(role));
                        m.insert("as".into(), json!(if resync { "resync" } else { "rebuild" }));
                        m
                    }
                    raidkit_array::Added::Spare => one("as", json!("spare")),
                })
                .map_err(|e| crate::admin::in_use_message(&e).unwrap_or(e.to_string())),
            "replace" => {
                raidkit_open::replace_member(&array, &text("member")?, &text("with")?, flag("force"))
            }
                .map(|r| one("role", json!(r)))
                .map_err(|e| crate::admin::in_use_message(&e).unwrap_or(e.to_string())),
            "speed" => {
                let rate = |k: &str| -> Result<Option<u64>, String> {
                    match args.get(k) {
                        None | Some(Value::Null) => Ok(None),
                        Some(v) => v
                            .as_u64()
                            .map(Some)
                            .ok_or_else(|| format!("\"{k}\" must be bytes per second")),
                    }
                };
                array.set_rebuild_speed(rate("rebuild_min")?, rate("rebuild_max")?);
                let (min, max) = array.rebuild_speed();
                let mut m = one("rebuild_min", json!(min));
                m.insert("rebuild_max".into(), json!(max));
                Ok(m)
            }
            "scrub" => {
                if flag("stop") {
                    return array
                        .stop_scrub()
                        .map(|s| one("stopped", json!(s)))
                        .map_err(|e| e.to_string());
                }
                array
                    .start_scrub(flag("check_only"))
                    .map(|()| one("started", json!(true)))
                    .map_err(|e| e.to_string())
            }
            other => Err(format!(
                "unknown command '{other}' (this server knows: status, stop, fail, remove, add, replace, speed, scrub)"
            )),
        }
    })
}

fn status_fields(array: &Array, stats: &Stats, served: &Served) -> Map<String, Value> {
    let sb = array.superblock();
    let c = |x: &std::sync::atomic::AtomicU64| x.load(Ordering::Relaxed);
    let v = json!({
        "state": array.state_name(),
        "array": {
            "uuid": sb.array_uuid.to_string(),
            "name": sb.name,
            "level": sb.level.to_string(),
            "layout": layout_json(sb.layout),
            "chunk": sb.chunk,
            "size": array.capacity(),
            "events": sb.events,
            "consistency_policy": raidkit_array::create::Policy::of(&sb).name(),
        },
        "members": array.members_status(),
        "recovery": array.recovery_status(),
        "scrub": array.recovery_status().filter(|r| r.kind == "scrub").map(|r| json!({
            "progress": r.progress,
            "bytes_done": r.bytes_done,
            "bytes_total": r.bytes_total,
            "rate": r.rate,
        })),
        "last_scrub": array.last_scrub(),
        "checksums": sb.checksums.enabled(),
        "recovery_pending": array.needs_recovery(),
        "last_recovery": array.last_recovery(),
        "rebuild_speed": {"min": array.rebuild_speed().0, "max": array.rebuild_speed().1},
        "corrected_read_errors": array.corrected_read_errors(),
        "bitmap": array.bitmap_status().map(|(region, dirty)| json!({"region": region, "dirty_regions": dirty})),
        "io": {
            "reads": c(&stats.reads),
            "writes": c(&stats.writes),
            "bytes_read": c(&stats.bytes_read),
            "bytes_written": c(&stats.bytes_written),
            "flushes": c(&stats.flushes),
            "trims": c(&stats.trims),
            "write_zeroes": c(&stats.zeroes),
            "merged_writes": c(&stats.merged_writes),
            "zero_copy_reads": c(&stats.zero_copy_reads),
            "mapped_reads": c(&stats.mapped_reads),
            "mapped_writes": c(&stats.mapped_writes),
            "run_waits": c(&stats.run_waits),
            "held_replies": c(&stats.held_replies),
            "errors": c(&stats.errors),
        },
        "connections": {
            "active": c(&stats.connections_active),
            "total": c(&stats.connections_total),
            "refused": c(&stats.connections_refused),
            "peers": stats.peers.locked().clone(),
        },
        "endpoints": served.endpoints,
        "control": served.control,
        "pid": std::process::id(),
        "uptime_seconds": served.started.elapsed().as_secs_f64(),
    });
    match v {
        Value::Object(m) => m,
        _ => unreachable!(),
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
