//! The flags of `raidkit bench` and its subcommands.

use super::*;

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: Option<BenchCommand>,
    #[command(flatten)]
    pub storage: StorageBenchArgs,
}

/// Storage benchmarks of a target.
#[derive(Debug, Args)]
pub struct StorageBenchArgs {
    /// What to measure: a file (created, and removed after, if it does not
    /// exist), a block device, a directory (a scratch file inside), an NBD
    /// export (nbd://HOST[:PORT]/EXPORT or nbd+unix:///EXPORT?socket=PATH),
    /// or a raidkit array as array[MEMBER,...].
    pub target: Option<String>,
    /// Tests to run, comma separated. dd/fio style: seq_write, seq_read
    /// (1 MiB blocks, MB/s, per zone), randwrite_4k, randread_4k (IOPS at
    /// queue depths 1 and 32, per zone). bonnie++'s set: char_write,
    /// block_write, rewrite, char_read, block_read, random_seeks, and
    /// file_create (directories: create/stat/delete rates, sequential and
    /// random). The lab's data path: mem_to_target, target_to_mem,
    /// streams_write, streams_read (K streams against one), mixed_rw
    /// (a reader and a writer at once). Groups: dd, bonnie, datapath, all.
    /// Tests a target cannot do (char I/O without a file system, file
    /// creation outside a directory) are skipped with a note.
    #[arg(long, default_value = DEFAULT_TESTS)]
    pub tests: String,
    /// Working set (default: the whole target; 1G for a new file or a directory).
    /// Sizes: bytes, or with a suffix K, M, G, T (powers of 1024).
    #[arg(value_name = "SIZE", long, value_parser = size)]
    pub size: Option<u64>,
    /// Runs of each test; the median is reported with min and max
    /// [default: 3; 1 with --quick].
    #[arg(long)]
    pub runs: Option<usize>,
    /// Seconds per random-I/O measurement, and the most each per-character
    /// test and random_seeks run may take [default: 2; 0.5 with --quick].
    #[arg(long)]
    pub seconds: Option<f64>,
    /// A short pass over every test asked for: one run, 0.5 s per timed
    /// test, a 64 MiB working set, whole-target zones, 1024 files. Flags
    /// given beside it win. The whole set takes under 30 s on a small
    /// target.
    #[arg(long)]
    pub quick: bool,
    /// Queue depths of randread_4k and randwrite_4k (comma-separated, 1 to 256).
    #[arg(long, default_value = "1,32")]
    pub qd: String,
    /// Seed of the random offsets and orders (default: a new one every
    /// time, so that no run reads back exactly the blocks an earlier one
    /// left in a cache; it is recorded with the results to repeat a run).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Measure seq_* and rand* over the whole working set (zone "all")
    /// instead of per outer/middle/inner third.
    #[arg(long)]
    pub whole: bool,
    /// Simultaneous streams for streams_write and streams_read.
    #[arg(long, default_value_t = 3)]
    pub streams: usize,
    /// Bytes moved one at a time by char_write and char_read (bonnie++'s -f).
    /// Sizes: bytes, or with a suffix K, M, G, T (powers of 1024).
    #[arg(value_name = "SIZE", long, value_parser = size, default_value = "20M")]
    pub char_size: u64,
    /// Block size of bonnie++'s block, rewrite and seek tests.
    /// Sizes: bytes, or with a suffix K, M, G, T (powers of 1024).
    #[arg(value_name = "SIZE", long, value_parser = size, default_value = "8K")]
    pub chunk: u64,
    /// Files for file_create (bonnie++'s -n, here a plain count)
    /// [default: 16384; 1024 with --quick].
    #[arg(long)]
    pub files: Option<usize>,
    /// Print JSON: {"config": {...}, "results": [{test, value, unit, runs, min, max, zone, qd}]}.
    #[arg(long)]
    pub json: bool,
    /// Also write the results as CSV to this file.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Also draw the results as SVG bar charts in this directory
    /// (throughput.svg, iops.svg, files.svg).
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    /// Write this sample of real data instead of random data (refused if it
    /// looks compressible, unless --allow-compressible). As with random
    /// data, the first 16 bytes of every 512 written are a stamp that keeps
    /// writes from being deduplicated.
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,
    /// Accept compressible --data.
    #[arg(long)]
    pub allow_compressible: bool,
    /// Allow the write tests to overwrite an existing file, device or export.
    #[arg(long)]
    pub destroy_data: bool,
    /// Qualification thresholds, judged after the run: PASS or FAIL each,
    /// and exit status 3 when one fails. TEST[@qdN][@ZONE][@xK] OP
    /// VALUE[UNIT], comma separated, such as
    /// 'seq_write>=10MB/s,randread_4k@qd32>=5000'; OP is >=, >, <= or <;
    /// units MB/s, GB/s, KB/s, IOPS, seeks/s, files/s, %, x; 5k is 5000.
    /// Every zone must meet it.
    #[arg(long, value_name = "REQUIREMENTS")]
    pub require: Option<String>,
    /// Keep this run's JSON (configuration, machine, the target's model,
    /// serial, firmware and write cache, an array's level and state) as a
    /// new file in DIR: the permanent record that `raidkit bench compare`
    /// and `raidkit bench report` read.
    #[arg(long, value_name = "DIR")]
    pub record: Option<PathBuf>,
    /// A name for this run in the record and the reports (such as the
    /// vendor's offer or the disk's slot).
    #[arg(long)]
    pub label: Option<String>,
    /// For an array[...] target: first measure each of its members alone
    /// and all at once, read-only, as `raidkit bench members` does (with
    /// this run's --runs, --seconds, --qd and --record), then the array.
    #[arg(long)]
    pub members_first: bool,
    /// Run streams_write and streams_read from N separate client
    /// processes, each with its own connection to the NBD export (N
    /// streams; --streams is then unused): the aggregate and each client's
    /// figure.
    #[arg(long, value_name = "N")]
    pub clients: Option<usize>,
    /// Start each client through this command prefix, `{i}` being the
    /// client's number from 1: 'ssh farm{i}' (raidkit at the same path
    /// there), 'ip netns exec lab{i}'.
    #[arg(long, value_name = "COMMAND", requires = "clients")]
    pub client_via: Option<String>,
    /// For an NBD export served by raidkit: its control socket, to record
    /// the array's level and whether it was degraded or rebuilding at the
    /// start and the end of the run.
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
}

