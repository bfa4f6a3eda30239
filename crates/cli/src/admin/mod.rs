//! Commands that talk to running servers through their control sockets:
//! stop, fail, remove, add, replace, grow, scrub, wait and speed; status
//! and list are in `status`.

use crate::cli::{
    AddArgs, FailArgs, GrowArgs, MemberArgs, ReplaceArgs, ScrubArgs, SpeedArgs, StopArgs, WaitArgs,
};
use crate::units::human;
use anyhow::{anyhow, bail, Context, Result};
use raidkit_control::{call, ControlError};
use serde_json::{json, Value};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod status;
pub use status::{list, status};

/// The server resolves paths in its own working directory: send absolute
/// paths for files that exist here. Role numbers and specs go as given.
fn absolute(member: &str) -> String {
    let p = Path::new(member);
    if p.exists() {
        if let Ok(c) = std::fs::canonicalize(p) {
            return c.display().to_string();
        }
    }
    member.to_string()
}

/// A member to add or swap in: as `absolute`, and a plain file name that
/// does not exist yet (the server creates it) is made absolute here too, so
/// that it is created where the user is, not where the server runs.
fn absolute_new(member: &str) -> String {
    let p = Path::new(member);
    let plain = !member.contains([':', '?', '[']) && member != "missing";
    if !p.exists() && plain && p.is_relative() {
        if let Ok(cwd) = std::env::current_dir() {
            return cwd.join(p).display().to_string();
        }
    }
    absolute(member)
}

/// A background process as a person reads it: "rebuild of role 2 onto
/// /dev/sdc", "reshape (3 to 4 members)", "parity-resync".
fn process_name(r: &serde_json::Map<String, Value>) -> String {
    let kind = r["kind"].as_str().unwrap_or("?");
    let member = r["member"].as_str().unwrap_or("");
    let with: String = r
        .get("with")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|p| {
            format!(
                ", with role {} onto {}",
                p["role"],
                p["member"].as_str().unwrap_or("?")
            )
        })
        .collect();
    match (r["role"].as_u64(), member.is_empty()) {
        (Some(role), _) => format!("{kind} of role {role} onto {member}{with}"),
        (None, false) => format!("{kind} ({member})"),
        (None, true) => kind.to_string(),
    }
}

/// Seconds left as a person reads them ("2h05m", "4m10s", "35s"); "?"
/// while no rate is known.
fn time_left(secs: &Value) -> String {
    let Some(s) = secs.as_f64().filter(|s| s.is_finite()) else {
        return "?".to_string();
    };
    let s = s.round() as u64;
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, sec) => format!("{sec}s"),
        (0, m, sec) => format!("{m}m{sec:02}s"),
        (h, m, _) => format!("{h}h{m:02}m"),
    }
}

fn request(control: Option<&Path>, req: Value) -> Result<Value> {
    let path = find_control(control)?;
    call(&path, &req, Duration::from_secs(60)).map_err(|e| anyhow!(e))
}

pub fn fail(a: FailArgs) -> Result<()> {
    let v = request(
        a.control.control.as_deref(),
        json!({"cmd": "fail", "member": absolute(&a.member), "force": a.force}),
    )?;
    if a.json {
        println!("{}", json!({"member": v["member"], "state": "faulty"}));
    } else {
        println!(
            "raidkit: {} marked faulty",
            v["member"].as_str().unwrap_or("?")
        );
    }
    Ok(())
}

pub fn remove(a: MemberArgs) -> Result<()> {
    let v = request(
        a.control.control.as_deref(),
        json!({"cmd": "remove", "member": absolute(&a.member)}),
    )?;
    if a.json {
        println!("{}", json!({"member": v["member"], "removed": true}));
    } else {
        println!("raidkit: {} removed", v["member"].as_str().unwrap_or("?"));
    }
    Ok(())
}

