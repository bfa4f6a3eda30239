//! Command-line flags, apart from the work they start.

use crate::units::parse_size;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

mod bench;
pub use bench::*;

/// Software RAID in user space: arrays of files, devices and other arrays,
/// placed exactly as Linux md places data.
#[derive(Debug, Parser)]
#[command(name = "raidkit", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// How log lines (on stderr) are written: text for people, json for
    /// log collectors (one JSON object per line: timestamp, level, fields
    /// with the message, target). RAIDKIT_LOG sets the level (e.g. debug).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create an array: write superblocks to the members (creating missing
    /// member files of --size) and make redundancy consistent.
    Create(CreateArgs),
    /// Show one member's superblock.
    Examine(ExamineArgs),
    /// Find arrays: read the superblocks of the given files, directories
    /// (their entries) or block devices (every block device when none is
    /// given) and list the arrays found by UUID, with their members, what
    /// is missing or stale, and the command that serves each.
    Scan(ScanArgs),
    /// Assemble the array from its members and describe it.
    Detail(DetailArgs),
    /// Read from the array (offline) to stdout or a file.
    Read(ReadArgs),
    /// Write to the array (offline) from stdin or a file.
    Write(WriteArgs),
    /// Assemble the array and serve it over NBD until SIGTERM or SIGINT.
    Serve(Box<ServeArgs>),
    /// Serve one file or block device as a plain NBD export (no array
    /// metadata), for arrays whose members are on other hosts
    /// (nbd://HOST:PORT/EXPORT members), until SIGTERM or SIGINT.
    Export(ExportArgs),
    /// Ask a running server for the array's state, members and I/O counters.
    Status(StatusArgs),
    /// Every raidkit server running on this machine, one line each: array,
    /// level, state, members in sync, size, PID, endpoint and recovery
    /// (raidkit's /proc/mdstat).
    List(ListArgs),
    /// Stop a running server cleanly (its array is flushed and marked
    /// clean), as SIGTERM does; refused while clients are connected unless
    /// --force.
    Stop(StopArgs),
    /// Check, offline, that redundancy agrees with the data: P and Q
    /// recomputed from the data by plain reference code, mirrors compared.
    /// Exits 1 if anything disagrees, 2 if it could not check (a member
    /// missing or in use).
    Check(CheckArgs),
    /// Mark a member of a running array faulty, as if it had failed.
    Fail(FailArgs),
    /// Let go of a failed member or a spare of a running array.
    Remove(MemberArgs),
    /// Add a member to a running array: it takes the place of a missing
    /// member and is rebuilt (only where it missed writes, if it is that
    /// member coming back), or it becomes a hot spare.
    Add(AddArgs),
    /// Rebuild a member's contents onto a new member while the old one
    /// stays in service; then the new one takes its place.
    Replace(ReplaceArgs),
    /// Grow a running array by members (RAID-0, 4, 5, 6): the data moves
    /// to md's placement for the new member count while the array serves;
    /// the new size is exported when the move ends. Or change its level
    /// in place (RAID-4 or a two-member RAID-1 to RAID-5), change its
    /// chunk (`--chunk`, the data rewritten in place while it serves), or
    /// use the room of members that have grown (`--size max`, no data
    /// moved).
    Grow(GrowArgs),
    /// Wait until no recovery runs on a running array (with a progress bar
    /// on a terminal).
    Wait(WaitArgs),
    /// Show or change a running array's rebuild speed limits.
    Speed(SpeedArgs),
    /// Scrub a running array: read every block of every member, check it
    /// against its checksum and against redundancy, and repair what
    /// disagrees (unless --check-only), naming each member, offset and
    /// array range. Runs in the background at the rebuild speed limits;
    /// resumed after a restart
    Scrub(ScrubArgs),
    /// Follow a running server's events (Fail, DegradedArray,
    /// RebuildStarted, Rebuild20..80, RebuildFinished, SpareActive,
    /// ScrubFinished, ChecksumError, SlowMember, ...), one line each, as
    /// mdadm --monitor does; --test sends a TestMessage through the whole
    /// path (the server's --program and --events-log too) and exits once
    /// it came back.
    Monitor(MonitorArgs),
    /// Change a stopped array's consistency policy (none, bitmap or
    /// journal): metadata only, no data is moved. Every member must be
    /// given, and the array must have been stopped cleanly.
    Policy(PolicyArgs),
    /// Benchmarks: `raidkit bench TARGET` measures any storage (a file, a
    /// block device, a directory, or array[...]); subcommands measure
    /// raidkit's own parts.
    Bench(Box<BenchArgs>),
}

