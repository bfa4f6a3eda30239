//! Background processes (rebuild, resync, replacement, parity resync,
//! check, scrub; reshape next) on one framework, in the spirit of md's
//! sync thread and SPDK's raid_bdev_process: a [`Process`] walks windows of
//! units in order (`windows`), paced by a throttle ([`Pacer`], md's
//! speed_limit_min/max), checkpoints its position every few seconds
//! (`Process::checkpoint_due`; where the position lives is the process's:
//! a member's recovery offset, the array's resync position), stops when the
//! array closes, and reports its progress across the whole process (a run
//! resumed from a checkpoint continues from there, as /proc/mdstat does),
//! with elapsed time and rate, through `Array::recovery_status`.

use crate::engine::Array;
use crate::events::{NewEvent, Severity};
use raidkit_member::Locked;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Default speed while clients are busy (bytes/s): md's idea of a floor.
pub const DEFAULT_MIN_RATE: u64 = 16 << 20;
/// How often a running rebuild records its checkpoint.
pub(crate) const CHECKPOINT_EVERY: Duration = Duration::from_secs(2);

/// A recovery in progress.
#[derive(Debug, Clone, Serialize)]
pub struct RecoveryStatus {
    /// rebuild, resync, replace, or parity-resync (after an unclean
    /// shutdown: parity recomputed where writes may have been torn).
    pub kind: &'static str,
    /// The member's role (none for a parity resync).
    pub role: Option<usize>,
    pub member: String,
    /// Other members rebuilt in the same pass (RAID-6 rebuilding two).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub with: Vec<Partner>,
    /// From 0 to 1, across the whole process: what runs before this one
    /// did counts (as /proc/mdstat shows a resumed resync).
    pub progress: f64,
    /// Bytes done and to do in this run.
    pub bytes_done: u64,
    pub bytes_total: u64,
    /// Bytes of the same process done by earlier runs (it resumed from a
    /// checkpoint): `progress` is `(bytes_before + bytes_done) /
    /// (bytes_before + bytes_total)`.
    pub bytes_before: u64,
    /// The checkpoint this run started from (0: the beginning).
    pub resumed_from: u64,
    /// Seconds this run has been going.
    pub seconds: f64,
    /// Bytes per second over the last few seconds (`RECENT`), so that it
    /// follows a speed change or a busy spell at once.
    pub rate: f64,
    /// Bytes per second over the whole run so far.
    pub rate_average: f64,
    /// Seconds until this run ends at `rate`, or at the speed limits if
    /// they are lower (none before a rate is known).
    pub seconds_left: Option<f64>,
    #[serde(skip)]
    pub(crate) began: Option<Instant>,
}

/// A member rebuilt in the same pass as the one a process names.
#[derive(Debug, Clone, Serialize)]
pub struct Partner {
    pub role: usize,
    pub member: String,
}

/// The last recovery that ended.
#[derive(Debug, Clone, Serialize)]
pub struct LastRecovery {
    pub kind: &'static str,
    pub role: Option<usize>,
    pub member: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub with: Vec<Partner>,
    /// Bytes rebuilt onto the member in this run.
    pub bytes: u64,
    pub seconds: f64,
    pub resumed_from: u64,
    /// done, or why it stopped.
    pub result: String,
}

#[derive(Debug, Default)]
struct State {
    running: Option<RecoveryStatus>,
    last: Option<LastRecovery>,
    notes: Vec<String>,
}

/// What a parity resync covers: redundancy recomputed from the data.
#[derive(Debug, Clone, Default)]
pub(crate) struct ParityResync {
    /// Every unit (stripe of a parity level, chunk of a mirror) from this
    /// one on: an initial sync, or a full resync, that records its position
    /// in the superblocks as it goes (`Superblock::resync`).
    pub from: Option<u64>,
    /// Regions of the members' data areas being written at a crash (the
    /// write-intent bitmap's), wherever they are.
    pub marked: Option<crate::bitmap::RegionSet>,
}