impl StorageBenchArgs {
    pub fn runs(&self) -> usize {
        self.runs.unwrap_or(if self.quick { 1 } else { 3 })
    }
    pub fn seconds(&self) -> f64 {
        self.seconds.unwrap_or(if self.quick { 0.5 } else { 2.0 })
    }
    pub fn files(&self) -> usize {
        self.files.unwrap_or(if self.quick { 1024 } else { 16384 })
    }
    pub fn whole(&self) -> bool {
        self.whole || self.quick
    }
    /// The working set asked for: --size, or 64 MiB with --quick.
    pub fn size_limit(&self) -> Option<u64> {
        self.size.or(self.quick.then_some(64 << 20))
    }
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Block read and write throughput against the number of members for
    /// several levels, on simulated disks, with the ideal lines: a table,
    /// CSV and SVG plots.
    Sweep(SweepArgs),
    /// Parity kernel throughput, one line per kernel as "name k chunk GB/s"
    /// (the format of the ISA-L anchor, to run side by side).
    Parity(BenchParityArgs),
    /// Array engine throughput through the array API (no NBD): full-stripe
    /// sequential writes and 4 KiB random writes on RAID-0, RAID-5 and
    /// RAID-6 built over the same member files.
    Engine(BenchEngineArgs),
    /// Each drive alone, then all at once, read-only: sequential reads per
    /// zone and 4 KiB random reads per member, the aggregate with every
    /// member reading together, and the members that differ from the
    /// median of their peers named as outliers.
    Members(BenchMembersArgs),
    /// Runs kept with --record side by side: each result's median per run,
    /// the ratio to the first run, and whether the difference exceeds the
    /// runs' own spread.
    Compare(BenchCompareArgs),
    /// One self-contained HTML evaluation sheet (tables and plots, no
    /// outside file) of every run kept in a --record directory.
    Report(BenchReportArgs),
    /// One client of `raidkit bench --clients` (started by it).
    #[command(hide = true)]
    StreamWorker(StreamWorkerArgs),
}

