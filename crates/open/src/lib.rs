//! Opening members from what a user types: files and block devices,
//! nested arrays (`array[...]`), fault injection (`fault:`) and simulated
//! disks (`sim:`). The engine (raidkit-array) takes members already opened;
//! this crate is the one place that turns names into members, so that a new
//! kind of member (a remote one, say) is added here and nowhere else.
//!
//! Member files and devices are opened with the process's I/O mode
//! ([`set_io_mode`]: direct, buffered, or auto), set once by a command's
//! `--io` flag; nested arrays and `fault:`/`sim:` wrappers take whatever
//! the files inside them were opened as.

pub mod spec;

pub use raidkit_member::IoMode;
pub use spec::{open, open_all, open_array, Spec};

use std::sync::atomic::{AtomicU8, Ordering};

/// The process's I/O mode (an `IoMode` as a number, for an atomic).
static IO_MODE: AtomicU8 = AtomicU8::new(mode_code(IoMode::Buffered));

const fn mode_code(m: IoMode) -> u8 {
    match m {
        IoMode::Auto => 0,
        IoMode::Direct => 1,
        IoMode::Buffered => 2,
    }
}

/// How every member file or device opened from now on, in this process, is
/// read and written. Callers that set nothing get buffered I/O.
pub fn set_io_mode(io: IoMode) {
    IO_MODE.store(mode_code(io), Ordering::Relaxed);
}

/// What each member file or device opened so far got ("direct I/O,
/// logical block 512, physical 4096"), by name, for a command to say at
/// start-up; taken once.
pub fn take_opened() -> Vec<(String, String)> {
    std::mem::take(
        &mut *OPENED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    )
}

static OPENED: std::sync::Mutex<Vec<(String, String)>> = std::sync::Mutex::new(Vec::new());

pub(crate) fn note_opened(name: &str, how: String) {
    OPENED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push((name.to_string(), how));
}

/// How long a request to a remote member (an NBD export) may wait for its
/// reply, in milliseconds; 0: as long as the network lets it.
static REMOTE_TIMEOUT_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(30_000);

/// How long connecting to a remote member and every request to it may take
/// before the connection counts as lost (default 30 s; `serve` sets its
/// member timeout). None: no limit.
pub fn set_remote_timeout(t: Option<std::time::Duration>) {
    let ms = t.map_or(0, |t| (t.as_millis() as u64).max(1));
    REMOTE_TIMEOUT_MS.store(ms, Ordering::Relaxed);
}

pub(crate) fn remote_timeout() -> Option<std::time::Duration> {
    match REMOTE_TIMEOUT_MS.load(Ordering::Relaxed) {
        0 => None,
        ms => Some(std::time::Duration::from_millis(ms)),
    }
}

/// The mode [`set_io_mode`] set (buffered if none was).
pub fn io_mode() -> IoMode {
    match IO_MODE.load(Ordering::Relaxed) {
        0 => IoMode::Auto,
        1 => IoMode::Direct,
        _ => IoMode::Buffered,
    }
}

use raidkit_array::create::{CreateMember, CreateOptions, CreateReport, MISSING};
use raidkit_array::{Added, Array, Error, Result};
use std::path::Path;

/// What `create` is to do with a member a user named: open it if it
/// exists (a file, a device, a nested array...), create it if it is a file
/// that does not, or leave its role empty for `missing`.
pub fn create_member(spec: &Spec, is_role: bool) -> Result<CreateMember> {
    if is_role && spec.path() == Some(MISSING) {
        return Ok(CreateMember::Missing);
    }
    match spec {
        Spec::File(p) if !Path::new(p).exists() => Ok(CreateMember::New(p.clone(), io_mode())),
        _ => Ok(CreateMember::Existing(open(spec, false)?)),
    }
}

/// Create an array over the members `specs` names (in role order) and the
/// spares `spares` names: every name is checked distinct, and every
/// member opened and checked before anything is written.
pub fn create(
    specs: &[Spec],
    spares: &[Spec],
    opts: &CreateOptions,
    progress: impl FnMut(u64, u64),
) -> Result<CreateReport> {
    let all: Vec<Spec> = specs.iter().chain(spares).cloned().collect();
    check_distinct(&all)?;
    let members = specs
        .iter()
        .map(|s| create_member(s, true))
        .collect::<Result<Vec<_>>>()?;
    let spares = spares
        .iter()
        .map(|s| create_member(s, false))
        .collect::<Result<Vec<_>>>()?;
    let opts = CreateOptions {
        spares,
        ..opts.clone()
    };
    raidkit_array::create::create(members, &opts, progress)
}

/// Add the member `spec_text` names to a running array (see
/// `Array::add_member`): refused before it is opened if the array already
/// has it in service.
pub fn add_member(array: &Array, spec_text: &str, force: bool) -> Result<Added> {
    let s = Spec::parse(spec_text)?;
    array.check_not_in_service(spec_text, s.path())?;
    let (m, created) = open_or_create(array, &s)?;
    array
        .add_member(m, force)
        .inspect_err(|_| forget_created(created))
}

/// Grow a running array by the members `specs` name (opened as `add`
/// opens them; files created there are removed again if it is refused).
pub fn grow(array: &Array, specs: &[String], force: bool) -> Result<raidkit_layout::Geometry> {
    let mut opened = Vec::new();
    let mut created = Vec::new();
    let r = (|| {
        let parsed = specs
            .iter()
            .map(|t| Spec::parse(t))
            .collect::<Result<Vec<_>>>()?;
        check_distinct(&parsed)?;
        for (text, s) in specs.iter().zip(parsed) {
            array.check_not_in_service(text, s.path())?;
            let (m, c) = open_or_create(array, &s)?;
            created.extend(c);
            opened.push(m);
        }
        array.grow(std::mem::take(&mut opened), force)
    })();
    if r.is_err() {
        created.into_iter().for_each(|c| forget_created(Some(c)));
    }
    r
}

