//! `serve --http ADDR`: Prometheus metrics at `/metrics`, the status as
//! JSON at `/api/status` (what `raidkit status --json` prints), recent
//! events at `/api/events`, and a status page at `/` for people who would
//! rather look than read. Read-only: nothing here changes the array.
//!
//! Metric names follow node_exporter's md collector (`node_md_state`,
//! `node_md_disks`, `node_md_blocks`, `node_md_blocks_synced`) under a
//! `raidkit_` prefix, plus what it lacks: recovery and scrub progress and
//! rate, per-member bytes, operations, latency histograms and errors by
//! kind, NBD connections and requests. They are read from the array's own
//! counters at each scrape (a `Collector`), so serving metrics adds nothing
//! to the I/O path beyond the counters status already keeps.

use anyhow::{Context, Result};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use raidkit_array::Array;
use raidkit_nbd::server::Stats;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The status page (one file: HTML, CSS and the script that polls
/// `/api/status` and `/api/events` and draws the plots).
const PAGE: &str = include_str!("status.html");

/// One array the listener reports on.
pub struct SiteArray {
    /// Its NBD export name (`?array=` picks it, as do its name and UUID).
    pub export: String,
    pub array: Arc<Array>,
    pub stats: Arc<Stats>,
    /// The write-behind in front of it, if any.
    pub behind: Option<Arc<raidkit_member::WriteBehind>>,
    /// The status as `raidkit status --json` has it.
    pub status: Box<dyn Fn() -> Value + Send + Sync>,
}

/// What the listener serves: every array of the server, the first by
/// default.
pub struct Site {
    pub arrays: Vec<SiteArray>,
}

impl Site {
    /// The array a query's `array=` names (the first when it names none).
    fn pick(&self, query: &str) -> Option<&SiteArray> {
        let Some(want) = param(query, "array") else {
            return self.arrays.first();
        };
        self.arrays.iter().find(|a| {
            let sb = a.array.superblock();
            a.export == want || sb.name == want || sb.array_uuid.to_string() == want
        })
    }
}

/// A query parameter's value, percent-decoded.
fn param(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let v = kv.strip_prefix(key)?.strip_prefix('=')?;
        Some(
            percent_encoding::percent_decode_str(&v.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned(),
        )
    })
}

/// Listen on `addr` and serve until the process ends (a thread of its
/// own). Returns the address bound (port 0 picks one).
pub fn start(addr: &str, site: Site) -> Result<std::net::SocketAddr> {
    let server = tiny_http::Server::http(addr)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("cannot listen for HTTP on {addr}"))?;
    let bound = server
        .server_addr()
        .to_ip()
        .context("the HTTP listener has no IP address")?;
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Metrics {
        arrays: site
            .arrays
            .iter()
            .map(|a| (a.array.clone(), a.stats.clone(), a.behind.clone()))
            .collect(),
    }));
    std::thread::Builder::new()
        .name("http".into())
        .spawn(move || {
            for req in server.incoming_requests() {
                let resp = answer(&req, &site, &registry);
                if let Err(e) = req.respond(resp) {
                    tracing::debug!("http: answering failed: {e}");
                }
            }
        })
        .context("starting the HTTP thread")?;
    Ok(bound)
}

type Response = tiny_http::Response<std::io::Cursor<Vec<u8>>>;

fn reply(code: u16, kind: &str, body: Vec<u8>) -> Response {
    let header = tiny_http::Header::from_bytes(&b"Content-Type"[..], kind.as_bytes())
        .expect("a valid header");
    tiny_http::Response::from_data(body)
        .with_status_code(code)
        .with_header(header)
}

