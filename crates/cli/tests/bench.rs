//! `raidkit bench TARGET`: results in the documented shape, the cache-bound
//! warning on a working set in RAM, compressible data refused unless asked
//! for, and clear errors for bad targets and options.

mod common;

use common::*;
use serde_json::Value;

fn bench_json(args: &[&str]) -> (Value, String) {
    let mut a = vec!["bench"];
    a.extend_from_slice(args);
    a.extend(["--json", "--runs", "2", "--seconds", "0.1"]);
    let o = ok(&a);
    (
        serde_json::from_slice(&o.stdout).unwrap(),
        String::from_utf8_lossy(&o.stderr).to_string(),
    )
}

#[test]
fn results_have_the_documented_shape_and_ram_targets_are_flagged() {
    let dir = tmp();
    let target = dir.path().join("t.img").display().to_string();
    let (v, err) = bench_json(&[&target, "--size", "12M", "--tests", "dd"]);
    // /dev/shm is a RAM disk: the warning must say so.
    assert!(err.contains("RAM file system"), "{err}");
    assert_eq!(v["config"]["cache_bound"], true);
    assert_eq!(v["config"]["size"], 12 << 20);
    assert!(v["config"]["machine"]["ram"].as_u64().unwrap() > 0);
    let results = v["results"].as_array().unwrap();
    // 2 sequential tests x 3 zones + 2 random tests x 3 zones x 2 queue depths.
    assert_eq!(results.len(), 18, "{v}");
    for r in results {
        for k in ["test", "value", "unit", "runs", "min", "max", "zone"] {
            assert!(!r[k].is_null(), "{k} missing in {r}");
        }
        assert_eq!(r["runs"], 2);
        let (value, min, max) = (
            r["value"].as_f64().unwrap(),
            r["min"].as_f64().unwrap(),
            r["max"].as_f64().unwrap(),
        );
        assert!(value > 0.0 && min <= value && value <= max, "{r}");
        if r["unit"] == "IOPS" {
            assert!(r["qd"] == 1 || r["qd"] == 32, "{r}");
        }
    }
    assert!(
        !std::path::Path::new(&target).exists(),
        "the scratch file was left behind"
    );
    // Other queue depths on request: one result per zone and depth.
    let (v, _) = bench_json(&[
        &target,
        "--size",
        "12M",
        "--tests",
        "randread_4k",
        "--qd",
        "4,16,128",
    ]);
    let qds: Vec<u64> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["qd"].as_u64().unwrap())
        .collect();
    assert_eq!(qds, [4, 16, 128, 4, 16, 128, 4, 16, 128], "{v}");
}

#[test]
fn an_array_and_a_small_buffered_working_set_warn_of_the_cache() {
    let dir = tmp();
    let ms = members(dir.path(), 3);
    create("5", &ms, "16M");
    let spec = format!("array[{}]", ms.join(","));
    let csv = dir.path().join("r.csv");
    let (v, err) = bench_json(&[
        &spec,
        "--tests",
        "seq_write,seq_read",
        "--size",
        "6M",
        "--csv",
        csv.to_str().unwrap(),
    ]);
    assert!(err.contains("cache-bound"), "{err}");
    assert_eq!(v["config"]["kind"], "raidkit array");
    assert_eq!(v["results"].as_array().unwrap().len(), 6);
    let text = std::fs::read_to_string(&csv).unwrap();
    // Columns are only ever added at the end: the first nine stay put.
    assert!(
        text.starts_with("test,zone,qd,value,unit,runs,min,max,streams,cpu,client_bound,client\n")
    );
    assert_eq!(text.lines().count(), 7);
    // The array is intact afterwards.
    ok(&args(&["check"], &ms));
}

