//! The control socket of a served array: the commands `raidkit` sends
//! it (status, fail, add, scrub, stop...) and the fields of its status.

use super::*;

/// What the control socket reports about the server itself, and the flag
/// that stops it.
#[derive(Clone)]
pub(super) struct Served {
    pub(super) endpoints: Vec<String>,
    pub(super) control: String,
    pub(super) started: Instant,
    pub(super) stop: Arc<AtomicBool>,
    /// The counters of every array of this process: `stop` stops them all
    /// and refuses while any has clients.
    pub(super) all: Vec<Arc<Stats>>,
    /// The write-behind in front of this array, if any.
    pub(super) behind: Option<Arc<raidkit_member::WriteBehind>>,
    /// How closing each array of this process ended, once it has: a stop
    /// through any one control socket stops them all.
    pub(super) closings: Arc<Vec<Arc<Closing>>>,
}

/// How closing an array at the stop ended (its members flushed and the
/// array marked clean, or why not), kept for `raidkit stop`: the control
/// socket outlives the close, and the command asks (`closed`) rather than
/// take the socket's going as success.
pub(super) struct Closing {
    name: String,
    /// Ok(whether the array was marked clean: a resync not finished
    /// leaves it dirty on purpose), or why closing failed.
    outcome: std::sync::Mutex<Option<Result<bool, String>>>,
    done: std::sync::Condvar,
    /// Someone follows the close (`raidkit stop` asked `closed`).
    followed: AtomicBool,
    /// The follower has the outcome: it said so (`closed` with `ack`).
    taken: AtomicBool,
}

impl Closing {
    pub(super) fn new(name: String) -> Closing {
        Closing {
            name,
            outcome: Default::default(),
            done: Default::default(),
            followed: AtomicBool::new(false),
            taken: AtomicBool::new(false),
        }
    }

    pub(super) fn set(&self, r: Result<bool, String>) {
        *self.outcome.locked() = Some(r);
        self.done.notify_all();
    }

    /// The outcome, waiting until `until` for it.
    fn wait(&self, until: Instant) -> Option<Result<bool, String>> {
        self.followed.store(true, Ordering::Release);
        let g = self.outcome.locked();
        let left = until.saturating_duration_since(Instant::now());
        let (g, _) = self
            .done
            .wait_timeout_while(g, left, |o| o.is_none())
            .unwrap_or_else(|e| e.into_inner());
        g.clone()
    }

