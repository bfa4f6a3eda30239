//! `status` and `list`: what running servers say of their arrays, as
//! text for a person or JSON for a script.

use super::{find_control, live_servers, process_name, status_of, time_left};
use crate::cli::{ListArgs, StatusArgs};
use crate::units::human;
use anyhow::{anyhow, Result};
use raidkit_control::call;
use serde_json::{json, Value};
use std::time::Duration;

/// One line (or JSON object) per running server, by array name:
/// /proc/mdstat for raidkit.
pub fn list(a: ListArgs) -> Result<()> {
    let mut rows = Vec::new();
    for s in live_servers()? {
        let Ok(v) = status_of(&s) else { continue };
        let members = v["members"].as_array().cloned().unwrap_or_default();
        // Every role is listed (a missing member too); a replacement
        // shares its role's number.
        let roles = |pred: &dyn Fn(&Value) -> bool| {
            let mut r: Vec<u64> = members
                .iter()
                .filter(|m| pred(m))
                .filter_map(|m| m["role"].as_u64())
                .collect();
            r.sort_unstable();
            r.dedup();
            r.len()
        };
        let total = roles(&|_| true);
        let up = roles(&|m| m["state"] == "active");
        let recovery = v["recovery"].as_object().map(|r| {
            json!({
                "kind": r["kind"],
                "role": r["role"],
                "progress": r["progress"],
                "rate": r["rate"],
                "seconds_left": r["seconds_left"],
            })
        });
        rows.push(json!({
            "name": v["array"]["name"],
            "uuid": v["array"]["uuid"],
            "level": v["array"]["level"],
            "state": v["state"],
            "size": v["array"]["size"],
            "members_up": up,
            "members_total": total,
            "endpoints": v["endpoints"],
            "pid": v["pid"],
            "control": s.display().to_string(),
            "clients": v["connections"]["active"],
            "recovery": recovery,
        }));
    }
    rows.sort_by(|x, y| {
        let k = |r: &Value| {
            (
                r["name"].as_str().unwrap_or("").to_string(),
                r["pid"].as_u64(),
            )
        };
        k(x).cmp(&k(y))
    });
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    if rows.is_empty() {
        println!("no raidkit server is running");
        return Ok(());
    }
    println!(
        "{:<16} {:<6} {:<10} {:>7} {:>9} {:>7}  {:<40} RECOVERY",
        "ARRAY", "LEVEL", "STATE", "MEMBERS", "SIZE", "PID", "ENDPOINT"
    );
    for r in &rows {
        let recovery = match r["recovery"].as_object() {
            None => "-".to_string(),
            Some(x) => format!(
                "{} {:.1}% at {}/s, {} left",
                x["kind"].as_str().unwrap_or("?"),
                x["progress"].as_f64().unwrap_or(0.0) * 100.0,
                human(x["rate"].as_f64().unwrap_or(0.0) as u64),
                time_left(&x["seconds_left"])
            ),
        };
        println!(
            "{:<16} {:<6} {:<10} {:>7} {:>9} {:>7}  {:<40} {recovery}",
            r["name"].as_str().unwrap_or("?"),
            r["level"].as_str().unwrap_or("?"),
            r["state"].as_str().unwrap_or("?"),
            format!("{}/{}", r["members_up"], r["members_total"]),
            human(r["size"].as_u64().unwrap_or(0)),
            r["pid"],
            r["endpoints"][0].as_str().unwrap_or("-"),
        );
    }
    Ok(())
}

pub fn status(a: StatusArgs) -> Result<()> {
    let path = find_control(a.control.as_deref())?;
    let v =
        call(&path, &json!({"cmd": "status"}), Duration::from_secs(10)).map_err(|e| anyhow!(e))?;
    print_status(&v, a.json)
}