fn size(s: &str) -> Result<u64, String> {
    parse_size(s)
}

fn rate(s: &str) -> Result<u64, String> {
    crate::units::parse_rate(s)
}

/// How the members' files and block devices are read and written.
#[derive(Debug, Args)]
pub struct IoArgs {
    /// I/O to the member files and devices: auto (direct I/O where the file
    /// system or device allows it, buffered on tmpfs), direct (O_DIRECT,
    /// past the page cache; refused where it cannot be had) or buffered
    /// (through the page cache). Members added or replaced on a running
    /// server get the server's mode. What each member got is logged at
    /// start-up (RAIDKIT_LOG=info).
    #[arg(long, value_name = "MODE", default_value = "auto", value_parser = io_mode)]
    pub io: raidkit_open::IoMode,
}

fn io_mode(s: &str) -> Result<raidkit_open::IoMode, String> {
    s.parse()
}

/// Members: file paths, block devices, or `array[M1,M2,...]` for an array
/// used as a member (nesting: RAID-50, RAID-60), in any order.
#[derive(Debug, Args)]
pub struct Members {
    /// The array's members, in any order.
    #[arg(required = true, value_name = "MEMBER")]
    pub members: Vec<String>,
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// RAID level: linear, 0, 1, 4, 5, 6 or 10.
    #[arg(short, long)]
    pub level: String,
    /// Layout: left-symmetric (default for 5 and 6), right-symmetric,
    /// left-asymmetric, right-asymmetric, parity-first, parity-last;
    /// n2 (default) or n3 for RAID-10 (md's near copies), f2 (far: the
    /// array again in each member's second half, one member on), o2
    /// (offset: each row of chunks followed by its copy one member on).
    #[arg(short = 'p', long)]
    pub layout: Option<String>,
    /// Chunk size, a power of two from 4K to 1G.
    /// Sizes: bytes, or with a suffix K, M, G, T (powers of 1024).
    #[arg(value_name = "SIZE", short, long, default_value = "512K", value_parser = size)]
    pub chunk: u64,
    /// Size of each member; member files that do not exist are created (sparse) this big.
    /// Sizes: bytes, or with a suffix K, M, G, T (powers of 1024).
    #[arg(value_name = "SIZE", short = 'z', long, value_parser = size)]
    pub size: Option<u64>,
    /// Array name (at most 64 bytes). Default: the first member's file
    /// name without its extension (`d0.img` gives `d0`, `/dev/sdb` gives
    /// `sdb`), as mdadm names an array after its device.
    #[arg(short = 'N', long)]
    pub name: Option<String>,
    /// Overwrite members that hold data or belong to another array.
    #[arg(short, long)]
    pub force: bool,
    /// Skip the initial sync of existing members: trust that their
    /// redundancy is already consistent (for example, they are all zero).
    #[arg(long)]
    pub assume_clean: bool,
    /// Return at once and leave the initial sync of existing members to
    /// the server, which runs it in the background while it serves (as md
    /// does after mdadm --create; resumed across restarts). Until a stripe
    /// is synced, writes to it compute parity from all its data and a
    /// degraded read of it is refused, never answered wrong; `check`
    /// waits for the sync.
    #[arg(long, conflicts_with = "assume_clean")]
    pub background_sync: bool,
    /// Hot spare (repeatable): a member kept ready that takes over, and is
    /// rebuilt, as soon as a member fails.
    #[arg(long, value_name = "PATH")]
    pub spare: Vec<String>,
    /// Failure domain of each member, in order (spares last), comma
    /// separated: what fails together (a host, a rack, a shelf). Without
    /// it a member's domain is the host of its nbd:// URI, or this host.
    /// An array whose members span several domains is refused where one
    /// domain holds more members than the level can lose, unless --force.
    #[arg(long, value_name = "LABEL,...", value_delimiter = ',')]
    pub domain: Vec<String>,
    /// Write-intent bitmap region size: a member that drops out and comes
    /// back resyncs only the regions written meanwhile. 0 disables it.
    /// Sizes: bytes, or with a suffix K, M, G, T (powers of 1024).
    #[arg(value_name = "SIZE", long, default_value = "64M", value_parser = size)]
    pub bitmap_region: u64,
    /// What keeps redundancy consistent across crashes: none (full resync
    /// after an unclean shutdown), bitmap (resync of the regions being
    /// written) or journal (default: every parity update logged first and
    /// replayed after a crash; closes the RAID-5/6 write hole). Levels
    /// without parity have no write hole: bitmap is their default, and
    /// journal is refused for them.
    #[arg(long, value_name = "POLICY")]
    pub consistency_policy: Option<String>,
    /// Keep a checksum (crc32c) of every 4 KiB block of every member,
    /// parity included: every read is verified, a block that silently
    /// changed on a disk is rebuilt from redundancy and the member named;
    /// beyond redundancy the read fails rather than return wrong data.
    /// Takes 0.1% of each member.
    /// Default on (off with --metadata md, whose superblock has no place
    /// for them).
    #[arg(long, value_name = "on|off", value_parser = on_off, action = clap::ArgAction::Set)]
    pub checksums: Option<bool>,
    /// Where each member's data begins: the metadata area before it holds
    /// the superblocks, the write-intent bitmap, the journal (all of the
    /// rest: a larger area means a longer journal, checkpointed less
    /// often) and the checksums. A whole number of MiB. Default: 1/128 of
    /// the member, between 1M and 128M (128M on members of 16G and more),
    /// as mdadm reserves. Not with --metadata md.
    /// Sizes: bytes, or with a suffix K, M, G, T (powers of 1024).
    #[arg(value_name = "SIZE", long, value_parser = size)]
    pub data_offset: Option<u64>,
    /// The superblock format: raidkit (default), or md (Linux md's v1.2,
    /// as mdadm --create writes it, with mdadm's data offset), so that the
    /// kernel's md driver assembles the array. md metadata has no raidkit
    /// checksums, bitmap or journal: the consistency policy is none.
    #[arg(long, value_name = "FORMAT", default_value = "raidkit")]
    pub metadata: String,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub io: IoArgs,
    #[command(flatten)]
    pub members: Members,
}

fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("'{s}': use on or off")),
    }
}

#[derive(Debug, Args)]
pub struct ExamineArgs {
    /// The member to examine.
    pub member: String,
    /// Print JSON (all sizes and offsets in bytes).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct PolicyArgs {
    /// The new policy: none (a full resync after an unclean shutdown),
    /// bitmap (a resync of the regions being written) or journal (parity
    /// levels: every stripe update logged first; no write hole).
    #[arg(value_name = "POLICY", value_parser = ["none", "bitmap", "journal"])]
    pub policy: String,
    /// The bitmap's region size for bitmap and journal (default: the
    /// present one, or 64M).
    /// of 1024).
    /// Sizes: bytes, or with a suffix K, M, G, T (powers of 1024).
    #[arg(value_name = "SIZE", long, value_parser = size)]
    pub bitmap_region: Option<u64>,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub members: Members,
}

#[derive(Debug, Args)]
pub struct DetailArgs {
    /// Print JSON (all sizes in bytes).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub members: Members,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub members: Members,
}

#[derive(Debug, Args)]
pub struct ReadArgs {
    /// Array offset to start at.
    /// Sizes: bytes, or with a suffix K, M, G, T (powers of 1024).
    #[arg(value_name = "SIZE", short, long, value_parser = size)]
    pub offset: u64,
    /// Number of bytes to read.
    /// Sizes: bytes, or with a suffix K, M, G, T (powers of 1024).
    #[arg(value_name = "SIZE", short = 'n', long, value_parser = size)]
    pub length: u64,
    /// Write the data here instead of stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub members: Members,
}