    /// When someone follows the close, keep the socket until it says it
    /// has the outcome (at most 10 s): between two of its requests, or
    /// with an answer not yet written when the process exits (a loaded
    /// machine), the follower would find the socket gone and never learn
    /// how it ended.
    pub(super) fn let_followers_answer(&self) {
        let t = Instant::now();
        while self.followed.load(Ordering::Acquire)
            && !self.taken.load(Ordering::Acquire)
            && t.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

pub(super) fn control_handler(
    array: Arc<Array>,
    stats: Arc<Stats>,
    served: Served,
) -> Arc<Handler> {
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
            // How closing the array ended, waiting up to `wait_ms` (at
            // most 30 s) for it: `raidkit stop` reports it.
            // Every array of this process (a stop stops them all).
            "closed" if flag("ack") => {
                // The follower has the outcome: the socket may go.
                for c in served.closings.iter() {
                    c.taken.store(true, Ordering::Release);
                }
                Ok(one("closed", json!(true)))
            }
            "closed" => {
                let wait = args.get("wait_ms").and_then(Value::as_u64).unwrap_or(0);
                let until = Instant::now() + Duration::from_millis(wait.min(30_000));
                let got: Vec<_> = served.closings.iter().map(|c| (c, c.wait(until))).collect();
                let all = got.iter().all(|(_, r)| r.is_some());
                let errors: Vec<String> = got
                    .iter()
                    .filter_map(|(c, r)| match r {
                        Some(Err(e)) => Some(format!("array '{}': {e}", c.name)),
                        _ => None,
                    })
                    .collect();
                let clean = got.iter().all(|(_, r)| matches!(r, Some(Ok(true))));
                let mut m = one("closed", json!(all));
                m.insert("clean".into(), json!(all && clean));
                m.insert(
                    "error".into(),
                    json!((all && !errors.is_empty()).then(|| errors.join("; "))),
                );
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
                let peers: Vec<String> = served
                    .all
                    .iter()
                    .flat_map(|s| s.peers.locked().clone())
                    .collect();
                if !peers.is_empty() && !flag("force") {
                    // A stop stops every array of the process: name the
                    // one each client is on when there are several (the
                    // command is refused in the name of the one asked).
                    let many = served.all.len() > 1;
                    let on: Vec<String> = served
                        .all
                        .iter()
                        .zip(served.closings.iter())
                        .flat_map(|(s, c)| {
                            s.peers
                                .locked()
                                .iter()
                                .map(|p| match many {
                                    true => format!("{p} on array '{}'", c.name),
                                    false => p.clone(),
                                })
                                .collect::<Vec<_>>()
                        })
                        .collect();
                    return Err(format!(
                        "{} client(s) connected ({}): disconnect them first, or stop with --force to disconnect them{}",
                        peers.len(),
                        on.join(", "),
                        if many { " (a stop stops every array this server serves)" } else { "" }
                    ));
                }
                served.stop.store(true, Ordering::Release);
                let mut m = one("stopping", json!(true));
                m.insert("pid".into(), json!(std::process::id()));
                m.insert("disconnected".into(), json!(peers));
                // Every array this server serves stops with it.
                let arrays: Vec<&str> = served.closings.iter().map(|c| c.name.as_str()).collect();
                m.insert("arrays".into(), json!(arrays));
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
            "add" => {
                let spec = text("member")?;
                crate::admin::unless_held(|| raidkit_open::add_member(&array, &spec, flag("force")))
            }
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
                let (old, new) = (text("member")?, text("with")?);
                crate::admin::unless_held(|| {
                    raidkit_open::replace_member(&array, &old, &new, flag("force"))
                })
            }
                .map(|r| one("role", json!(r)))
                .map_err(|e| crate::admin::in_use_message(&e).unwrap_or(e.to_string())),
            "grow" => {
                let members: Vec<String> = match args.get("add") {
                    Some(Value::Array(xs)) => xs
                        .iter()
                        .map(|x| x.as_str().map(str::to_string))
                        .collect::<Option<Vec<_>>>()
                        .ok_or("\"add\" must be a list of member specs")?,
                    None | Some(Value::Null) => Vec::new(),
                    _ => return Err("\"add\" must be a list of member specs".into()),
                };
                let level = match args.get("level") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(l)) => Some(
                        l.parse::<raidkit_layout::Level>()
                            .map_err(|e| format!("\"level\": {e}"))?,
                    ),
                    Some(_) => return Err("\"level\" must be a level (\"5\")".into()),
                };
                let grow_size = match args.get("size") {
                    None | Some(Value::Null) => false,
                    Some(Value::String(s)) if s == "max" => true,
                    Some(_) => return Err("\"size\" must be \"max\"".into()),
                };
                let chunk = match args.get("chunk") {
                    None | Some(Value::Null) => None,
                    Some(c) => Some(c.as_u64().ok_or("\"chunk\" must be bytes")?),
                };
                if let Some(c) = chunk {
                    if !members.is_empty() || level.is_some() || grow_size {
                        return Err("changing the chunk is a change of its own: change the chunk, then add members, change the level or the size".into());
                    }
                    let old = array.geometry();
                    let g = array.change_chunk(c).map_err(|e| e.to_string())?;
                    let mut m = one("members", json!(g.members()));
                    m.insert("size".into(), json!(old.capacity()));
                    m.insert("new_size".into(), json!(g.capacity()));
                    m.insert("level".into(), json!(g.level.to_string()));
                    m.insert("layout".into(), json!(g.layout.to_string()));
                    m.insert("chunk".into(), json!(g.chunk));
                    m.insert("old_chunk".into(), json!(old.chunk));
                    return Ok(m);
                }
                if grow_size {
                    if !members.is_empty() || level.is_some() {
                        return Err("growing the size is a change of its own: grow the size, then add members or change the level".into());
                    }
                    let (before, after) = array.grow_size().map_err(|e| e.to_string())?;
                    let g = array.geometry();
                    let mut m = one("members", json!(g.members()));
                    m.insert("size".into(), json!(before));
                    m.insert("new_size".into(), json!(after));
                    m.insert("level".into(), json!(g.level.to_string()));
                    m.insert("layout".into(), json!(g.layout.to_string()));
                    return Ok(m);
                }
                if members.is_empty() && level.is_none() {
                    return Err("grow: nothing to do (\"add\", \"level\" or \"size\")".into());
                }
                let size = array.capacity();
                // The level first (no data moves), then the members.
                let mut g = (*array.geometry()).clone();
                let mut members = members.as_slice();
                match level {
                    // RAID-5 to RAID-6 takes one new member, for Q.
                    Some(l @ raidkit_layout::Level::Raid6)
                        if g.level == raidkit_layout::Level::Raid5 =>
                    {
                        let [first, rest @ ..] = members else {
                            return Err("a RAID-5 becomes a RAID-6 with one new member for Q: give it (--add MEMBER)".into());
                        };
                        if !rest.is_empty() {
                            return Err("RAID-5 to RAID-6 takes exactly one new member (for Q); add more with another grow once it is built".into());
                        }
                        g = raidkit_open::take_over_adding(&array, l, first, flag("force"))
                            .map_err(|e| {
                                crate::admin::in_use_message(&e).unwrap_or(e.to_string())
                            })?;
                        members = &[];
                    }
                    Some(l) => g = array.take_over(l).map_err(|e| e.to_string())?,
                    None => {}
                }
                if !members.is_empty() {
                    g = raidkit_open::grow(&array, members, flag("force")).map_err(|e| {
                        crate::admin::in_use_message(&e).unwrap_or(e.to_string())
                    })?;
                }
                let mut m = one("members", json!(g.members()));
                m.insert("size".into(), json!(size));
                m.insert("new_size".into(), json!(g.capacity()));
                m.insert("level".into(), json!(g.level.to_string()));
                m.insert("layout".into(), json!(g.layout.to_string()));
                Ok(m)
            }
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
                let (lo, hi) = (rate("rebuild_min")?, rate("rebuild_max")?);
                // The pair as it would be, checked before anything changes:
                // a floor above the ceiling would rebuild faster while
                // clients are busy than when they are idle.
                // A ceiling alone below the floor brings the floor down
                // with it (`speed --rebuild-max 4M` slows a rebuild).
                let (cur_lo, cur_hi) = array.rebuild_speed();
                let lo = match (lo, hi) {
                    (None, Some(h)) if h != 0 && cur_lo > h => Some(h),
                    _ => lo,
                };
                let (new_lo, new_hi) = (lo.unwrap_or(cur_lo), hi.unwrap_or(cur_hi));
                if new_hi != 0 && new_lo > new_hi {
                    return Err(format!(
                        "--rebuild-min ({new_lo} bytes/s) would be above --rebuild-max ({new_hi} bytes/s): the speed while clients are busy is at most the idle one"
                    ));
                }
                array.set_rebuild_speed(lo, hi);
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
                "unknown command '{other}' (this server knows: status, stop, closed, fail, remove, add, replace, grow, speed, scrub)"
            )),
        }
    })
}

