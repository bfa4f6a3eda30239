//! The permanent record: every run's JSON appended to a results directory
//! (`--record DIR`), runs compared side by side (`raidkit bench compare`),
//! and one self-contained HTML evaluation sheet of a directory
//! (`raidkit bench report`).
//!
//! A record is the JSON `--json` prints, with `time`, `label`, the target's
//! `identity` and, for arrays, their state at the start and the end of the
//! run. Its `format` field is 1; fields are only ever added.

use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The record format's version.
pub(super) const FORMAT: u64 = 1;

/// Write `doc` into `dir` as a file of its own; its path.
pub(super) fn save(dir: &Path, doc: &Value) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let time = doc["time"].as_str().unwrap_or("0000-00-00T00:00:00Z");
    let stamp: String = time.chars().filter(|c| c.is_ascii_alphanumeric()).collect();
    let what = doc["label"]
        .as_str()
        .or(doc["config"]["target"].as_str())
        .unwrap_or("run");
    let slug: String = what
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect::<String>()
        .split('-')
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("-");
    let slug = &slug[..slug.len().min(48)];
    for n in 0.. {
        let name = if n == 0 {
            format!("{stamp}-{slug}.json")
        } else {
            format!("{stamp}-{slug}-{n}.json")
        };
        let path = dir.join(name);
        // create_new: a record is never overwritten, even by a run in the
        // same second.
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(mut f) => {
                use std::io::Write;
                f.write_all(serde_json::to_string_pretty(doc)?.as_bytes())?;
                f.write_all(b"\n")?;
                f.sync_all()?;
                return Ok(path);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("writing {}", path.display())),
        }
    }
    unreachable!("some name is free")
}

/// A record read back.
pub(crate) struct Run {
    pub path: PathBuf,
    pub doc: Value,
}

pub(crate) fn load(path: &Path) -> Result<Run> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let doc: Value = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a raidkit bench record (bad JSON)", path.display()))?;
    if !doc["results"].is_array() || !doc["config"].is_object() {
        bail!(
            "{}: not a raidkit bench record (no config and results)",
            path.display()
        );
    }
    Ok(Run {
        path: path.to_path_buf(),
        doc,
    })
}

/// Every record in a directory, oldest first.
pub(crate) fn load_dir(dir: &Path) -> Result<Vec<Run>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    let mut runs: Vec<Run> = paths.iter().map(|p| load(p)).collect::<Result<_>>()?;
    runs.sort_by(|a, b| {
        a.doc["time"]
            .as_str()
            .unwrap_or("")
            .cmp(b.doc["time"].as_str().unwrap_or(""))
    });
    if runs.is_empty() {
        bail!("{}: no records (*.json) in it", dir.display());
    }
    Ok(runs)
}

/// The name of a result row: test and its qualifiers.
pub(crate) fn key(r: &Value) -> String {
    let mut k = r["test"].as_str().unwrap_or("?").to_string();
    if let Some(m) = r["member"].as_str() {
        k = format!("{m}: {k}");
    }
    if let Some(z) = r["zone"].as_str() {
        let _ = write!(k, " {z}");
    }
    if let Some(q) = r["qd"].as_u64() {
        let _ = write!(k, " qd{q}");
    }
    if let Some(s) = r["streams"].as_u64() {
        let _ = write!(k, " x{s}");
    }
    if let Some(c) = r["client"].as_u64() {
        let _ = write!(k, " client {c}");
    }
    k
}

/// Row keys in first-seen order across runs.
fn keys(runs: &[Run]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for run in runs {
        for r in run.doc["results"].as_array().into_iter().flatten() {
            let k = key(r);
            if !out.iter().any(|(x, _)| *x == k) {
                out.push((k, r["unit"].as_str().unwrap_or("").to_string()));
            }
        }
    }
    out
}