/// Print a status response, as JSON or for people.
fn print_status(v: &Value, as_json: bool) -> Result<()> {
    let a_json = as_json;
    if a_json {
        let mut v = v.clone();
        if let Some(o) = v.as_object_mut() {
            o.remove("ok");
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let arr = &v["array"];
    println!(
        "array '{}' ({}, {}, {} usable, consistency policy {}): {}",
        arr["name"].as_str().unwrap_or("?"),
        arr["level"].as_str().unwrap_or("?"),
        arr["layout"].as_str().unwrap_or("-"),
        human(arr["size"].as_u64().unwrap_or(0)),
        arr["consistency_policy"].as_str().unwrap_or("?"),
        v["state"].as_str().unwrap_or("?")
    );
    for m in v["members"].as_array().into_iter().flatten() {
        // A member without a role (a spare, or a failed one a spare has
        // replaced) shows '-': its state says which.
        let role = m["role"]
            .as_u64()
            .map(|r| r.to_string())
            .unwrap_or_else(|| "-".into());
        // Error counters where there are any, and a slow member said so.
        let e = &m["errors"];
        let errors: Vec<String> = ["read", "write", "checksum", "timeout"]
            .iter()
            .filter_map(|k| {
                let n = e[*k].as_u64().unwrap_or(0);
                (n > 0).then(|| format!("{k} {n}"))
            })
            .collect();
        let slow = &m["slow"];
        // Members elsewhere say where: their failure domain.
        let domain = match m["domain"].as_str() {
            Some(d) if d != raidkit_array::domains::LOCAL => format!(" [{d}]"),
            _ => String::new(),
        };
        println!(
            "  {role:>4}  {:<12} {}{domain}{}{}{}",
            m["state"].as_str().unwrap_or("?"),
            m["path"].as_str().unwrap_or("-"),
            m["reason"]
                .as_str()
                .map(|r| format!("  ({r})"))
                .unwrap_or_default(),
            if errors.is_empty() {
                String::new()
            } else {
                format!("  errors: {}", errors.join(", "))
            },
            if slow.is_object() {
                format!(
                    "  SLOW: {:.1} ms per operation, peers {:.1} ms",
                    slow["latency_us"].as_f64().unwrap_or(0.0) / 1000.0,
                    slow["peers_us"].as_f64().unwrap_or(0.0) / 1000.0
                )
            } else {
                String::new()
            }
        );
    }
    let io = &v["io"];
    println!(
        "io: {} reads ({}), {} writes ({}), {} flushes, {} errors; connections: {} active, {} total",
        io["reads"],
        human(io["bytes_read"].as_u64().unwrap_or(0)),
        io["writes"],
        human(io["bytes_written"].as_u64().unwrap_or(0)),
        io["flushes"],
        io["errors"],
        v["connections"]["active"],
        v["connections"]["total"]
    );
    if let Some(w) = v["write_behind"].as_object() {
        println!(
            "write-behind: {} writes ({}) answered before they were on the members, {} not yet{}",
            w["writes"],
            human(w["bytes"].as_u64().unwrap_or(0)),
            w["pending"],
            if w["failed"].as_bool() == Some(true) {
                "; ONE OF THEM FAILED: data a client was told was written is lost, every flush fails"
            } else {
                ""
            }
        );
    }
    if let Some(g) = v["reshape"].as_object() {
        match (g["old_chunk"].as_u64(), g["chunk"].as_u64()) {
            (Some(a), Some(b)) if a != b => println!(
                "reshape: changing the chunk from {} to {}, {} all along",
                human(a),
                human(b),
                human(g["size"].as_u64().unwrap_or(0))
            ),
            _ => println!(
                "reshape: growing to {} members, {} now, {} when it ends",
                g["members"],
                human(g["size"].as_u64().unwrap_or(0)),
                human(g["new_size"].as_u64().unwrap_or(0))
            ),
        }
    }
    if let Some(r) = v["recovery"].as_object() {
        println!(
            "recovery: {}: {:.1}% ({} of {} in this run, {:.1}s, {}/s, {} left)",
            process_name(r),
            r["progress"].as_f64().unwrap_or(0.0) * 100.0,
            human(r["bytes_done"].as_u64().unwrap_or(0)),
            human(r["bytes_total"].as_u64().unwrap_or(0)),
            r["seconds"].as_f64().unwrap_or(0.0),
            human(r["rate"].as_f64().unwrap_or(0.0) as u64),
            time_left(&r["seconds_left"])
        );
    }
    if let Some(r) = v["last_recovery"].as_object() {
        println!(
            "last recovery: {}: {} in {:.1}s ({})",
            process_name(r),
            human(r["bytes"].as_u64().unwrap_or(0)),
            r["seconds"].as_f64().unwrap_or(0.0),
            r["result"].as_str().unwrap_or("?")
        );
    }
    // As `zpool status` says "scan: scrub repaired 0B in ... on <date>".
    if let Some(l) = v["last_scrub"].as_object() {
        let ended = std::time::UNIX_EPOCH + Duration::from_secs(l["ended"].as_u64().unwrap_or(0));
        println!(
            "last scrub{}: {}, ended {}, {} of each member in {:.1}s, {} mismatch(es), {} repaired, {} unrepaired",
            if l["check_only"] == true { " (check only)" } else { "" },
            l["result"].as_str().unwrap_or("?"),
            humantime::format_rfc3339_seconds(ended),
            human(l["bytes"].as_u64().unwrap_or(0)),
            l["seconds"].as_f64().unwrap_or(0.0),
            l["found"],
            l["repaired"],
            l["unrepaired"]
        );
    }
    Ok(())
}
