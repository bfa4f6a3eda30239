//! `raidkit bench sweep`: block throughput against the number of members,
//! in the style of the seeds' 3ware plots, on simulated disks (or on real
//! member files with `--dir` and no `--disk`), with the ideal lines
//! (N x disk, (N-1) x disk, ...) drawn in. Output: a table, CSV, JSON and
//! SVG plots.

use crate::cli::SweepArgs;
use anyhow::{bail, Context, Result};
use raidkit_array::assemble::assemble;
use raidkit_array::create::{CreateOptions, Policy};
use raidkit_array::Array;
use raidkit_layout::Level;
use raidkit_member::{Member, SimConfig};
use raidkit_open::spec::{self, Spec};
use serde_json::json;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One point of the sweep.
struct Point {
    level: Level,
    members: usize,
    write: f64,
    read: f64,
}

fn parse_range(s: &str) -> Result<Vec<usize>> {
    let (a, b) = match s.split_once("..") {
        Some((a, b)) => (a.trim().parse::<usize>()?, b.trim().parse::<usize>()?),
        None => {
            let n = s.trim().parse::<usize>()?;
            (n, n)
        }
    };
    if a < 1 || b < a || b > 64 {
        bail!("--members {s}: give FROM..TO with 1 <= FROM <= TO <= 64");
    }
    Ok((a..=b).collect())
}

fn min_members(level: Level) -> usize {
    match level {
        Level::Raid5 | Level::Raid4 => 3,
        Level::Raid6 => 4,
        _ => 2,
    }
}

/// Data members' worth of one disk that the level can stream (the ideal).
fn ideal_factor(level: Level, n: usize) -> f64 {
    match level {
        Level::Raid0 | Level::Linear => n as f64,
        Level::Raid4 | Level::Raid5 => (n - 1) as f64,
        Level::Raid6 => (n - 2) as f64,
        // Each chunk written twice; sequential reads use every other chunk of each member.
        Level::Raid10 => n as f64 / 2.0,
        Level::Raid1 => 1.0,
    }
}

/// One streaming client: `qd` requests of `block` bytes in flight (each
/// from its own thread, taking the next block of the stream), for `secs`.
/// MB/s.
fn measure(dev: &dyn Member, write: bool, block: u64, qd: usize, secs: f64) -> Result<f64> {
    let cap = dev.len() / block * block;
    if cap == 0 {
        bail!("members too small for a {block}-byte block");
    }
    let next = AtomicU64::new(0);
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs_f64(secs);
    let bytes = std::thread::scope(|sc| -> Result<u64> {
        let workers: Vec<_> = (0..qd)
            .map(|_| {
                sc.spawn(|| -> Result<u64> {
                    let buf = vec![0x5au8; block as usize];
                    let mut rbuf = vec![0u8; block as usize];
                    let mut bytes = 0u64;
                    while Instant::now() < until {
                        let off = next.fetch_add(block, Ordering::Relaxed) % cap;
                        if write {
                            dev.write_at(&buf, off)?;
                        } else {
                            dev.read_at(&mut rbuf, off)?;
                        }
                        bytes += block;
                    }
                    Ok(bytes)
                })
            })
            .collect();
        let mut sum = 0;
        for w in workers {
            sum += w
                .join()
                .map_err(|_| anyhow::anyhow!("a sweep worker panicked"))??;
        }
        Ok(sum)
    })?;
    if write {
        dev.flush()?;
    }
    Ok(bytes as f64 / t0.elapsed().as_secs_f64() / 1e6)
}

