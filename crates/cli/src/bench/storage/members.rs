//! `raidkit bench members MEMBER...`: every drive checked alone before any
//! array test, as the seeds' authors did (`hdparm -tT` on each drive: "poorly
//! performing hardware invalidates the whole test suite"), then all of
//! them at once (the JBOD aggregate of the 3ware notes), and the outliers
//! named against the median of their peers.
//!
//! Read-only by default: each member is opened read-only (direct I/O
//! where it opens), so the data of an array's members is never touched.
//! `--write --destroy-data` adds seq_write per zone and randwrite_4k,
//! which overwrite the members (for drives not yet in an array).
//! - seq_read per zone (outer, middle, inner third): 1 MiB reads from the
//!   zone's start for --seconds (or to the zone's end), as `hdparm -t`
//!   reads for 3 s;
//! - randread_4k at each --qd over the whole member for --seconds;
//! - aggregate: every member's outer zone read sequentially at once, one
//!   thread each, for --seconds: each member's rate together, and the sum.

use super::{cpu, identity, median, record, Aligned, RandomJob, Rw, BLOCK};
use crate::cli::{BenchMembersArgs, StorageBenchArgs};
use anyhow::{anyhow, bail, Context, Result};
use raidkit_member::Member;
use raidkit_open::spec::Spec;
use serde_json::{json, Value};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// One member opened for reading.
struct Drive {
    name: String,
    io: Box<dyn Rw + Send>,
    len: u64,
    direct: bool,
    identity: Value,
}

