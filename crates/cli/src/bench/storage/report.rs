//! The results of `raidkit bench TARGET`: a bonnie++-like table and a full
//! table on the terminal, JSON, CSV and SVG bar charts.

use super::{median, Series};
use crate::cli::StorageBenchArgs;
use crate::units::human;
use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::fmt::Write as _;

/// What was measured, and how.
pub(super) struct Meta<'a> {
    pub target_text: &'a str,
    pub kind: &'a str,
    pub size: u64,
    pub direct: bool,
    pub data_source: &'a str,
    pub tests: &'a [&'static str],
    pub cache_bound: bool,
    pub ram_fs: bool,
    pub seed: u64,
    pub qds: &'a [usize],
    /// How fast the client prepares the data it writes (MB/s).
    pub prepare_mbs: f64,
    /// Requirements to judge (--require).
    pub reqs: &'a [super::require::Requirement],
    /// Fields added to the JSON document (time, label, identity, array).
    pub extra: Value,
}

/// The machine the client ran on.
pub(super) fn machine() -> Value {
    json!({
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "ram": super::ram_bytes(),
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
        "cpu": std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| s.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split(':').nth(1)).map(|x| x.trim().to_string())),
        "host": std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim(),
    })
}

fn result_json(s: &Series) -> Value {
    let mut o = json!({
        "test": s.test,
        "value": median(&s.values),
        "unit": s.unit,
        "runs": s.values.len(),
        "min": s.values.iter().copied().fold(f64::INFINITY, f64::min),
        "max": s.values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    });
    if let Some(z) = s.zone {
        o["zone"] = json!(z);
    }
    if let Some(q) = s.qd {
        o["qd"] = json!(q);
    }
    if let Some(k) = s.streams {
        o["streams"] = json!(k);
    }
    if let Some(c) = s.client {
        o["client"] = json!(c);
    }
    if !s.cpu.is_empty() {
        let c = median(&s.cpu);
        o["cpu"] = json!((c * 10.0).round() / 10.0);
        o["threads"] = json!(s.threads);
        o["client_bound"] = json!(super::cpu::client_bound(c, s.threads));
    }
    o
}

/// Whether any result was taken while the client was the bound.
pub(super) fn any_client_bound(series: &[Series]) -> bool {
    series
        .iter()
        .any(|s| !s.cpu.is_empty() && super::cpu::client_bound(median(&s.cpu), s.threads))
}

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(0.0)
}