#[derive(Debug, Args)]
pub struct WriteArgs {
    /// Array offset to start at.
    /// Sizes: bytes, or with a suffix K, M, G, T (powers of 1024).
    #[arg(value_name = "SIZE", short, long, value_parser = size)]
    pub offset: u64,
    /// Read the data from this file instead of stdin.
    #[arg(long = "in")]
    pub input: Option<PathBuf>,
    /// Start the array degraded although members are missing that it did
    /// not know to be gone when it stopped (mdadm's --run); without it
    /// that is refused, naming the missing members.
    #[arg(long)]
    pub run: bool,
    /// Print what was written as JSON ({"written": bytes, "offset": bytes})
    /// on stdout, instead of the line on stderr.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub io: IoArgs,
    #[command(flatten)]
    pub members: Members,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Serve in the background: return (exit 0) once the array is served,
    /// after printing the endpoints, as mdadm --assemble returns once the
    /// array runs; the server goes on in a session of its own (its log still
    /// to this stderr: redirect it, e.g. 2>>lab.log). `raidkit stop` stops it.
    #[arg(long)]
    pub daemon: bool,
    /// TCP address to listen on (port 0 picks a free port, printed at start-up).
    /// Default 127.0.0.1:10809, unless only --socket is given.
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<String>,
    /// Also (or, without --listen, only) listen on this Unix socket.
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Export name (default: the array's name). Clients asking for the
    /// default export ("") get it too.
    #[arg(long)]
    pub export: Option<String>,
    /// Serve read-only: writes are refused and the members are never written.
    #[arg(long)]
    pub read_only: bool,
    /// Control socket path (default: raidkit-<array uuid>.ctl in the temp directory).
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// Requests served at once per connection (default: 8 when every member
    /// is written through the page cache, where a request is a memory copy
    /// and more threads than that only contend; 32, a client's usual queue
    /// depth, when a member waits on a device, so that the requests a
    /// client has in flight all reach the disks).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Connections served at once (each costs a thread per worker); more
    /// are closed at once and counted in status as refused.
    #[arg(long, value_name = "N", default_value_t = raidkit_nbd::DEFAULT_MAX_CONNECTIONS as u32, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// Answer large reads with splice(2), file to socket, no copy in the
    /// server: auto (for TCP clients on other machines; a client on this
    /// one copies the data out of the page cache at a higher cost than the
    /// server saves), always, or never.
    #[arg(long, value_name = "WHEN", default_value = "auto", value_parser = ["auto", "always", "never"])]
    pub zero_copy: String,
    /// Do not send large reads of cached data straight from mappings of the
    /// member files (one copy in the server instead of two); read them into
    /// a buffer first, as for uncached data.
    #[arg(long)]
    pub no_mapped_reads: bool,
    /// Do not read ahead of a sequential reader. By default an array of
    /// members without a page cache (direct I/O) reads the next few full
    /// stripes of a sequential stream while the client takes the last, so
    /// that one reader at queue depth 1 keeps every disk working.
    #[arg(long)]
    pub no_read_ahead: bool,
    /// Do not write behind a sequential writer. By default, for an array of
    /// members without a page cache, a client that sends one write at a
    /// time in sequence (a dd-style stream) has each write answered once
    /// its bytes are copied, and up to four written at once (at most
    /// 32 MiB), as a disk's write cache does: a flush waits for them and
    /// reports an error any of them met.
    #[arg(long)]
    pub no_write_behind: bool,
    /// Do not receive large writes to cached pages straight into mappings
    /// of the member files (plain files of linear, RAID-0 and, by whole
    /// stripes, RAID-4/5/6 arrays: one copy in the server instead of two);
    /// receive them into a buffer first, as for mirrored levels.
    #[arg(long)]
    pub no_mapped_writes: bool,
    /// Send each small write's reply at once, even when the next request
    /// is a small write whose reply could share its system call.
    #[arg(long)]
    pub no_batch_replies: bool,
    /// Rebuild speed while clients are busy,
    /// as md's speed_limit_min. Changeable at run time (raidkit speed).
    /// Rates: bytes per second, suffixes K, M, G, T (powers of 1024), /s accepted; 0: no limit.
    #[arg(long, value_name = "RATE", default_value = "16M", value_parser = rate)]
    pub rebuild_min: u64,
    /// Rebuild speed when clients are idle, as md's
    /// speed_limit_max.
    /// Rates: bytes per second, suffixes K, M, G, T (powers of 1024), /s accepted; 0: no limit.
    #[arg(long, value_name = "RATE", default_value = "0", value_parser = rate)]
    pub rebuild_max: u64,
    /// A member that has an operation outstanding this long (seconds)
    /// without completing anything is failed.
    #[arg(long, value_name = "SECONDS", default_value_t = 30.0)]
    pub member_timeout: f64,
    /// A member on another host (nbd://) whose connection is lost is
    /// `disconnected`: the array serves without it while it is tried again
    /// in the background (after 0.5 s, then at least every 4 s). Back within this many
    /// seconds, it rejoins by itself and is resynced only where writes
    /// went while it was away; away longer, it is failed for good.
    #[arg(long, value_name = "SECONDS", default_value_t = 300.0)]
    pub rejoin_timeout: f64,
    /// Run this program for every event, as mdadm --monitor's PROGRAM:
    /// `PATH EVENT ARRAY [MEMBER]`, the event as JSON in RAIDKIT_EVENT.
    /// One at a time, never holding up I/O; killed after
    /// --program-timeout; its failures are logged.
    #[arg(long, value_name = "PATH")]
    pub program: Option<PathBuf>,
    /// Seconds an event program may run before it is killed.
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
    pub program_timeout: f64,
    /// Append every event to this file as a JSON line.
    #[arg(long, value_name = "FILE")]
    pub events_log: Option<PathBuf>,
    /// Serve Prometheus metrics (/metrics), the status as JSON
    /// (/api/status, /api/events) and a status page (/) over HTTP on this
    /// address; --http alone listens on 127.0.0.1:10810. Read-only. Off
    /// unless asked.
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "127.0.0.1:10810")]
    pub http: Option<String>,
    /// Start an array that has lost too many members from the most recent
    /// stale ones, as md's --force (their last writes may be missing).
    #[arg(long)]
    pub force: bool,
    /// Start the array degraded although members are missing that it did
    /// not know to be gone when it stopped (mdadm's --run); without it
    /// that is refused, naming the missing members. A remote member whose
    /// host does not answer is then left out, tried again in the
    /// background, and takes its role back by itself if it answers within
    /// --rejoin-timeout.
    #[arg(long)]
    pub run: bool,
    /// Serve every array of this config file (TOML; default
    /// /etc/raidkit/raidkit.toml), each as an export of one server, their
    /// members found by UUID wherever they are (`raidkit scan --config`
    /// writes one). Options given on the command line win over the
    /// file's settings, which win over the defaults.
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = crate::config::DEFAULT_PATH)]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub io: IoArgs,
    #[command(flatten)]
    pub access: AccessArgs,
    #[command(flatten)]
    pub members: ServeMembers,
    /// The options given on the command line (not defaults), by id.
    #[arg(skip)]
    pub given: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The file or block device to export.
    pub path: PathBuf,
    /// TCP address to listen on (port 0 picks a free port, printed at
    /// start-up). Default 127.0.0.1:10809, unless only --socket is given.
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<String>,
    /// Also (or, without --listen, only) listen on this Unix socket.
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Export name (default: the file's name).
    #[arg(long)]
    pub name: Option<String>,
    /// Serve read-only: writes are refused and the file is never written.
    #[arg(long)]
    pub read_only: bool,
    /// Connections served at once.
    #[arg(long, value_name = "N", default_value_t = raidkit_nbd::DEFAULT_MAX_CONNECTIONS as u32, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    #[command(flatten)]
    pub io: IoArgs,
    #[command(flatten)]
    pub access: AccessArgs,
}

