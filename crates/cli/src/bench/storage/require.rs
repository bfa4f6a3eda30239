//! `--require`: qualification thresholds, judged against the results of
//! a run, for scripts and procurement sheets.
//!
//! A requirement is `TEST[@QUALIFIER...] OP VALUE[UNIT]`, several joined by
//! commas: `seq_write>=10MB/s,randread_4k@qd32>=5000,seq_read@inner>=80MB/s`.
//! - TEST: a result's name as the results table prints it (`seq_write`,
//!   `randread_4k`, `streams_write_per_stream`, `block_read`, ...);
//! - qualifiers narrow the results judged: `qdN` (queue depth), a zone
//!   (`outer`, `middle`, `inner`, `all`), `xK` (streams);
//! - OP: `>=`, `>`, `<=`, `<`;
//! - VALUE: a number with an optional unit: `MB/s`, `GB/s`, `KB/s`, `IOPS`,
//!   `seeks/s`, `files/s`, `%`, `x`; `k` after the number multiplies by
//!   1000 (`5k` IOPS). A unit must be the results' own (MB/s, GB/s and
//!   KB/s convert); without one, the results' unit is meant.
//!
//! Every result the requirement names must meet it (every zone, so the
//! slowest part of a disk decides, as a buyer would want), judged on the
//! median of its runs. A requirement that names no result fails: a
//! threshold nobody measured is not met.

use anyhow::{anyhow, bail, Result};
use serde_json::{json, Value};

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Requirement {
    pub text: String,
    test: String,
    qd: Option<u64>,
    zone: Option<String>,
    streams: Option<u64>,
    op: Op,
    /// The threshold in `unit`.
    value: f64,
    /// None: the results' own unit.
    unit: Option<&'static str>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    Ge,
    Gt,
    Le,
    Lt,
}

impl Op {
    fn holds(self, a: f64, b: f64) -> bool {
        match self {
            Op::Ge => a >= b,
            Op::Gt => a > b,
            Op::Le => a <= b,
            Op::Lt => a < b,
        }
    }
}

/// Units a value may carry, with their factor to the results' unit.
const UNITS: [(&str, &str, f64); 8] = [
    ("MB/s", "MB/s", 1.0),
    ("GB/s", "MB/s", 1000.0),
    ("KB/s", "MB/s", 0.001),
    ("IOPS", "IOPS", 1.0),
    ("seeks/s", "seeks/s", 1.0),
    ("files/s", "files/s", 1.0),
    ("%", "%", 1.0),
    ("x", "x", 1.0),
];

pub(crate) fn parse(list: &str) -> Result<Vec<Requirement>> {
    let reqs: Vec<Requirement> = list
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(parse_one)
        .collect::<Result<_>>()?;
    if reqs.is_empty() {
        bail!("--require is empty");
    }
    Ok(reqs)
}

fn parse_one(text: &str) -> Result<Requirement> {
    let err = |why: &str| {
        anyhow!("--require '{text}': {why} (the form is TEST[@qdN][@ZONE][@xK]>=VALUE[UNIT], such as seq_write>=10MB/s or randread_4k@qd32>=5000)")
    };
    let (at, op, oplen) = ["<=", ">=", "<", ">"]
        .iter()
        .filter_map(|o| text.find(o).map(|i| (i, *o, o.len())))
        .min_by_key(|(i, _, len)| (*i, std::cmp::Reverse(*len)))
        .ok_or_else(|| err("no comparison (>=, >, <=, <)"))?;
    let op = match op {
        ">=" => Op::Ge,
        ">" => Op::Gt,
        "<=" => Op::Le,
        _ => Op::Lt,
    };
    let (name, rhs) = (text[..at].trim(), text[at + oplen..].trim());
    let mut parts = name.split('@');
    let test = parts.next().unwrap_or("").trim();
    if test.is_empty() || !test.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(err("no test name before the comparison"));
    }
    let (mut qd, mut zone, mut streams) = (None, None, None);
    for q in parts.map(str::trim) {
        if let Some(n) = q.strip_prefix("qd").and_then(|n| n.parse().ok()) {
            qd = Some(n);
        } else if let Some(n) = q.strip_prefix('x').and_then(|n| n.parse().ok()) {
            streams = Some(n);
        } else if ["outer", "middle", "inner", "all"].contains(&q) {
            zone = Some(q.to_string());
        } else {
            return Err(err(&format!(
                "unknown qualifier '@{q}' (qdN, xK, outer, middle, inner, all)"
            )));
        }
    }
    let num_end = rhs
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+' || c == 'e'))
        .unwrap_or(rhs.len());
    let mut value: f64 = rhs[..num_end]
        .parse()
        .map_err(|_| err("no number after the comparison"))?;
    if !value.is_finite() {
        return Err(err("the number is not finite"));
    }
    let mut rest = rhs[num_end..].trim();
    if let Some(r) = rest
        .strip_prefix(['k', 'K'])
        .filter(|r| !r.starts_with("B/s"))
    {
        value *= 1000.0;
        rest = r.trim();
    }
    let unit = if rest.is_empty() {
        None
    } else {
        let (_, u, factor) = UNITS
            .iter()
            .find(|(name, _, _)| name.eq_ignore_ascii_case(rest))
            .ok_or_else(|| {
                err(&format!(
                    "unknown unit '{rest}' (known: {})",
                    UNITS.map(|u| u.0).join(", ")
                ))
            })?;
        value *= factor;
        Some(*u)
    };
    Ok(Requirement {
        text: text.to_string(),
        test: test.to_string(),
        qd,
        zone,
        streams,
        op,
        value,
        unit,
    })
}

