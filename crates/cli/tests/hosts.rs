//! Arrays whose members are NBD exports: `raidkit export` serves a file
//! as a plain export, `nbd://` member specs put it in an array, and a
//! storage host that goes away is a member lost, not the array.

mod common;

use common::*;
use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// `raidkit export FILE` on a free loopback port: the process and its URI.
fn export(file: &str) -> (Guarded, String) {
    let mut g = Guarded::spawn(
        Command::new(env!("CARGO_BIN_EXE_raidkit"))
            .args(["export", "--listen", "127.0.0.1:0", file])
            .stdout(Stdio::piped())
            .stderr(Stdio::null()),
    );
    let out = g.child().stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if let Some(i) = line.find("nbd://") {
                let _ = tx.send(line[i..].to_string());
            }
        }
    });
    let uri = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("raidkit export printed no URI");
    (g, uri)
}

/// 4 MiB of a pattern (`shift` makes it differ from others) written at
/// the start of the export `uri` with nbdcopy: the bytes.
fn write_pattern(dir: &std::path::Path, uri: &str, shift: u32) -> Vec<u8> {
    let data: Vec<u8> = (0..4u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> shift) as u8)
        .collect();
    let input = dir.join("in.raw");
    std::fs::write(&input, &data).unwrap();
    tool(
        "timeout",
        &["60", "nbdcopy", &input.display().to_string(), uri],
    );
    data
}

/// A RAID-1's two 64 MiB files in `dir`, one local and one to be served
/// (by `nbdkit_file`), and a free loopback port for it.
fn local_and_remote(dir: &std::path::Path) -> (String, String, String) {
    let local = sized_files(dir, "local", 1, 64 << 20).remove(0);
    let remote_file = sized_files(dir, "remote", 1, 64 << 20).remove(0);
    // The tests of this file run at once, and a port freed here may be
    // handed out again at the next bind: none is given to two tests.
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap();
    let port = loop {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let p = l.local_addr().unwrap().port();
        if !given.contains(&p) {
            given.push(p);
            break p.to_string();
        }
    };
    (local, remote_file, port)
}

