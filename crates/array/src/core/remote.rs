//! Members on other hosts whose connection comes and goes. A member in
//! sync whose link is lost is failed as any other (the array serves
//! degraded at once, the superblocks of the others record it) but is
//! remembered as `disconnected`: the client connects again in the
//! background, and a member that comes back within the rejoin time, with
//! the superblock it had when it left, takes its role again and is resynced
//! only where the write-intent bitmap says writes went while it was away.
//! One that answers with anything else (another array's superblock, an
//! older or newer event count, another member's) is refused and stays
//! failed; one away longer is failed for good and waits for `add` or a
//! spare.

use super::{Core, Disk, View};
use crate::events::{NewEvent, Severity};
use crate::superblock::{probe, Role, Superblock};
use raidkit_member::{Locked, Member};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Default time a disconnected member may stay away and still rejoin by
/// itself (the bitmap keeps what it missed meanwhile).
pub const DEFAULT_REJOIN_TIMEOUT: Duration = Duration::from_secs(300);

/// How long one attempt to connect again may take.
const CONNECT_LIMIT: Duration = Duration::from_secs(3);

/// The longest wait between two attempts (the first come sooner).
const MAX_BACKOFF: Duration = Duration::from_secs(4);

/// A disconnected member's time away.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Away {
    pub since: Instant,
    next_try: Instant,
    tries: u32,
}

impl Away {
    fn new() -> Away {
        let now = Instant::now();
        Away {
            since: now,
            next_try: now + Duration::from_millis(500),
            tries: 0,
        }
    }

    /// After a failed attempt: 1 s, 2 s, then every `MAX_BACKOFF`.
    fn retry_later(&mut self) {
        self.tries += 1;
        let wait = Duration::from_secs(1 << self.tries.min(3)) / 2;
        self.next_try = Instant::now() + wait.min(MAX_BACKOFF);
    }
}

/// Opens a remote member again, connecting for at most the time given.
pub type Reopen =
    Box<dyn Fn(Duration) -> std::result::Result<Arc<dyn Member>, String> + Send + Sync>;

/// Remote members the array started without because their hosts did not
/// answer (`serve --run`), tried again in the background as disconnected
/// members are.
#[derive(Default)]
pub(crate) struct Awaiting {
    /// The members of roles the array did not know to be gone when it
    /// started: the only ones that may take their roles back by
    /// themselves (one failed earlier, for errors say, waits for `add`).
    pub expected: Vec<Uuid>,
    pub members: Vec<Arc<Awaited>>,
}

/// One member named at start that did not answer.
pub(crate) struct Awaited {
    pub name: String,
    reopen: Reopen,
    /// Its time away (since the start) and why the last attempt failed.
    state: Mutex<(Away, String)>,
    /// Why it was refused when it answered: no longer tried, listed as
    /// faulty until it is removed or added.
    refused: Mutex<Option<String>>,
}

impl Awaited {
    /// Since when it has been tried, and why the last attempt failed.
    pub fn since(&self) -> (Instant, String) {
        let s = self.state.locked();
        (s.0.since, s.1.clone())
    }

    /// Why it was refused, if it was.
    pub fn refused(&self) -> Option<String> {
        self.refused.locked().clone()
    }
}

/// What an attempt to bring a member back came to.
enum Attempt {
    /// Not reachable yet (or not readable): tried again later.
    NotYet(String),
    /// It answers, but not as the member that left: never trusted.
    Refused(String),
    Rejoined {
        resync: bool,
    },
}

impl Core {
    /// Called as `d` is failed: if its link is what was lost, it is
    /// remembered as away (and may come back). Returns why the link is
    /// down, if it is.
    pub(crate) fn note_lost(&self, d: &Disk, in_sync: bool) -> Option<String> {
        let why = d.member.remote()?.lost()?;
        if in_sync {
            *d.away.locked() = Some(Away::new());
        }
        Some(why)
    }

    pub fn set_rejoin_timeout(&self, t: Duration) {
        self.rejoin_ns.store(t.as_nanos() as u64, Ordering::Relaxed);
    }

    pub(super) fn rejoin_timeout(&self) -> Duration {
        Duration::from_nanos(self.rejoin_ns.load(Ordering::Relaxed))
    }

