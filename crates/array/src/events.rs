//! Events: every change of an array's state that a person should hear of,
//! named as `mdadm --monitor` names them where md has the event (Fail,
//! FailSpare, DegradedArray, RebuildStarted, Rebuild20/40/60/80,
//! RebuildFinished, SpareActive, DeviceDisappeared, TestMessage) and with
//! raidkit's own names where it has none (ArrayFailed, ResyncStarted,
//! ResyncFinished, ScrubStarted, ScrubFinished, ChecksumError, SlowMember,
//! MemberReturned, ClientConnected, ClientDisconnected).
//!
//! Events are kept in a ring (the last `KEEP`), numbered, so that a
//! follower (`raidkit monitor`, the status page) asks for those after the
//! last it saw and waits for the next; and handed to subscribers (the
//! server's program runner and event log), which must not block: they
//! are called on the thread that changed the state, often on the I/O path.

use raidkit_member::Locked;
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Events kept for followers.
const KEEP: usize = 1000;

/// How much a person needs to hear of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Connections coming and going: for debugging, not for a pager.
    Debug,
    Info,
    /// Something is wrong or redundancy is reduced.
    Warning,
    /// Data is unavailable.
    Critical,
}

/// One event.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// Numbered from 1 in the order they happened (per server).
    pub seq: u64,
    /// Seconds since the Unix epoch.
    pub time: f64,
    /// The event's name (see the module).
    pub event: &'static str,
    pub array: String,
    /// The member concerned, by its name (path or spec), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<usize>,
    pub severity: Severity,
    /// What happened, for people.
    pub detail: String,
    /// Figures that go with it (a scrub's counts, a rebuild's bytes).
    #[serde(skip_serializing_if = "serde_json::Value::is_null")]
    pub data: serde_json::Value,
}

/// An event about to be sent (`Events::emit` numbers and stamps it).
#[derive(Debug, Clone)]
pub struct NewEvent {
    pub event: &'static str,
    pub member: Option<String>,
    pub role: Option<usize>,
    pub severity: Severity,
    pub detail: String,
    pub data: serde_json::Value,
}

impl NewEvent {
    pub fn new(event: &'static str, severity: Severity, detail: impl Into<String>) -> NewEvent {
        NewEvent {
            event,
            member: None,
            role: None,
            severity,
            detail: detail.into(),
            data: serde_json::Value::Null,
        }
    }

    pub fn member(mut self, name: impl Into<String>, role: Option<usize>) -> NewEvent {
        self.member = Some(name.into());
        self.role = role;
        self
    }

    pub fn data(mut self, data: serde_json::Value) -> NewEvent {
        self.data = data;
        self
    }
}

type Subscriber = Arc<dyn Fn(&Event) + Send + Sync>;

#[derive(Default)]
struct Ring {
    next: u64,
    kept: VecDeque<Event>,
}

/// The events of one server (shared by its arrays).
#[derive(Default)]
pub struct Events {
    ring: Mutex<Ring>,
    arrived: Condvar,
    subscribers: Mutex<Vec<Subscriber>>,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events").finish_non_exhaustive()
    }
}

impl Events {
    pub fn new() -> Arc<Events> {
        Arc::new(Events::default())
    }

    /// Call `f` with every event from now on, in their order. `f` must not
    /// block, nor emit events: it is called under the lock that numbers
    /// them.
    pub fn subscribe(&self, f: impl Fn(&Event) + Send + Sync + 'static) {
        self.subscribers.locked().push(Arc::new(f));
    }

    /// Record an event of `array` and hand it to the subscribers.
    pub fn emit(&self, array: &str, e: NewEvent) -> Event {
        let time = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let ev = {
            let mut r = self.ring.locked();
            r.next += 1;
            let ev = Event {
                seq: r.next,
                time,
                event: e.event,
                array: array.to_string(),
                member: e.member,
                role: e.role,
                severity: e.severity,
                detail: e.detail,
                data: e.data,
            };
            r.kept.push_back(ev.clone());
            while r.kept.len() > KEEP {
                r.kept.pop_front();
            }
            // Handed over under the lock that numbers them, so that every
            // subscriber (the events log) gets events in their order;
            // subscribers do not block.
            let subs: Vec<Subscriber> = self.subscribers.locked().clone();
            for s in subs {
                s(&ev);
            }
            ev
        };
        self.arrived.notify_all();
        match ev.severity {
            Severity::Debug => tracing::debug!(event = ev.event, array, "{}", ev.detail),
            Severity::Info => tracing::info!(event = ev.event, array, "{}", ev.detail),
            Severity::Warning | Severity::Critical => {
                tracing::warn!(event = ev.event, array, "{}", ev.detail)
            }
        }
        ev
    }

    /// The events numbered after `seq` that are still kept, waiting up to
    /// `wait` for one if there are none yet. Also returns the number of
    /// the last event (so a follower that starts knows where it is).
    pub fn after(&self, seq: u64, wait: Duration) -> (Vec<Event>, u64) {
        let deadline = std::time::Instant::now() + wait;
        let mut r = self.ring.locked();
        loop {
            if r.next > seq {
                let out: Vec<Event> = r.kept.iter().filter(|e| e.seq > seq).cloned().collect();
                return (out, r.next);
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return (Vec::new(), r.next);
            }
            r = self
                .arrived
                .wait_timeout(r, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// The last `n` events kept.
    pub fn recent(&self, n: usize) -> Vec<Event> {
        let r = self.ring.locked();
        r.kept.iter().rev().take(n).rev().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_numbered_kept_and_followed() {
        let ev = Events::new();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = seen.clone();
        ev.subscribe(move |e| s2.lock().unwrap().push(e.event));
        let (none, last) = ev.after(0, Duration::ZERO);
        assert!(none.is_empty() && last == 0);
        ev.emit("a", NewEvent::new("TestMessage", Severity::Info, "hello"));
        let ev2 = ev.clone();
        let t = std::thread::spawn(move || ev2.after(1, Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(50));
        ev.emit(
            "a",
            NewEvent::new("Fail", Severity::Warning, "x").member("/dev/x", Some(2)),
        );
        let (got, last) = t.join().unwrap();
        assert_eq!(last, 2);
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].event, got[0].role), ("Fail", Some(2)));
        assert_eq!(*seen.lock().unwrap(), vec!["TestMessage", "Fail"]);
        for _ in 0..KEEP + 5 {
            ev.emit("a", NewEvent::new("TestMessage", Severity::Info, ""));
        }
        let (all, last) = ev.after(0, Duration::ZERO);
        assert_eq!(all.len(), KEEP);
        assert_eq!(all.last().unwrap().seq, last);
        assert_eq!(ev.recent(3).len(), 3);
    }
}

#[cfg(test)]
mod order {
    use super::*;

    /// Events emitted from many threads at once reach a subscriber (the
    /// events log) in the order of their numbers.
    #[test]
    fn subscribers_see_events_in_number_order() {
        let ev = Events::new();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = seen.clone();
        ev.subscribe(move |e| s2.lock().unwrap().push(e.seq));
        std::thread::scope(|sc| {
            for _ in 0..4 {
                sc.spawn(|| {
                    for _ in 0..2000 {
                        ev.emit("a", NewEvent::new("TestMessage", Severity::Debug, ""));
                    }
                });
            }
        });
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 8000);
        let out_of_order = seen.windows(2).filter(|w| w[0] >= w[1]).count();
        assert_eq!(out_of_order, 0, "{out_of_order} events out of order");
    }
}