pub fn sweep(a: SweepArgs) -> Result<()> {
    let levels: Vec<Level> = a
        .levels
        .split(',')
        .map(|l| {
            l.trim()
                .parse::<Level>()
                .map_err(|e| anyhow::anyhow!("{e}"))
        })
        .collect::<Result<_>>()?;
    let counts = parse_range(&a.members)?;
    let disk = SimConfig::parse(&a.disk.replace(',', "&"))
        .map_err(|e| anyhow::anyhow!("--disk {}: {e}", a.disk))?;
    if !a.dir.is_dir() {
        bail!("--dir {}: not a directory", a.dir.display());
    }
    // Interrupted (Ctrl-C, SIGTERM), the sweep stops at the next
    // measurement and removes its member files before it exits: they can
    // be gigabytes of the RAM disk.
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    let interrupted = || -> Result<()> {
        if stop.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        Ok(())
    };
    let mut points = Vec::new();
    for &level in &levels {
        for &n in counts.iter().filter(|&&n| n >= min_members(level)) {
            let paths: Vec<String> = (0..n)
                .map(|i| {
                    a.dir
                        .join(format!("raidkit-sweep-{}-{i}.img", std::process::id()))
                        .display()
                        .to_string()
                })
                .collect();
            let result = (|| -> Result<Point> {
                interrupted()?;
                let opts = CreateOptions {
                    level,
                    layout: level.default_layout(),
                    chunk: a.chunk,
                    size: Some(a.size),
                    name: "sweep".into(),
                    force: true,
                    assume_clean: true,
                    background_sync: false,
                    bitmap_region: 0,
                    policy: Policy::None,
                    spares: Vec::new(),
                    checksums: false,
                    md: false,
                    data_offset: None,
                    domains: Vec::new(),
                };
                let files: Vec<Spec> = paths.iter().map(|p| Spec::File(p.clone())).collect();
                raidkit_open::create(&files, &[], &opts, |_, _| {})
                    .context("creating the array")?;
                let sims: Vec<Spec> = files
                    .into_iter()
                    .map(|f| Spec::Sim(Box::new(f), disk, a.disk.clone()))
                    .collect();
                let array = Arc::new(Array::open(
                    assemble(spec::open_all(&sims, false)?)?,
                    "sweep",
                    false,
                )?);
                let devices = array.waits_on_devices();
                let behind = if a.write_behind && devices {
                    Some(crate::serve::write_behind(&array)?)
                } else {
                    None
                };
                let under: Arc<dyn Member> = match &behind {
                    Some(b) => b.clone(),
                    None => array.clone(),
                };
                let ahead = if a.read_ahead && devices {
                    Some(crate::serve::read_ahead(&array, under.clone())?)
                } else {
                    None
                };
                // Writes go through it too, as a served client's do (it
                // drops what it read ahead).
                let dev: &dyn Member = match &ahead {
                    Some(r) => r,
                    None => under.as_ref(),
                };
                let data = if level.is_parity() {
                    array.geometry().data_members() as u64
                } else {
                    n as u64
                };
                // Four full stripes per request: what a streaming writer issues.
                let block = 4 * data * a.chunk;
                let mut w = Vec::new();
                let mut r = Vec::new();
                for _ in 0..a.runs {
                    interrupted()?;
                    w.push(measure(dev, true, block, a.qd.into(), a.seconds)?);
                    interrupted()?;
                    r.push(measure(dev, false, block, a.qd.into(), a.seconds)?);
                }
                drop(ahead);
                if let Some(b) = &behind {
                    b.drain()?;
                }
                array.close()?;
                Ok(Point {
                    level,
                    members: n,
                    write: median(&mut w),
                    read: median(&mut r),
                })
            })();
            for p in &paths {
                let _ = std::fs::remove_file(p);
            }
            let p = result.with_context(|| format!("{level} with {n} members"))?;
            eprintln!(
                "sweep: {} x{}: write {:.0} MB/s, read {:.0} MB/s (ideal {:.0})",
                p.level,
                p.members,
                p.write,
                p.read,
                ideal_factor(level, n) * disk.bandwidth as f64 / 1e6
            );
            points.push(p);
        }
    }
    let bw = disk.bandwidth as f64 / 1e6;
    let mut csv =
        String::from("level,members,write_mbs,read_mbs,ideal_mbs,write_vs_ideal,read_vs_ideal\n");
    for p in &points {
        let ideal = ideal_factor(p.level, p.members) * bw;
        let _ = writeln!(
            csv,
            "{},{},{:.1},{:.1},{:.1},{:.3},{:.3}",
            p.level,
            p.members,
            p.write,
            p.read,
            ideal,
            p.write / ideal,
            p.read / ideal
        );
    }
    if let Some(f) = &a.csv {
        std::fs::write(f, &csv).with_context(|| format!("writing {}", f.display()))?;
    }
    if let Some(dir) = &a.plot {
        std::fs::create_dir_all(dir)?;
        for (metric, name) in [(true, "write"), (false, "read")] {
            let svg = plot(&points, &levels, bw, metric, &a.disk);
            let f = dir.join(format!("sweep-{name}.svg"));
            std::fs::write(&f, svg).with_context(|| format!("writing {}", f.display()))?;
        }
    }
    if a.json {
        let v: Vec<_> = points
            .iter()
            .map(|p| {
                json!({"level": p.level.to_string(), "members": p.members, "write": p.write,
                       "read": p.read, "ideal": ideal_factor(p.level, p.members) * bw, "unit": "MB/s"})
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({"config": {"disk": a.disk, "chunk": a.chunk,
                "member_size": a.size, "seconds": a.seconds, "runs": a.runs}, "results": v}))?
        );
    } else {
        print!("{}", csv.replace(',', "\t"));
    }
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// A line plot as SVG: measured lines solid, ideal lines dashed, one colour
/// per level. Written by hand: a few polylines and labels need no plotting
/// library.
fn plot(points: &[Point], levels: &[Level], bw: f64, write: bool, disk: &str) -> String {
    const W: f64 = 720.0;
    const H: f64 = 480.0;
    const L: f64 = 70.0;
    const R: f64 = 150.0;
    const T: f64 = 40.0;
    const B: f64 = 50.0;
    let colours = [
        "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
    ];
    let nmin = points.iter().map(|p| p.members).min().unwrap_or(1) as f64;
    let nmax = points.iter().map(|p| p.members).max().unwrap_or(2) as f64;
    let ymax = points
        .iter()
        .map(|p| (if write { p.write } else { p.read }).max(ideal_factor(p.level, p.members) * bw))
        .fold(1.0, f64::max)
        * 1.1;
    let x = |n: f64| L + (n - nmin) / (nmax - nmin).max(1.0) * (W - L - R);
    let y = |v: f64| H - B - v / ymax * (H - T - B);
    let mut s = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="22" font-size="15" text-anchor="middle">Block {} throughput against members (simulated disks: {disk})</text>
<line x1="{L}" y1="{}" x2="{}" y2="{}" stroke="black"/><line x1="{L}" y1="{T}" x2="{L}" y2="{}" stroke="black"/>
<text x="{}" y="{}" text-anchor="middle">members</text>
<text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">MB/s</text>
"##,
        (W - R + L) / 2.0,
        if write { "write" } else { "read" },
        H - B,
        W - R,
        H - B,
        H - B,
        (W - R + L) / 2.0,
        H - 12.0,
        H / 2.0,
        H / 2.0
    );
    for n in nmin as usize..=nmax as usize {
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{n}</text>"#,
            x(n as f64),
            H - B + 16.0
        );
    }
    for i in 0..=5 {
        let v = ymax / 5.0 * i as f64;
        let _ = writeln!(
            s,
            r##"<text x="{}" y="{:.1}" text-anchor="end">{:.0}</text><line x1="{L}" y1="{:.1}" x2="{}" y2="{:.1}" stroke="#ddd"/>"##,
            L - 6.0,
            y(v) + 4.0,
            v,
            y(v),
            W - R,
            y(v)
        );
    }
    for (i, level) in levels.iter().enumerate() {
        let c = colours[i % colours.len()];
        let ps: Vec<&Point> = points.iter().filter(|p| p.level == *level).collect();
        if ps.is_empty() {
            continue;
        }
        let line = |f: &dyn Fn(&Point) -> f64| {
            ps.iter()
                .map(|p| format!("{:.1},{:.1}", x(p.members as f64), y(f(p))))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let measured = line(&|p| if write { p.write } else { p.read });
        let ideal = line(&|p| ideal_factor(p.level, p.members) * bw);
        let _ = writeln!(
            s,
            r#"<polyline points="{ideal}" fill="none" stroke="{c}" stroke-width="1.5" stroke-dasharray="6 4"/>
<polyline points="{measured}" fill="none" stroke="{c}" stroke-width="2.5"/>"#
        );
        for p in &ps {
            let v = if write { p.write } else { p.read };
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{c}"/>"#,
                x(p.members as f64),
                y(v)
            );
        }
        let ly = T + 20.0 + i as f64 * 36.0;
        let _ = writeln!(
            s,
            r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{c}" stroke-width="2.5"/><text x="{}" y="{}">{level}</text>
<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="{c}" stroke-dasharray="6 4"/><text x="{}" y="{}">{level} ideal</text>"#,
            W - R + 10.0,
            W - R + 35.0,
            W - R + 40.0,
            ly + 4.0,
            W - R + 10.0,
            ly + 16.0,
            W - R + 35.0,
            ly + 16.0,
            W - R + 40.0,
            ly + 20.0
        );
    }
    s.push_str("</svg>\n");
    s
}