pub(super) fn status_fields(array: &Array, stats: &Stats, served: &Served) -> Map<String, Value> {
    let sb = array.superblock();
    let c = |x: &std::sync::atomic::AtomicU64| x.load(Ordering::Relaxed);
    // The recovery is read before the state it makes: one that ends in
    // between then shows as still running (a client waiting for its end
    // asks again), never as ended with the array still called rebuilding.
    let recovery = array.recovery_status();
    let scrub = recovery.as_ref().filter(|r| r.kind == "scrub").map(|r| {
        json!({
            "progress": r.progress,
            "bytes_done": r.bytes_done,
            "bytes_total": r.bytes_total,
            "rate": r.rate,
        })
    });
    let pending = array.needs_recovery();
    let last = array.last_recovery();
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
            "metadata": crate::commands::metadata_name(&sb),
        },
        "members": array.members_status(),
        "recovery": recovery,
        "reshape": array.reshape_target().map(|to| json!({
            "size": array.capacity(),
            "new_size": to,
            "members": array.geometry().members(),
            "old_chunk": array.reshape_chunks().map(|c| c.0),
            "chunk": array.reshape_chunks().map(|c| c.1),
        })),
        "scrub": scrub,
        "last_scrub": array.last_scrub(),
        "checksums": sb.checksums.enabled(),
        "recovery_pending": pending,
        "last_recovery": last,
        "rebuild_speed": {"min": array.rebuild_speed().0, "max": array.rebuild_speed().1},
        "corrected_read_errors": array.corrected_read_errors(),
        "write_behind": served.behind.as_ref().map(|b| {
            let c = b.counts();
            json!({"writes": c.writes, "bytes": c.bytes, "pending": c.pending, "failed": c.failed})
        }),
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