/// Who may connect to a server, and how (serve, export).
#[derive(Debug, Args, Clone)]
pub struct AccessArgs {
    /// TLS (NBD_OPT_STARTTLS): off, on (offered; clients choose) or
    /// require (clients must switch to TLS before anything else). on and
    /// require need --tls-cert and --tls-key, or --tls-psk.
    #[arg(long, value_name = "MODE", default_value = "off", value_parser = ["off", "on", "require"])]
    pub tls: String,
    /// The server's certificate chain (PEM).
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// The server's private key (PEM).
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// Require clients to show a certificate signed by this authority (PEM).
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// Pre-shared keys instead of certificates: a file of lines
    /// IDENTITY:HEXKEY (nbdkit's and qemu's --tls-psk format, as GnuTLS's
    /// psktool writes it); clients must know one of them.
    #[arg(long, value_name = "FILE")]
    pub tls_psk: Option<PathBuf>,
    /// Let in only peers from these addresses or networks
    /// (ADDR[/PREFIX],...); others are disconnected before the NBD
    /// handshake. Unix socket clients are not affected.
    #[arg(long, value_name = "CIDR,...")]
    pub allow: Option<String>,
}

/// The members of the array `serve` serves (none with --config).
#[derive(Debug, Args)]
pub struct ServeMembers {
    /// The array's members, in any order.
    #[arg(value_name = "MEMBER", required_unless_present = "config")]
    pub members: Vec<String>,
}