/// Print the results; the JSON document of the run (what --json prints
/// and --record keeps), and how many requirements failed.
pub(super) fn emit(
    a: &StorageBenchArgs,
    m: &Meta,
    series: &[Series],
    notes: &[String],
) -> Result<(Value, usize)> {
    let config = json!({
        "target": m.target_text,
        "kind": m.kind,
        "size": m.size,
        "direct_io": m.direct,
        "runs": a.runs(),
        "seconds": a.seconds(),
        "streams": a.streams,
        "char_size": a.char_size,
        "chunk": a.chunk,
        "files": a.files(),
        "zones": if a.whole() { "whole" } else { "thirds" },
        "qd": m.qds,
        "seed": m.seed,
        "data": m.data_source,
        "tests": m.tests,
        "machine": machine(),
        "cache_bound": m.cache_bound,
        "data_prepare_mbs": m.prepare_mbs.round(),
        "ram_fs": m.ram_fs,
        "raidkit": env!("CARGO_PKG_VERSION"),
    });
    let results: Vec<Value> = series.iter().map(result_json).collect();
    if let Some(csv) = &a.csv {
        // Columns are only ever added at the end: scripts read them by position.
        let mut text =
            String::from("test,zone,qd,value,unit,runs,min,max,streams,cpu,client_bound,client\n");
        for r in &results {
            let _ = writeln!(
                text,
                "{},{},{},{:.3},{},{},{:.3},{:.3},{},{},{},{}",
                r["test"].as_str().unwrap_or(""),
                r["zone"].as_str().unwrap_or(""),
                r["qd"].as_u64().map(|q| q.to_string()).unwrap_or_default(),
                f(r, "value"),
                r["unit"].as_str().unwrap_or(""),
                r["runs"],
                f(r, "min"),
                f(r, "max"),
                r["streams"]
                    .as_u64()
                    .map(|q| q.to_string())
                    .unwrap_or_default(),
                r["cpu"].as_f64().map(|c| c.to_string()).unwrap_or_default(),
                r["client_bound"]
                    .as_bool()
                    .map(|b| b.to_string())
                    .unwrap_or_default(),
                r["client"]
                    .as_u64()
                    .map(|c| c.to_string())
                    .unwrap_or_default(),
            );
        }
        std::fs::write(csv, text).with_context(|| format!("writing {}", csv.display()))?;
    }
    if let Some(dir) = &a.plot {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for (unit, name) in [
            ("MB/s", "throughput.svg"),
            ("IOPS", "iops.svg"),
            ("files/s", "files.svg"),
        ] {
            let rows: Vec<&Value> = results.iter().filter(|r| r["unit"] == unit).collect();
            if rows.is_empty() {
                continue;
            }
            let p = dir.join(name);
            std::fs::write(&p, bars(m.target_text, unit, &rows))
                .with_context(|| format!("writing {}", p.display()))?;
        }
    }
    for n in notes {
        eprintln!("raidkit: {n}");
    }
    let verdicts: Vec<super::require::Verdict> = m
        .reqs
        .iter()
        .map(|r| super::require::judge(r, &results))
        .collect();
    let failed = verdicts.iter().filter(|v| !v.pass).count();
    let mut doc = json!({
        "format": super::record::FORMAT,
        "config": config,
        "results": results,
        "notes": notes,
        "requirements": verdicts.iter().map(|v| v.json.clone()).collect::<Vec<_>>(),
    });
    if let (Some(d), Some(e)) = (doc.as_object_mut(), m.extra.as_object()) {
        for (k, v) in e {
            d.insert(k.clone(), v.clone());
        }
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok((doc, failed));
    }
    println!(
        "raidkit bench {} ({}, {} working set, {} I/O, {} run(s), data {}, seed {})",
        m.target_text,
        m.kind,
        human(m.size),
        if m.direct { "direct" } else { "buffered" },
        a.runs(),
        m.data_source,
        m.seed
    );
    bonnie_table(m.size, a.files(), &results);
    println!();
    println!(
        "{:<26} {:<7} {:>3} {:>12} {:<8} {:>12} {:>12} {:>6}",
        "test", "zone", "qd", "median", "unit", "min", "max", "%cpu"
    );
    for r in &results {
        let qd = r["qd"]
            .as_u64()
            .or(r["streams"].as_u64())
            .map(|q| q.to_string())
            .or(r["client"].as_u64().map(|c| format!("#{c}")))
            .unwrap_or_else(|| "-".into());
        let cpu = r["cpu"]
            .as_f64()
            .map(|c| format!("{c:.0}"))
            .unwrap_or_else(|| "-".into());
        let bound = if r["client_bound"] == true {
            "  client-bound"
        } else {
            ""
        };
        println!(
            "{:<26} {:<7} {:>3} {:>12.1} {:<8} {:>12.1} {:>12.1} {:>6}{bound}",
            r["test"].as_str().unwrap_or(""),
            r["zone"].as_str().unwrap_or("-"),
            qd,
            f(r, "value"),
            r["unit"].as_str().unwrap_or(""),
            f(r, "min"),
            f(r, "max"),
            cpu,
        );
    }
    if results.iter().any(|r| {
        r["test"]
            .as_str()
            .is_some_and(|t| t.starts_with("streams_"))
    }) {
        println!();
        println!("streams: _one = one copy alone; the aggregate = all copies' bytes over the time until the last ended;");
        println!("  _per_stream = the mean of each copy's own rate; _overhead = 1 - per_stream / one (what sharing cost");
        println!("  each stream; negative when one stream alone left the target idle part of the time); _scaling =");
        println!("  aggregate / one (the number of streams at best, 1 for a target one stream saturates)");
    }
    if !verdicts.is_empty() {
        println!();
        println!(
            "requirements ({} of {} met):",
            verdicts.len() - failed,
            verdicts.len()
        );
        for v in &verdicts {
            println!("  {}", v.line);
        }
    }
    Ok((doc, failed))
}