pub fn add(a: AddArgs) -> Result<()> {
    let v = request(
        a.control.control.as_deref(),
        json!({"cmd": "add", "member": absolute_new(&a.member), "force": a.force}),
    )?;
    if a.json {
        // "as": rebuild, resync or spare; "role": null for a spare.
        println!(
            "{}",
            json!({"member": a.member, "as": v["as"], "role": v["role"]})
        );
        return Ok(());
    }
    match v["as"].as_str() {
        Some("spare") => println!("raidkit: {} added as a spare", a.member),
        Some(how) => println!(
            "raidkit: {} added in role {}; {} started (raidkit wait to follow it)",
            a.member, v["role"], how
        ),
        None => println!("raidkit: {} added", a.member),
    }
    Ok(())
}

pub fn grow(a: GrowArgs) -> Result<()> {
    if a.chunk.is_some() && (!a.add.is_empty() || a.level.is_some() || a.size.is_some()) {
        bail!("grow --chunk is a change of its own: change the chunk, then add members, change the level or the size");
    }
    if let Some(s) = &a.size {
        if s != "max" {
            bail!("grow --size takes `max` (use all the room the members have), not '{s}'");
        }
        if !a.add.is_empty() || a.level.is_some() {
            bail!("grow --size max is a change of its own: grow the size, then add members or change the level");
        }
    }
    if a.add.is_empty() && a.level.is_none() && a.size.is_none() && a.chunk.is_none() {
        bail!("grow: give the members to add (--add MEMBER...), a level (--level 5), a chunk (--chunk 64K) or --size max");
    }
    let members: Vec<String> = a.add.iter().map(|m| absolute_new(m)).collect();
    let v = request(
        a.control.control.as_deref(),
        json!({"cmd": "grow", "add": members, "level": a.level, "size": a.size,
               "chunk": a.chunk, "force": a.force}),
    )?;
    if a.json {
        println!(
            "{}",
            json!({"members": v["members"], "size": v["size"], "new_size": v["new_size"],
                   "level": v["level"], "chunk": v["chunk"], "old_chunk": v["old_chunk"]})
        );
        return Ok(());
    }
    if a.chunk.is_some() {
        println!(
            "raidkit: changing the chunk from {} to {}; the data moves while the array serves (raidkit wait to follow it)",
            human(v["old_chunk"].as_u64().unwrap_or(0)),
            human(v["chunk"].as_u64().unwrap_or(0))
        );
    }
    let q_built = v["level"] == "raid6" && a.level.is_some();
    if a.level.is_some() {
        println!(
            "raidkit: now {} ({}); no data moved{}",
            v["level"].as_str().unwrap_or("?"),
            v["layout"].as_str().unwrap_or("?"),
            if q_built {
                "; Q is being built on the new member (raidkit wait to follow it)"
            } else {
                ""
            }
        );
    }
    if a.size.is_some() {
        let resync = if v["level"] == "raid0" {
            ""
        } else {
            "; the new space's redundancy is made consistent while the array serves (raidkit wait to follow it)"
        };
        println!(
            "raidkit: grown into the members' new room, {} to {}{resync}",
            human(v["size"].as_u64().unwrap_or(0)),
            human(v["new_size"].as_u64().unwrap_or(0))
        );
    }
    if !a.add.is_empty() && !q_built {
        println!(
            "raidkit: growing to {} members, {} to {}; the data moves while the array serves (raidkit wait to follow it)",
            v["members"],
            human(v["size"].as_u64().unwrap_or(0)),
            human(v["new_size"].as_u64().unwrap_or(0))
        );
    }
    Ok(())
}

pub fn replace(a: ReplaceArgs) -> Result<()> {
    let v = request(
        a.control.control.as_deref(),
        json!({"cmd": "replace", "member": absolute(&a.member),
               "with": absolute_new(&a.with), "force": a.force}),
    )?;
    if a.json {
        println!(
            "{}",
            json!({"member": a.member, "with": a.with, "role": v["role"]})
        );
    } else {
        println!(
            "raidkit: rebuilding role {} onto {} while {} serves (raidkit wait to follow it)",
            v["role"], a.with, a.member
        );
    }
    Ok(())
}