    /// One round of link upkeep (called every half second or so): members
    /// in service whose idle connection has dropped are failed as
    /// disconnected; disconnected members due for it are tried again, at
    /// once (each attempt bounded); those away too long are failed for
    /// good.
    pub fn watch_links(&self) {
        let v = self.view.load_full();
        for d in v.writable() {
            if let Some(why) = d.member.remote().and_then(|r| r.lost()) {
                self.fail_disk_by_ptr(&d, &format!("connection lost: {why}"));
            }
        }
        if self.read_only || !self.alive.load(Ordering::Acquire) {
            return;
        }
        let v = self.view.load_full();
        let limit = self.rejoin_timeout();
        let mut due = Vec::new();
        for (d, role, _) in &v.failed {
            let Some(role) = *role else { continue };
            let Some(away) = *d.away.locked() else {
                continue;
            };
            if away.since.elapsed() > limit {
                self.give_up(d, limit);
            } else if Instant::now() >= away.next_try {
                due.push((d.clone(), role));
            }
        }
        let waiting: Vec<Arc<Awaited>> = self.awaited.locked().members.clone();
        let mut first_tries = Vec::new();
        for a in waiting.into_iter().filter(|a| a.refused().is_none()) {
            let away = a.state.locked().0;
            if limit.is_zero() || away.since.elapsed() > limit {
                self.stop_awaiting(&a, limit);
            } else if Instant::now() >= away.next_try {
                first_tries.push(a);
            }
        }
        // Attempts at once: a host that does not answer must not hold up
        // the others' return.
        std::thread::scope(|sc| {
            for (d, role) in &due {
                spawn_or_run(sc, move || self.attempt(d, *role));
            }
            for a in &first_tries {
                spawn_or_run(sc, move || self.attempt_awaited(a));
            }
        });
    }

    /// A remote member named at start whose host did not answer (`why`):
    /// the array started without it, and it is tried again in the
    /// background until the rejoin timeout; once it answers with the
    /// superblock of the member of a role the array did not know to be
    /// gone, it takes that role back, resynced by bitmap where it can be.
    pub fn await_member(&self, name: &str, why: &str, reopen: Reopen) {
        let limit = self.rejoin_timeout();
        let text = if self.read_only || limit.is_zero() {
            format!(
                "not reached at start ({why}): the array started without it; `raidkit add` it once its host is back"
            )
        } else {
            self.awaited.locked().members.push(Arc::new(Awaited {
                name: name.to_string(),
                reopen,
                state: Mutex::new((Away::new(), why.to_string())),
                refused: Mutex::new(None),
            }));
            format!(
                "not reached at start ({why}): the array started without it; it is tried again in the background and takes its role back by itself if it answers within {}s",
                limit.as_secs()
            )
        };
        // The event is logged as it is sent.
        self.emit(NewEvent::new("Disconnected", Severity::Warning, text).member(name, None));
    }

    /// The members of roles that the array did not know to be gone when it
    /// started (set once, at start).
    pub(crate) fn expect_back(&self, members: Vec<Uuid>) {
        self.awaited.locked().expected = members;
    }

    /// Take the awaited member `who` names off the list (it was added by
    /// hand, or removed): its name, if it was awaited.
    pub(crate) fn forget_awaited(&self, who: &str) -> Option<String> {
        let mut w = self.awaited.locked();
        let i = w
            .members
            .iter()
            .position(|a| super::membership::same_member(&a.name, who))?;
        Some(w.members.remove(i).name.clone())
    }

    /// No longer try `a` (still listed, as faulty, for `why`); false if it
    /// was taken off the list or given up on meanwhile.
    pub(crate) fn give_up_on(&self, a: &Arc<Awaited>, why: &str) -> bool {
        let w = self.awaited.locked();
        if !w.members.iter().any(|x| Arc::ptr_eq(x, a)) {
            return false;
        }
        let mut r = a.refused.locked();
        if r.is_some() {
            return false;
        }
        *r = Some(why.to_string());
        true
    }

    /// Whether `a` is still awaited; takes it off the list if `remove`.
    fn awaited_still(&self, a: &Arc<Awaited>, remove: bool) -> bool {
        let mut w = self.awaited.locked();
        let at = w.members.iter().position(|x| Arc::ptr_eq(x, a));
        if remove {
            if let Some(i) = at {
                w.members.remove(i);
            }
        }
        at.is_some()
    }

    fn stop_awaiting(&self, a: &Arc<Awaited>, limit: Duration) {
        let last = a.state.locked().1.clone();
        let why = format!(
            "not reached within {}s of the start (last: {last}): no longer tried; `raidkit add` it once its host is back",
            limit.as_secs()
        );
        if !self.give_up_on(a, &why) {
            return;
        }
        tracing::warn!(member = a.name, "{why}");
        self.emit(NewEvent::new("Fail", Severity::Warning, why).member(&a.name, None));
    }