/// Open read-only, or read-write for --write; direct I/O where it opens.
fn open_path(path: &Path, write: bool) -> Result<(File, bool)> {
    let mut o = OpenOptions::new();
    o.read(true).write(write);
    match o.clone().custom_flags(libc::O_DIRECT).open(path) {
        Ok(f) => Ok((f, true)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok((
            o.open(path)
                .with_context(|| format!("opening {}", path.display()))?,
            false,
        )),
        Err(e) => Err(anyhow!(e).context(format!("opening {}", path.display()))),
    }
}

fn open(name: &str, write: bool) -> Result<Drive> {
    if name.starts_with("nbd://") || name.starts_with("nbd+unix://") {
        let c = raidkit_nbd::NbdClient::connect(name)?;
        if write && c.read_only() {
            bail!("{name} is a read-only export: --write cannot run on it");
        }
        let len = c.len();
        return Ok(Drive {
            name: name.to_string(),
            io: Box::new(Arc::new(c)),
            len,
            direct: false,
            identity: json!({"target": name}),
        });
    }
    let path = Path::new(name);
    let (f, direct) = open_path(path, write)?;
    let len = {
        use std::io::Seek;
        let mut r = &f;
        r.seek(std::io::SeekFrom::End(0))
            .with_context(|| format!("sizing {}", path.display()))?
    };
    if len < 3 * BLOCK as u64 {
        bail!("{name} has {len} bytes: too small to measure (at least 3 MiB)");
    }
    Ok(Drive {
        name: name.to_string(),
        io: Box::new(f),
        len,
        direct,
        identity: identity::path(path),
    })
}

/// Read sequentially from `off` in 1 MiB pieces until `end` or `secs`
/// have passed: MB/s.
fn seq_read(t: &dyn Rw, off: u64, end: u64, secs: f64, start: Option<Instant>) -> Result<f64> {
    let mut buf = Aligned::new(BLOCK);
    let t0 = start.unwrap_or_else(Instant::now);
    let mut o = off;
    while o + BLOCK as u64 <= end {
        t.read_at(buf.as_mut_slice(), o)?;
        o += BLOCK as u64;
        if t0.elapsed().as_secs_f64() >= secs {
            break;
        }
    }
    Ok((o - off) as f64 / t0.elapsed().as_secs_f64() / 1e6)
}

/// Write sequentially from `off` in 1 MiB pieces (incompressible,
/// stamped data) until `end` or `secs` have passed, then flush: MB/s.
fn seq_write(t: &dyn Rw, pattern: &Aligned, off: u64, end: u64, secs: f64) -> Result<f64> {
    let mut w = super::Writer::new(pattern);
    let t0 = Instant::now();
    let mut o = off;
    while o + BLOCK as u64 <= end {
        t.write_at(w.data(0, BLOCK, o), o)?;
        o += BLOCK as u64;
        if t0.elapsed().as_secs_f64() >= secs {
            break;
        }
    }
    t.flush()?;
    Ok((o - off) as f64 / t0.elapsed().as_secs_f64() / 1e6)
}

/// A result row of one member.
fn row(
    member: &str,
    test: &str,
    zone: &str,
    qd: Option<usize>,
    unit: &str,
    values: &[f64],
    cpus: &[f64],
) -> Value {
    let mut r = json!({
        "member": member,
        "test": test,
        "zone": zone,
        "value": median(values),
        "unit": unit,
        "runs": values.len(),
        "min": values.iter().copied().fold(f64::INFINITY, f64::min),
        "max": values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        "cpu": (median(cpus) * 10.0).round() / 10.0,
    });
    if let Some(q) = qd {
        r["qd"] = json!(q);
    }
    r
}

pub fn members(a: BenchMembersArgs) -> Result<()> {
    run(&a, &a.members, true).map(|_| ())
}

/// Measure `names` as `a` says; the record written (if any). Used by
/// `bench members` and by `bench --members-first`.
/// `print`: print the results (the table, or JSON with --json).
pub(crate) fn run(a: &BenchMembersArgs, names: &[String], print: bool) -> Result<Value> {
    if names.is_empty() {
        bail!("give the members to measure (files, block devices or nbd:// exports)");
    }
    if a.runs == 0 {
        bail!("--runs must be at least 1");
    }
    if !(a.seconds > 0.0 && a.seconds <= 3600.0) {
        bail!("--seconds must be more than 0 and at most 3600");
    }
    if !(a.outlier > 0.0 && a.outlier < 100.0) {
        bail!("--outlier must be a percentage between 0 and 100");
    }
    let qds = super::parse_qds(&a.qd)?;
    let started = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    if a.write && !a.destroy_data {
        bail!(
            "--write overwrites the members' data: give --destroy-data as well if that is intended"
        );
    }
    let drives: Vec<Drive> = names
        .iter()
        .map(|n| open(n, a.write))
        .collect::<Result<_>>()?;
    let mut pattern = Aligned::new(BLOCK);
    super::fill_random(pattern.as_mut_slice(), 0x5eed);
    let mut seed = super::splitmix64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64,
    );
    let mut results: Vec<Value> = Vec::new();
    for (di, d) in drives.iter().enumerate() {
        if print && !a.json {
            eprintln!(
                "raidkit: measuring {} ({} of {})",
                d.name,
                di + 1,
                drives.len()
            );
        }
        let len = a.size.unwrap_or(d.len).min(d.len);
        let zone_len = len / 3 / BLOCK as u64 * BLOCK as u64;
        for (zi, zone) in ["outer", "middle", "inner"].iter().enumerate() {
            let z0 = zi as u64 * zone_len;
            let (mut v, mut c) = (Vec::new(), Vec::new());
            for _ in 0..a.runs {
                let clock = cpu::Clock::start();
                v.push(seq_read(&*d.io, z0, z0 + zone_len, a.seconds, None)?);
                c.push(clock.pct());
            }
            results.push(row(&d.name, "seq_read", zone, None, "MB/s", &v, &c));
        }
        if a.write {
            for (zi, zone) in ["outer", "middle", "inner"].iter().enumerate() {
                let z0 = zi as u64 * zone_len;
                let (mut v, mut c) = (Vec::new(), Vec::new());
                for _ in 0..a.runs {
                    let clock = cpu::Clock::start();
                    v.push(seq_write(&*d.io, &pattern, z0, z0 + zone_len, a.seconds)?);
                    c.push(clock.pct());
                }
                results.push(row(&d.name, "seq_write", zone, None, "MB/s", &v, &c));
            }
        }
        for write in [false, true].into_iter().filter(|w| !w || a.write) {
            for &qd in &qds {
                let (mut v, mut c) = (Vec::new(), Vec::new());
                for _ in 0..a.runs {
                    seed = super::splitmix64(seed);
                    let clock = cpu::Clock::start();
                    v.push(
                        RandomJob {
                            t: &*d.io,
                            secs: a.seconds,
                            pattern: &pattern,
                            seed,
                            z0: 0,
                            len: len / 4096 * 4096,
                            qd,
                            write,
                        }
                        .run()?,
                    );
                    c.push(clock.pct());
                }
                let test = if write { "randwrite_4k" } else { "randread_4k" };
                results.push(row(&d.name, test, "all", Some(qd), "IOPS", &v, &c));
            }
        }
    }
    // All at once: each member's outer zone, one thread each.
    let mut together: Vec<Vec<f64>> = vec![Vec::new(); drives.len()];
    let mut agg_cpu = Vec::new();
    for _ in 0..a.runs {
        let clock = cpu::Clock::start();
        let start = Instant::now();
        let rates: Vec<Result<f64>> = std::thread::scope(|sc| {
            let hs: Vec<_> = drives
                .iter()
                .map(|d| {
                    let end = a.size.unwrap_or(d.len).min(d.len) / 3 / BLOCK as u64 * BLOCK as u64;
                    sc.spawn(move || {
                        seq_read(&*d.io, 0, end.max(BLOCK as u64), a.seconds, Some(start))
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("reader")).collect()
        });
        for (i, r) in rates.into_iter().enumerate() {
            together[i].push(r?);
        }
        agg_cpu.push(clock.pct());
    }
    let sums: Vec<f64> = (0..a.runs)
        .map(|run| together.iter().map(|v| v[run]).sum())
        .collect();
    let alone_outer: Vec<f64> = drives
        .iter()
        .map(|d| {
            results
                .iter()
                .find(|r| {
                    r["member"] == d.name.as_str()
                        && r["test"] == "seq_read"
                        && r["zone"] == "outer"
                })
                .and_then(|r| r["value"].as_f64())
                .unwrap_or(f64::NAN)
        })
        .collect();
    for (d, v) in drives.iter().zip(&together) {
        results.push(row(
            &d.name,
            "seq_read_together",
            "outer",
            None,
            "MB/s",
            v,
            &agg_cpu,
        ));
    }
    let mut agg = row(
        "all",
        "seq_read_aggregate",
        "outer",
        None,
        "MB/s",
        &sums,
        &agg_cpu,
    );
    agg["member"] = Value::Null;
    let alone_sum: f64 = alone_outer.iter().sum();
    agg["of_sum_alone"] = json!(median(&sums) / alone_sum);
    results.push(agg);

    let outliers = outliers(&results, a.outlier / 100.0);
    let mut notes: Vec<String> = Vec::new();
    if drives
        .iter()
        .any(|d| !d.direct && !d.name.starts_with("nbd"))
    {
        notes.push("warning: some members would not open with direct I/O (a RAM file system?): their figures may come from a cache".into());
    }
    let doc = json!({
        "format": record::FORMAT,
        "time": started,
        "label": a.label,
        "config": {
            "target": format!("members[{}]", names.join(",")),
            "kind": "members",
            "runs": a.runs,
            "seconds": a.seconds,
            "qd": qds,
            "size": a.size,
            "outlier_pct": a.outlier,
            "read_only": !a.write,
            "machine": super::report::machine(),
            "raidkit": env!("CARGO_PKG_VERSION"),
        },
        "identity": {"members": drives.iter().map(|d| json!({"member": d.name, "bytes": d.len, "direct_io": d.direct, "identity": d.identity})).collect::<Vec<_>>()},
        "results": results,
        "outliers": outliers,
        "notes": notes,
    });
    for n in &notes {
        eprintln!("raidkit: {n}");
    }
    if print && a.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else if print {
        print_table(&doc, &drives, &qds);
    }
    if let Some(dir) = &a.record {
        let p = record::save(dir, &doc)?;
        eprintln!("raidkit: recorded in {}", p.display());
    }
    Ok(doc)
}

/// `--members-first`: the members of an array[...] target measured alone
/// and together (read-only) before the array is opened; their record.
pub(super) fn members_first(a: &StorageBenchArgs, target_text: &str) -> Result<Value> {
    let s = Spec::parse(target_text)?;
    let Spec::Array(members) = &s else {
        bail!("--members-first needs an array[MEMBER,...] target, whose members it can name");
    };
    let names: Vec<String> = members
        .iter()
        .map(|m| match m {
            Spec::File(p) | Spec::Nbd(p) => Ok(p.clone()),
            other => Err(anyhow!(
                "--members-first measures files, block devices and nbd:// exports; member {other} is none of them"
            )),
        })
        .collect::<Result<_>>()?;
    let ma = BenchMembersArgs {
        members: names.clone(),
        runs: a.runs(),
        seconds: a.seconds(),
        qd: a.qd.clone(),
        size: None,
        outlier: 25.0,
        json: a.json,
        record: a.record.clone(),
        label: a.label.as_ref().map(|l| format!("{l} (members)")),
        // The members of an array hold its data: only ever read here.
        write: false,
        destroy_data: false,
    };
    let doc = run(&ma, &names, !a.json)?;
    if !a.json {
        println!();
    }
    Ok(doc)
}

/// Members whose figure differs from the median of their peers' by more
/// than `frac` (either way), per test.
fn outliers(results: &[Value], frac: f64) -> Vec<Value> {
    let mut out = Vec::new();
    let per_member: Vec<&Value> = results.iter().filter(|r| r["member"].is_string()).collect();
    for r in &per_member {
        let peers: Vec<f64> = per_member
            .iter()
            .filter(|p| {
                p["member"] != r["member"]
                    && p["test"] == r["test"]
                    && p["zone"] == r["zone"]
                    && p["qd"] == r["qd"]
            })
            .filter_map(|p| p["value"].as_f64())
            .collect();
        if peers.is_empty() {
            continue;
        }
        let m = median(&peers);
        let v = r["value"].as_f64().unwrap_or(f64::NAN);
        if m > 0.0 && (v / m - 1.0).abs() > frac {
            out.push(json!({
                "member": r["member"],
                "test": r["test"],
                "zone": r["zone"],
                "qd": r["qd"],
                "value": v,
                "peers_median": m,
                "ratio": v / m,
                "unit": r["unit"],
            }));
        }
    }
    out
}

fn print_table(doc: &Value, drives: &[Drive], qds: &[usize]) {
    let results = doc["results"].as_array().cloned().unwrap_or_default();
    let get = |m: &str, test: &str, zone: &str, qd: Option<usize>| {
        results
            .iter()
            .find(|r| {
                r["member"] == m
                    && r["test"] == test
                    && r["zone"] == zone
                    && r["qd"].as_u64() == qd.map(|q| q as u64)
            })
            .and_then(|r| r["value"].as_f64())
    };
    let mut head = format!(
        "{:<28} {:>10} {:>10} {:>10}",
        "member", "outer", "middle", "inner"
    );
    for q in qds {
        head.push_str(&format!(" {:>10}", format!("4K qd{q}")));
    }
    head.push_str(&format!(" {:>10}", "together"));
    println!("seq_read in MB/s per zone, randread_4k in IOPS; together: the outer zone read with every member at once");
    println!("{head}");
    // One line per member: the sequential test per zone, the random test
    // per queue depth, and (for reads) the figure with all at once.
    let lines = |seq: &str, rand: &str, together: Option<&str>| {
        for d in drives {
            let mut line = format!("{:<28}", d.name);
            for z in ["outer", "middle", "inner"] {
                let v = get(&d.name, seq, z, None).unwrap_or(f64::NAN);
                line.push_str(&format!(" {v:>10.1}"));
            }
            for &q in qds {
                let v = get(&d.name, rand, "all", Some(q)).unwrap_or(f64::NAN);
                line.push_str(&format!(" {v:>10.0}"));
            }
            if let Some(t) = together {
                let v = get(&d.name, t, "outer", None).unwrap_or(f64::NAN);
                line.push_str(&format!(" {v:>10.1}"));
            }
            println!("{line}");
        }
    };
    lines("seq_read", "randread_4k", Some("seq_read_together"));
    if results.iter().any(|r| r["test"] == "seq_write") {
        println!();
        println!("with --write: seq_write in MB/s per zone, randwrite_4k in IOPS");
        lines("seq_write", "randwrite_4k", None);
        println!();
    }
    if let Some(agg) = results.iter().find(|r| r["test"] == "seq_read_aggregate") {
        println!(
            "aggregate: {:.1} MB/s with all {} members at once, {:.2} of the sum of their outer zones alone",
            agg["value"].as_f64().unwrap_or(0.0),
            drives.len(),
            agg["of_sum_alone"].as_f64().unwrap_or(0.0)
        );
    }
    let outliers = doc["outliers"].as_array().cloned().unwrap_or_default();
    if outliers.is_empty() {
        println!(
            "no outliers: every member within {}% of its peers' median on every test",
            doc["config"]["outlier_pct"]
        );
    }
    for o in outliers {
        let what = match o["qd"].as_u64() {
            Some(q) => format!("{} qd{q}", o["test"].as_str().unwrap_or("")),
            None => format!(
                "{} {}",
                o["test"].as_str().unwrap_or(""),
                o["zone"].as_str().unwrap_or("")
            ),
        };
        println!(
            "OUTLIER {}: {what} {:.1} {}, {:.2}x its peers' median ({:.1})",
            o["member"].as_str().unwrap_or("?"),
            o["value"].as_f64().unwrap_or(0.0),
            o["unit"].as_str().unwrap_or(""),
            o["ratio"].as_f64().unwrap_or(0.0),
            o["peers_median"].as_f64().unwrap_or(0.0),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_member_is_named_against_its_peers() {
        let r = |m: &str, v: f64| json!({"member": m, "test": "seq_read", "zone": "inner", "value": v, "unit": "MB/s"});
        let results = vec![r("a", 90.0), r("b", 91.0), r("c", 55.0), r("d", 89.0)];
        let o = outliers(&results, 0.2);
        assert_eq!(o.len(), 1, "{o:?}");
        assert_eq!(o[0]["member"], "c");
        assert!((o[0]["peers_median"].as_f64().unwrap() - 90.0).abs() < 1e-9);
        // Within 20 %: none.
        assert!(outliers(&[r("a", 90.0), r("b", 80.0), r("c", 85.0)], 0.2).is_empty());
    }
}