#[derive(Debug, Args)]
pub struct StreamWorkerArgs {
    /// The NBD export.
    pub target: String,
    #[arg(long)]
    pub offset: u64,
    #[arg(long)]
    pub length: u64,
    #[arg(long)]
    pub write: bool,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

#[derive(Debug, Args)]
pub struct BenchMembersArgs {
    /// The members: files, block devices or nbd:// exports (opened
    /// read-only).
    #[arg(required = true)]
    pub members: Vec<String>,
    /// Runs of each measurement; the median is reported with min and max.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Seconds per measurement (each zone's sequential read is cut there,
    /// as hdparm -t reads for 3 s).
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
    /// Queue depths of the random reads (comma-separated, 1 to 256).
    #[arg(long, default_value = "1,32")]
    pub qd: String,
    /// Measure only the first SIZE bytes of each member (zones are thirds
    /// of it). Sizes: bytes, or with a suffix K, M, G, T (powers of 1024).
    #[arg(value_name = "SIZE", long, value_parser = size)]
    pub size: Option<u64>,
    /// A member whose figure differs from the median of its peers' by more
    /// than this percentage (either way) is named an outlier.
    #[arg(long, default_value_t = 25.0)]
    pub outlier: f64,
    /// Print JSON: {"config", "identity", "results": [{member, test, zone, qd, value, unit, ...}], "outliers": [...]}.
    #[arg(long)]
    pub json: bool,
    /// Keep the run's JSON as a new file in DIR (see `raidkit bench --record`).
    #[arg(long, value_name = "DIR")]
    pub record: Option<PathBuf>,
    /// A name for this run in the record and the reports.
    #[arg(long)]
    pub label: Option<String>,
    /// Also measure writes: seq_write per zone and randwrite_4k at each
    /// --qd. They overwrite the members' data (needs --destroy-data): for
    /// drives not yet in an array.
    #[arg(long)]
    pub write: bool,
    /// Allow --write to overwrite the members.
    #[arg(long)]
    pub destroy_data: bool,
}

#[derive(Debug, Args)]
pub struct BenchCompareArgs {
    /// Records written by --record (two or more).
    #[arg(required = true, num_args = 2..)]
    pub records: Vec<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct BenchReportArgs {
    /// A --record directory.
    pub dir: PathBuf,
    /// Where to write the page (default: DIR/report.html).
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct SweepArgs {
    /// Levels, comma separated.
    #[arg(long, default_value = "0,5,6,10")]
    pub levels: String,
    /// Member counts, FROM..TO.
    #[arg(long, default_value = "2..8")]
    pub members: String,
    /// The simulated disk: bw=RATE,seek=DUR (RATE in bytes per second, K,
    /// M, G, T powers of 1024, as every raidkit rate; DUR like 8ms).
    #[arg(long, default_value = "bw=150M,seek=8ms")]
    pub disk: String,
    /// Directory for the member files (their contents do not matter; the
    /// simulated disk sets the pace).
    #[arg(long, default_value = "/dev/shm")]
    pub dir: PathBuf,
    /// Size of each member.
    /// Sizes: bytes, or with a suffix K, M, G, T (powers of 1024).
    #[arg(value_name = "SIZE", long, default_value = "128M", value_parser = size)]
    pub size: u64,
    /// Chunk size.
    /// Sizes: bytes, or with a suffix K, M, G, T (powers of 1024).
    #[arg(value_name = "SIZE", long, default_value = "512K", value_parser = size)]
    pub chunk: u64,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 1.0)]
    pub seconds: f64,
    /// Runs per point (median reported).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Requests of the streaming client in flight at once (1: each waits
    /// for the last, as a dd-style reader or writer without read-ahead or
    /// write-back).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub qd: u16,
    /// Read through the read-ahead `serve` puts in front of arrays whose
    /// members wait for devices (whole stripes, about 1 MiB, four in
    /// flight): the reads a served client gets.
    #[arg(long)]
    pub read_ahead: bool,
    /// Write through the write-behind `serve` puts in front of arrays
    /// whose members wait for devices (a writer at queue depth 1 answered
    /// once its bytes are copied, four requests written at once): the
    /// writes a served client gets. The measurement ends with a flush,
    /// which waits for them.
    #[arg(long)]
    pub write_behind: bool,
    /// Write the results as CSV to this file.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Write sweep-write.svg and sweep-read.svg into this directory.
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct BenchEngineArgs {
    /// Members per array.
    #[arg(long, default_value_t = 6)]
    pub members: usize,
    /// Size of each member file.
    /// Sizes: bytes, or with a suffix K, M, G, T (powers of 1024).
    #[arg(value_name = "SIZE", long, default_value = "256M", value_parser = size)]
    pub size: u64,
    /// Chunk size.
    /// Sizes: bytes, or with a suffix K, M, G, T (powers of 1024).
    #[arg(value_name = "SIZE", long, default_value = "512K", value_parser = size)]
    pub chunk: u64,
    /// Directory for the member files (a RAM disk measures the engine, not disks).
    #[arg(long, default_value = "/dev/shm")]
    pub dir: PathBuf,
    /// Writer threads, each on its own region.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
    /// Rounds (levels alternate within each round); medians are reported.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Consistency policy of the arrays: none, bitmap or journal.
    #[arg(long, default_value = "none")]
    pub policy: String,
}

#[derive(Debug, Args)]
pub struct BenchParityArgs {
    /// Data chunks per stripe.
    #[arg(long, default_value_t = 8)]
    pub k: usize,
    /// Chunk size in bytes.
    /// Sizes: bytes, or with a suffix K, M, G, T (powers of 1024).
    #[arg(value_name = "SIZE", long, default_value = "64K", value_parser = size)]
    pub chunk: u64,
    /// Seconds per kernel.
    #[arg(long, default_value_t = 1.0)]
    pub seconds: f64,
    /// Instruction set to use (default: the best this CPU has): avx512bw,
    /// avx2, ssse3 or portable.
    #[arg(long)]
    pub isa: Option<String>,
}