#[test]
fn compressible_data_is_refused_unless_asked_for() {
    let dir = tmp();
    let sample = dir.path().join("text.dat");
    std::fs::write(&sample, "event 1 energy 13.2 GeV; ".repeat(20000)).unwrap();
    let target = dir.path().join("t.img").display().to_string();
    let s = sample.to_str().unwrap();
    fails(
        &[
            "bench",
            &target,
            "--size",
            "6M",
            "--data",
            s,
            "--tests",
            "seq_write",
        ],
        "compressible",
    );
    let (v, _) = bench_json(&[
        &target,
        "--size",
        "6M",
        "--data",
        s,
        "--allow-compressible",
        "--tests",
        "seq_write",
    ]);
    assert!(v["config"]["data"].as_str().unwrap().contains("bits/byte"));
}

#[test]
fn bad_targets_and_options_get_clear_errors() {
    let dir = tmp();
    let existing = dir.path().join("keep.img");
    std::fs::write(&existing, vec![7u8; 8 << 20]).unwrap();
    let e = existing.to_str().unwrap();
    fails(&["bench", e], "--destroy-data");
    assert!(
        std::fs::read(&existing).unwrap().iter().all(|&b| b == 7),
        "data was overwritten"
    );
    fails(&["bench", "/nonexistent-dir/x.img"], "no such file");
    fails(
        &["bench", e, "--tests", "seq_read,warp_speed"],
        "unknown test 'warp_speed'",
    );
    fails(
        &["bench", e, "--tests", "seq_read", "--runs", "0"],
        "at least 1",
    );
    fails(
        &["bench", "nbd://127.0.0.1:1/x", "--tests", "seq_read"],
        "connecting to 127.0.0.1:1",
    );
    fails(&["bench", "nbd://127.0.0.1:notaport/x"], "bad port");
    fails(
        &["bench", e, "--tests", "seq_read", "--streams", "0"],
        "--streams",
    );
    fails(
        &["bench", e, "--tests", "seq_read", "--chunk", "100"],
        "--chunk",
    );
    fails(
        &["bench", e, "--tests", "randread_4k", "--qd", "0"],
        "--qd 0: give queue depths from 1 to 256",
    );
    fails(
        &["bench", e, "--tests", "randread_4k", "--qd", "1,x"],
        "--qd 1,x: give queue depths",
    );
    fails(&["bench"], "give a TARGET");
    fails(
        &["bench", e, "--tests", "seq_read", "--size", "1M"],
        "too small",
    );
}

fn result<'a>(v: &'a Value, test: &str) -> &'a Value {
    v["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["test"] == test)
        .unwrap_or_else(|| panic!("no {test} in {v}"))
}