/// The recovery state shared with the status reporter.
#[derive(Debug)]
pub(crate) struct Recovery {
    state: Mutex<State>,
    /// Bytes/s while clients are busy; 0: no limit.
    min_rate: AtomicU64,
    /// Bytes/s when idle; 0: no limit.
    max_rate: AtomicU64,
    pub(crate) done: AtomicU64,
    /// (when, bytes done) of this run, one every `SAMPLE_EVERY`, the last
    /// `RECENT` of them: the recent rate.
    samples: Mutex<std::collections::VecDeque<(Instant, u64)>>,
    /// A parity resync waiting to run (after an unclean shutdown).
    pub(crate) pending_parity: Mutex<Option<ParityResync>>,
    /// A parity resync has not finished: the array must stay marked dirty.
    pub(crate) parity_unfinished: std::sync::atomic::AtomicBool,
    /// The regions an unclean stop left marked, while their resync has not
    /// finished: mirror copies may differ there.
    pub(crate) resync_marked: Mutex<Option<crate::bitmap::RegionSet>>,
    /// A scrub asked for and not started yet.
    pub(crate) pending_scrub: Mutex<Option<crate::scrub::ScrubRequest>>,
    /// Tells a running scrub to stop.
    pub(crate) scrub_stop: std::sync::atomic::AtomicBool,
    pub(crate) last_scrub: Mutex<Option<crate::scrub::LastScrub>>,
}

impl Default for Recovery {
    fn default() -> Self {
        Recovery {
            state: Mutex::default(),
            min_rate: AtomicU64::new(DEFAULT_MIN_RATE),
            max_rate: AtomicU64::new(0),
            done: AtomicU64::new(0),
            samples: Mutex::default(),
            pending_parity: Mutex::new(None),
            parity_unfinished: std::sync::atomic::AtomicBool::new(false),
            resync_marked: Mutex::new(None),
            pending_scrub: Mutex::new(None),
            scrub_stop: std::sync::atomic::AtomicBool::new(false),
            last_scrub: Mutex::new(None),
        }
    }
}

/// The span the reported rate of a recovery covers: long enough to smooth
/// over the pacer's steps, short enough to follow a speed change within
/// seconds (md's /proc/mdstat takes up to 30 s).
const RECENT: Duration = Duration::from_secs(5);
/// How often a progress sample is kept.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);

impl Recovery {
    /// Keep a sample of the progress, at most one per `SAMPLE_EVERY`.
    fn sample(&self, done: u64) {
        let now = Instant::now();
        let mut s = self.samples.locked();
        if s.back()
            .is_some_and(|(t, _)| now.duration_since(*t) < SAMPLE_EVERY)
        {
            return;
        }
        s.push_back((now, done));
        // Keep one sample older than RECENT: the window's start.
        while s.len() > 2
            && s.get(1)
                .is_some_and(|(t, _)| now.duration_since(*t) >= RECENT)
        {
            s.pop_front();
        }
    }

    /// Bytes per second over the last `RECENT` (from the oldest sample in
    /// it to now); None until a second has been sampled.
    fn recent_rate(&self, done: u64) -> Option<f64> {
        let s = self.samples.locked();
        let (t, d) = *s.front()?;
        let dt = t.elapsed().as_secs_f64();
        (dt >= 1.0).then(|| done.saturating_sub(d) as f64 / dt)
    }

    pub fn note(&self, notes: Vec<String>) {
        self.state.locked().notes.extend(notes);
    }
}

/// The rebuild throttle: the busy rate (md's speed_limit_min) while
/// clients issue requests, the idle rate (speed_limit_max) otherwise; 0
/// means no limit.
pub(crate) struct Pacer<'a> {
    array: &'a Array,
    since: Instant,
    bytes: u64,
    last_fg: u64,
    last_rate: u64,
    /// Until when the bytes counted so far ask it to rest (none: no limit).
    until: Option<Instant>,
    /// Whether clients were busy at the last count (the busy rate in force).
    busy: bool,
    /// What tells the process to stop, besides the array stopping (a
    /// scrub's `--stop`).
    told_to_stop: Option<&'a std::sync::atomic::AtomicBool>,
}