fn find<'a>(run: &'a Run, k: &str) -> Option<&'a Value> {
    run.doc["results"].as_array()?.iter().find(|r| key(r) == k)
}

fn num(r: &Value, k: &str) -> f64 {
    r[k].as_f64().unwrap_or(f64::NAN)
}

/// How a result compares with the first run's.
#[derive(Debug, PartialEq)]
pub(crate) enum Difference {
    /// One of the two has a single run: no spread to judge by.
    Unknown,
    /// The two runs' min–max ranges overlap: the difference is noise.
    WithinSpread,
    /// They do not: the difference exceeds the runs' own spread.
    Beyond,
}

pub(crate) fn difference(base: &Value, other: &Value) -> Difference {
    if base["runs"].as_u64().unwrap_or(1) < 2 || other["runs"].as_u64().unwrap_or(1) < 2 {
        return Difference::Unknown;
    }
    let (a0, a1, b0, b1) = (
        num(base, "min"),
        num(base, "max"),
        num(other, "min"),
        num(other, "max"),
    );
    if a1 < b0 || b1 < a0 {
        Difference::Beyond
    } else {
        Difference::WithinSpread
    }
}

fn title(run: &Run) -> String {
    run.doc["label"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| {
            run.path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default()
        })
}

/// `raidkit bench compare A.json B.json ...`
pub fn compare(files: &[PathBuf], as_json: bool) -> Result<()> {
    if files.len() < 2 {
        bail!("give at least two records to compare");
    }
    let runs: Vec<Run> = files.iter().map(|p| load(p)).collect::<Result<_>>()?;
    let rows = keys(&runs);
    if as_json {
        let out: Vec<Value> = rows
            .iter()
            .map(|(k, unit)| {
                let base = find(&runs[0], k);
                let cols: Vec<Value> = runs
                    .iter()
                    .map(|run| match (find(run, k), base) {
                        (Some(r), Some(b)) => serde_json::json!({
                            "value": r["value"], "min": r["min"], "max": r["max"], "runs": r["runs"],
                            "ratio": num(r, "value") / num(b, "value"),
                            "difference": format!("{:?}", difference(b, r)),
                        }),
                        (Some(r), None) => serde_json::json!({"value": r["value"], "min": r["min"], "max": r["max"], "runs": r["runs"]}),
                        _ => Value::Null,
                    })
                    .collect();
                serde_json::json!({"result": k, "unit": unit, "runs": cols})
            })
            .collect();
        let names: Vec<String> = runs.iter().map(|r| r.path.display().to_string()).collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({"records": names, "results": out}))?
        );
        return Ok(());
    }
    for (i, run) in runs.iter().enumerate() {
        println!(
            "[{}] {} ({}, {}, {} run(s) each)",
            i + 1,
            run.path.display(),
            run.doc["config"]["target"].as_str().unwrap_or("?"),
            run.doc["time"].as_str().unwrap_or("time unknown"),
            run.doc["config"]["runs"]
        );
    }
    println!("ratio: against [1]; '*' the difference exceeds both runs' spread (their min-max ranges do not overlap), '~' it is within it, '?' one side has a single run");
    let mut head = format!("{:<34} {:<8}", "result", "unit");
    for i in 0..runs.len() {
        let _ = write!(head, " {:>12}", format!("[{}]", i + 1));
        if i > 0 {
            let _ = write!(head, " {:>7}", "ratio");
        }
    }
    println!("{head}");
    for (k, unit) in &rows {
        let base = find(&runs[0], k);
        let mut line = format!("{k:<34} {unit:<8}");
        for (i, run) in runs.iter().enumerate() {
            match find(run, k) {
                Some(r) => {
                    let _ = write!(line, " {:>12.1}", num(r, "value"));
                    if i > 0 {
                        match base {
                            Some(b) => {
                                let mark = match difference(b, r) {
                                    Difference::Beyond => '*',
                                    Difference::WithinSpread => '~',
                                    Difference::Unknown => '?',
                                };
                                let _ = write!(
                                    line,
                                    " {:>6.2}{mark}",
                                    num(r, "value") / num(b, "value")
                                );
                            }
                            None => {
                                let _ = write!(line, " {:>7}", "-");
                            }
                        }
                    }
                }
                None => {
                    let _ = write!(line, " {:>12}", "-");
                    if i > 0 {
                        let _ = write!(line, " {:>7}", "-");
                    }
                }
            }
        }
        println!("{line}");
    }
    Ok(())
}