#[test]
fn a_directory_gets_bonnies_set_and_the_data_path_tests() {
    let dir = tmp();
    let plots = dir.path().join("plots");
    let (v, err) = bench_json(&[
        dir.path().to_str().unwrap(),
        "--tests",
        "bonnie,datapath",
        "--size",
        "16M",
        "--char-size",
        "64K",
        "--files",
        "200",
        "--streams",
        "2",
        "--plot",
        plots.to_str().unwrap(),
    ]);
    assert!(err.contains("RAM file system"), "{err}");
    assert_eq!(v["config"]["kind"], "directory");
    for (test, unit) in [
        ("char_write", "MB/s"),
        ("block_write", "MB/s"),
        ("rewrite", "MB/s"),
        ("char_read", "MB/s"),
        ("block_read", "MB/s"),
        ("random_seeks", "seeks/s"),
        ("seq_create", "files/s"),
        ("seq_stat", "files/s"),
        ("seq_delete", "files/s"),
        ("random_create", "files/s"),
        ("random_stat", "files/s"),
        ("random_delete", "files/s"),
        ("mem_to_target", "MB/s"),
        ("target_to_mem", "MB/s"),
        ("streams_write_one", "MB/s"),
        ("streams_write", "MB/s"),
        ("streams_write_per_stream", "MB/s"),
        ("streams_read", "MB/s"),
        ("mixed_write", "MB/s"),
        ("mixed_read", "MB/s"),
    ] {
        let r = result(&v, test);
        assert_eq!(r["unit"], unit, "{r}");
        assert_eq!(r["runs"], 2, "{r}");
        assert!(r["value"].as_f64().unwrap() > 0.0, "{r}");
    }
    assert_eq!(result(&v, "streams_write")["streams"], 2);
    // The overhead is 1 - per-stream/one-stream, as the seeds define it;
    // it is recomputed here from the run's own medians as a sanity bound.
    let over = result(&v, "streams_read_overhead");
    assert_eq!(over["unit"], "%");
    assert!(over["value"].as_f64().unwrap() < 100.0, "{over}");
    // The per-character tests moved one byte per call: 64 KiB of them.
    assert_eq!(v["config"]["char_size"], 64 << 10);
    for (f, bar) in [
        ("throughput.svg", "block_write"),
        ("files.svg", "seq_create"),
    ] {
        let svg = std::fs::read_to_string(plots.join(f)).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains(bar), "{f}: {svg}");
        assert!(svg.trim_end().ends_with("</svg>"));
    }
    // Nothing left behind in the directory but the plots.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != "plots")
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn an_nbd_export_is_measured_within_its_working_set_only() {
    let dir = tmp();
    let ms = members(dir.path(), 3);
    create("5", &ms, "16M");
    let mut s = Served::start(dir.path(), &ms, &[]);
    // Writing to someone's export needs consent.
    fails(&["bench", &s.uri, "--tests", "seq_write"], "--destroy-data");
    let ctl = s.control.to_str().unwrap().to_string();
    let (v, err) = bench_json(&[
        &s.uri,
        "--destroy-data",
        "--tests",
        "seq_write,seq_read,randwrite_4k,block_write,rewrite,char_write,streams_write",
        "--whole",
        "--size",
        "8M",
        "--control",
        &ctl,
    ]);
    assert_eq!(v["config"]["kind"], "NBD export");
    // The served array's level and state, asked of its server before and
    // after the run.
    for when in ["start", "end"] {
        let a = &v["array"][when];
        assert_eq!(a["level"], "raid5", "{a}");
        assert_eq!(a["state"], "optimal", "{a}");
        assert_eq!(a["degraded"], false, "{a}");
        assert_eq!(a["members"], 3, "{a}");
    }
    assert!(err.contains("char_write and char_read skipped"), "{err}");
    assert!(
        v["results"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["test"] != "char_write"),
        "{v}"
    );
    assert_eq!(result(&v, "seq_write")["zone"], "all");
    assert!(result(&v, "rewrite")["value"].as_f64().unwrap() > 0.0);
    assert_eq!(s.stop().code(), Some(0));
    // Only the first 8 MiB of the 16 MiB-per-member RAID-5 was written:
    // the rest still reads as zeroes, and parity agrees.
    let size: u64 = {
        let o = ok(&args(&["detail", "--json"], &ms));
        let d: Value = serde_json::from_slice(&o.stdout).unwrap();
        d["size"].as_u64().unwrap()
    };
    let out = dir.path().join("tail.bin");
    ok(&args(
        &[
            "read",
            "--offset",
            "8M",
            "--length",
            &(size - (8 << 20)).to_string(),
            "--out",
            out.to_str().unwrap(),
        ],
        &ms,
    ));
    let tail = std::fs::read(&out).unwrap();
    assert!(!tail.is_empty() && tail.iter().all(|&b| b == 0));
    let head = dir.path().join("head.bin");
    ok(&args(
        &[
            "read",
            "--offset",
            "0",
            "--length",
            "8M",
            "--out",
            head.to_str().unwrap(),
        ],
        &ms,
    ));
    assert!(std::fs::read(&head).unwrap().iter().any(|&b| b != 0));
    ok(&args(&["check"], &ms));
    // Served again, with a member failed: the record says the array was
    // degraded.
    let mut s = Served::start(dir.path(), &ms, &[]);
    let ctl = s.control.to_str().unwrap().to_string();
    // A member failed: the record says the array was degraded.
    ok(&["fail", "--control", &ctl, &ms[1]]);
    let (dv, _) = bench_json(&[
        &s.uri,
        "--tests",
        "seq_read",
        "--whole",
        "--size",
        "4M",
        "--control",
        &ctl,
    ]);
    assert_eq!(dv["array"]["start"]["degraded"], true, "{}", dv["array"]);
    assert_eq!(dv["array"]["start"]["state"], "degraded", "{}", dv["array"]);
    assert_eq!(s.stop().code(), Some(0));
}