impl<'a> Pacer<'a> {
    pub fn new(array: &'a Array) -> Pacer<'a> {
        Pacer {
            array,
            since: Instant::now(),
            bytes: 0,
            last_fg: array.fg_ops.load(Ordering::Relaxed),
            last_rate: u64::MAX,
            until: None,
            busy: false,
            told_to_stop: None,
        }
    }

    /// Count `bytes` and sleep as long as the rate asks; `before_wait`
    /// runs first if it will sleep at all.
    pub fn pace(&mut self, bytes: u64, before_wait: &mut dyn FnMut()) {
        self.count(bytes);
        if self.owes() {
            before_wait();
            self.settle();
        }
    }

    /// Count `bytes` without sleeping: the sleep they call for is owed
    /// until `settle` (or time) pays it.
    pub fn count(&mut self, bytes: u64) {
        let fg = self.array.fg_ops.load(Ordering::Relaxed);
        let (min, max) = self.array.rebuild_speed();
        self.busy = fg != self.last_fg;
        let rate = if self.busy { min } else { max };
        self.last_fg = fg;
        if rate != self.last_rate || self.since.elapsed() > Duration::from_secs(2) {
            self.since = Instant::now();
            self.bytes = 0;
            self.last_rate = rate;
        }
        self.bytes += bytes;
        self.until = (rate != 0)
            .then(|| self.since + Duration::from_secs_f64(self.bytes as f64 / rate as f64));
    }

    /// Whether the bytes counted call for a sleep not yet taken.
    pub fn owes(&self) -> bool {
        self.owed().is_some()
    }

    /// How long a sleep the bytes counted still call for, if any.
    pub fn owed(&self) -> Option<Duration> {
        self.until
            .map(|t| t.saturating_duration_since(Instant::now()))
            .filter(|d| !d.is_zero())
    }

    /// Sleep what is owed, cut short when the array stops, when the limit
    /// in force is changed (`raidkit speed`: a new limit starts a new
    /// count, so raising a slow one takes effect at once), and when what
    /// the process works on changes under it (a member fails, is removed
    /// or joins; a scrub is told to stop): the rest is forgiven, so that
    /// the process looks at once, not after a rest of minutes at a low
    /// limit.
    pub fn settle(&mut self) {
        let Some(until) = self.until else {
            return;
        };
        let view = self.array.core.view.load_full();
        loop {
            let now = Instant::now();
            if now >= until || self.array.core.wake.stopped() {
                return;
            }
            let (min, max) = self.array.rebuild_speed();
            if self.last_rate != if self.busy { min } else { max }
                || !std::sync::Arc::ptr_eq(&view, &self.array.core.view.load())
                || self.told_to_stop.is_some_and(|f| f.load(Ordering::Acquire))
            {
                self.since = now;
                self.bytes = 0;
                self.last_rate = u64::MAX;
                self.until = None;
                return;
            }
            // In short naps: any of those is noticed within 100 ms.
            std::thread::sleep((until - now).min(Duration::from_millis(100)));
        }
    }
}

/// What a process is about to do, for its status line.
pub(crate) struct Plan {
    pub kind: &'static str,
    pub role: Option<usize>,
    pub member: String,
    /// Other members rebuilt in the same pass.
    pub with: Vec<Partner>,
    /// Bytes of the same process done by earlier runs.
    pub bytes_before: u64,
    /// Bytes this run has to do.
    pub bytes_total: u64,
    /// The checkpoint this run starts from (0: the beginning).
    pub resumed_from: u64,
}

/// One run of a background process: its status while it runs, its pacing,
/// its checkpoint cadence, its record when it ends.
pub(crate) struct Process<'a> {
    array: &'a Array,
    kind: &'static str,
    role: Option<usize>,
    member: String,
    with: Vec<Partner>,
    resumed_from: u64,
    began: Instant,
    pacer: Pacer<'a>,
    last_checkpoint: Instant,
    /// Bytes done by earlier runs, and of the whole process.
    before: u64,
    whole: u64,
    /// The next progress step (20, 40, 60, 80 %) announced for a rebuild.
    next_step: u64,
}