fn answer(req: &tiny_http::Request, site: &Site, registry: &Registry) -> Response {
    if *req.method() != tiny_http::Method::Get && *req.method() != tiny_http::Method::Head {
        return reply(405, "text/plain", b"read-only: GET only\n".to_vec());
    }
    let url = req.url();
    let (path, query) = url.split_once('?').unwrap_or((url, ""));
    match path {
        "/" | "/index.html" => reply(200, "text/html; charset=utf-8", PAGE.as_bytes().to_vec()),
        "/metrics" => {
            let mut out = String::new();
            match prometheus_client::encoding::text::encode(&mut out, registry) {
                Ok(()) => reply(
                    200,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    out.into_bytes(),
                ),
                Err(e) => reply(500, "text/plain", format!("{e}\n").into_bytes()),
            }
        }
        "/api/arrays" => reply(
            200,
            "application/json",
            serde_json::to_vec(&json!({
                "arrays": site.arrays.iter().map(|a| {
                    let sb = a.array.superblock();
                    json!({
                        "export": a.export,
                        "name": sb.name,
                        "uuid": sb.array_uuid.to_string(),
                        "state": a.array.state_name(),
                    })
                }).collect::<Vec<_>>()
            }))
            .unwrap_or_default(),
        ),
        "/api/status" | "/api/events" => {
            let Some(a) = site.pick(query) else {
                return reply(
                    404,
                    "text/plain",
                    b"no such array (see /api/arrays)\n".to_vec(),
                );
            };
            if path == "/api/status" {
                return reply(
                    200,
                    "application/json",
                    serde_json::to_vec(&(a.status)()).unwrap_or_default(),
                );
            }
            let after = param(query, "after").and_then(|v| v.parse::<u64>().ok());
            let ev = a.array.events();
            let (list, last) = match after {
                Some(n) => ev.after(n, std::time::Duration::ZERO),
                None => {
                    let recent = ev.recent(50);
                    let last = ev.after(u64::MAX, std::time::Duration::ZERO).1;
                    (recent, last)
                }
            };
            reply(
                200,
                "application/json",
                serde_json::to_vec(&json!({"events": list, "last": last})).unwrap_or_default(),
            )
        }
        _ => reply(
            404,
            "text/plain",
            b"not found: /, /metrics, /api/arrays, /api/status, /api/events\n".to_vec(),
        ),
    }
}

/// One array's sources: the array, its NBD counters, its write-behind.
type Sources = (
    Arc<Array>,
    Arc<Stats>,
    Option<Arc<raidkit_member::WriteBehind>>,
);

/// The metrics, read at each scrape, of every array (an `array` label
/// tells them apart).
#[derive(Debug)]
struct Metrics {
    arrays: Vec<Sources>,
}

/// Labels of one series.
type Labels = Vec<(String, String)>;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// One metric family of gauges or counters, each series with its labels.
struct Family {
    name: String,
    help: String,
    kind: MetricType,
    series: Vec<(Labels, f64)>,
}

/// A histogram series: labels, sum, count, (upper bound, cumulative count).
type HistSeries = (Labels, f64, u64, Vec<(f64, u64)>);

/// The families of a scrape, gathered array by array and then encoded
/// once each (a family's descriptor may appear only once).
#[derive(Default)]
struct Families {
    list: Vec<Family>,
    hist: Vec<HistSeries>,
}

impl Families {
    fn family(
        &mut self,
        name: &str,
        help: &str,
        kind: MetricType,
        series: &[(Labels, f64)],
    ) -> Result<(), std::fmt::Error> {
        match self.list.iter_mut().find(|f| f.name == name) {
            Some(f) => f.series.extend_from_slice(series),
            None => self.list.push(Family {
                name: name.to_string(),
                help: help.to_string(),
                kind,
                series: series.to_vec(),
            }),
        }
        Ok(())
    }

    fn encode(&self, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.list {
            let mut m = enc.encode_descriptor(&f.name, &f.help, None, f.kind)?;
            for (l, v) in &f.series {
                let e = m.encode_family(l)?;
                match f.kind {
                    MetricType::Counter => ConstCounter::new(*v).encode(e)?,
                    _ => ConstGauge::new(*v).encode(e)?,
                }
            }
        }
        let mut h = enc.encode_descriptor(
            "raidkit_member_operation_seconds",
            "Time each member operation took (every kind: data, metadata, journal)",
            None,
            MetricType::Histogram,
        )?;
        for (l, sum, count, buckets) in &self.hist {
            hist(h.encode_family(l)?, *sum, *count, buckets)?;
        }
        Ok(())
    }
}

impl Collector for Metrics {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut fams = Families::default();
        for (a, s, b) in &self.arrays {
            collect(&mut fams, a, s, b.as_deref())?;
        }
        fams.encode(&mut enc)
    }
}