/// How many 4 KiB blocks of `data` are not all zero, and how many of those
/// are alike (the same as an earlier one).
fn nonzero_and_duplicate_blocks(data: &[u8]) -> (usize, usize) {
    let mut seen = std::collections::HashSet::new();
    let mut nonzero = 0;
    let mut dups = 0;
    for b in data.chunks(4096).filter(|b| b.iter().any(|&x| x != 0)) {
        nonzero += 1;
        if !seen.insert(b) {
            dups += 1;
        }
    }
    (nonzero, dups)
}

/// A deduplicating target must not be flattered: no two blocks any write
/// test leaves behind are alike, whether written sequentially, at random by
/// threads (a file) or pipelined on one connection (an NBD export).
#[test]
fn written_data_cannot_be_deduplicated() {
    let dir = tmp();
    let file = dir.path().join("t.img");
    std::fs::write(&file, vec![0u8; 12 << 20]).unwrap();
    let f = file.to_str().unwrap();
    bench_json(&[f, "--destroy-data", "--tests", "seq_write"]);
    let (nonzero, dups) = nonzero_and_duplicate_blocks(&std::fs::read(&file).unwrap());
    assert_eq!((nonzero, dups), (3072, 0));

    for (test, extra) in [("randwrite_4k", None), ("block_write", Some("--whole"))] {
        std::fs::write(&file, vec![0u8; 12 << 20]).unwrap();
        let mut a = vec![f, "--destroy-data", "--tests", test];
        a.extend(extra);
        bench_json(&a);
        let (nonzero, dups) = nonzero_and_duplicate_blocks(&std::fs::read(&file).unwrap());
        assert!(nonzero > 100, "{test}: only {nonzero} blocks written");
        assert_eq!(dups, 0, "{test}: {dups} of {nonzero} blocks alike");
    }

    let ms = members(dir.path(), 2);
    create("0", &ms, "8M");
    let mut s = Served::start(dir.path(), &ms, &[]);
    bench_json(&[&s.uri, "--destroy-data", "--tests", "randwrite_4k"]);
    assert_eq!(s.stop().code(), Some(0));
    let size = {
        let o = ok(&args(&["detail", "--json"], &ms));
        let d: Value = serde_json::from_slice(&o.stdout).unwrap();
        d["size"].as_u64().unwrap().to_string()
    };
    let out = dir.path().join("all.bin");
    let o = out.to_str().unwrap();
    ok(&args(
        &["read", "--offset", "0", "--length", &size, "--out", o],
        &ms,
    ));
    let (nonzero, dups) = nonzero_and_duplicate_blocks(&std::fs::read(&out).unwrap());
    assert!(nonzero > 100, "NBD: only {nonzero} blocks written");
    assert_eq!(dups, 0, "NBD: {dups} of {nonzero} blocks alike");
}

/// Which 4 KiB blocks of the file at `p` are not all zero.
fn written_blocks(p: &std::path::Path) -> std::collections::BTreeSet<usize> {
    std::fs::read(p)
        .unwrap()
        .chunks(4096)
        .enumerate()
        .filter(|(_, b)| b.iter().any(|&x| x != 0))
        .map(|(i, _)| i)
        .collect()
}