    fn attempt_awaited(&self, a: &Arc<Awaited>) {
        let outcome = self.try_first_join(a);
        match outcome {
            Attempt::NotYet(why) => {
                tracing::debug!(member = a.name, "not reached yet: {why}");
                let mut s = a.state.locked();
                s.0.retry_later();
                s.1 = why;
            }
            Attempt::Refused(why) => {
                // Kept in the list, as a failed member is, to say why.
                let why = format!(
                    "answered {:.1}s after the start but {why}: refused (`raidkit add` takes it in, `raidkit remove` forgets it)",
                    a.since().0.elapsed().as_secs_f64()
                );
                if !self.give_up_on(a, &why) {
                    return;
                }
                tracing::error!(member = a.name, "{why}");
                self.emit(
                    NewEvent::new("RejoinRefused", Severity::Warning, why).member(&a.name, None),
                );
            }
            Attempt::Rejoined { .. } => {}
        }
    }

    /// Open an awaited member and, if it is the member of a role the
    /// array expects back, put it in that role.
    fn try_first_join(&self, a: &Arc<Awaited>) -> Attempt {
        let m = match (a.reopen)(CONNECT_LIMIT) {
            Ok(m) => m,
            Err(e) => return Attempt::NotYet(e),
        };
        let (msb, mut meta) = match self.answer_of(m.as_ref()) {
            Ok(x) => x,
            Err(a) => return a,
        };
        let Role::Active(r) = msb.role else {
            return Attempt::Refused(
                "its superblock says it was a spare: `raidkit add` takes it back".into(),
            );
        };
        let r = r as usize;
        let expected = self.awaited.locked().expected.contains(&msb.member_uuid);
        let v = View::clone(&self.view.load());
        if r >= v.roles.len()
            || v.roles[r].disk.is_some()
            || meta.sb.roles[r].member_uuid != msb.member_uuid
        {
            return Attempt::Refused(format!("role {r} it held has another member now"));
        }
        if !expected {
            return Attempt::Refused(format!(
                "the array knew it gone from role {r} before this start (failed or removed): `raidkit add` takes it back"
            ));
        }
        if msb.events > meta.sb.events {
            return Attempt::Refused(format!(
                "its superblock is newer than ours (events {}, ours {}): the array was written elsewhere meanwhile",
                msb.events, meta.sb.events
            ));
        }
        // Taken off the list under the metadata lock: a `raidkit add` of
        // it meanwhile finds the role taken, or this finds the name in
        // service.
        if !self.awaited_still(a, true) {
            return Attempt::Refused("it was given up on meanwhile".into());
        }
        let name = m.name().to_string();
        match self.return_to_role(&mut meta, v, r, m, &msb) {
            Ok(resync) => {
                drop(meta);
                let how = format!(
                    "reached {:.1}s after the start and",
                    a.since().0.elapsed().as_secs_f64()
                );
                self.returned(&name, r, resync, &how);
                Attempt::Rejoined { resync }
            }
            Err(e) => {
                // Tried again later.
                self.awaited.locked().members.push(a.clone());
                Attempt::NotYet(e.to_string())
            }
        }
    }

    fn give_up(&self, d: &Arc<Disk>, limit: Duration) {
        if d.away.locked().take().is_none() {
            return;
        }
        let why = format!(
            "disconnected for longer than {}s: failed for good (raidkit remove, then raidkit add, brings it or another member back)",
            limit.as_secs()
        );
        let mut v = View::clone(&self.view.load());
        let role = v.failed.iter_mut().find_map(|f| {
            std::ptr::eq(Arc::as_ptr(&f.0), Arc::as_ptr(d)).then(|| {
                f.2 = why.clone();
                f.1
            })
        });
        self.view.store(Arc::new(v));
        tracing::warn!(member = d.name(), "{why}");
        self.emit(NewEvent::new("Fail", Severity::Warning, why).member(d.name(), role.flatten()));
    }

    fn attempt(&self, d: &Arc<Disk>, role: usize) {
        let outcome = self.try_rejoin(d, role);
        let mut away = d.away.locked();
        let Some(a) = away.as_mut() else { return };
        match outcome {
            Attempt::NotYet(why) => {
                tracing::debug!(member = d.name(), "not back yet: {why}");
                a.retry_later();
            }
            Attempt::Refused(why) => {
                let since = a.since;
                *away = None;
                drop(away);
                self.refuse(d, role, since, &why);
            }
            Attempt::Rejoined { resync } => {
                let since = a.since;
                *away = None;
                drop(away);
                let how = format!(
                    "reconnected after {:.1}s and back",
                    since.elapsed().as_secs_f64()
                );
                self.returned(d.name(), role, resync, &how);
            }
        }
    }

    fn refuse(&self, d: &Arc<Disk>, role: usize, since: Instant, why: &str) {
        let why = format!(
            "came back after {:.1}s but {why}: refused, failed for good",
            since.elapsed().as_secs_f64()
        );
        let mut v = View::clone(&self.view.load());
        for f in v.failed.iter_mut() {
            if std::ptr::eq(Arc::as_ptr(&f.0), Arc::as_ptr(d)) {
                f.2 = why.clone();
            }
        }
        self.view.store(Arc::new(v));
        if let Some(r) = d.member.remote() {
            r.cut("refused");
        }
        tracing::error!(member = d.name(), "{why}");
        self.emit(
            NewEvent::new("RejoinRefused", Severity::Warning, why).member(d.name(), Some(role)),
        );
    }