pub fn scrub(a: ScrubArgs) -> Result<()> {
    let path = find_control(a.control.control.as_deref())?;
    let st = request(Some(&path), json!({"cmd": "status"}))?;
    let before = st["last_scrub"]["run"].as_u64().unwrap_or(0);
    // `--wait` with a scrub already running (started by hand, by a timer,
    // or resumed at the start) follows that one.
    let follow = a.wait && !a.stop && st["scrub"].is_object();
    if follow {
        eprintln!("raidkit: a scrub is already running; following it");
    }
    let v = if follow {
        Value::Null
    } else {
        request(
            Some(&path),
            json!({"cmd": "scrub", "check_only": a.check_only, "stop": a.stop}),
        )?
    };
    if a.stop {
        if a.json {
            println!("{}", json!({"stopped": v["stopped"]}));
        } else if v["stopped"].as_bool() == Some(true) {
            println!("raidkit: scrub stopped");
        } else {
            println!("raidkit: no scrub was running");
        }
        return Ok(());
    }
    if !a.wait {
        if a.json {
            println!("{}", json!({"started": true, "check_only": a.check_only}));
        } else {
            println!("raidkit: scrub started (raidkit status shows its progress; raidkit scrub --wait follows it)");
        }
        return Ok(());
    }
    let bar = std::io::stderr().is_terminal().then(|| {
        let b = indicatif::ProgressBar::new(1);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "scrub [{bar:40}] {percent:>3}% {bytes}/{total_bytes}",
            )
            .expect("progress template")
            .progress_chars("=> "),
        );
        b
    });
    let last = loop {
        std::thread::sleep(Duration::from_millis(200));
        // The server gone while the scrub ran: nothing was found to be
        // wrong, and nothing was verified either.
        let st = request(Some(&path), json!({"cmd": "status"})).map_err(|e| {
            crate::say::Unfinished(e.context("lost the server while waiting for the scrub"))
        })?;
        if let (Some(b), Some(s)) = (&bar, st["scrub"].as_object()) {
            let total = s["bytes_total"].as_u64().unwrap_or(0);
            b.set_length(total.max(1));
            b.set_position(s["bytes_done"].as_u64().unwrap_or(0));
        }
        if st["scrub"].is_null() && st["last_scrub"]["run"].as_u64().unwrap_or(0) > before {
            break st["last_scrub"].clone();
        }
    };
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let unrepaired = last["unrepaired"].as_u64().unwrap_or(0);
    // `mismatches` lists the first 1000; `found` counts them all.
    let found = last["found"]
        .as_u64()
        .unwrap_or_else(|| last["mismatches"].as_array().map_or(0, |m| m.len() as u64));
    if a.json {
        println!("{last}");
    } else {
        for m in last["mismatches"].as_array().into_iter().flatten() {
            println!(
                "{} (role {}): {} at member offset {}, array bytes {}+{}: {}",
                m["member"].as_str().unwrap_or("?"),
                m["role"],
                m["kind"].as_str().unwrap_or("?"),
                m["member_offset"],
                m["array_offset"],
                m["length"],
                m["action"].as_str().unwrap_or("?")
            );
        }
        if last["check_only"] == true {
            println!(
                "raidkit: scrub (check only) {}: {} of each member in {:.1}s, {found} mismatch(es) found, nothing repaired",
                last["result"].as_str().unwrap_or("?"),
                human(last["bytes"].as_u64().unwrap_or(0)),
                last["seconds"].as_f64().unwrap_or(0.0),
            );
        } else {
            println!(
                "raidkit: scrub {}: {} of each member in {:.1}s, {} repaired, {} unrepaired",
                last["result"].as_str().unwrap_or("?"),
                human(last["bytes"].as_u64().unwrap_or(0)),
                last["seconds"].as_f64().unwrap_or(0.0),
                last["repaired"],
                unrepaired
            );
        }
    }
    if unrepaired > 0 || (last["check_only"] == true && found > 0) {
        std::process::exit(1);
    }
    let result = last["result"].as_str().unwrap_or("?");
    if result != "done" {
        return Err(crate::say::Unfinished(anyhow!(
            "the scrub did not finish ({result}): the array was not wholly verified"
        ))
        .into());
    }
    Ok(())
}

