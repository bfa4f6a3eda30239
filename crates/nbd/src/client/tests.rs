use super::*;

#[test]
fn parses_nbd_uris() {
    assert_eq!(
        Address::parse("nbd://127.0.0.1:10900/disk").unwrap(),
        Address {
            endpoint: Endpoint::Tcp("127.0.0.1:10900".into()),
            export: "disk".into(),
            tls: None,
        }
    );
    assert_eq!(
        Address::parse("nbd://localhost").unwrap().endpoint,
        Endpoint::Tcp("localhost:10809".into())
    );
    assert_eq!(
        Address::parse("nbd+unix:///x?socket=/tmp/s").unwrap(),
        Address {
            endpoint: Endpoint::Unix("/tmp/s".into()),
            export: "x".into(),
            tls: None,
        }
    );
    // TLS settings from the query; the query is not the export's.
    let a = Address::parse("nbds://[::1]:1234/d?tls-certificates=/pki&tls-hostname=s1").unwrap();
    assert_eq!(a.endpoint, Endpoint::Tcp("[::1]:1234".into()));
    assert_eq!(a.export, "d");
    assert_eq!(a.host(), "::1");
    let t = a.tls.unwrap();
    assert_eq!(t.certificates.as_deref(), Some("/pki"));
    assert_eq!(t.hostname.as_deref(), Some("s1"));
    assert_eq!(Address::parse("nbd://h/d?x=1").unwrap().export, "d");
    assert!(Address::parse("nbds+unix:///d?socket=/s")
        .unwrap()
        .tls
        .is_some());
    assert!(Address::parse("nbd://host:notaport/x").is_err());
    assert!(Address::parse("nbd+unix:///x").is_err());
    assert!(Address::parse("http://x").is_err());
    assert!(Address::parse("nbd:///x").is_err());
}

/// `device` served as export "t" on a free loopback port: the server
/// and its URI.
fn serve_device(
    device: Arc<dyn Member>,
    read_only: bool,
    config: crate::Config,
) -> (Arc<crate::Server>, String) {
    let server = crate::Server::new(
        crate::Export {
            preferred_block: crate::server::PREFERRED_BLOCK,
            name: "t".into(),
            description: String::new(),
            device,
            read_only,
        },
        config,
    );
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let uri = format!("nbd://{}/t", l.local_addr().unwrap());
    server.serve_tcp(l).unwrap();
    (server, uri)
}

fn serve(read_only: bool) -> (Arc<crate::Server>, Arc<raidkit_member::MemMember>, String) {
    let mem = Arc::new(raidkit_member::MemMember::new("mem", 8 << 20));
    let (server, uri) = serve_device(mem.clone(), read_only, crate::Config::default());
    (server, mem, uri)
}