/// One array's series.
fn collect(
    fams: &mut Families,
    a: &Array,
    s: &Stats,
    behind: Option<&raidkit_member::WriteBehind>,
) -> Result<(), std::fmt::Error> {
    {
        let sb = a.superblock();
        let name = sb.name.as_str();
        let arr = |extra: &[(&str, &str)]| {
            let mut l = labels(&[("array", name)]);
            l.extend(labels(extra));
            l
        };
        let state = a.state_name();
        let states = ["optimal", "degraded", "rebuilding", "reshaping", "failed"];
        fams.family(
            "raidkit_md_state",
            "Array state (node_md_state): 1 for the state it is in",
            MetricType::Gauge,
            &states
                .iter()
                .map(|s| (arr(&[("state", s)]), f64::from(u8::from(*s == state))))
                .collect::<Vec<_>>(),
        )?;
        let members = a.members_status();
        let member_states = ["active", "rebuilding", "faulty", "spare", "missing"];
        fams.family(
            "raidkit_md_disks",
            "Members by state (node_md_disks)",
            MetricType::Gauge,
            &member_states
                .iter()
                .map(|s| {
                    let n = members.iter().filter(|m| m.state == *s).count();
                    (arr(&[("state", s)]), n as f64)
                })
                .collect::<Vec<_>>(),
        )?;
        fams.family(
            "raidkit_md_disks_required",
            "Members the array has roles for (node_md_disks_required)",
            MetricType::Gauge,
            &[(arr(&[]), a.geometry().members() as f64)],
        )?;
        fams.family(
            "raidkit_md_size_bytes",
            "Capacity of the array in bytes (node_md_blocks in bytes)",
            MetricType::Gauge,
            &[(arr(&[]), a.capacity() as f64)],
        )?;
        let rec = a.recovery_status();
        let kinds = ["rebuild", "replace", "resync", "parity-resync", "scrub"];
        let per_kind = |f: &dyn Fn(&raidkit_array::RecoveryStatus) -> f64| -> Vec<(Labels, f64)> {
            kinds
                .iter()
                .map(|k| {
                    let v = rec.as_ref().filter(|r| r.kind == *k).map_or(0.0, f);
                    (arr(&[("kind", k)]), v)
                })
                .collect()
        };
        fams.family(
            "raidkit_md_recovery_progress_ratio",
            "Progress of the running recovery or scrub, 0 to 1 (0 when none of this kind runs)",
            MetricType::Gauge,
            &per_kind(&|r| r.progress),
        )?;
        fams.family(
            "raidkit_md_recovery_done_bytes",
            "Bytes done by the running recovery or scrub, earlier runs included (node_md_blocks_synced in bytes)",
            MetricType::Gauge,
            &per_kind(&|r| (r.bytes_before + r.bytes_done) as f64),
        )?;
        fams.family(
            "raidkit_md_recovery_rate_bytes_per_second",
            "Rate of the running recovery or scrub over the last seconds",
            MetricType::Gauge,
            &per_kind(&|r| r.rate),
        )?;
        fams.family(
            "raidkit_md_recovery_seconds_left",
            "Time the running recovery or scrub still needs at its rate (0 when unknown)",
            MetricType::Gauge,
            &per_kind(&|r| r.seconds_left.unwrap_or(0.0)),
        )?;
        if let Some(s) = a.last_scrub() {
            fams.family(
                "raidkit_scrub_last_repaired_blocks",
                "Blocks the last scrub repaired",
                MetricType::Gauge,
                &[(arr(&[]), s.repaired as f64)],
            )?;
            fams.family(
                "raidkit_scrub_last_unrepaired_blocks",
                "Blocks the last scrub found and could not repair",
                MetricType::Gauge,
                &[(arr(&[]), s.unrepaired as f64)],
            )?;
        }
        // Per member: open members only (a missing role has no counters).
        let open: Vec<_> = members
            .iter()
            .filter_map(|m| Some((m, m.path.as_deref()?, m.io.as_ref()?)))
            .collect();
        let member_labels = |m: &raidkit_array::MemberStatus, path: &str| {
            let role = m.role.map_or_else(|| "none".to_string(), |r| r.to_string());
            arr(&[("member", path), ("role", &role)])
        };
        let per_member = |f: &dyn Fn(&raidkit_array::MemberIo) -> u64| -> Vec<(Labels, f64)> {
            open.iter()
                .map(|(m, p, io)| (member_labels(m, p), f(io) as f64))
                .collect()
        };
        for (metric, help, f) in [
            (
                "raidkit_member_read_bytes",
                "Bytes read from the member's data area",
                (|io: &raidkit_array::MemberIo| io.read_bytes)
                    as fn(&raidkit_array::MemberIo) -> u64,
            ),
            (
                "raidkit_member_reads",
                "Reads of the member's data area",
                |io| io.read_ops,
            ),
            (
                "raidkit_member_written_bytes",
                "Bytes written to the member's data area",
                |io| io.write_bytes,
            ),
            (
                "raidkit_member_writes",
                "Writes to the member's data area",
                |io| io.write_ops,
            ),
        ] {
            fams.family(metric, help, MetricType::Counter, &per_member(&f))?;
        }
        let mut errors = Vec::new();
        for (m, p, _) in &open {
            let e = m.errors.unwrap_or_default();
            for (kind, n) in [
                ("read", e.read),
                ("write", e.write),
                ("checksum", e.checksum),
                ("timeout", e.timeout),
            ] {
                let mut l = member_labels(m, p);
                l.push(("kind".into(), kind.into()));
                errors.push((l, n as f64));
            }
        }
        fams.family(
            "raidkit_member_errors",
            "Errors seen on the member by kind: read, write, checksum (a block that disagrees with its checksum), timeout (an operation over the member timeout)",
            MetricType::Counter,
            &errors,
        )?;
        fams.family(
            "raidkit_member_state",
            "A member's state (active, rebuilding, faulty, spare): 1 for the state it is in",
            MetricType::Gauge,
            &open
                .iter()
                .flat_map(|(m, p, _)| {
                    ["active", "rebuilding", "faulty", "spare"].map(|s| {
                        let mut l = member_labels(m, p);
                        l.push(("state".into(), s.into()));
                        (l, f64::from(u8::from(m.state == s)))
                    })
                })
                .collect::<Vec<_>>(),
        )?;
        fams.family(
            "raidkit_member_slow",
            "1 while the member is much slower than its peers (SlowMember)",
            MetricType::Gauge,
            &open
                .iter()
                .map(|(m, p, _)| (member_labels(m, p), f64::from(u8::from(m.slow.is_some()))))
                .collect::<Vec<_>>(),
        )?;
        for (m, p, io) in &open {
            let l = member_labels(m, p);
            let mut buckets: Vec<(f64, u64)> = raidkit_array::LATENCY_BOUNDS_US
                .iter()
                .zip(&io.latency)
                .map(|(&b, &n)| (b as f64 / 1e6, n))
                .collect();
            buckets.push((f64::INFINITY, *io.latency.last().unwrap_or(&0)));
            fams.hist
                .push((l, io.busy_us as f64 / 1e6, io.ops, buckets));
        }
        let ld = |x: &std::sync::atomic::AtomicU64| x.load(Ordering::Relaxed) as f64;
        fams.family(
            "raidkit_nbd_connections",
            "NBD client connections open now",
            MetricType::Gauge,
            &[(arr(&[]), ld(&s.connections_active))],
        )?;
        fams.family(
            "raidkit_nbd_connections_accepted",
            "NBD client connections accepted since the server started",
            MetricType::Counter,
            &[(arr(&[]), ld(&s.connections_total))],
        )?;
        fams.family(
            "raidkit_nbd_connections_refused",
            "NBD client connections refused (over --max-connections)",
            MetricType::Counter,
            &[(arr(&[]), ld(&s.connections_refused))],
        )?;
        fams.family(
            "raidkit_nbd_requests",
            "NBD requests served, by type",
            MetricType::Counter,
            &[
                (arr(&[("type", "read")]), ld(&s.reads)),
                (arr(&[("type", "write")]), ld(&s.writes)),
                (arr(&[("type", "flush")]), ld(&s.flushes)),
                (arr(&[("type", "trim")]), ld(&s.trims)),
                (arr(&[("type", "write_zeroes")]), ld(&s.zeroes)),
            ],
        )?;
        fams.family(
            "raidkit_nbd_request_errors",
            "NBD requests answered with an error",
            MetricType::Counter,
            &[(arr(&[]), ld(&s.errors))],
        )?;
        fams.family(
            "raidkit_nbd_read_bytes",
            "Bytes clients read",
            MetricType::Counter,
            &[(arr(&[]), ld(&s.bytes_read))],
        )?;
        fams.family(
            "raidkit_nbd_written_bytes",
            "Bytes clients wrote",
            MetricType::Counter,
            &[(arr(&[]), ld(&s.bytes_written))],
        )?;
        if let Some(b) = behind {
            let c = b.counts();
            fams.family(
                "raidkit_write_behind_writes",
                "Writes answered before they were on the members (write-behind)",
                MetricType::Counter,
                &[(arr(&[]), c.writes as f64)],
            )?;
            fams.family(
                "raidkit_write_behind_bytes",
                "Bytes of the writes answered before they were on the members",
                MetricType::Counter,
                &[(arr(&[]), c.bytes as f64)],
            )?;
            fams.family(
                "raidkit_write_behind_pending",
                "Writes answered and not yet on the members, now",
                MetricType::Gauge,
                &[(arr(&[]), c.pending as f64)],
            )?;
            fams.family(
                "raidkit_write_behind_failed",
                "1 once a write answered early has failed (write-behind is off since)",
                MetricType::Gauge,
                &[(arr(&[]), f64::from(u8::from(c.failed)))],
            )?;
        }
        Ok(())
    }
}

/// A histogram from counts per bucket (the last bucket +Inf).
fn hist(
    mut e: prometheus_client::encoding::MetricEncoder,
    sum: f64,
    count: u64,
    buckets: &[(f64, u64)],
) -> Result<(), std::fmt::Error> {
    e.encode_histogram::<prometheus_client::encoding::NoLabelSet>(sum, count, buckets, None)
}
