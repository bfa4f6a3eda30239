//! `raidkit bench engine`: the array engine measured through its API, so
//! that parity levels can be compared with RAID-0 over the same members
//! without the network in the way.

use crate::cli::BenchEngineArgs;
use anyhow::{bail, Context, Result};
use raidkit_array::assemble::assemble;
use raidkit_array::create::CreateOptions;
use raidkit_array::Array;
use raidkit_layout::Level;
use raidkit_open::spec::{self, Spec};
use std::time::{Duration, Instant};

struct Bench {
    level: Level,
    array: Array,
    /// Bytes per sequential write: four full stripes.
    stripe_write: u64,
}

fn build(a: &BenchEngineArgs, level: Level, tag: &str) -> Result<(Bench, Vec<String>)> {
    let paths: Vec<String> = (0..a.members)
        .map(|i| {
            a.dir
                .join(format!(
                    "raidkit-bench-{}-{tag}-{i}.img",
                    std::process::id()
                ))
                .display()
                .to_string()
        })
        .collect();
    let specs: Vec<Spec> = paths.iter().map(|p| Spec::File(p.clone())).collect();
    let opts = CreateOptions {
        level,
        layout: level.default_layout(),
        chunk: a.chunk,
        size: Some(a.size),
        name: format!("bench-{tag}"),
        force: false,
        assume_clean: false,
        background_sync: false,
        bitmap_region: 64 << 20,
        policy: raidkit_array::create::Policy::parse(&a.policy)?,
        spares: Vec::new(),
        checksums: false,
        md: false,
        data_offset: None,
        domains: Vec::new(),
    };
    raidkit_open::create(&specs, &[], &opts, |_, _| {})
        .with_context(|| format!("creating the {level} array"))?;
    let array = Array::open(assemble(spec::open_all(&specs, false)?)?, tag, false)?;
    let data = array.geometry().data_members() as u64;
    Ok((
        Bench {
            level,
            array,
            stripe_write: 4 * data * a.chunk,
        },
        paths,
    ))
}

/// MB/s of `threads` writers, each walking its own region with `block`-byte
/// writes (sequential, or at random block-aligned offsets).
fn measure(b: &Bench, threads: usize, block: u64, random: bool, secs: f64) -> Result<f64> {
    let cap = b.array.capacity();
    let region = cap / threads as u64 / block * block;
    if region < block {
        bail!("members are too small for {threads} writers of {block}-byte blocks");
    }
    let dur = Duration::from_secs_f64(secs);
    let start = Instant::now();
    let total: u64 = std::thread::scope(|s| -> Result<u64> {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || -> Result<u64> {
                    let buf: Vec<u8> = (0..block)
                        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(t as u8))
                        .collect();
                    let base = t as u64 * region;
                    let mut x = 0x2545_f491_4f6c_dd1du64 ^ t as u64;
                    let (mut pos, mut done) = (0u64, 0u64);
                    while start.elapsed() < dur {
                        let off = if random {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            (x % (region / block)) * block
                        } else {
                            let o = pos;
                            pos = (pos + block) % region;
                            o
                        };
                        b.array.write(&buf, base + off)?;
                        done += block;
                    }
                    Ok(done)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("writer thread"))
            .sum()
    })?;
    Ok(total as f64 / start.elapsed().as_secs_f64() / 1e6)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

pub fn engine(a: BenchEngineArgs) -> Result<()> {
    if a.members < 4 {
        bail!("--members must be at least 4 (RAID-6 needs 4)");
    }
    if a.threads == 0 || a.runs == 0 || a.seconds.is_nan() || a.seconds <= 0.0 {
        bail!("--threads, --runs and --seconds must be positive");
    }
    if !a.dir.is_dir() {
        bail!("{} is not a directory", a.dir.display());
    }
    let mut all_paths = Vec::new();
    let result = (|| -> Result<()> {
        let mut benches = Vec::new();
        for (level, tag) in [
            (Level::Raid0, "r0"),
            (Level::Raid5, "r5"),
            (Level::Raid6, "r6"),
        ] {
            let (b, paths) = build(&a, level, tag)?;
            all_paths.extend(paths);
            benches.push(b);
        }
        // Fill every array once first: the first write to a RAM-disk page
        // allocates it, and that cost is not the engine's.
        for b in &benches {
            let buf = vec![0x5au8; b.stripe_write as usize];
            let cap = b.array.capacity() / b.stripe_write * b.stripe_write;
            let mut pos = 0;
            while pos < cap {
                b.array.write(&buf, pos)?;
                pos += b.stripe_write;
            }
            let tail = b.array.capacity() - cap;
            if tail > 0 {
                b.array.write(&buf[..tail as usize], cap)?;
            }
        }
        let mut seq = vec![Vec::new(); benches.len()];
        let mut rnd = vec![Vec::new(); benches.len()];
        for _ in 0..a.runs {
            for (i, b) in benches.iter().enumerate() {
                seq[i].push(measure(b, a.threads, b.stripe_write, false, a.seconds)?);
                rnd[i].push(measure(b, a.threads, 4096, true, a.seconds)? * 1e6 / 4096.0);
            }
        }
        println!(
            "engine: {} members of {} each, chunk {}, {} writer thread(s), {} s x {} runs, medians",
            a.members,
            crate::units::human(a.size),
            crate::units::human(a.chunk),
            a.threads,
            a.seconds,
            a.runs
        );
        // A full-stripe write puts members/data bytes on the members per
        // byte of data: where member bandwidth (or the CPU copying into
        // members) is the limit, RAID-5 can reach (N-1)/N of RAID-0 and
        // RAID-6 (N-2)/N. "of ideal" is the ratio against that bound;
        // "member MB/s" the bytes the members took (data and parity).
        println!(
            "{:<8}{:>16}{:>10}{:>8}{:>10}{:>14}{:>20}",
            "level",
            "seq write MB/s",
            "vs raid0",
            "ideal",
            "of ideal",
            "member MB/s",
            "4K rand write IOPS"
        );
        let base = median(&mut seq[0].clone());
        for (i, b) in benches.iter().enumerate() {
            let s = median(&mut seq[i]);
            let r = median(&mut rnd[i]);
            let n = b.array.geometry().members() as f64;
            let ideal = b.array.geometry().data_members() as f64 / n;
            println!(
                "{:<8}{:>16.0}{:>10.2}{:>8.2}{:>10.2}{:>14.0}{:>20.0}",
                b.level.to_string(),
                s,
                s / base,
                ideal,
                s / base / ideal,
                s / ideal,
                r
            );
        }
        println!(
            "(sequential writes of four full stripes: {} bytes)",
            benches
                .iter()
                .map(|b| format!("{} {}", b.level, b.stripe_write))
                .collect::<Vec<_>>()
                .join(", ")
        );
        Ok(())
    })();
    for p in &all_paths {
        let _ = std::fs::remove_file(p);
    }
    result
}