#[test]
fn one_server_serves_several_exports_each_with_its_own_device_and_counters() {
    let dev = |n: &str, size: u64| Arc::new(raidkit_member::MemMember::new(n, size));
    let (a, b) = (dev("a", 4 << 20), dev("b", 8 << 20));
    let export = |name: &str, d: &Arc<raidkit_member::MemMember>, read_only| {
        let device: Arc<dyn Member> = d.clone();
        (
            crate::Export {
                preferred_block: crate::server::PREFERRED_BLOCK,
                name: name.into(),
                description: format!("export {name}"),
                device,
                read_only,
            },
            crate::Config::default(),
        )
    };
    let server = crate::Server::with_exports(
        vec![export("first", &a, false), export("second", &b, true)],
        8,
    );
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("nbd://{}", l.local_addr().unwrap());
    server.serve_tcp(l).unwrap();
    b.write_at(&[0xb2; 4096], 4096).unwrap();
    let c1 = NbdClient::connect(&format!("{base}/first")).unwrap();
    let c2 = NbdClient::connect(&format!("{base}/second")).unwrap();
    // The default export (no name) is the first.
    let c0 = NbdClient::connect(&format!("{base}/")).unwrap();
    assert_eq!((c1.len(), c2.len(), c0.len()), (4 << 20, 8 << 20, 4 << 20));
    assert!(!c1.read_only() && c2.read_only());
    c1.write_at(&[0xa1; 4096], 4096).unwrap();
    let mut got = vec![0u8; 4096];
    c2.read_at(&mut got, 4096).unwrap();
    assert_eq!(
        got,
        vec![0xb2; 4096],
        "the second export reads its own device"
    );
    c0.read_at(&mut got, 4096).unwrap();
    assert_eq!(got, vec![0xa1; 4096], "the default export is the first");
    assert!(
        c2.write_at(&[1; 512], 0).is_err(),
        "the second is read-only"
    );
    let e = NbdClient::connect(&format!("{base}/third")).unwrap_err();
    assert!(e.to_string().contains("no such export"), "{e}");
    // Each export counts its own clients and requests.
    let (s1, s2) = (
        server.target("first").unwrap().stats(),
        server.target("second").unwrap().stats(),
    );
    use std::sync::atomic::Ordering::Relaxed;
    assert_eq!(s1.connections_active.load(Relaxed), 2);
    assert_eq!(s2.connections_active.load(Relaxed), 1);
    assert_eq!(s1.writes.load(Relaxed), 1);
    assert_eq!(s2.writes.load(Relaxed), 0);
    assert_eq!(s2.reads.load(Relaxed), 1);
    drop((c0, c1, c2));
    server.shutdown();
    assert_eq!(s1.connections_active.load(Relaxed), 0);
}

#[test]
fn pipelined_requests_from_many_threads_round_trip() {
    let (server, mem, uri) = serve(false);
    let c = NbdClient::connect(&uri).unwrap();
    assert_eq!(c.len(), 8 << 20);
    assert!(!c.read_only());
    std::thread::scope(|sc| {
        for t in 0..8u8 {
            let c = &c;
            sc.spawn(move || {
                for i in 0..64u64 {
                    let off = (t as u64 * 64 + i) * 8192 + 7;
                    let data = vec![t ^ (i as u8); 5000];
                    c.write_at(&data, off).unwrap();
                    let mut back = vec![0u8; 5000];
                    c.read_at(&mut back, off).unwrap();
                    assert_eq!(back, data);
                }
            });
        }
    });
    c.flush().unwrap();
    let snap = mem.snapshot();
    assert_eq!(snap[(3 * 64 + 5) * 8192 + 7], 3 ^ 5);
    // Out of range: refused locally, and the connection stays usable.
    let mut b = [0u8; 16];
    assert!(c.read_at(&mut b, (8 << 20) - 8).is_err());
    c.read_at(&mut b, 0).unwrap();
    // A wrong export name is a clear error.
    let e = NbdClient::connect(&uri.replace("/t", "/nope")).unwrap_err();
    assert!(e.to_string().contains("no such export"), "{e}");
    drop(c);
    server.shutdown();
}