/// Which running server to talk to.
#[derive(Debug, Args)]
pub struct Control {
    /// The server: its control socket, or its array's name or UUID
    /// (default: the only server running).
    #[arg(long, value_name = "PATH|NAME|UUID")]
    pub control: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Print JSON (an array of objects, one per server).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct StopArgs {
    /// The array: its name or UUID, or the server's control socket
    /// (default: the only server running).
    pub array: Option<String>,
    /// Stop even while clients are connected: they are disconnected, and
    /// writes they have not flushed may be lost to them.
    #[arg(long)]
    pub force: bool,
    /// Seconds to wait for the server to finish.
    #[arg(long, default_value_t = 120)]
    pub timeout: u64,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub control: Control,
}

#[derive(Debug, Args)]
pub struct FailArgs {
    /// The member: its path, or its role number.
    pub member: String,
    /// Fail it even if the array cannot run without it.
    #[arg(long)]
    pub force: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub control: Control,
}

#[derive(Debug, Args)]
pub struct MemberArgs {
    /// The member: its path, or its role number.
    pub member: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub control: Control,
}

#[derive(Debug, Args)]
pub struct AddArgs {
    /// The member to add (a path, or any member spec). A plain path that
    /// does not exist is created, as large as the array's members (the
    /// file a spec such as fault: or sim: wraps must exist).
    pub member: String,
    /// Use it even if it holds data or another array's superblock.
    #[arg(long)]
    pub force: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub control: Control,
}

#[derive(Debug, Args)]
pub struct GrowArgs {
    /// Members to add (paths or member specs); a plain path that does not
    /// exist is created, as large as the array's members (the file a spec
    /// such as fault: or sim: wraps must exist).
    #[arg(long, num_args = 1.., value_name = "MEMBER")]
    pub add: Vec<String>,
    /// Convert to another level where no data moves: `5` turns a RAID-4
    /// or a two-member RAID-1 into a RAID-5 (with `--add`, grown after);
    /// `6` with one `--add` turns a RAID-5 into a RAID-6 whose Q is built
    /// on the new member (md's "-6" layout). Other conversions are refused.
    #[arg(long, value_name = "LEVEL")]
    pub level: Option<String>,
    /// Change the chunk size (RAID-0, 4, 5 and 6): every byte moves to
    /// md's placement for the new chunk while the array serves, a batch
    /// at a time, each first set aside in the members' metadata area (no
    /// backup file). A change of its own. Sizes: bytes, or with a suffix
    /// K, M (powers of 1024); a power of two from 4K to 1G.
    #[arg(long, value_name = "SIZE", value_parser = size)]
    pub chunk: Option<u64>,
    /// `max`: use all the room the members have (devices or files that
    /// grew since the array was made: each member's length less its
    /// metadata, the smallest one's, in whole chunks). No data moves; the
    /// new stripes' redundancy is made consistent in the background (an
    /// initial sync of the new space). Not for linear arrays; with
    /// checksums, only within what the checksum area was made for (the
    /// members' size at create): a growth past it is refused, with
    /// nothing changed.
    #[arg(long, value_name = "max")]
    pub size: Option<String>,
    /// Use the new members even if they hold data or another array's superblock.
    #[arg(long)]
    pub force: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub control: Control,
}

#[derive(Debug, Args)]
pub struct ReplaceArgs {
    /// The member to replace: its path, or its role number.
    pub member: String,
    /// The new member (a path, or any member spec). A plain path that does
    /// not exist is created, as large as the array's members (the file a
    /// spec such as fault: or sim: wraps must exist).
    #[arg(long, value_name = "PATH")]
    pub with: String,
    /// Use the new member even if it holds data or another array's superblock.
    #[arg(long)]
    pub force: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub control: Control,
}

#[derive(Debug, Args)]
pub struct WaitArgs {
    /// Give up (exit 1) after this many seconds.
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<f64>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub control: Control,
}

#[derive(Debug, Args)]
pub struct SpeedArgs {
    /// New busy-time rebuild speed.
    /// Rates: bytes per second, suffixes K, M, G, T (powers of 1024), /s accepted; 0: no limit.
    #[arg(long, value_name = "RATE", value_parser = rate)]
    pub rebuild_min: Option<u64>,
    /// New idle-time rebuild speed.
    /// Rates: bytes per second, suffixes K, M, G, T (powers of 1024), /s accepted; 0: no limit.
    #[arg(long, value_name = "RATE", value_parser = rate)]
    pub rebuild_max: Option<u64>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub control: Control,
}

#[derive(Debug, Args)]
pub struct ScanArgs {
    /// Files, directories or block devices to look at (default: every
    /// block device).
    pub paths: Vec<std::path::PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Print a config file for `raidkit serve --config` that serves every
    /// array found, looking for members where this scan looked.
    #[arg(long, conflicts_with = "json")]
    pub config: bool,
}

#[derive(Debug, Args)]
pub struct MonitorArgs {
    /// Print each event as a JSON line.
    #[arg(long)]
    pub json: bool,
    /// Send a TestMessage event and exit once it came back (exit 1 if it
    /// did not within 10 s).
    #[arg(long)]
    pub test: bool,
    /// Start with the events the server still keeps (its last 1000),
    /// not only those from now on.
    #[arg(long, conflicts_with = "test")]
    pub all: bool,
    #[command(flatten)]
    pub control: Control,
}

#[derive(Debug, Args)]
pub struct ScrubArgs {
    /// Report what disagrees without repairing anything.
    #[arg(long)]
    pub check_only: bool,
    /// Stop a scrub that runs.
    #[arg(long, conflicts_with = "check_only")]
    pub stop: bool,
    /// Wait until the scrub ends (a progress bar on a terminal), print
    /// what it found, and exit 1 if anything was left unrepaired (or,
    /// with --check-only, found at all), 2 if the scrub did not run to its
    /// end (stopped, a member lost, the server gone).
    #[arg(long, conflicts_with = "stop")]
    pub wait: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub control: Control,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The server: its control socket, or its array's name or UUID
    /// (default: the only server running).
    #[arg(long, value_name = "PATH|NAME|UUID")]
    pub control: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Tests run by default: everything the target can do.
pub const DEFAULT_TESTS: &str = "all";