fn esc(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => esc(s),
        other => esc(&other.to_string()),
    }
}

/// `raidkit bench report DIR`: one self-contained HTML page (no script,
/// no outside file) with every record of DIR.
pub fn report(dir: &Path, output: Option<&Path>) -> Result<PathBuf> {
    let runs = load_dir(dir)?;
    let out = output
        .map(Path::to_path_buf)
        .unwrap_or_else(|| dir.join("report.html"));
    let mut h = String::new();
    let _ = write!(
        h,
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>raidkit bench: evaluation sheet</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
th, td {{ border: 1px solid #bbb; padding: 0.25em 0.6em; text-align: right; }}
th:first-child, td:first-child {{ text-align: left; }}
.pass {{ color: #176e1a; font-weight: bold; }} .fail {{ color: #b00020; font-weight: bold; }}
.beyond {{ background: #fff3c4; }} .note {{ color: #555; }}
table.info td {{ text-align: left; }}
</style></head><body>
<h1>raidkit bench: evaluation sheet</h1>
<p>{} run(s) recorded in <code>{}</code>. Figures are medians of each test's runs; min and max give their spread.</p>
"#,
        runs.len(),
        esc(&dir.display().to_string())
    );
    // All runs side by side.
    let rows = keys(&runs);
    let _ = write!(
        h,
        "<h2 id=\"summary\">All runs side by side</h2>\n<p class=\"note\">Ratio against run 1; a shaded cell differs from run 1 by more than both runs' spread.</p>\n<table><tr><th>result</th><th>unit</th>"
    );
    for (i, run) in runs.iter().enumerate() {
        let _ = write!(
            h,
            "<th><a href=\"#run{}\">{}</a></th>",
            i + 1,
            esc(&format!("{}: {}", i + 1, title(run)))
        );
    }
    h.push_str("</tr>\n");
    for (k, unit) in &rows {
        let base = find(&runs[0], k);
        let _ = write!(h, "<tr><td>{}</td><td>{}</td>", esc(k), esc(unit));
        for run in &runs {
            match find(run, k) {
                Some(r) => {
                    let (class, ratio) = match base {
                        Some(b) if !std::ptr::eq(run, &runs[0]) => (
                            if difference(b, r) == Difference::Beyond {
                                " class=\"beyond\""
                            } else {
                                ""
                            },
                            format!(" ({:.2}×)", num(r, "value") / num(b, "value")),
                        ),
                        _ => ("", String::new()),
                    };
                    let _ = write!(h, "<td{class}>{:.1}{ratio}</td>", num(r, "value"));
                }
                None => h.push_str("<td>-</td>"),
            }
        }
        h.push_str("</tr>\n");
    }
    h.push_str("</table>\n");
    for (i, run) in runs.iter().enumerate() {
        let d = &run.doc;
        let c = &d["config"];
        let _ = write!(
            h,
            "<h2 id=\"run{}\">Run {}: {}</h2>\n<table class=\"info\">",
            i + 1,
            i + 1,
            esc(&title(run))
        );
        let machine = &c["machine"];
        let id = &d["identity"];
        let disk = if id["disk"].is_object() {
            &id["disk"]
        } else {
            id
        };
        for (name, v) in [
            ("record", Value::String(run.path.display().to_string())),
            ("time", d["time"].clone()),
            ("target", c["target"].clone()),
            ("kind", c["kind"].clone()),
            ("working set (bytes)", c["size"].clone()),
            ("direct I/O", c["direct_io"].clone()),
            ("runs per test", c["runs"].clone()),
            ("device", disk["device"].clone()),
            ("model", disk["model"].clone()),
            ("serial", disk["serial"].clone()),
            ("firmware", disk["firmware"].clone()),
            ("write cache", disk["write_cache"].clone()),
            ("array level", d["array"]["start"]["level"].clone()),
            ("array state (start / end)", {
                let (s, e) = (&d["array"]["start"]["state"], &d["array"]["end"]["state"]);
                if s.is_null() {
                    Value::Null
                } else {
                    Value::String(format!(
                        "{} / {}",
                        s.as_str().unwrap_or("?"),
                        e.as_str().unwrap_or("?")
                    ))
                }
            }),
            ("machine", {
                Value::String(format!(
                    "{} CPUs, {} bytes RAM, {}, kernel {}",
                    machine["cpus"],
                    machine["ram"],
                    machine["cpu"].as_str().unwrap_or("CPU unknown"),
                    machine["kernel"].as_str().unwrap_or("?")
                ))
            }),
            ("raidkit", c["raidkit"].clone()),
        ] {
            if !v.is_null() {
                let _ = write!(h, "<tr><th>{name}</th><td>{}</td></tr>", cell(&v));
            }
        }
        h.push_str("</table>\n");
        if let Some(reqs) = d["requirements"].as_array().filter(|r| !r.is_empty()) {
            h.push_str("<h3>Requirements</h3>\n<table><tr><th>requirement</th><th>verdict</th><th>measured</th></tr>\n");
            for r in reqs {
                let pass = r["pass"] == true;
                let measured = match r["value"].as_f64() {
                    Some(v) => format!("{v:.1} {}", r["unit"].as_str().unwrap_or("")),
                    None => r["why"].as_str().unwrap_or("-").to_string(),
                };
                let _ = writeln!(
                    h,
                    "<tr><td>{}</td><td class=\"{}\">{}</td><td>{}</td></tr>",
                    cell(&r["requirement"]),
                    if pass { "pass" } else { "fail" },
                    if pass { "PASS" } else { "FAIL" },
                    esc(&measured)
                );
            }
            h.push_str("</table>\n");
        }
        h.push_str("<h3>Results</h3>\n<table><tr><th>result</th><th>median</th><th>unit</th><th>min</th><th>max</th><th>client %cpu</th></tr>\n");
        let results: Vec<Value> = d["results"].as_array().cloned().unwrap_or_default();
        for r in &results {
            let bound = if r["client_bound"] == true {
                " (client-bound)"
            } else {
                ""
            };
            let _ = writeln!(
                h,
                "<tr><td>{}</td><td>{:.1}</td><td>{}</td><td>{:.1}</td><td>{:.1}</td><td>{}{bound}</td></tr>",
                esc(&key(r)),
                num(r, "value"),
                cell(&r["unit"]),
                num(r, "min"),
                num(r, "max"),
                cell(&r["cpu"]),
            );
        }
        h.push_str("</table>\n");
        for unit in ["MB/s", "IOPS"] {
            let rs: Vec<&Value> = results.iter().filter(|r| r["unit"] == unit).collect();
            if !rs.is_empty() {
                h.push_str(&super::report::bars(
                    c["target"].as_str().unwrap_or("?"),
                    unit,
                    &rs,
                ));
            }
        }
        if let Some(notes) = d["notes"].as_array().filter(|n| !n.is_empty()) {
            h.push_str("<ul class=\"note\">");
            for n in notes {
                let _ = write!(h, "<li>{}</li>", cell(n));
            }
            h.push_str("</ul>\n");
        }
    }
    h.push_str("</body></html>\n");
    std::fs::write(&out, h).with_context(|| format!("writing {}", out.display()))?;
    Ok(out)
}