/// nbdkit serving `file` on 127.0.0.1:`port`, listening when this returns.
fn nbdkit_file(port: &str, file: &str) -> Guarded {
    let g = Guarded::spawn(
        Command::new("nbdkit")
            .args(["-f", "-i", "127.0.0.1", "-p", port, "file", file])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    wait_for("nbdkit to listen", 30, || {
        std::net::TcpStream::connect(format!("127.0.0.1:{port}")).is_ok()
    });
    g
}

/// `n` files `<prefix><i>.img` of `len` bytes in `dir`, by path.
fn sized_files(dir: &std::path::Path, prefix: &str, n: usize, len: u64) -> Vec<String> {
    (0..n)
        .map(|i| {
            let f = dir.join(format!("{prefix}{i}.img")).display().to_string();
            std::fs::File::create(&f).unwrap().set_len(len).unwrap();
            f
        })
        .collect()
}

#[test]
fn an_array_of_exports_serves_and_survives_a_storage_host_going_away() {
    let dir = tmp();
    let files = sized_files(dir.path(), "host", 3, 64 << 20);
    let mut hosts: Vec<(Guarded, String)> = files.iter().map(|f| export(f)).collect();
    let uris: Vec<String> = hosts.iter().map(|h| h.1.clone()).collect();
    create("5", &uris, "48M");
    // The array's superblock is on the exported files themselves.
    let e: serde_json::Value =
        serde_json::from_slice(&ok(&["examine", "--json", &files[1]]).stdout).unwrap();
    assert_eq!(e["role"], 1, "{e:#}");

    let mut s = Served::start(dir.path(), &uris, &[]);
    let data = write_pattern(dir.path(), &s.uri, 9);
    let read_back = |name: &str| -> Vec<u8> {
        let out = dir.path().join(name);
        tool(
            "timeout",
            &["60", "nbdcopy", &s.uri, &out.display().to_string()],
        );
        std::fs::read(&out).unwrap()
    };
    assert!(read_back("a.raw")[..data.len()] == data[..]);

    // A storage host goes away: its member fails at its next request, the
    // array serves degraded, every byte still right; the member is
    // disconnected (it may come back), not failed for good.
    hosts[1].0.kill();
    let got = read_back("b.raw");
    assert!(got[..data.len()] == data[..], "degraded read differs");
    let st = s.status();
    assert_eq!(st["state"], "degraded", "{st:#}");
    assert_eq!(st["members"][1]["state"], "disconnected", "{st:#}");

    // The host comes back at the same address, serving a member of
    // another array (of the same size): refused, never trusted.
    let others = sized_files(dir.path(), "other", 3, 64 << 20);
    create("5", &others, "48M");
    let addr = uris[1]["nbd://".len()..]
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let _back = Guarded::spawn(
        Command::new(env!("CARGO_BIN_EXE_raidkit"))
            .args([
                "export",
                "--listen",
                &addr,
                "--name",
                "host1.img",
                &others[1],
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    wait_for("the other array's member refused", 30, || {
        s.status()["members"][1]["state"] == "faulty"
    });
    let got = read_back("c.raw");
    assert!(
        got[..data.len()] == data[..],
        "read after the refusal differs"
    );
    assert_eq!(s.stop().code(), Some(0));
    drop(hosts);
}

/// Two storage hosts hang at once (a switch restarting): the RAID-5
/// fails. When they answer again, their members are not shown as coming
/// back by themselves (a failed array takes none back while it runs):
/// they are failed for good, and the next start with `--force` brings
/// the array back with every flushed byte.
#[test]
fn a_failed_array_of_exports_says_its_members_are_gone_and_comes_back_at_the_next_start() {
    let dir = tmp();
    let files = sized_files(dir.path(), "host", 3, 64 << 20);
    let hosts: Vec<(Guarded, String)> = files.iter().map(|f| export(f)).collect();
    let uris: Vec<String> = hosts.iter().map(|h| h.1.clone()).collect();
    create("5", &uris, "48M");
    let timeouts = ["--member-timeout", "2", "--rejoin-timeout", "10"];
    let mut s = Served::start(dir.path(), &uris, &timeouts);
    let data = write_pattern(dir.path(), &s.uri, 11);

    let signal = |sig: &str, i: usize| tool("kill", &[sig, &hosts[i].0.id().to_string()]);
    signal("-STOP", 1);
    signal("-STOP", 2);
    let failed_write = output_within(
        Command::new("qemu-io").args(["-f", "raw", "-c", "write -P 0x5a 1M 64k", &s.uri]),
        Duration::from_secs(30),
    );
    signal("-CONT", 1);
    signal("-CONT", 2);
    assert!(
        !failed_write.status.success(),
        "a write with two of three members hung succeeded"
    );
    // Both hosts answer again; give them the time a disconnected member
    // takes to rejoin (the first attempt comes after half a second).
    std::thread::sleep(Duration::from_secs(3));
    let st = s.status();
    assert_eq!(st["state"], "failed", "{st:#}");
    for i in [1, 2] {
        assert_eq!(
            st["members"][i]["state"], "faulty",
            "member {i} of a failed array shown as coming back: {st:#}"
        );
    }
    let _ = s.stop();

    // The next start takes the most recent members (--force), rebuilds
    // the stale one, and every byte flushed before is there; the blocks
    // of the write that failed hold the old data or the new.
    let mut s = Served::start(dir.path(), &uris, &["--force"]);
    wait_for("the array whole again", 120, || {
        s.status()["state"] == "optimal"
    });
    let out = dir.path().join("out.raw");
    tool(
        "timeout",
        &["60", "nbdcopy", &s.uri, &out.display().to_string()],
    );
    let got = std::fs::read(&out).unwrap();
    let hit = (1 << 20)..(1 << 20) + (64 << 10);
    for (b, (g, d)) in got[..data.len()]
        .chunks(4096)
        .zip(data.chunks(4096))
        .enumerate()
    {
        let new = hit.contains(&(b * 4096)) && g.iter().all(|&x| x == 0x5a);
        assert!(
            g == d || new,
            "block {b} holds neither the old data nor the new"
        );
    }
    assert_eq!(s.stop().code(), Some(0));
    let checked = raidkit(&args(&["check"], &uris));
    assert_eq!(checked.status.code(), Some(0), "{checked:?}");
    drop(hosts);
}

/// Network namespaces with a veth pair each to this (the head's)
/// namespace, made for one test and removed when dropped, also when the
/// test fails: namespace `i` is a host at 10.<net>.<i>.2, its link's end
/// here is `<prefix>v<i>` at 10.<net>.<i>.1.
struct Hosts {
    prefix: String,
    net: u32,
    made: Vec<usize>,
}

impl Hosts {
    fn new() -> Hosts {
        // Tests of one process run at once: each set of hosts gets names
        // and a network of its own.
        static SETS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let k = SETS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pid = std::process::id();
        Hosts {
            prefix: format!("rk{}{}", pid % 100_000, (b'a' + (k % 26) as u8) as char),
            net: 100 + (pid % 50 * 3 + k) % 150,
            made: Vec::new(),
        }
    }

    fn ns(&self, i: usize) -> String {
        format!("{}n{i}", self.prefix)
    }

    fn link(&self, i: usize) -> String {
        format!("{}v{i}", self.prefix)
    }

    /// The host's address and the head's address on its link.
    fn addr(&self, i: usize) -> (String, String) {
        (
            format!("10.{}.{i}.2", self.net),
            format!("10.{}.{i}.1", self.net),
        )
    }

    fn ip(a: &[&str]) {
        tool("timeout", &[&["10", "ip"], a].concat());
    }

    fn add(&mut self, i: usize) {
        let (ns, link, peer) = (self.ns(i), self.link(i), format!("{}p{i}", self.prefix));
        let (there, here) = self.addr(i);
        Self::ip(&["netns", "add", &ns]);
        self.made.push(i);
        Self::ip(&["link", "add", &link, "type", "veth", "peer", "name", &peer]);
        Self::ip(&["link", "set", &peer, "netns", &ns]);
        Self::ip(&["addr", "add", &format!("{here}/24"), "dev", &link]);
        Self::ip(&["link", "set", &link, "up"]);
        Self::ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{there}/24"),
            "dev",
            &peer,
        ]);
        Self::ip(&["-n", &ns, "link", "set", &peer, "up"]);
        Self::ip(&["-n", &ns, "link", "set", "lo", "up"]);
    }

    /// Cut (or restore) the host's link, as a pulled cable.
    fn set_link(&self, i: usize, up: bool) {
        Self::ip(&["link", "set", &self.link(i), if up { "up" } else { "down" }]);
    }

    /// A command run inside host `i`.
    fn cmd(&self, i: usize, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(i), program]);
        c
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for &i in &self.made {
            cleanup(
                "ip",
                &["link", "del", &self.link(i)],
                Duration::from_secs(10),
            );
            cleanup(
                "ip",
                &["netns", "del", &self.ns(i)],
                Duration::from_secs(10),
            );
        }
    }
}