/// Change the array's level with one new member (RAID-5 to RAID-6: the
/// member holds Q), opened as `grow` opens members; a file created here is
/// removed again if the change is refused.
pub fn take_over_adding(
    array: &Array,
    level: raidkit_layout::Level,
    spec: &str,
    force: bool,
) -> Result<raidkit_layout::Geometry> {
    let s = Spec::parse(spec)?;
    array.check_not_in_service(spec, s.path())?;
    let (m, created) = open_or_create(array, &s)?;
    let r = array.take_over_adding(level, m, force);
    if r.is_err() {
        forget_created(created);
    }
    r
}

/// Open the member a spec names for `add` or `replace`; a plain file that
/// does not exist is created, as large as the array's members (as
/// `create` makes missing member files). Some(path): it was created here.
fn open_or_create(
    array: &Array,
    s: &Spec,
) -> Result<(std::sync::Arc<dyn raidkit_member::Member>, Option<String>)> {
    match s {
        Spec::File(p) if !Path::new(p).exists() => {
            let len = array.member_len();
            let o = raidkit_member::create_member(p, len, io_mode()).map_err(|e| {
                Error::Invalid(format!(
                    "{p} does not exist and could not be created ({} bytes, as the array's members): {}",
                    len, e.source
                ))
            })?;
            note_opened(p, o.to_string());
            Ok((o.member, Some(p.clone())))
        }
        _ => Ok((open(s, false)?, None)),
    }
}

/// A member file created for an `add` or `replace` the array refused goes
/// again: nothing is left behind by a refusal.
fn forget_created(created: Option<String>) {
    if let Some(p) = created {
        let _ = std::fs::remove_file(p);
    }
}

/// Rebuild `who` onto the member `with_text` names (see
/// `Array::replace_member`); what can be refused is refused before the new
/// member is opened.
pub fn replace_member(array: &Array, who: &str, with_text: &str, force: bool) -> Result<usize> {
    array.check_replaceable(who)?;
    let s = Spec::parse(with_text)?;
    array.check_not_in_service(with_text, s.path())?;
    let (m, created) = open_or_create(array, &s)?;
    array
        .replace_member(who, m, force)
        .inspect_err(|_| forget_created(created))
}

/// The same file named twice (directly, through a link, or inside a nested spec).
fn check_distinct(specs: &[Spec]) -> Result<()> {
    match first_repeat(specs) {
        Some((first, p)) => Err(Error::Invalid(format!(
            "{p} is given more than once (also as {first})"
        ))),
        None => Ok(()),
    }
}

/// The first file or NBD export `specs` name twice: the first name, and
/// the second.
pub(crate) fn first_repeat(specs: &[Spec]) -> Option<(String, String)> {
    first_repeat_file(specs).or_else(|| first_repeat_export(specs))
}

/// The first NBD export named twice: the same server address and export
/// name, however the URI spells them (a trailing slash, TLS settings).
/// Two addresses of one server are not caught here; their superblocks
/// are, once written (assembly refuses a member UUID seen twice).
fn first_repeat_export(specs: &[Spec]) -> Option<(String, String)> {
    let mut seen: Vec<(String, String)> = Vec::new();
    for uri in specs.iter().flat_map(|s| s.exports()) {
        let key = match raidkit_nbd::Address::parse(uri) {
            Ok(a) => format!("{:?} {}", a.endpoint, a.export),
            Err(_) => uri.to_string(),
        };
        if let Some((_, first)) = seen.iter().find(|(k, _)| *k == key) {
            return Some((first.clone(), uri.to_string()));
        }
        seen.push((key, uri.to_string()));
    }
    None
}

/// The first file `specs` name twice.
fn first_repeat_file(specs: &[Spec]) -> Option<(String, String)> {
    let all: Vec<&str> = specs
        .iter()
        .flat_map(|s| s.files())
        .filter(|&f| f != MISSING)
        .collect();
    let mut seen: Vec<(String, Option<(u64, u64)>)> = Vec::new();
    for p in all {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        // A block device by its device number: two nodes of one disk are
        // one member.
        let id = std::fs::metadata(p)
            .ok()
            .map(|m| match m.file_type().is_block_device() {
                true => (0, m.rdev()),
                false => (m.dev(), m.ino()),
            });
        // A file not made yet (create --size makes it) by where it would
        // be: m0.img, ./m0.img and its full path are one file.
        let key = match id {
            Some(_) => p.to_string(),
            None => would_be(p),
        };
        if let Some((first, _)) = seen
            .iter()
            .find(|(q, qid)| *q == key || (id.is_some() && *qid == id))
        {
            let first = specs
                .iter()
                .flat_map(|s| s.files())
                .find(|f| *f == first.as_str() || would_be(f) == *first)
                .unwrap_or(first)
                .to_string();
            return Some((first, p.to_string()));
        }
        seen.push((key, id));
    }
    None
}

/// Where a path that does not exist yet would be: its directory's real
/// path and its name (the path as given if its directory is not there).
fn would_be(p: &str) -> String {
    let path = std::path::Path::new(p);
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    match (std::fs::canonicalize(dir), path.file_name()) {
        (Ok(d), Some(name)) => d.join(name).display().to_string(),
        _ => p.to_string(),
    }
}