/// One requirement judged: PASS or FAIL, and why.
pub(crate) struct Verdict {
    pub pass: bool,
    pub line: String,
    pub json: Value,
}

/// Judge `r` against the results (the JSON objects the report writes).
pub(crate) fn judge(r: &Requirement, results: &[Value]) -> Verdict {
    let matched: Vec<&Value> = results
        .iter()
        .filter(|v| v["test"] == r.test.as_str())
        .filter(|v| r.qd.is_none_or(|q| v["qd"].as_u64() == Some(q)))
        .filter(|v| r.zone.as_deref().is_none_or(|z| v["zone"] == z))
        .filter(|v| r.streams.is_none_or(|k| v["streams"].as_u64() == Some(k)))
        .collect();
    let fail = |why: String| Verdict {
        pass: false,
        line: format!("FAIL  {}: {why}", r.text),
        json: json!({"requirement": r.text, "pass": false, "why": why}),
    };
    if matched.is_empty() {
        return fail("no such result was measured in this run".into());
    }
    let unit = matched[0]["unit"].as_str().unwrap_or("");
    if let Some(u) = r.unit.filter(|u| *u != unit) {
        return fail(format!("the results are in {unit}, the requirement in {u}"));
    }
    // The result furthest on the wrong side decides (the worst zone).
    let worst = matched
        .iter()
        .min_by(|a, b| {
            let (x, y) = (
                a["value"].as_f64().unwrap_or(0.0),
                b["value"].as_f64().unwrap_or(0.0),
            );
            match r.op {
                Op::Ge | Op::Gt => x.total_cmp(&y),
                Op::Le | Op::Lt => y.total_cmp(&x),
            }
        })
        .expect("matched is not empty");
    let v = worst["value"].as_f64().unwrap_or(f64::NAN);
    let pass = r.op.holds(v, r.value);
    let mut place = String::new();
    for k in ["zone", "qd", "streams", "client"] {
        if let Some(x) = worst.get(k).filter(|x| !x.is_null()) {
            place.push_str(&format!(
                " {k} {}",
                x.as_str().map(str::to_string).unwrap_or(x.to_string())
            ));
        }
    }
    let of = if matched.len() > 1 {
        format!(", the worst of {} results", matched.len())
    } else {
        String::new()
    };
    let line = format!(
        "{}  {}: measured {v:.1} {unit}{}{of}",
        if pass { "PASS" } else { "FAIL" },
        r.text,
        if place.is_empty() {
            String::new()
        } else {
            format!(" ({})", place.trim())
        }
    );
    Verdict {
        pass,
        line,
        json: json!({"requirement": r.text, "pass": pass, "value": v, "unit": unit, "results": matched.len()}),
    }
}

/// Raised when a requirement failed: the results were printed, and the
/// process exits with status 3 (1 is for runs that did not complete).
#[derive(Debug)]
pub(crate) struct Failed {
    pub failed: usize,
    pub of: usize,
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} of {} requirements failed", self.failed, self.of)
    }
}

impl std::error::Error for Failed {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requirements_parse_with_units_and_qualifiers() {
        let r = parse("seq_write>=10MB/s, randread_4k@qd32>=5k ,seq_read@inner>0.08GB/s").unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!(
            (r[0].op, r[0].value, r[0].unit),
            (Op::Ge, 10.0, Some("MB/s"))
        );
        assert_eq!((r[1].qd, r[1].value, r[1].unit), (Some(32), 5000.0, None));
        assert_eq!(r[2].zone.as_deref(), Some("inner"));
        assert_eq!(r[2].op, Op::Gt);
        assert!((r[2].value - 80.0).abs() < 1e-9);
        let r = parse("streams_write_overhead@x2<=20%").unwrap();
        assert_eq!((r[0].streams, r[0].op, r[0].value), (Some(2), Op::Le, 20.0));
        for bad in [
            "",
            "seq_write",
            "seq_write>=",
            ">=5",
            "seq_write>=5furlongs",
            "seq_write@qd>=5",
            "seq write>=5",
        ] {
            assert!(parse(bad).is_err(), "{bad} parsed");
        }
    }

    #[test]
    fn the_worst_matching_result_decides() {
        let results = vec![
            json!({"test": "seq_read", "zone": "outer", "value": 120.0, "unit": "MB/s"}),
            json!({"test": "seq_read", "zone": "inner", "value": 60.0, "unit": "MB/s"}),
            json!({"test": "randread_4k", "zone": "all", "qd": 32, "value": 4000.0, "unit": "IOPS"}),
        ];
        let j = |t: &str| judge(&parse(t).unwrap()[0], &results);
        assert!(j("seq_read>=50MB/s").pass);
        assert!(!j("seq_read>=80MB/s").pass, "the inner zone is below");
        assert!(j("seq_read@outer>=80MB/s").pass);
        assert!(j("seq_read<=130MB/s").pass);
        assert!(!j("seq_read<100").pass, "the outer zone is above");
        assert!(!j("randread_4k@qd32>=5000").pass);
        assert!(j("randread_4k@qd32>=3.5k").pass);
        assert!(!j("randread_4k@qd1>=1").pass, "not measured");
        assert!(!j("randread_4k>=1MB/s").pass, "wrong unit");
        assert!(!j("block_write>=1").pass, "not measured");
    }
}