/// Random offsets come from a seed recorded with the results: the same
/// seed draws the same offsets, and by default every invocation draws new
/// ones (so no run reads back exactly what a cache still holds).
#[test]
fn random_offsets_come_from_a_recorded_seed() {
    // A sparse file of 256 MiB: 4 KiB blocks.
    const BLOCKS: usize = 65536;
    let dir = tmp();
    let run = |name: &str, seed: Option<&str>| {
        let f = dir.path().join(name);
        std::fs::File::create(&f)
            .unwrap()
            .set_len(BLOCKS as u64 * 4096)
            .unwrap();
        let fs = f.to_str().unwrap().to_string();
        let mut a = vec![
            "bench",
            &fs,
            "--destroy-data",
            "--tests",
            "randwrite_4k",
            "--qd",
            "1",
            "--whole",
            "--runs",
            "1",
            "--seconds",
            "0.05",
            "--json",
        ];
        if let Some(s) = seed {
            a.extend(["--seed", s]);
        }
        let v: Value = serde_json::from_slice(&ok(&a).stdout).unwrap();
        assert_eq!(v["config"]["qd"], serde_json::json!([1]));
        (v["config"]["seed"].as_u64().unwrap(), written_blocks(&f))
    };
    let (s1, a) = run("a.img", Some("42"));
    let (s2, b) = run("b.img", Some("42"));
    assert_eq!((s1, s2), (42, 42));
    // Runs of the same seed for different times: one set of blocks holds
    // the other.
    let (small, big) = if a.len() <= b.len() {
        (&a, &b)
    } else {
        (&b, &a)
    };
    assert!(small.len() > 100, "only {} blocks written", small.len());
    assert!(small.is_subset(big), "the same seed drew other offsets");
    // Another seed, and no seed at all: other offsets. Offsets drawn
    // independently share about |a| |c| / BLOCKS blocks by chance (a fast
    // machine covers much of the file in the time given), the same offsets
    // min(|a|, |c|): the count must lie nearer to chance.
    for (name, seed) in [("c.img", Some("43")), ("d.img", None)] {
        let (s, c) = run(name, seed);
        assert_ne!(s, 42);
        let shared = c.intersection(&a).count();
        let chance = a.len() * c.len() / BLOCKS;
        let same = c.len().min(a.len());
        assert!(
            same - chance > 50 && shared < (chance + same) / 2,
            "seed {s}: {shared} of {} blocks the same as seed 42's ({chance} by chance)",
            c.len()
        );
    }
}

fn records(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    v.sort();
    v
}