/// The events a process of `kind` starts and ends with.
fn event_names(kind: &str) -> (&'static str, &'static str) {
    match kind {
        "parity-resync" => ("ResyncStarted", "ResyncFinished"),
        "scrub" => ("ScrubStarted", "ScrubFinished"),
        "reshape" => ("ReshapeStarted", "ReshapeFinished"),
        _ => ("RebuildStarted", "RebuildFinished"),
    }
}

/// The first 20 % step above where a process stands.
fn next_step(done: u64, whole: u64) -> u64 {
    if whole == 0 {
        return 100;
    }
    (done * 100 / whole) / 20 * 20 + 20
}

impl<'a> Process<'a> {
    /// Start a run: `status` shows it from now on.
    pub fn start(array: &'a Array, plan: Plan) -> Process<'a> {
        let r = &array.recovery;
        r.done.store(0, Ordering::Relaxed);
        let began = Instant::now();
        {
            let mut s = r.samples.locked();
            s.clear();
            s.push_back((began, 0));
        }
        r.state.locked().running = Some(RecoveryStatus {
            kind: plan.kind,
            role: plan.role,
            member: plan.member.clone(),
            with: plan.with.clone(),
            progress: 0.0,
            bytes_done: 0,
            bytes_total: plan.bytes_total,
            bytes_before: plan.bytes_before,
            resumed_from: plan.resumed_from,
            seconds: 0.0,
            rate: 0.0,
            rate_average: 0.0,
            seconds_left: None,
            began: Some(began),
        });
        // At info: `serve` logs at info by default, so its log records every
        // recovery; offline commands (create's initial sync) say their own.
        tracing::info!(
            kind = plan.kind,
            role = plan.role,
            member = plan.member.as_str(),
            from = plan.resumed_from,
            with = ?plan.with.iter().map(|p| p.member.as_str()).collect::<Vec<_>>(),
            "{} started",
            plan.kind
        );
        let (started, _) = event_names(plan.kind);
        let mut e = NewEvent::new(started, Severity::Info, format!("{} started", plan.kind)).data(
            serde_json::json!({
                "kind": plan.kind,
                "resumed_from": plan.resumed_from,
                "bytes_total": plan.bytes_total,
                "with": plan.with,
            }),
        );
        if !plan.member.is_empty() {
            e = e.member(plan.member.clone(), plan.role);
        }
        array.core.emit(e);
        let whole = plan.bytes_before + plan.bytes_total;
        Process {
            array,
            kind: plan.kind,
            role: plan.role,
            member: plan.member,
            with: plan.with,
            resumed_from: plan.resumed_from,
            began,
            pacer: Pacer {
                told_to_stop: (plan.kind == "scrub").then_some(&r.scrub_stop),
                ..Pacer::new(array)
            },
            last_checkpoint: began,
            before: plan.bytes_before,
            whole,
            next_step: next_step(plan.bytes_before, whole),
        }
    }

    /// `bytes` more done: counted in the progress, then paced.
    pub fn advance(&mut self, bytes: u64) {
        self.advance_then(bytes, &mut || {});
    }

    /// As `advance`; `before_wait` runs first if the pace makes it sleep
    /// (to release what clients may be waiting for).
    pub fn advance_then(&mut self, bytes: u64, before_wait: &mut dyn FnMut()) {
        self.progress(bytes);
        self.pacer.pace(bytes, before_wait);
    }

    /// A process that paces what it starts rather than what it finishes
    /// (`owe` as it starts work, `settle` with nothing held): `bytes` more
    /// done, counted in the progress only.
    pub fn progress(&mut self, bytes: u64) {
        let r = &self.array.recovery;
        let done = r.done.fetch_add(bytes, Ordering::Relaxed) + bytes;
        r.sample(done);
        // md's Rebuild20 ... Rebuild80, for the processes that rebuild
        // members (md sends them for every sync; a parity resync and a
        // scrub have their own start and end events here).
        if self.next_step <= 80 && event_names(self.kind).0 == "RebuildStarted" {
            let pct = (self.before + done) * 100 / self.whole.max(1);
            while self.next_step <= 80 && pct >= self.next_step {
                let name = match self.next_step {
                    20 => "Rebuild20",
                    40 => "Rebuild40",
                    60 => "Rebuild60",
                    _ => "Rebuild80",
                };
                self.array.core.emit(
                    NewEvent::new(
                        name,
                        Severity::Info,
                        format!("{}: {} % done", self.kind, self.next_step),
                    )
                    .member(self.member.clone(), self.role),
                );
                self.next_step += 20;
            }
        }
    }

    /// `bytes` about to be worked on, counted by the throttle: a sleep may
    /// be owed from now (`owes`).
    pub fn owe(&mut self, bytes: u64) {
        self.pacer.count(bytes);
    }

    /// Whether the throttle asks for a rest before more work is started.
    pub fn owes(&self) -> bool {
        self.pacer.owes()
    }

    /// How long the throttle still asks to wait before more work is
    /// started, if at all.
    pub fn owed(&self) -> Option<std::time::Duration> {
        self.pacer.owed()
    }

    /// Take the rest the throttle asks for. The caller holds nothing a
    /// client may wait for (no stripe locks): the point of pacing what is
    /// started is that a throttled process sleeps with nothing locked.
    pub fn settle(&mut self) {
        self.pacer.settle();
    }

    /// Whether it is time to record the position reached (every
    /// `CHECKPOINT_EVERY`); the caller records it.
    pub fn checkpoint_due(&mut self) -> bool {
        if self.last_checkpoint.elapsed() >= CHECKPOINT_EVERY {
            self.last_checkpoint = Instant::now();
            true
        } else {
            false
        }
    }

    /// Whether the array is being stopped: the process records its
    /// position and ends.
    pub fn stopped(&self) -> bool {
        self.array.core.wake.stopped()
    }

    /// End the run with `result` ("done", or why it stopped), recorded as
    /// the last recovery.
    pub fn end(self, result: String) {
        self.end_as(result, true);
    }

    /// End the run because it is taken up again at once with another
    /// member (`Outcome::Regroup`): recorded, but no end event goes out
    /// (the rebuild has not ended; its next run's start says who joined).
    pub fn end_regrouped(self, result: String) {
        self.end_as(result, false);
    }

    fn end_as(self, result: String, event: bool) {
        let bytes = self.array.recovery.done.load(Ordering::Relaxed);
        let seconds = self.began.elapsed().as_secs_f64();
        tracing::info!(
            kind = self.kind,
            role = self.role,
            bytes,
            seconds,
            result = result.as_str(),
            "{} ended",
            self.kind
        );
        let (_, finished) = event_names(self.kind);
        // A scrub's end goes out with its counts (from the scrub itself).
        if self.kind != "scrub" && event {
            let mut e = NewEvent::new(
                finished,
                if result == "done" {
                    Severity::Info
                } else {
                    Severity::Warning
                },
                format!("{} ended: {result}", self.kind),
            )
            .data(serde_json::json!({
                "kind": self.kind, "result": result, "bytes": bytes, "seconds": seconds,
                "with": self.with,
            }));
            if !self.member.is_empty() {
                e = e.member(self.member.clone(), self.role);
            }
            self.array.core.emit(e);
        }
        let mut st = self.array.recovery.state.locked();
        st.running = None;
        st.last = Some(LastRecovery {
            kind: self.kind,
            role: self.role,
            member: self.member,
            with: self.with,
            bytes,
            seconds,
            resumed_from: self.resumed_from,
            result,
        });
    }
}

/// The windows a process walks: units from `from` to `end` for which
/// `wanted` holds, in order, as runs of at most `window` consecutive
/// wanted units `[a, b)`.
pub(crate) fn windows(
    from: u64,
    end: u64,
    window: u64,
    wanted: impl Fn(u64) -> bool,
) -> impl Iterator<Item = (u64, u64)> {
    let mut s = from;
    std::iter::from_fn(move || {
        while s < end && !wanted(s) {
            s += 1;
        }
        if s >= end {
            return None;
        }
        let a = s;
        s += 1;
        while s < end && s - a < window.max(1) && wanted(s) {
            s += 1;
        }
        Some((a, s))
    })
}

impl Array {
    /// Rebuild speed limits in bytes/s (0: unlimited): `min` while clients
    /// are busy, `max` when they are idle.
    pub fn set_rebuild_speed(&self, min: Option<u64>, max: Option<u64>) {
        if let Some(m) = min {
            self.recovery.min_rate.store(m, Ordering::Relaxed);
        }
        if let Some(m) = max {
            self.recovery.max_rate.store(m, Ordering::Relaxed);
        }
    }