    /// The superblock a member that answers again holds, if it is one of
    /// this array's, with the metadata lock taken (the array still
    /// alive); else what the attempt came to.
    fn answer_of(
        &self,
        m: &dyn Member,
    ) -> std::result::Result<(Superblock, std::sync::MutexGuard<'_, super::Meta>), Attempt> {
        let msb = match probe(m) {
            Err(e) => return Err(Attempt::NotYet(e.to_string())),
            Ok(None) => {
                return Err(Attempt::Refused(
                    "it has no superblock: another disk answers there".into(),
                ))
            }
            Ok(Some(Err(e))) => {
                return Err(Attempt::Refused(format!(
                    "its superblock is unreadable ({e})"
                )))
            }
            Ok(Some(Ok(m))) => m,
        };
        let meta = self.meta.locked();
        if !self.alive.load(Ordering::Acquire) {
            return Err(Attempt::Refused("the array failed meanwhile".into()));
        }
        if msb.array_uuid != meta.sb.array_uuid {
            return Err(Attempt::Refused(format!(
                "it answers with the superblock of another array ({})",
                msb.array_uuid
            )));
        }
        Ok((msb, meta))
    }

    /// Connect again and, if it is the member that left, put it back.
    fn try_rejoin(&self, d: &Arc<Disk>, role: usize) -> Attempt {
        let Some(link) = d.member.remote() else {
            return Attempt::Refused("it is not a remote member".into());
        };
        if let Err(e) = link.reconnect(CONNECT_LIMIT) {
            return Attempt::NotYet(e.to_string());
        }
        // The member itself, under the checksum layer: its superblock.
        let raw: Arc<dyn Member> = match &d.checked {
            Some(c) => c.inner().clone(),
            None => d.member.clone(),
        };
        let (msb, mut meta) = match self.answer_of(raw.as_ref()) {
            Ok(x) => x,
            Err(a) => return a,
        };
        if msb.member_uuid != d.uuid || msb.role != Role::Active(role as u32) {
            return Attempt::Refused(format!(
                "it answers with the superblock of another member ({})",
                msb.member_uuid
            ));
        }
        // What it had when it left: the last superblock it took, or the
        // one it was being sent when the link went (its reply lost).
        let left_at = d.sb.locked().events;
        let tried = d.sb_tried.load(Ordering::Acquire).max(left_at);
        if msb.events < left_at || msb.events > tried {
            return Attempt::Refused(format!(
                "its superblock is {} (events {}, it had {left_at}{} when it left)",
                if msb.events < left_at {
                    "stale"
                } else {
                    "newer than ours: written elsewhere meanwhile"
                },
                msb.events,
                if tried > left_at {
                    format!(" or {tried}")
                } else {
                    String::new()
                }
            ));
        }
        let mut v = View::clone(&self.view.load());
        let still_away = v
            .failed
            .iter()
            .any(|f| std::ptr::eq(Arc::as_ptr(&f.0), Arc::as_ptr(d)));
        if !still_away {
            return Attempt::Refused("it was removed meanwhile".into());
        }
        if v.roles[role].disk.is_some() || meta.sb.roles[role].member_uuid != d.uuid {
            return Attempt::Refused(format!("role {role} was taken by another member meanwhile"));
        }
        // A bitmap clear's update goes out only after a flush of every
        // member went through. If that update (or a later one) was sent to
        // it, it held every write up to the clear, and each write it
        // missed since has its bit, even if the link went before the
        // update reached it.
        let as_left = Superblock {
            events: tried,
            ..msb.clone()
        };
        let dirty = self.missed_writes(&meta, &as_left);
        let resync = dirty.is_some();
        let back = Arc::new(Disk::new(raw, msb, true));
        let r = self
            .enter_role(&mut meta, &mut v, role, back, dirty)
            .and_then(|()| self.commit(&mut meta, v));
        match r {
            Ok(()) => Attempt::Rejoined { resync },
            Err(e) => Attempt::NotYet(e.to_string()),
        }
    }
}

/// Run `f` on a thread of the scope, or here if no thread can be had.
fn spawn_or_run<'scope, F>(sc: &'scope std::thread::Scope<'scope, '_>, f: F)
where
    F: FnOnce() + Send + Copy + 'scope,
{
    if std::thread::Builder::new()
        .name("reconnect".into())
        .spawn_scoped(sc, f)
        .is_err()
    {
        f();
    }
}