#[test]
fn a_queue_of_pipelined_requests_runs_from_one_thread() {
    let (server, mem, uri) = serve(false);
    let c = NbdClient::connect(&uri).unwrap();
    let mut offsets = Vec::new();
    let mut fill = |off: u64, b: &mut [u8]| {
        offsets.push(off);
        b.fill(0xA5)
    };
    let mut k = 0u64;
    let n = c
        .run_queue(8, 4096, Some(&mut fill), std::time::Instant::now(), || {
            k += 1;
            (k - 1) * 4096
        })
        .unwrap();
    // A deadline already past: exactly the first 8 requests are sent.
    assert_eq!(n, 8);
    // Each write's data was asked for with its own offset.
    assert_eq!(offsets, (0..8).map(|i| i * 4096).collect::<Vec<u64>>());
    assert!(mem.snapshot()[..8 * 4096].iter().all(|&b| b == 0xA5));
    assert_eq!(mem.snapshot()[8 * 4096], 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(50);
    let n = c.run_queue(32, 4096, None, deadline, || 4096).unwrap();
    assert!(n >= 32, "{n}");
    // Out of range is refused before anything is sent; the connection
    // stays usable.
    assert!(c.run_queue(1, 4096, None, deadline, || 8 << 20).is_err());
    let mut b = [0u8; 4];
    c.read_at(&mut b, 0).unwrap();
    assert_eq!(b, [0xA5; 4]);
    drop(c);
    server.shutdown();
}

#[test]
fn queued_replies_are_taken_apart_whole_across_batches_and_errors() {
    const LEN: u64 = 160 << 10;
    let dev = Arc::new(Recording::new((4 << 20)..(5 << 20)));
    let pattern: Vec<u8> = (0..8u64 << 20).map(|i| (i % 251) as u8).collect();
    dev.mem.write_at(&pattern, 0).unwrap();
    let (server, uri) = serve_device(dev.clone(), false, crate::Config::default());
    let c = NbdClient::connect(&uri).unwrap();
    let before = polled();
    // Reads of 160 KiB, more than half a receive batch: replies
    // straddle every receive.
    let mut k = 0u64;
    let deadline = std::time::Instant::now() + Duration::from_millis(50);
    let n = c
        .run_queue(16, LEN as u32, None, deadline, || {
            k += 1;
            (k % 25) * LEN
        })
        .unwrap();
    assert!(n >= 16, "{n}");
    // Polled for replies with 16 in flight.
    assert!(polled() > before);
    // Failed reads among good ones: the error is the queue's, and
    // every reply was taken apart (the connection still answers
    // right).
    let mut k = 0u64;
    let e = c
        .run_queue(8, LEN as u32, None, std::time::Instant::now(), || {
            k += 1;
            if k.is_multiple_of(3) {
                4 << 20
            } else {
                k * LEN
            }
        })
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    let mut b = vec![0u8; LEN as usize];
    c.read_at(&mut b, 3 * LEN).unwrap();
    assert_eq!(b, pattern[3 * LEN as usize..4 * LEN as usize]);
    drop(c);
    server.shutdown();
}

/// A memory member that records the writes it is given, and fails
/// reads that start in `bad`. It counts the calls whose buffer does not
/// start on a 4 KiB boundary: a direct-I/O member would bounce those.
#[derive(Debug)]
struct Recording {
    mem: raidkit_member::MemMember,
    writes: std::sync::Mutex<Vec<(u64, usize)>>,
    bad: std::ops::Range<u64>,
    misaligned: std::sync::atomic::AtomicUsize,
}

impl Recording {
    fn new(bad: std::ops::Range<u64>) -> Recording {
        Recording {
            mem: raidkit_member::MemMember::new("mem", 8 << 20),
            writes: Default::default(),
            bad,
            misaligned: Default::default(),
        }
    }

    fn check_aligned(&self, buf: &[u8]) {
        if !(buf.as_ptr() as usize).is_multiple_of(raidkit_member::aligned::ALIGN) {
            self.misaligned
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl Member for Recording {
    fn name(&self) -> &str {
        "recording"
    }
    fn len(&self) -> u64 {
        self.mem.len()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), MemberError> {
        if self.bad.contains(&offset) {
            let e = io::Error::from_raw_os_error(libc::EIO);
            return Err(MemberError::new(
                "recording",
                Op::Read,
                offset,
                buf.len() as u64,
                e,
            ));
        }
        self.check_aligned(buf);
        self.mem.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), MemberError> {
        self.check_aligned(buf);
        self.writes.lock().unwrap().push((offset, buf.len()));
        self.mem.write_at(buf, offset)
    }
    fn flush(&self) -> Result<(), MemberError> {
        self.mem.flush()
    }
}

#[test]
fn the_device_reads_into_and_writes_from_buffers_aligned_for_direct_io() {
    // A direct-I/O member takes a buffer that starts on a block boundary
    // as it is; any other it copies through a bounce buffer of its own.
    // The server's buffers for read data and write payloads are aligned,
    // whatever the sizes that came before on the connection.
    let dev = Arc::new(Recording::new(0..0));
    let (server, uri) = serve_device(dev.clone(), false, crate::Config::default());
    let c = NbdClient::connect(&uri).unwrap();
    let mut at = 0u64;
    for (i, len) in [4096usize, 512, 65536, 12288, 1 << 20, 4096, 3 << 20, 8192]
        .into_iter()
        .enumerate()
    {
        let data: Vec<u8> = (0..len).map(|j| (j * 13 + i) as u8).collect();
        c.write_at(&data, at).unwrap();
        let mut back = vec![0u8; len];
        c.read_at(&mut back, at).unwrap();
        assert_eq!(back, data, "{len} bytes at {at}");
        at += len.next_multiple_of(4096) as u64;
    }
    drop(c);
    server.shutdown();
    assert!(!dev.writes.lock().unwrap().is_empty());
    assert_eq!(
        dev.misaligned.load(std::sync::atomic::Ordering::Relaxed),
        0,
        "device calls with a buffer off a 4 KiB boundary"
    );
}

#[test]
fn merged_write_runs_end_on_stripe_boundaries() {
    const PIECE: u64 = 64 << 10;
    const STRIPE: u64 = 3 * PIECE;
    let dev = Arc::new(Recording::new(0..0));
    let config = crate::Config {
        merge_writes: true,
        merge_align: STRIPE,
        ..Default::default()
    };
    let (server, uri) = serve_device(dev.clone(), false, config);
    let c = NbdClient::connect(&uri).unwrap();
    // A sequential stream that starts off the stripe grid: 127 pieces
    // from the second one on, each piece a different pattern.
    let data: Vec<u8> = (0..127 * PIECE)
        .map(|i| (i / PIECE * 7 + i % 251) as u8)
        .collect();
    // All 127 in flight at once (a deadline already past sends exactly
    // one queue's worth).
    let mut k = 0u64;
    let n = c
        .run_queue(
            127,
            PIECE as u32,
            Some(&mut |off: u64, b: &mut [u8]| {
                let at = (off - PIECE) as usize;
                b.copy_from_slice(&data[at..at + PIECE as usize])
            }),
            std::time::Instant::now(),
            || {
                k += 1;
                k * PIECE
            },
        )
        .unwrap();
    assert_eq!(n, 127);
    drop(c);
    server.shutdown();
    let writes = dev.writes.lock().unwrap().clone();
    let merged: Vec<_> = writes.iter().filter(|w| w.1 as u64 > PIECE).collect();
    assert!(!merged.is_empty(), "no write was merged: {writes:?}");
    for &(off, len) in &writes {
        // A run stops where it reaches a stripe boundary: none lies
        // strictly inside a merged write.
        let next = (off / STRIPE + 1) * STRIPE;
        assert!(
            next >= off + len as u64,
            "write {off}+{len} runs over the stripe boundary at {next}"
        );
    }
    assert_eq!(
        &dev.mem.snapshot()[PIECE as usize..128 * PIECE as usize],
        &data[..]
    );
}

#[test]
fn read_only_export_refuses_writes_and_server_loss_is_an_error() {
    let (server, _mem, uri) = serve(true);
    let c = NbdClient::connect(&uri).unwrap();
    assert!(c.read_only());
    assert!(c.write_at(&[1u8; 512], 0).is_err());
    server.shutdown();
    let mut b = [0u8; 512];
    // The server closed the connection: an error, not a hang.
    assert!(c.read_at(&mut b, 0).is_err());
}

/// A member striped over files in PIECE-sized pieces (as RAID-0), that
/// offers its bytes as file extents for zero-copy reads and counts how
/// reads reach it. With `bad`, it offers a write-only handle instead,
/// which splice cannot read.
#[derive(Debug)]
struct Striped {
    files: Vec<std::fs::File>,
    bad: Option<std::fs::File>,
    /// Mapped windows of the files (of `bad` instead, if it is there).
    mappers: Vec<raidkit_member::Mapper>,
    len: u64,
    read_ats: std::sync::atomic::AtomicU64,
    offers: std::sync::atomic::AtomicU64,
}

const PIECE: u64 = 100 << 10;

impl Striped {
    /// (file index, offset in it, length) of the pieces of a range.
    fn map(&self, mut off: u64, len: u64) -> Vec<(usize, u64, u64)> {
        let (n, end) = (self.files.len() as u64, off + len);
        let mut v = Vec::new();
        while off < end {
            let i = off / PIECE;
            let k = (PIECE - off % PIECE).min(end - off);
            v.push(((i % n) as usize, (i / n) * PIECE + off % PIECE, k));
            off += k;
        }
        v
    }
}

impl Member for Striped {
    fn name(&self) -> &str {
        "striped"
    }
    fn len(&self) -> u64 {
        self.len
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), MemberError> {
        use std::os::unix::fs::FileExt;
        self.read_ats.fetch_add(1, Ordering::Relaxed);
        let mut at = 0;
        for (f, o, k) in self.map(offset, buf.len() as u64) {
            self.files[f]
                .read_exact_at(&mut buf[at..at + k as usize], o)
                .unwrap();
            at += k as usize;
        }
        Ok(())
    }
    fn write_at(&self, _: &[u8], _: u64) -> Result<(), MemberError> {
        unreachable!("read-only test member")
    }
    fn flush(&self) -> Result<(), MemberError> {
        Ok(())
    }
    fn with_file_extents(
        &self,
        offset: u64,
        len: u64,
        f: &mut dyn FnMut(&[raidkit_member::FileExtent<'_>]) -> io::Result<()>,
    ) -> Option<io::Result<()>> {
        self.offers.fetch_add(1, Ordering::Relaxed);
        let ext: Vec<_> = self
            .map(offset, len)
            .into_iter()
            .map(|(i, offset, len)| raidkit_member::FileExtent {
                file: self.bad.as_ref().unwrap_or(&self.files[i]),
                mapper: self.mappers.get(i).or(self.mappers.first()),
                offset,
                len,
                landed: None,
            })
            .collect();
        Some(f(&ext))
    }
}

#[test]
fn large_reads_spliced_or_mapped_from_files_match_the_data_and_fall_back_when_they_cannot_be() {
    use std::io::Write as _;
    let dir = tempfile::tempdir().unwrap();
    let n = 3usize;
    let per = 4u64 << 20;
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut files = Vec::new();
    for i in 0..n {
        let p = dir.path().join(format!("m{i}"));
        let mut data = vec![0u8; per as usize];
        for b in data.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b.copy_from_slice(&x.to_le_bytes()[..b.len()]);
        }
        std::fs::File::create(&p).unwrap().write_all(&data).unwrap();
        files.push(std::fs::File::open(&p).unwrap());
    }
    let bad = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("m0"))
        .unwrap();
    use crate::ZeroCopy::{Always, Auto, Never};
    // Auto: the client is on this machine (loopback), so no splicing.
    // The bad file is open for writing only: neither splice nor a
    // mapping can read it.
    let try_bad = || Some(bad.try_clone().unwrap());
    for (bad, zero_copy, mapped_reads) in [
        (None, Always, false),
        (try_bad(), Always, false),
        (None, Auto, false),
        (None, Never, true),
        (try_bad(), Never, true),
    ] {
        let broken = bad.is_some();
        let mappers = match (&bad, mapped_reads) {
            (_, false) => Vec::new(),
            (Some(b), true) => vec![raidkit_member::Mapper::new(b, per, false).unwrap()],
            (None, true) => files
                .iter()
                .map(|f| raidkit_member::Mapper::new(f, per, false).unwrap())
                .collect(),
        };
        let m = Arc::new(Striped {
            files: files.iter().map(|f| f.try_clone().unwrap()).collect(),
            bad,
            mappers,
            len: n as u64 * per,
            read_ats: Default::default(),
            offers: Default::default(),
        });
        let server = crate::Server::new(
            crate::Export {
                preferred_block: crate::server::PREFERRED_BLOCK,
                name: "t".into(),
                description: String::new(),
                device: m.clone(),
                read_only: true,
            },
            crate::Config {
                zero_copy,
                mapped_reads,
                ..crate::Config::default()
            },
        );
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let uri = format!("nbd://{}/t", l.local_addr().unwrap());
        server.serve_tcp(l).unwrap();
        let c = NbdClient::connect(&uri).unwrap();
        // Unaligned starts and lengths over several pieces, the largest
        // a pipe takes (1 MiB), and one larger than any pipe (3 MiB).
        let reads = [
            (0u64, 64usize << 10),
            (12_345, 300_001),
            ((5 << 20) + 7, 1 << 20),
            (PIECE * 4 - 1, 777_777),
            (1 << 20, 3 << 20),
        ];
        for &(off, len) in &reads {
            let mut got = vec![0u8; len];
            c.read_at(&mut got, off).unwrap();
            let mut want = vec![0u8; len];
            m.read_at(&mut want, off).unwrap();
            assert!(
                got == want,
                "read of {len} at {off} (broken extents: {broken})"
            );
        }
        let offers = m.offers.load(Ordering::Relaxed);
        // Our own reads of `want` count as read_ats too: one per read.
        let served_by_read_at = m.read_ats.load(Ordering::Relaxed) - reads.len() as u64;
        let spliced = server.stats().zero_copy_reads.load(Ordering::Relaxed);
        let mapped = server.stats().mapped_reads.load(Ordering::Relaxed);
        // Every read was served once, one way or another.
        assert_eq!(spliced + mapped + served_by_read_at, reads.len() as u64);
        if mapped_reads {
            // Every read was offered; the files were just written, so
            // their pages are cached and all can be sent from mappings
            // (none is too large), unless the file cannot be mapped.
            assert_eq!((offers, spliced), (reads.len() as u64, 0));
            assert_eq!(mapped, if broken { 0 } else { reads.len() as u64 });
            drop(c);
            server.shutdown();
            continue;
        }
        assert_eq!(mapped, 0);
        if zero_copy == Auto {
            assert_eq!((offers, spliced), (0, 0));
            drop(c);
            server.shutdown();
            continue;
        }
        // The 3 MiB read is never offered: it cannot fit in a pipe.
        assert_eq!(offers, reads.len() as u64 - 1);
        if broken {
            // Every splice failed: all were served through read_at.
            assert_eq!(spliced, 0);
        } else {
            // At least the three up to 800 KiB fit in any pipe we ask for
            // (the unaligned 1 MiB one needs more than 1 MiB).
            assert!(spliced >= 3, "{spliced} zero-copy reads");
        }
        drop(c);
        server.shutdown();
    }
}

/// A connection cut (by the stall watch, by a send that failed) while
/// other threads wait for replies: each request gets an answer or an
/// error. A reader whose read failed while another thread's cut had taken
/// its waiter but not yet completed it panicked ("completed"), and the
/// client's request it served was never answered.
#[test]
fn requests_in_flight_when_the_connection_is_cut_all_end() {
    use raidkit_member::Remote;
    let slow: Arc<dyn Member> = Arc::new(raidkit_member::FaultMember::new(
        Arc::new(raidkit_member::MemMember::new("mem", 8 << 20)),
        raidkit_member::FaultConfig::parse("delay=1ms").unwrap(),
    ));
    let (server, uri) = serve_device(slow, false, crate::Config::default());
    let c = NbdClient::connect(&uri).unwrap();
    for round in 0..40 {
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|sc| {
            for t in 0..16u64 {
                let (c, stop) = (&c, &stop);
                sc.spawn(move || {
                    let mut b = vec![0u8; 4096];
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        // An answer or an error: either ends the request.
                        let _ = c.read_at(&mut b, t * 65536);
                    }
                });
            }
            std::thread::sleep(Duration::from_millis(5));
            c.cut(&format!("cut {round}"));
            std::thread::sleep(Duration::from_millis(2));
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        c.reconnect(Duration::from_secs(10)).unwrap();
    }
    let mut b = [0u8; 16];
    c.read_at(&mut b, 0).unwrap();
    drop(c);
    server.shutdown();
}

/// A server that takes the connection and says nothing (not an NBD
/// server, one at its client limit, a link gone down after the connect):
/// the client gives up within its limit, with a timeout, not "resource
/// temporarily unavailable".
#[test]
fn a_server_that_never_greets_is_a_timeout() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let uri = format!("nbd://{}/x", l.local_addr().unwrap());
    let t = std::time::Instant::now();
    let e = NbdClient::connect_with(&uri, Some(Duration::from_millis(500))).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    drop(l);
}