pub fn speed(a: SpeedArgs) -> Result<()> {
    let v = request(
        a.control.control.as_deref(),
        json!({"cmd": "speed", "rebuild_min": a.rebuild_min, "rebuild_max": a.rebuild_max}),
    )?;
    let show = |k: &str| match v[k].as_u64() {
        Some(0) | None => "unlimited".to_string(),
        Some(n) => format!("{}/s", human(n)),
    };
    if a.json {
        println!(
            "{}",
            // `rebuild_speed` as `status --json` has it; the flat names
            // stay for scripts that read them.
            json!({"rebuild_min": v["rebuild_min"], "rebuild_max": v["rebuild_max"],
                   "rebuild_speed": {"min": v["rebuild_min"], "max": v["rebuild_max"]}})
        );
    } else {
        println!(
            "rebuild speed: {} while clients are busy, {} when idle",
            show("rebuild_min"),
            show("rebuild_max")
        );
    }
    Ok(())
}

/// Poll the server until no recovery runs or is pending.
pub fn wait(a: WaitArgs) -> Result<()> {
    let path = find_control(a.control.control.as_deref())?;
    let started = Instant::now();
    let bar = std::io::stderr().is_terminal().then(|| {
        let b = indicatif::ProgressBar::new(1);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg} [{bar:40}] {percent:>3}% {bytes}/{total_bytes} {prefix}",
            )
            .expect("progress template")
            .progress_chars("=> "),
        );
        b
    });
    loop {
        let v = call(&path, &json!({"cmd": "status"}), Duration::from_secs(10))
            .map_err(|e| anyhow!(e))?;
        let running = v["recovery"].as_object();
        if let (Some(b), Some(r)) = (&bar, running) {
            // Across the whole process: a resumed one starts where the
            // earlier runs left it.
            let before = r["bytes_before"].as_u64().unwrap_or(0);
            b.set_length(before + r["bytes_total"].as_u64().unwrap_or(0));
            b.set_position(before + r["bytes_done"].as_u64().unwrap_or(0));
            b.set_message(process_name(r));
            // The server's rate over the last seconds, not the bar's own
            // estimate, which lags a speed change.
            b.set_prefix(format!(
                "{}/s, {} left",
                human(r["rate"].as_f64().unwrap_or(0.0) as u64),
                time_left(&r["seconds_left"])
            ));
        }
        if running.is_none() && !v["recovery_pending"].as_bool().unwrap_or(false) {
            if let Some(b) = &bar {
                b.finish_and_clear();
            }
            let state = v["state"].as_str().unwrap_or("?");
            if a.json {
                println!(
                    "{}",
                    json!({"state": state, "last_recovery": v["last_recovery"],
                           "waited_seconds": started.elapsed().as_secs_f64()})
                );
            } else if let Some(r) = v["last_recovery"].as_object() {
                println!(
                    "raidkit: last recovery: {}: {} in {:.1}s ({}); array {state}",
                    process_name(r),
                    human(r["bytes"].as_u64().unwrap_or(0)),
                    r["seconds"].as_f64().unwrap_or(0.0),
                    r["result"].as_str().unwrap_or("?")
                );
            } else {
                println!("raidkit: no recovery running; array {state}");
            }
            if state == "failed" {
                bail!("the array has failed");
            }
            return Ok(());
        }
        if v["state"] == "failed" {
            bail!("the array has failed; recovery cannot finish");
        }
        if a.timeout
            .is_some_and(|t| started.elapsed().as_secs_f64() > t)
        {
            bail!(
                "recovery still running after {:.0}s",
                started.elapsed().as_secs_f64()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The control sockets of every server running on this machine (those in
/// the temp directory that answer).
fn live_servers() -> Result<Vec<PathBuf>> {
    let dir = std::env::temp_dir();
    let mut live = Vec::new();
    for e in std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
        let p = e?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("raidkit-")
            && name.ends_with(".ctl")
            && std::os::unix::net::UnixStream::connect(&p).is_ok()
        {
            // A link to a socket put elsewhere (`serve --control PATH`)
            // stands for it.
            live.push(std::fs::canonicalize(&p).unwrap_or(p));
        }
    }
    live.sort();
    live.dedup();
    Ok(live)
}

/// The running server of the array with this UUID, if any: its PID and
/// endpoints.
pub fn server_of(uuid: &str) -> Option<(u64, Vec<String>)> {
    live_servers().ok()?.iter().find_map(|p| {
        let v = status_of(p).ok()?;
        (v["array"]["uuid"] == uuid).then(|| {
            let eps = v["endpoints"].as_array().into_iter().flatten();
            (
                v["pid"].as_u64().unwrap_or(0),
                eps.filter_map(|e| e.as_str().map(str::to_string)).collect(),
            )
        })
    })
}

fn status_of(path: &Path) -> Result<Value> {
    call(path, &json!({"cmd": "status"}), Duration::from_secs(10))
        .map_err(|e| anyhow!("{}: {e}", path.display()))
}

/// The control socket to use: the one given (a socket path, or the name or
/// UUID of a running array), or the only live one in the temp directory.
pub fn find_control(given: Option<&Path>) -> Result<PathBuf> {
    find_control_of(given, false)
}

/// As `find_control`; with `whole_server`, for a command on a whole server
/// (`stop`), several sockets that one server holds (its arrays of a config
/// file) are not several choices: any of them will do.
fn find_control_of(given: Option<&Path>, whole_server: bool) -> Result<PathBuf> {
    let one_server = |paths: &[PathBuf]| -> Option<PathBuf> {
        if !whole_server {
            return None;
        }
        let pids: Vec<u64> = paths
            .iter()
            .map(|p| status_of(p).ok().and_then(|v| v["pid"].as_u64()))
            .collect::<Option<_>>()?;
        pids.windows(2)
            .all(|w| w[0] == w[1])
            .then(|| paths.first().cloned())
            .flatten()
    };
    if let Some(p) = given {
        let text = p.to_string_lossy();
        // A file of that name that is no socket (a member named like its
        // array, in the current directory) does not hide the array's name.
        let socket = |p: &Path| {
            use std::os::unix::fs::FileTypeExt;
            std::fs::metadata(p).is_ok_and(|m| m.file_type().is_socket())
        };
        if socket(p) {
            return Ok(p.to_path_buf());
        }
        // A name or a UUID: ask every running server.
        let mut found = Vec::new();
        let mut names = Vec::new();
        for s in live_servers()? {
            let Ok(v) = status_of(&s) else { continue };
            let name = v["array"]["name"].as_str().unwrap_or("").to_string();
            let uuid = v["array"]["uuid"].as_str().unwrap_or("").to_string();
            if name == text || uuid == text {
                found.push(s);
            } else {
                names.push(format!("'{name}'"));
            }
        }
        if let Some(one) = one_server(&found) {
            return Ok(one);
        }
        return match found.len() {
            1 => Ok(found.remove(0)),
            0 if p.exists() => bail!(
                "{text} is not a control socket, and no running raidkit server has an array of that name or UUID"
            ),
            0 => bail!(
                "no running raidkit server has an array named '{text}' or with that UUID, and there is no such control socket{}",
                if names.is_empty() {
                    " (no server is running)".to_string()
                } else {
                    format!(" (running: {})", names.join(", "))
                }
            ),
            _ => bail!(
                "several running servers have an array named '{text}' ({}); give --control PATH or the UUID",
                found
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
    }
    let mut live = live_servers()?;
    if let Some(one) = one_server(&live) {
        return Ok(one);
    }
    let dir = std::env::temp_dir();
    match live.len() {
        1 => Ok(live.remove(0)),
        0 => bail!(
            "no running raidkit server found in {}; give --control PATH",
            dir.display()
        ),
        _ => bail!(
            "several raidkit servers are running ({}); give --control PATH, or the array's name or UUID (raidkit list shows them)",
            live.iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Stop a running server cleanly: the control socket asks it to, and this
/// waits until it has gone (its array marked clean).
pub fn stop(a: StopArgs) -> Result<()> {
    let given = a
        .array
        .as_deref()
        .map(Path::new)
        .or(a.control.control.as_deref());
    let path = find_control_of(given, true)?;
    let before = status_of(&path)?;
    let name = before["array"]["name"].as_str().unwrap_or("?").to_string();
    let v = call(
        &path,
        &json!({"cmd": "stop", "force": a.force}),
        Duration::from_secs(10),
    )
    .map_err(|e| anyhow!("array '{name}': {e}"))?;
    let pid = v["pid"].as_u64().unwrap_or(0);
    // The server says how closing the array ended (members flushed, the
    // array marked clean, no write answered early lost), then removes its
    // socket last. A server that cannot say (its socket gone first) is
    // taken at its socket's going, as before `closed` existed.
    let started = Instant::now();
    let mut closed: Option<Value> = None;
    while std::os::unix::net::UnixStream::connect(&path).is_ok() {
        if started.elapsed() > Duration::from_secs(a.timeout) {
            bail!(
                "array '{name}' (PID {pid}) has not stopped after {}s",
                a.timeout
            );
        }
        if closed.is_none() {
            let ask = json!({"cmd": "closed", "wait_ms": 1000});
            match call(&path, &ask, Duration::from_secs(5)) {
                Ok(r) if r["closed"] == true => {
                    closed = Some(r);
                    // Say so: the server keeps its socket until then.
                    let ack = json!({"cmd": "closed", "ack": true});
                    let _ = call(&path, &ack, Duration::from_secs(5));
                }
                Ok(_) => continue,
                Err(ControlError::Refused(_)) => closed = Some(Value::Null),
                Err(_) => {}
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // The socket goes before the process ends, which lets go of the
    // members (their locks, a block device's exclusive open) as it exits:
    // a `check` or `serve` run right after this returned found them in
    // use. So this returns once the process has gone too.
    while pid > 0 && process_alive(pid) {
        if started.elapsed() > Duration::from_secs(a.timeout) {
            bail!(
                "array '{name}' (PID {pid}) closed its control socket but has not exited after {}s",
                a.timeout
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Gone without saying (killed while closing, say): not taken as a
    // clean stop.
    let error = match &closed {
        None => Some(
            "it went away without saying whether it closed the array cleanly (see its log)"
                .to_string(),
        ),
        Some(c) => c["error"].as_str().map(str::to_string),
    };
    if a.json {
        println!(
            "{}",
            json!({"stopped": true, "name": name, "pid": pid, "disconnected": v["disconnected"],
                   "arrays": v["arrays"],
                   "clean": closed.as_ref().map(|c| c["clean"] == true), "error": error})
        );
    } else if error.is_none() {
        // A server of a config file stops every array it serves.
        let others: Vec<String> = v["arrays"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str())
            .filter(|a| *a != name)
            .map(|a| format!("'{a}'"))
            .collect();
        if others.is_empty() {
            println!("raidkit: stopped array '{name}' (PID {pid})");
        } else {
            println!(
                "raidkit: stopped array '{name}' and with it {} (PID {pid}: one server)",
                others.join(", ")
            );
        }
        if closed.as_ref().is_some_and(|c| c["clean"] == false) {
            println!(
                "raidkit: array '{name}' is left dirty (a resync not finished, or requests given up on: see its log): the next start resyncs what it must"
            );
        }
    }
    if let Some(e) = error {
        bail!("array '{name}' (PID {pid}) stopped, but {e}");
    }
    Ok(())
}

/// Whether process `pid` still runs: a zombie (exited, not yet reaped by
/// its parent) holds nothing and counts as gone, as does a PID this
/// machine's /proc does not show (a server in another PID namespace).
fn process_alive(pid: u64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses
        // and may hold spaces.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Whether `e` is an open refused because this very process holds the
/// member: a rebuild stopped by `fail` or `remove` lets go of its target
/// when its batch ends, a moment later; a hung device, never.
pub fn held_by_this_server(e: &(dyn std::error::Error + 'static)) -> bool {
    member_error(e)
        .and_then(|m| raidkit_member::InUse::of_error(&m.source))
        .and_then(|busy| busy.pid)
        .is_some_and(|pid| pid == std::process::id())
}

/// The member error `e` is, or has among its causes.
fn member_error<'e>(
    e: &'e (dyn std::error::Error + 'static),
) -> Option<&'e raidkit_member::MemberError> {
    let mut cause = Some(e);
    while let Some(c) = cause {
        let member =
            c.downcast_ref::<raidkit_member::MemberError>()
                .or_else(|| match c.downcast_ref::<raidkit_array::Error>() {
                    Some(raidkit_array::Error::Member(m)) => Some(m),
                    _ => None,
                });
        if member.is_some() {
            return member;
        }
        cause = c.source();
    }
    None
}

/// `f`, again while it fails on a member this server itself still holds
/// (`held_by_this_server`), for up to 10 s: `add` right after `fail` and
/// `remove` of a member being rebuilt would otherwise be refused for a
/// moment with no cause the user could see.
pub fn unless_held<T, E: std::error::Error + 'static>(
    mut f: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    let t0 = std::time::Instant::now();
    loop {
        match f() {
            Err(e) if held_by_this_server(&e) && t0.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(100));
            }
            r => return r,
        }
    }
}

/// For an open refused because another process holds the member: if that
/// process is a raidkit server, the message names it and its array ("d0.img
/// is in use by the raidkit server of array 'lab' (PID 1234)"), so that the
/// user knows which server to stop.
pub fn in_use_message(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let m = member_error(e)?;
    let busy = raidkit_member::InUse::of_error(&m.source)?;
    let pid = busy.pid?;
    if pid == std::process::id() {
        // This server still holds it: an operation on it that has not
        // returned (a superblock write given up on a hung disk keeps its
        // file open until the kernel answers).
        return Some(format!(
            "{} is still held by this server: an operation on it has not returned (a hung device); it can be added again once the device answers, or after a restart",
            m.member
        ));
    }
    let array = server_array(pid)?;
    Some(format!(
        "{} is in use by the raidkit server of array '{array}' (PID {pid})",
        m.member
    ))
}

/// The array served by the raidkit server with process ID `pid`: its
/// control socket found among its open sockets (/proc/PID/fd and
/// /proc/net/unix), then asked. Never this process itself, whose control
/// socket may be the one busy asking.
pub fn server_array(pid: u32) -> Option<String> {
    if pid == std::process::id() {
        return None;
    }
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()?
        .flatten()
        .filter_map(|fd| {
            let l = std::fs::read_link(fd.path()).ok()?;
            let l = l.to_str()?;
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let unix = std::fs::read_to_string("/proc/net/unix").ok()?;
    // "Num RefCount Protocol Flags Type St Inode Path": the server's bound
    // sockets, its control socket (usually raidkit-*.ctl) tried first; an
    // NBD socket does not answer a status request and is passed over.
    let mut sockets: Vec<PathBuf> = unix
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let path = f.get(7)?;
            inodes
                .iter()
                .any(|i| Some(&i.as_str()) == f.get(6))
                .then(|| PathBuf::from(path))
        })
        .collect();
    sockets.sort_by_key(|p| !p.to_string_lossy().ends_with(".ctl"));
    sockets.iter().find_map(|s| {
        let v = call(s, &json!({"cmd": "status"}), Duration::from_secs(2)).ok()?;
        v["array"]["name"].as_str().map(String::from)
    })
}