/// The procurement kit on a small target on the machine's disk: --quick
/// runs every test in under 30 s, requirements are judged PASS or FAIL
/// (exit status 3 on a failure), every run is kept in the record with the
/// client's CPU beside each figure, two runs are compared, and the record
/// becomes one HTML sheet that a browser renders.
#[test]
fn quick_runs_are_judged_recorded_compared_and_reported() {
    let scratch = tempfile::tempdir_in("/var/tmp").unwrap();
    let dir = tmp();
    let rec = dir.path().join("record");
    let rec_s = rec.to_str().unwrap();
    let target = scratch.path().to_str().unwrap();
    let t0 = std::time::Instant::now();
    let o = raidkit(&[
        "bench",
        target,
        "--quick",
        "--tests",
        "all",
        "--record",
        rec_s,
        "--label",
        "first",
        "--require",
        "seq_write>=1MB/s, seq_read>=1000000GB/s, randread_4k@qd32>=1",
    ]);
    let took = t0.elapsed();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    // A failed requirement: the run completed, its status says so.
    assert_eq!(o.status.code(), Some(3), "{out}\n{err}");
    assert!(err.contains("1 of 3 requirements failed"), "{err}");
    assert!(out.contains("PASS  seq_write>=1MB/s"), "{out}");
    assert!(out.contains("FAIL  seq_read>=1000000GB/s"), "{out}");
    assert!(out.contains("PASS  randread_4k@qd32>=1"), "{out}");
    assert!(took.as_secs() < 30, "--quick took {took:?}");
    // Nothing but the record is left of the run.
    assert_eq!(std::fs::read_dir(scratch.path()).unwrap().count(), 0);

    let files = records(&rec);
    assert_eq!(files.len(), 1, "{files:?}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&files[0]).unwrap()).unwrap();
    assert_eq!(v["format"], 1);
    assert_eq!(v["label"], "first");
    assert!(v["time"].as_str().unwrap().ends_with('Z'));
    assert_eq!(v["config"]["runs"], 1);
    assert_eq!(v["config"]["zones"], "whole");
    let verdicts: Vec<bool> = v["requirements"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["pass"].as_bool().unwrap())
        .collect();
    assert_eq!(verdicts, [true, false, true]);
    // The target's identity: the file system and the disk under it.
    assert!(
        v["identity"]["file_system"]["type"].is_string(),
        "{}",
        v["identity"]
    );
    assert!(
        v["identity"]["disk"]["device"].is_string(),
        "{}",
        v["identity"]
    );
    // Every timed figure has the client's CPU beside it.
    let results = v["results"].as_array().unwrap();
    assert!(results.len() >= 30, "{}", results.len());
    for r in results.iter().filter(|r| r["unit"] != "files/s") {
        assert!(r["cpu"].as_f64().is_some_and(|c| c >= 0.0), "{r}");
        assert!(r["client_bound"].is_boolean(), "{r}");
    }
    // One byte per system call: the client is the bound, and it says so.
    assert_eq!(result(&v, "char_write")["client_bound"], true);
    assert!(v["config"]["data_prepare_mbs"].as_f64().unwrap() > 1000.0);
    // The seeds' streams figures, defined: scaling is aggregate / one.
    let one = result(&v, "streams_write_one")["value"].as_f64().unwrap();
    let agg = result(&v, "streams_write")["value"].as_f64().unwrap();
    let scaling = result(&v, "streams_write_scaling")["value"]
        .as_f64()
        .unwrap();
    assert!((scaling - agg / one).abs() < 1e-6 * scaling.max(1.0));

    // A second run, of two rounds each, to compare with.
    let o = raidkit(&[
        "bench", target, "--quick", "--tests", "dd", "--runs", "2", "--record", rec_s, "--label",
        "second",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let files = records(&rec);
    assert_eq!(files.len(), 2);
    let (a, b) = (files[0].to_str().unwrap(), files[1].to_str().unwrap());
    let o = ok(&["bench", "compare", a, b]);
    let text = String::from_utf8_lossy(&o.stdout);
    let row = text
        .lines()
        .find(|l| l.starts_with("seq_write all"))
        .unwrap_or_else(|| panic!("{text}"));
    // One run in the first record: the spread is unknown, and said so.
    assert!(row.trim_end().ends_with('?'), "{row}");
    let o = ok(&["bench", "compare", a, b, "--json"]);
    let c: Value = serde_json::from_slice(&o.stdout).unwrap();
    let seq = c["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["result"] == "seq_write all")
        .unwrap();
    let ratio = seq["runs"][1]["ratio"].as_f64().unwrap();
    let (va, vb) = (
        seq["runs"][0]["value"].as_f64().unwrap(),
        seq["runs"][1]["value"].as_f64().unwrap(),
    );
    assert!((ratio - vb / va).abs() < 1e-9, "{seq}");
    // Not a record: a clear error.
    let junk = dir.path().join("junk.json");
    std::fs::write(&junk, "{\"not\": 1}").unwrap();
    fails(
        &["bench", "compare", a, junk.to_str().unwrap()],
        "not a raidkit bench record",
    );

    // The evaluation sheet, as a browser shows it.
    let o = ok(&["bench", "report", rec_s]);
    let page = rec.join("report.html");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        page.to_str().unwrap()
    );
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        !html.contains("<script") && !html.contains("src="),
        "not self-contained"
    );
    let profile = dir.path().join("chromium");
    let p = format!("--user-data-dir={}", profile.display());
    let url = format!("file://{}", page.display());
    let dom = tool(
        "timeout",
        &[
            "60",
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            &p,
            "--dump-dom",
            &url,
        ],
    );
    let dom = String::from_utf8_lossy(&dom.stdout);
    for needle in [
        "Run 1: first",
        "Run 2: second",
        ">FAIL<",
        ">PASS<",
        "<svg",
        "seq_write all",
    ] {
        assert!(dom.contains(needle), "{needle} not in the rendered page");
    }
}

/// Each member alone, then all together, read-only; the one that reads at
/// a quarter of its peers' rate is named. Members: nbdkit exports of files,
/// three limited to 400 Mbit/s and one to 100 Mbit/s.
#[test]
fn members_are_checked_alone_then_together_and_the_slow_one_is_named() {
    let dir = tmp();
    let mut servers = Vec::new();
    let mut uris = Vec::new();
    let mut sums = Vec::new();
    for i in 0..4 {
        let f = dir.path().join(format!("m{i}.img"));
        let data: Vec<u8> = (0..24u32 << 20)
            .map(|x| (x.wrapping_mul(2654435761) >> 13) as u8 ^ i as u8)
            .collect();
        std::fs::write(&f, &data).unwrap();
        sums.push(data);
        let sock = dir.path().join(format!("m{i}.sock"));
        let rate = if i == 2 { "rate=100M" } else { "rate=400M" };
        servers.push(Guarded::spawn(
            std::process::Command::new("nbdkit")
                .args(["-f", "-U", sock.to_str().unwrap(), "--filter=rate", "file"])
                .arg(&f)
                .args([rate, "burstiness=0.01"]),
        ));
        uris.push(format!("nbd+unix:///?socket={}", sock.display()));
    }
    for u in &uris {
        wait_for(&format!("{u} to serve"), 30, || {
            try_tool("timeout", &["5", "nbdinfo", "--size", u])
                .status
                .success()
        });
    }
    let mut a = vec![
        "bench",
        "members",
        "--runs",
        "1",
        "--seconds",
        "0.4",
        "--qd",
        "1,8",
        "--json",
    ];
    a.extend(uris.iter().map(|s| s.as_str()));
    let v: Value = serde_json::from_slice(&ok(&a).stdout).unwrap();
    let results = v["results"].as_array().unwrap();
    let get = |m: &str, test: &str, zone: &str| {
        results
            .iter()
            .find(|r| r["member"] == m && r["test"] == test && r["zone"] == zone)
            .unwrap_or_else(|| panic!("no {test} {zone} for {m}"))["value"]
            .as_f64()
            .unwrap()
    };
    for u in &uris {
        for z in ["outer", "middle", "inner"] {
            assert!(get(u, "seq_read", z) > 0.0);
        }
        assert!(get(u, "seq_read_together", "outer") > 0.0);
        for qd in [1, 8] {
            assert!(results
                .iter()
                .any(|r| r["member"] == u.as_str() && r["test"] == "randread_4k" && r["qd"] == qd));
        }
    }
    let slow = get(&uris[2], "seq_read", "outer");
    let fast = get(&uris[0], "seq_read", "outer");
    assert!(slow < fast / 2.0, "slow {slow} fast {fast}");
    // The slow one, and only it, is named, on every sequential zone.
    let outliers = v["outliers"].as_array().unwrap();
    for o in outliers.iter().filter(|o| o["test"] == "seq_read") {
        assert_eq!(o["member"], uris[2].as_str(), "{o}");
        assert!(o["ratio"].as_f64().unwrap() < 0.5, "{o}");
    }
    assert_eq!(
        outliers.iter().filter(|o| o["test"] == "seq_read").count(),
        3,
        "{outliers:?}"
    );
    let agg = results
        .iter()
        .find(|r| r["test"] == "seq_read_aggregate")
        .unwrap();
    assert!(agg["value"].as_f64().unwrap() > fast, "{agg}");
    drop(servers);
    // Read-only: the members' bytes are as they were.
    for (i, data) in sums.iter().enumerate() {
        let now = std::fs::read(dir.path().join(format!("m{i}.img"))).unwrap();
        assert!(now == *data, "member {i} changed");
    }

    // --write: drives not yet in an array, overwritten only when asked.
    let blank: Vec<String> = (0..2)
        .map(|i| {
            let f = dir.path().join(format!("blank{i}.img"));
            std::fs::write(&f, vec![0u8; 12 << 20]).unwrap();
            f.display().to_string()
        })
        .collect();
    fails(
        &["bench", "members", "--write", &blank[0], &blank[1]],
        "--destroy-data",
    );
    assert!(std::fs::read(&blank[0]).unwrap().iter().all(|&b| b == 0));
    let o = ok(&[
        "bench",
        "members",
        "--write",
        "--destroy-data",
        "--runs",
        "1",
        "--seconds",
        "0.1",
        "--qd",
        "4",
        "--json",
        &blank[0],
        &blank[1],
    ]);
    let w: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(w["config"]["read_only"], false);
    let wr = w["results"].as_array().unwrap();
    for m in &blank {
        for z in ["outer", "middle", "inner"] {
            assert!(wr.iter().any(|r| r["member"] == m.as_str()
                && r["test"] == "seq_write"
                && r["zone"] == z
                && r["value"].as_f64().unwrap() > 0.0));
        }
        assert!(wr
            .iter()
            .any(|r| r["member"] == m.as_str() && r["test"] == "randwrite_4k" && r["qd"] == 4));
        // Written: incompressible data where zeroes were.
        assert!(std::fs::read(m).unwrap().iter().any(|&b| b != 0));
    }

    // --members-first: an array's members, then the array, in one record.
    let ms = members(dir.path(), 3);
    create("5", &ms, "12M");
    let before: Vec<Vec<u8>> = ms.iter().map(|m| std::fs::read(m).unwrap()).collect();
    let spec = format!("array[{}]", ms.join(","));
    let o = ok(&[
        "bench",
        &spec,
        "--members-first",
        "--tests",
        "seq_read",
        "--runs",
        "1",
        "--seconds",
        "0.1",
        "--json",
    ]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let mf = v["members_first"]["results"].as_array().unwrap();
    for m in &ms {
        assert!(mf
            .iter()
            .any(|r| r["member"] == m.as_str() && r["test"] == "seq_read"));
    }
    assert_eq!(v["array"]["start"]["level"], "raid5");
    assert_eq!(v["array"]["start"]["degraded"], false);
    assert_eq!(v["array"]["end"]["state"], "optimal");
    assert!(result(&v, "seq_read")["value"].as_f64().unwrap() > 0.0);
    for (m, b) in ms.iter().zip(&before) {
        assert!(
            std::fs::read(m).unwrap() == *b,
            "{m} changed by a read-only bench"
        );
    }
    // No members: a usage error (clap's status 2).
    let o = raidkit_refused(&["bench", "members"]);
    assert_eq!(o.status.code(), Some(2));
    fails(
        &["bench", &ms[0], "--members-first", "--tests", "seq_read"],
        "--members-first needs an array",
    );
}

#[test]
fn an_interrupted_sweep_exits_with_an_error_and_leaves_no_member_files() {
    let dir = tmp();
    let d = dir.path().display().to_string();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_raidkit"));
    cmd.args([
        "bench",
        "sweep",
        "--levels",
        "5",
        "--members",
        "4..6",
        "--size",
        "64M",
        "--seconds",
        "2",
        "--runs",
        "3",
        "--dir",
        &d,
    ])
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null());
    let mut g = Guarded::spawn(&mut cmd);
    let files = || {
        std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|n| n.starts_with("raidkit-sweep-"))
            .count()
    };
    wait_for("the sweep's member files", 30, || files() > 0);
    // SAFETY: kill(2) on our own child, not yet reaped.
    unsafe { libc::kill(g.id() as i32, libc::SIGINT) };
    let mut status = None;
    wait_for("the sweep to exit after SIGINT", 30, || {
        status = g.try_wait();
        status.is_some()
    });
    let status = status.unwrap();
    assert!(!status.success(), "{status:?}");
    assert_eq!(status.code(), Some(1), "an error, not killed by the signal");
    assert_eq!(files(), 0, "member files left behind");
}