    /// The bitmap's region size and how many regions are dirty now.
    pub fn bitmap_status(&self) -> Option<(u64, u64)> {
        self.core
            .bitmap
            .as_ref()
            .map(|b| (b.region(), b.snapshot().count()))
    }

    /// Stop the recovery loop (at its next batch, after a checkpoint).
    pub fn stop_background(&self) {
        self.core.wake.stop();
    }

    pub fn rebuild_speed(&self) -> (u64, u64) {
        (
            self.recovery.min_rate.load(Ordering::Relaxed),
            self.recovery.max_rate.load(Ordering::Relaxed),
        )
    }

    /// What a background process may do in one step under the lower of
    /// the speed limits (none without one): what that limit allows in
    /// 1/16 s, so that a process under a low limit comes in small steps
    /// between rests rather than a burst and a long rest (a client that
    /// meets a step waits for the whole of it).
    pub(crate) fn paced_step(&self) -> Option<u64> {
        let (min, max) = self.rebuild_speed();
        [min, max]
            .into_iter()
            .filter(|&r| r != 0)
            .min()
            .map(|r| r / 16)
    }

    pub fn recovery_status(&self) -> Option<RecoveryStatus> {
        let st = self.recovery.state.locked();
        st.running.clone().map(|mut r| {
            r.bytes_done = self.recovery.done.load(Ordering::Relaxed);
            let whole = r.bytes_before + r.bytes_total;
            r.progress = if whole == 0 {
                1.0
            } else {
                ((r.bytes_before + r.bytes_done) as f64 / whole as f64).min(1.0)
            };
            r.seconds = r.began.map_or(0.0, |b| b.elapsed().as_secs_f64());
            r.rate_average = if r.seconds > 0.0 {
                r.bytes_done as f64 / r.seconds
            } else {
                0.0
            };
            r.rate = self
                .recovery
                .recent_rate(r.bytes_done)
                .unwrap_or(r.rate_average);
            // Never faster than the limits let it go: the first step after
            // a start runs at once, and a rate measured over it promised
            // minutes where a low limit takes hours.
            let (min, max) = self.rebuild_speed();
            let most = if min == 0 || max == 0 {
                f64::INFINITY
            } else {
                min.max(max) as f64
            };
            let speed = r.rate.min(most);
            r.seconds_left =
                (speed > 0.0).then(|| r.bytes_total.saturating_sub(r.bytes_done) as f64 / speed);
            r
        })
    }

    pub fn last_recovery(&self) -> Option<LastRecovery> {
        self.recovery.state.locked().last.clone()
    }

    /// Messages about members taken back in at start-up.
    pub fn notes(&self) -> Vec<String> {
        self.recovery.state.locked().notes.clone()
    }

    /// The array's state for reports: failed, rebuilding (a member is being
    /// rebuilt or waits to be), degraded or optimal.
    pub fn state_name(&self) -> &'static str {
        match self.health() {
            crate::Health::Failed => "failed",
            _ if self.reshape_in_progress() => "reshaping",
            _ if self.recovery_status().is_some() || self.needs_recovery() => "rebuilding",
            h => h.name(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::windows;

    #[test]
    fn windows_skip_unwanted_units_and_cut_runs() {
        let w: Vec<_> = windows(2, 20, 4, |u| !(7..9).contains(&u) && u != 15).collect();
        assert_eq!(w, [(2, 6), (6, 7), (9, 13), (13, 15), (16, 20)]);
        assert_eq!(windows(5, 5, 4, |_| true).count(), 0);
        assert_eq!(
            windows(0, 3, 0, |_| true).collect::<Vec<_>>(),
            [(0, 1), (1, 2), (2, 3)]
        );
    }
}