/// Every event of the log so far, as JSON.
fn events(log: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn count(evs: &[serde_json::Value], name: &str) -> usize {
    evs.iter().filter(|e| e["event"] == name).count()
}

/// fio from the client host against the array: `rw` of 4 jobs, each on
/// its own 6 MiB, verified (crc32c headers) after writing; `extra` adds
/// options (a rate, verify_only).
fn fio(hosts: &Hosts, client: usize, uri: &str, name: &str, extra: &[&str]) -> Output {
    let mut c = hosts.cmd(client, "timeout");
    c.args([
        "240",
        "fio",
        &format!("--name={name}"),
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--rw=randwrite",
        "--bs=16k",
        "--numjobs=4",
        "--size=6m",
        "--offset_increment=6m",
        "--iodepth=8",
        "--verify=crc32c",
        "--verify_fatal=1",
        // No state file left behind in the working directory.
        "--verify_state_save=0",
        "--randseed=7",
        "--group_reporting",
    ]);
    c.args(extra);
    output_within(&mut c, DEADLINE)
}

fn state(st: &serde_json::Value, i: usize) -> String {
    st["members"][i]["state"].as_str().unwrap_or("").to_string()
}

#[test]
fn six_storage_hosts_lose_links_come_back_and_rejoin_by_bitmap() {
    let dir = tmp();
    let mut hosts = Hosts::new();
    // Hosts 0-5 store the members, 6 is the new host of `add`, 7 the client.
    for i in 0..8 {
        hosts.add(i);
    }
    let file = |i: usize| {
        dir.path()
            .join(format!("disk{i}.img"))
            .display()
            .to_string()
    };
    for i in 0..7 {
        std::fs::File::create(file(i))
            .unwrap()
            .set_len(48 << 20)
            .unwrap();
    }
    // Three kinds of storage server: raidkit export, nbdkit, qemu-nbd.
    let serve_on = |i: usize| -> (Guarded, String) {
        let (there, _) = hosts.addr(i);
        let g = match i {
            3 | 4 => Guarded::spawn(
                hosts
                    .cmd(i, "nbdkit")
                    .args(["-f", "-i", &there, "-p", "10809", "file", &file(i)])
                    .stderr(Stdio::null()),
            ),
            5 => Guarded::spawn(
                hosts
                    .cmd(i, "qemu-nbd")
                    .args(["-f", "raw", "-b", &there, "-p", "10809", "-x", "d5"])
                    .args(["--shared=8", "--persistent", &file(i)])
                    .stderr(Stdio::null()),
            ),
            _ => Guarded::spawn(
                hosts
                    .cmd(i, BIN)
                    .args(["export", "--listen", &format!("{there}:10809"), &file(i)])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null()),
            ),
        };
        let export = match i {
            3 | 4 => String::new(),
            5 => "d5".to_string(),
            _ => format!("disk{i}.img"),
        };
        let uri = format!("nbd://{there}:10809/{export}");
        wait_for(&format!("{uri} to serve"), 30, || {
            try_tool("timeout", &["5", "nbdinfo", "--size", &uri])
                .status
                .success()
        });
        (g, uri)
    };
    let mut servers: Vec<(Guarded, String)> = (0..6).map(serve_on).collect();
    let uris: Vec<String> = servers.iter().map(|s| s.1.clone()).collect();
    ok(&args(
        &[
            "create",
            "--level",
            "6",
            "--chunk",
            "64K",
            "--bitmap-region",
            "1M",
            "--size",
            "40M",
        ],
        &uris,
    ));
    // A copy of host 2's disk as it is now: what a host restored from an
    // old image would serve.
    std::fs::copy(file(2), dir.path().join("disk2.old")).unwrap();

    let log = dir.path().join("events.jsonl");
    let (_, head) = hosts.addr(7);
    let listen = format!("{head}:0");
    let logged = log.display().to_string();
    // Only the client's network may use the array.
    let clients = format!("10.{}.7.0/24", hosts.net);
    let start = || -> Served {
        Served::start_on(
            dir.path(),
            &uris,
            &["--listen", &listen],
            &[
                "--member-timeout",
                "3",
                "--rejoin-timeout",
                "25",
                "--events-log",
                &logged,
                "--allow",
                &clients,
            ],
        )
    };
    let mut s = start();

    // Host 6, routed to the head, is outside the list: its connection
    // reaches the server (counted) and is closed before the handshake.
    Hosts::ip(&[
        "-n",
        &hosts.ns(6),
        "route",
        "add",
        &clients,
        "via",
        &hosts.addr(6).1,
    ]);
    let refused = |s: &Served| s.status()["connections"]["refused"].as_u64().unwrap_or(0);
    let before = refused(&s);
    let out = output_within(
        hosts
            .cmd(6, "timeout")
            .args(["20", "nbdinfo", "--size", &s.uri]),
        Duration::from_secs(30),
    );
    assert!(!out.status.success(), "host 6 let in: {out:?}");
    assert!(
        refused(&s) > before,
        "host 6 not refused by --allow: {out:?}"
    );

    // Two links cut while the client writes (and then verifies).
    let writer = {
        let uri = s.uri.clone();
        let hosts = Hosts {
            prefix: hosts.prefix.clone(),
            net: hosts.net,
            made: Vec::new(),
        };
        std::thread::spawn(move || fio(&hosts, 7, &uri, "cut", &["--rate=1m"]))
    };
    std::thread::sleep(Duration::from_secs(2));
    hosts.set_link(1, false);
    std::thread::sleep(Duration::from_secs(2));
    hosts.set_link(4, false);
    let out = writer.join().unwrap();
    assert!(
        out.status.success(),
        "fio with two links cut: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for("both members disconnected", 30, || {
        let st = s.status();
        state(&st, 1) == "disconnected" && state(&st, 4) == "disconnected"
    });
    assert_eq!(s.status()["state"], "degraded");
    assert_eq!(
        count(&events(&log), "Disconnected"),
        2,
        "{:#?}",
        events(&log)
    );

    // Both back: they rejoin by themselves, resynced only where written.
    hosts.set_link(1, true);
    hosts.set_link(4, true);
    let t = std::time::Instant::now();
    loop {
        let st = s.status();
        if st["state"] == "optimal" && st["recovery"].is_null() {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(90),
            "both members not back in sync: {st:#}\nevents: {:#?}\nlog: {}",
            events(&log),
            s.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let evs = events(&log);
    assert_eq!(count(&evs, "MemberReturned"), 2, "{evs:#?}");
    let resynced: Vec<u64> = evs
        .iter()
        .filter(|e| e["event"] == "RebuildFinished")
        .map(|e| e["data"]["bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(resynced.len(), 2, "{evs:#?}");
    // 24 MiB written over 4 data members: each member got about 6 MiB
    // (spread over 1 MiB regions); a full rebuild is 40 MiB.
    for b in &resynced {
        assert!(*b > 0 && *b < 20 << 20, "resynced {b} bytes: {evs:#?}");
    }
    let out = fio(&hosts, 7, &s.uri, "cut", &["--verify_only"]);
    assert!(out.status.success(), "verify after the rejoin: {out:?}");
    // Stopped, checked offline over the same exports (redundancy agrees
    // with the data on every member, the two rejoined included), served
    // again.
    assert_eq!(s.stop().code(), Some(0));
    ok(&args(&["check"], &uris));
    s = start();

    // A storage server gone for good: failed once the rejoin time is up;
    // a new host's export added takes its place.
    servers[5].0.kill();
    wait_for("host 5 disconnected", 30, || {
        state(&s.status(), 5) == "disconnected"
    });
    wait_for("host 5 failed for good", 60, || {
        state(&s.status(), 5) == "faulty"
    });
    let ctl = s.control.display().to_string();
    ok(&["remove", "--control", &ctl, &uris[5]]);
    let (g6, uri6) = serve_on(6);
    ok(&["add", "--control", &ctl, &uri6]);
    wait_for("the new member rebuilt", 60, || {
        let st = s.status();
        st["state"] == "optimal" && st["recovery"].is_null()
    });

    // A host that comes back with an old image of its disk: refused.
    servers[2].0.kill();
    wait_for("host 2 disconnected", 30, || {
        state(&s.status(), 2) == "disconnected"
    });
    let out = fio(&hosts, 7, &s.uri, "while-away", &["--size=1m"]);
    assert!(out.status.success(), "{out:?}");
    std::fs::rename(dir.path().join("disk2.old"), file(2)).unwrap();
    servers[2] = serve_on(2);
    wait_for("the stale member refused", 30, || {
        count(&events(&log), "RejoinRefused") == 1
    });
    let st = s.status();
    assert_eq!(state(&st, 2), "faulty", "{st:#}");
    assert_eq!(st["state"], "degraded", "{st:#}");

    // A slow link: reported slow, no errors. (This kernel has no netem
    // for a plain delay; a token bucket of 8 Mbit/s on the host's side
    // makes each 16 KiB reply take 16 ms.)
    tool(
        "timeout",
        &[
            "10",
            "ip",
            "netns",
            "exec",
            &hosts.ns(3),
            "tc",
            "qdisc",
            "add",
            "dev",
            &format!("{}p3", hosts.prefix),
            "root",
            "tbf",
            "rate",
            "8mbit",
            "burst",
            "16k",
            "latency",
            "2s",
        ],
    );
    let out = fio(&hosts, 7, &s.uri, "cut", &["--verify_only"]);
    assert!(out.status.success(), "verify over a slow link: {out:?}");
    let st = s.status();
    assert!(!st["members"][3]["slow"].is_null(), "{st:#}");
    assert_eq!(st["members"][3]["state"], "active", "{st:#}");
    assert_eq!(st["members"][3]["errors"]["read"], 0, "{st:#}");

    assert_eq!(s.stop().code(), Some(0));
    drop(g6);
    drop(servers);
}

#[test]
fn create_refuses_an_array_one_failure_domain_could_take_down() {
    let dir = tmp();
    let ms = members(dir.path(), 4);
    let blank = |m: &String| std::fs::read(m).map_or(true, |b| b.iter().all(|&x| x == 0));
    let make = |level: &str, domains: &str, extra: &[&str]| -> Output {
        let mut a = vec![
            "create", "--level", level, "--size", "16M", "--domain", domains,
        ];
        a.extend_from_slice(extra);
        a.extend(ms.iter().map(|s| s.as_str()));
        raidkit_refused(&a)
    };
    // RAID-5 with two members in rack a: losing rack a loses the array.
    let out = make("5", "a,a,b,c", &[]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(ms
        .iter()
        .all(|m| !std::path::Path::new(m).exists() || blank(m)));
    // One label per member, no more, no less.
    let out = make("6", "a,b", &[]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    // RAID-6 survives any two: the same placement is fine.
    let out = make("6", "a,a,b,c", &[]);
    assert!(out.status.success(), "{out:?}");
    let d: serde_json::Value =
        serde_json::from_slice(&ok(&args(&["detail", "--json"], &ms)).stdout).unwrap();
    let domains: Vec<&str> = d["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["domain"].as_str().unwrap())
        .collect();
    assert_eq!(domains, ["a", "a", "b", "c"], "{d:#}");
    let text = String::from_utf8(ok(&args(&["detail"], &ms)).stdout).unwrap();
    assert!(
        text.lines()
            .any(|l| l.contains(" b ") && l.contains(&ms[2])),
        "{text}"
    );
    // --force creates what is refused otherwise.
    let out = make("5", "a,a,b,c", &["--force"]);
    assert!(out.status.success(), "{out:?}");

    // Without labels, a member's domain is the host of its URI: two local
    // files and one export on 127.0.0.1 put two RAID-5 members here.
    let f = dir.path().join("remote.img").display().to_string();
    std::fs::File::create(&f)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let (_host, uri) = export(&f);
    let local: Vec<String> = (0..2)
        .map(|i| dir.path().join(format!("l{i}.img")).display().to_string())
        .collect();
    let mut a = vec!["create", "--level", "5", "--size", "16M"];
    a.extend(local.iter().map(|s| s.as_str()));
    a.push(&uri);
    let out = raidkit_refused(&a);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(local
        .iter()
        .all(|m| !std::path::Path::new(m).exists() || blank(m)));
    // RAID-1 of the three survives losing two.
    a[2] = "1";
    let out = raidkit_refused(&a);
    assert!(out.status.success(), "{out:?}");
    let d: serde_json::Value =
        serde_json::from_slice(&ok(&["detail", "--json", &local[0], &local[1], &uri]).stdout)
            .unwrap();
    assert_eq!(d["members"][2]["domain"], "127.0.0.1", "{d:#}");
    assert_eq!(d["members"][0]["domain"], "local", "{d:#}");
}

/// An address of this (the head's) namespace on its loopback device, for
/// one test; removed when dropped, also when the test fails.
struct HeadAddress(String);

impl HeadAddress {
    fn add(addr: &str) -> HeadAddress {
        Hosts::ip(&["addr", "add", &format!("{addr}/32"), "dev", "lo"]);
        HeadAddress(addr.to_string())
    }
}

impl Drop for HeadAddress {
    fn drop(&mut self) {
        cleanup(
            "ip",
            &["addr", "del", &format!("{}/32", self.0), "dev", "lo"],
            Duration::from_secs(10),
        );
    }
}

/// The lab's three farm nodes reading one server at once: `raidkit bench
/// --clients 3` runs its streams from three processes, each started in a
/// network namespace of its own (--client-via) with its own connection to
/// one served RAID-5, and reports the aggregate and each client's figure.
#[test]
fn bench_clients_on_three_hosts_share_one_array() {
    let dir = tmp();
    let mut hosts = Hosts::new();
    for i in 1..=3 {
        hosts.add(i);
    }
    // One address of the server's that every host reaches over its link.
    let head = format!("10.{}.250.1", hosts.net);
    let _head = HeadAddress::add(&head);
    for i in 1..=3 {
        let via = hosts.addr(i).1;
        Hosts::ip(&[
            "-n",
            &hosts.ns(i),
            "route",
            "add",
            &format!("{head}/32"),
            "via",
            &via,
        ]);
    }
    let ms = members(dir.path(), 4);
    create("5", &ms, "48M");
    let log = dir.path().join("events.jsonl");
    let logged = log.display().to_string();
    let mut s = Served::start_on(
        dir.path(),
        &ms,
        &["--listen", &format!("{head}:0")],
        &["--events-log", &logged],
    );
    assert!(s.uri.contains(&head), "{}", s.uri);
    let via = format!("ip netns exec {}n{{i}}", hosts.prefix);
    let o = output_within(
        Command::new(env!("CARGO_BIN_EXE_raidkit")).args([
            "bench",
            &s.uri,
            "--destroy-data",
            "--tests",
            "streams_write,streams_read",
            "--clients",
            "3",
            "--client-via",
            &via,
            // One run: the bound below holds per run, not between medians.
            "--runs",
            "1",
            "--size",
            "36M",
            "--json",
        ]),
        DEADLINE,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let results = v["results"].as_array().unwrap();
    for side in ["write", "read"] {
        let find = |t: &str| {
            results
                .iter()
                .filter(|r| r["test"] == t)
                .collect::<Vec<_>>()
        };
        let clients = find(&format!("streams_{side}_client"));
        let mut numbers: Vec<u64> = clients
            .iter()
            .map(|r| r["client"].as_u64().unwrap())
            .collect();
        numbers.sort();
        assert_eq!(numbers, [1, 2, 3], "{clients:?}");
        let agg = find(&format!("streams_{side}"));
        assert_eq!(agg.len(), 1);
        assert_eq!(agg[0]["streams"], 3);
        let total = agg[0]["value"].as_f64().unwrap();
        // The aggregate is 3 parts over the slowest client's time: at
        // least 3 times the slowest client's rate, at most the sum.
        let rates: Vec<f64> = clients
            .iter()
            .map(|r| r["value"].as_f64().unwrap())
            .collect();
        let slowest = rates.iter().copied().fold(f64::INFINITY, f64::min);
        assert!(total > 0.0 && rates.iter().all(|&r| r > 0.0), "{agg:?}");
        assert!(total >= 3.0 * slowest * 0.999, "{total} against {rates:?}");
        for c in &clients {
            assert!(c["cpu"].as_f64().is_some(), "{c}");
        }
    }
    // The connections came from the three hosts' own addresses.
    s.stop();
    let peers: std::collections::BTreeSet<String> = events(&log)
        .iter()
        .filter(|e| e["event"] == "ClientConnected")
        .filter_map(|e| e["data"]["peer"].as_str())
        .map(|p| p.rsplit_once(':').map(|x| x.0).unwrap_or(p).to_string())
        .collect();
    let want: std::collections::BTreeSet<String> = (1..=3).map(|i| hosts.addr(i).0).collect();
    assert!(
        want.is_subset(&peers),
        "connections from {peers:?}, expected {want:?}"
    );
    // Each client process ended with its run: none is left.
    let left = try_tool("pgrep", &["-f", "bench stream-worker"]);
    assert!(
        !left.status.success(),
        "{}",
        String::from_utf8_lossy(&left.stdout)
    );
}

/// A member's server that is asked to stop (nbdkit answers the requests
/// in flight with NBD_ESHUTDOWN, then waits for its clients to go) is a
/// link lost: the member is disconnected, not failed for good; the
/// connection is closed at once, so the server exits; and once it is
/// back at its address the member rejoins by itself, resynced where it
/// missed writes, every byte a client wrote still right.
#[test]
fn a_member_server_that_shuts_down_is_disconnected_and_rejoins() {
    let dir = tmp();
    let (local, remote_file, port) = local_and_remote(dir.path());
    let nbdkit = || nbdkit_file(&port, &remote_file);
    let mut host = nbdkit();
    let members = vec![local.clone(), format!("nbd://127.0.0.1:{port}/")];
    create("1", &members, "48M");
    let mut s = Served::start(dir.path(), &members, &["--rejoin-timeout", "120"]);
    // Writes (verified as they are read back at the end of the job) going
    // on while the member's server stops.
    let uri = s.uri.clone();
    let writer = std::thread::spawn(move || {
        try_tool(
            "timeout",
            &[
                "120",
                "fio",
                "--name=w",
                "--ioengine=nbd",
                &format!("--uri={uri}"),
                "--rw=randwrite",
                "--bs=64k",
                "--size=40M",
                "--iodepth=8",
                "--verify=crc32c",
                "--do_verify=1",
                "--verify_fatal=1",
                "--verify_state_save=0",
            ],
        )
    });
    wait_for("writes to begin", 30, || {
        s.status()["io"]["writes"].as_u64().unwrap_or(0) > 50
    });
    // SAFETY: kill(2) on our own child, still running.
    unsafe { libc::kill(host.id() as i32, libc::SIGTERM) };
    host.wait_within(Duration::from_secs(10));
    wait_for("the member to be seen gone", 30, || {
        s.status()["members"][1]["state"] != "active"
    });
    let st = s.status();
    assert_eq!(st["members"][1]["state"], "disconnected", "{st:#}");
    let _back = nbdkit();
    wait_for("the member to rejoin", 60, || {
        let st = s.status();
        st["state"] == "optimal" && st["members"][1]["state"] == "active"
    });
    let out = writer.join().unwrap();
    assert!(out.status.success(), "fio: {out:?}");
    assert_eq!(s.stop().code(), Some(0));
    ok(&["check", &members[0], &members[1]]);
}

/// A host that is down when the array starts: without `--run` the start is
/// refused; with it the array starts degraded, lists the member as
/// disconnected, and takes it back in its role (with the writes it missed)
/// once its host answers. A member the array had failed before it stopped
/// is not taken back by itself, and one whose host stays away is given up
/// on at the rejoin timeout.
#[test]
fn a_member_host_down_at_start_is_taken_back_when_it_answers() {
    let dir = tmp();
    let (local, remote_file, port) = local_and_remote(dir.path());
    let nbdkit = || nbdkit_file(&port, &remote_file);
    let remote = format!("nbd://127.0.0.1:{port}/");
    let members = vec![local.clone(), remote.clone()];
    let evlog = dir.path().join("events.jsonl");
    let ev = evlog.display().to_string();
    let mut host = nbdkit();
    create("1", &members, "48M");
    let mut s = Served::start(dir.path(), &members, &[]);
    let old = write_pattern(dir.path(), &s.uri, 0);
    assert_eq!(s.stop().code(), Some(0));
    host.kill();

    // Without --run: refused, nothing started.
    let out = raidkit(&args(&["serve", "--listen", "127.0.0.1:0"], &members));
    assert!(!out.status.success(), "{out:?}");

    let mut s = Served::start(
        dir.path(),
        &members,
        &["--run", "--rejoin-timeout", "120", "--events-log", &ev],
    );
    let st = s.status();
    assert_eq!(st["state"], "degraded", "{st:#}");
    assert_eq!(st["members"][1]["state"], "missing", "{st:#}");
    let waiting = &st["members"][2];
    assert_eq!(waiting["path"], remote.as_str(), "{st:#}");
    assert_eq!(waiting["state"], "disconnected", "{st:#}");
    assert!(waiting["role"].is_null(), "{st:#}");
    // Written while the member is away: it must get these too.
    let new = write_pattern(dir.path(), &s.uri, 3);
    assert_ne!(old, new);
    let _host = nbdkit();
    wait_for("the member to take its role back", 60, || {
        let st = s.status();
        st["state"] == "optimal" && st["members"][1]["path"] == remote.as_str()
    });
    let st = s.status();
    assert_eq!(st["members"].as_array().unwrap().len(), 2, "{st:#}");
    assert_eq!(st["members"][1]["state"], "active", "{st:#}");
    let evs = events(&evlog);
    assert_eq!(count(&evs, "MemberReturned"), 1, "{evs:#?}");
    assert_eq!(s.stop().code(), Some(0));
    // The member that came back holds what was written without it: read
    // it alone (the local member left out, the array started degraded).
    let mut s = Served::start(
        dir.path(),
        std::slice::from_ref(&remote),
        &["--run", "--read-only"],
    );
    let back = dir.path().join("back.raw");
    tool(
        "timeout",
        &["60", "nbdcopy", &s.uri, &back.display().to_string()],
    );
    assert!(std::fs::read(&back).unwrap()[..new.len()] == new[..]);
    assert_eq!(s.stop().code(), Some(0));
    ok(&["check", &members[0], &members[1]]);

    // A member the array failed before it stopped waits for `add`.
    let mut s = Served::start(dir.path(), &members, &[]);
    let ctl = s.control.display().to_string();
    ok(&["fail", "--control", &ctl, "1"]);
    assert_eq!(s.stop().code(), Some(0));
    drop(_host);
    std::fs::remove_file(&evlog).unwrap();
    let mut s = Served::start(
        dir.path(),
        &members,
        &["--run", "--rejoin-timeout", "120", "--events-log", &ev],
    );
    let _host = nbdkit();
    wait_for("the member to be refused", 60, || {
        count(&events(&evlog), "RejoinRefused") == 1
    });
    // Still listed, with why, until it is added or removed.
    let st = s.status();
    assert_eq!(st["state"], "degraded", "{st:#}");
    assert_eq!(st["members"][1]["state"], "missing", "{st:#}");
    assert_eq!(st["members"][2]["path"], remote.as_str(), "{st:#}");
    assert_eq!(st["members"][2]["state"], "faulty", "{st:#}");
    assert_eq!(s.stop().code(), Some(0));

    // A host that stays away is given up on at the rejoin timeout.
    drop(_host);
    std::fs::remove_file(&evlog).unwrap();
    let s = Served::start(
        dir.path(),
        &members,
        &["--run", "--rejoin-timeout", "2", "--events-log", &ev],
    );
    assert_eq!(s.status()["members"][2]["state"], "disconnected");
    wait_for("the member to be given up on", 30, || {
        s.status()["members"][2]["state"] == "faulty"
    });
    let evs = events(&evlog);
    assert!(
        evs.iter()
            .any(|e| e["event"] == "Fail" && e["member"] == remote.as_str()),
        "{evs:#?}"
    );
    drop(s);

    // An array that fails takes no member back while it runs, not even
    // one it was waiting for.
    std::fs::remove_file(&evlog).unwrap();
    let s = Served::start(
        dir.path(),
        &members,
        &["--run", "--rejoin-timeout", "120", "--events-log", &ev],
    );
    assert_eq!(s.status()["members"][2]["state"], "disconnected");
    let ctl = s.control.display().to_string();
    ok(&["fail", "--force", "--control", &ctl, "0"]);
    let st = s.status();
    assert_eq!(st["state"], "failed", "{st:#}");
    assert_eq!(st["members"][2]["state"], "faulty", "{st:#}");
    let evs = events(&evlog);
    assert!(
        evs.iter()
            .any(|e| e["event"] == "Fail" && e["member"] == remote.as_str()),
        "{evs:#?}"
    );
}

/// One export named twice is refused by
/// `create` before anything is written, as a file named twice is: the
/// second role's superblock would overwrite the first's.
#[test]
fn create_refuses_an_export_named_twice() {
    let dir = tmp();
    let files = sized_files(dir.path(), "m", 3, 64 << 20);
    let (_e, uri) = export(&files[2]);
    let other = uri.clone();
    let before = std::fs::read(&files[2]).unwrap();
    let members = vec![uri.clone(), files[0].clone(), files[1].clone(), other];
    let out = raidkit_refused(&args(&["create", "--level", "5", "--force"], &members));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        std::fs::read(&files[2]).unwrap() == before,
        "the export was written"
    );
    // Each once: made.
    ok(&args(
        &["create", "--level", "5", "--force"],
        &[uri, files[0].clone(), files[1].clone()],
    ));
    assert!(std::fs::read(&files[2]).unwrap() != before);
}