/// bonnie++'s two-line summary, when its tests ran (MB/s rather than K/s).
fn bonnie_table(size: u64, files: usize, results: &[Value]) {
    let get = |t: &str| {
        results
            .iter()
            .find(|r| r["test"] == t)
            .map(|r| format!("{:.1}", f(r, "value")))
            .unwrap_or_else(|| "-".into())
    };
    // The client's CPU, as bonnie++'s %CP beside each figure.
    let cp = |t: &str| {
        results
            .iter()
            .find(|r| r["test"] == t)
            .and_then(|r| r["cpu"].as_f64())
            .map(|c| format!("{c:.0}"))
            .unwrap_or_else(|| "-".into())
    };
    let io = &super::BONNIE[..6];
    if io.iter().any(|t| results.iter().any(|r| r["test"] == *t)) {
        println!();
        println!(
            "         ----------Sequential Output---------- ----Sequential Input--- ---Random---"
        );
        println!(
            "         --Per Chr-- ---Block--- --Rewrite-- --Per Chr-- ---Block--- ---Seeks---"
        );
        println!(
            "Size        MB/s %CP    MB/s %CP    MB/s %CP    MB/s %CP    MB/s %CP    /sec %CP"
        );
        let mut line = format!("{:<8}", human(size));
        for t in io {
            let _ = write!(line, " {:>7} {:>3}", get(t), cp(t));
        }
        println!("{line}");
    }
    let fc = super::bonnie::NAMES;
    if fc.iter().any(|t| results.iter().any(|r| r["test"] == *t)) {
        println!();
        println!("         ------Sequential Create------ --------Random Create--------");
        println!("         -Create-- --Stat--- -Delete-- -Create-- --Stat--- -Delete--");
        println!("files         /sec      /sec      /sec      /sec      /sec      /sec");
        let mut line = format!("{files:<8}");
        for t in fc {
            let _ = write!(line, " {:>9}", get(t));
        }
        println!("{line}");
    }
}

/// A horizontal bar chart of one unit's results, medians as bars and the
/// min–max spread as whiskers.
pub(super) fn bars(target: &str, unit: &str, rows: &[&Value]) -> String {
    let row_h = 22.0;
    let left = 260.0;
    let width = 900.0;
    let plot_w = width - left - 40.0;
    let height = 60.0 + row_h * rows.len() as f64 + 30.0;
    let top = rows
        .iter()
        .map(|r| f(r, "max"))
        .fold(0.0f64, f64::max)
        .max(1e-9);
    let x = |v: f64| left + v / top * plot_w;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r#"<rect width="100%" height="100%" fill="white"/><text x="10" y="20" font-size="14">raidkit bench {}: {unit} (bar: median; line: min to max)</text>"#,
        xml(target)
    );
    for (i, r) in rows.iter().enumerate() {
        let y = 40.0 + row_h * i as f64;
        let mut label = r["test"].as_str().unwrap_or("").to_string();
        if let Some(z) = r["zone"].as_str() {
            label.push_str(&format!(" {z}"));
        }
        if let Some(q) = r["qd"].as_u64() {
            label.push_str(&format!(" qd{q}"));
        }
        if let Some(k) = r["streams"].as_u64() {
            label.push_str(&format!(" x{k}"));
        }
        if let Some(c) = r["client"].as_u64() {
            label.push_str(&format!(" client {c}"));
        }
        let v = f(r, "value");
        let _ = writeln!(
            s,
            r##"<text x="{}" y="{}" text-anchor="end">{}</text><rect x="{left}" y="{}" width="{:.1}" height="{}" fill="#4a7bb7"/><line x1="{:.1}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="black"/><text x="{:.1}" y="{}">{:.1}</text>"##,
            left - 6.0,
            y + 14.0,
            xml(&label),
            y + 3.0,
            (x(v) - left).max(0.5),
            row_h - 6.0,
            x(f(r, "min")),
            x(f(r, "max")),
            y + row_h / 2.0,
            y + row_h / 2.0,
            x(f(r, "max")) + 4.0,
            y + 14.0,
            v
        );
    }
    s.push_str("</svg>\n");
    s
}

fn xml(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
