#!/usr/bin/python3
"""kill -9 torture: a client writes and flushes through NBD and records what
was acknowledged; the server is killed (SIGKILL) at a random moment (from
0.2 to 1.5 s after it acknowledged its first writes, which it must do within
FIRST_BATCH seconds of its start), restarted (every other cycle with a member missing) and checked: every block
whose write was acknowledged and then flushed must read back, and no block
may hold anything but its last flushed contents or one of the writes issued
after that flush.

usage: scripts/torture.py [--cycles N] [--level 5|6] [--seed S] [--raidkit PATH]
                          [--members N] [--policy POLICY] [--kill-min SECONDS]
                          [--sabotage] [--old-copy] [--sync-cut] [--grow]
                          [--chunk SIZE] [--devices DEV,DEV,...] [--sequential]
                          [--serve-arg=ARG ...]

--sequential: every request is 64 KiB where the last ended (wrapping at the
end of the span): one writer in sequence, which serve writes behind on
members that wait for devices (a flush must still find every write it
covers, and a kill lose only unflushed ones).

--devices: the members are these block devices (4 for RAID-5, 5 for
RAID-6; at least 48 MiB each, their contents are overwritten), not files on
the RAM disk: loop devices with direct I/O over files on a disk, say, where
the server opens them with O_DIRECT and a durable write is a device cache
flush. Not with --grow, --chunk or --sync-cut, which make member files.

--grow: in the first cycle the array is grown by one member (`raidkit grow
--add`), its reshape slowed (serve --rebuild-min/--rebuild-max 12M) so
that the kills land all through it, and the server is killed while data
moves. No member is left out while it runs. At the end the reshape must have
finished: the array has its new size and one more member, and `raidkit
check` finds every stripe consistent.

--chunk SIZE: as --grow, but the first cycle changes the chunk to SIZE
(`raidkit grow --chunk`); at the end the array has the new chunk, its
members and size unchanged, and `raidkit check` finds every stripe
consistent.

--old-copy: every fourth cycle copies the member files before the start, and
two cycles later, if every member is in sync, one member's old copy is put
back in its place (a restored backup, a disk swapped back): it missed the
writes since, and must never serve them. Only the cycle after that runs
without a member.
--sync-cut: the members start full of random bytes and `create` is killed
during its initial sync; the servers resume it. No member is left out until
a kill finds the sync done. At the end the array is stopped cleanly once in
sync, `raidkit check` must find every stripe consistent, and every block is
checked again with a member left out (rebuilt from parity).
Prints one line per cycle and a summary. Exits 0 when nothing was lost, 1 on
any loss (the summary line says how many blocks; a block the server refuses
to read, EIO, is lost too: with checksums that is what damage beyond
redundancy gives), 2 on any other failure: an
NBD error that is not the server's death at the planned kill, a server that
does not start, a cycle in which no write was acknowledged, or anything
unexpected. A failure is never reported as a loss, nor a loss as success.
"""

import argparse
import hashlib
import os
import random
import shutil
import signal
import stat
import socket
import subprocess
import sys
import tempfile
import select
import threading
import time
import traceback

import nbd

BLOCK = 4096
SPAN_BLOCKS = 8192  # the first 32 MiB of the array take the writes
FIRST_BATCH = 20  # seconds a restarted server has to acknowledge its first writes


def content(seed, block):
    """The 4 KiB a write with this seed puts in this block."""
    h = hashlib.blake2b(f"{seed}:{block}".encode(), digest_size=32).digest()
    return h * (BLOCK // len(h))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Server:
    def __init__(self, raidkit, members, workdir, log, extra=()):
        self.port = free_port()
        self.uri = f"nbd://127.0.0.1:{self.port}/torture"
        self.control = os.path.join(workdir, "ctl")
        self.proc = subprocess.Popen(
            [raidkit, "serve", "--listen", f"127.0.0.1:{self.port}",
             "--control", os.path.join(workdir, "ctl")]
            + ([] if "--rebuild-min" in extra else ["--rebuild-min", "0"])
            # A cycle may start without a member on purpose (a dead disk).
            + ["--run"] + list(extra) + members,
            stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
            # The link to the control socket that `raidkit list` finds
            # (raidkit-<uuid>.ctl in the temp directory) lands in the
            # workdir: a killed server leaves it behind, and it goes with
            # the workdir instead of dangling in /tmp.
            env={**os.environ, "TMPDIR": workdir})
        self.killed = False
        deadline = time.time() + 60
        out = b""
        fd = self.proc.stdout.fileno()
        while b"listening on" not in out and time.time() < deadline:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if not ready:
                continue
            more = os.read(fd, 4096)
            if not more:
                break  # the server exited
            out += more
        started = b"listening on" in out
        if not started:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            raise RuntimeError(f"server did not start (exit {self.proc.returncode})")

    def in_sync(self, raidkit):
        """Whether every member is in sync (asked just before a kill)."""
        try:
            r = subprocess.run([raidkit, "status", "--json", "--control", self.control],
                               capture_output=True, text=True, timeout=30)
        except subprocess.TimeoutExpired:
            return False
        return r.returncode == 0 and '"state": "optimal"' in r.stdout

    def kill9(self):
        # Set before the signal: an NBD error seen after this is the
        # server's death; one seen before it is a real error.
        self.killed = True
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.proc.stdout.close()


def connect(uri):
    h = nbd.NBD()
    h.connect_uri(uri)
    return h


def check(h, expected, maybe, initial=None):
    """Blocks whose contents are not allowed. Afterwards `expected` holds
    what is there (every block now has a definite value). `initial`: what
    never-written blocks hold (zeros if absent); an empty dict is filled
    from this read (the first, before any write)."""
    bad = []
    record = initial is not None and not initial
    for start in range(0, SPAN_BLOCKS, 256):
        try:
            data = h.pread(256 * BLOCK, start * BLOCK)
        except nbd.Error:
            # Some block there cannot be read (a checksum says it is wrong
            # and redundancy cannot rebuild it): block by block, and each
            # that fails is lost (the server never returned wrong data).
            data = None
        for i in range(256):
            b = start + i
            if data is None:
                try:
                    got = h.pread(BLOCK, b * BLOCK)
                except nbd.Error:
                    bad.append(b)
                    continue
            else:
                got = data[i * BLOCK:(i + 1) * BLOCK]
            if record:
                initial[b] = got
            never = bytes(BLOCK) if initial is None else initial.get(b, bytes(BLOCK))
            # None: a block never written, as it was at the start.
            allowed = [expected.get(b)] + sorted(maybe.get(b, ()))
            match = [s for s in allowed
                     if got == (never if s is None else content(s, b))]
            if not match:
                bad.append(b)
            elif match[0] is None:
                expected.pop(b, None)
            else:
                expected[b] = match[0]
    maybe.clear()
    return bad


def stop_and_check(args, server, members):
    """Stop the server cleanly (SIGTERM) and run `raidkit check` on the
    members: its completed process."""
    server.proc.send_signal(signal.SIGTERM)
    if server.proc.wait(timeout=60) != 0:
        raise RuntimeError(f"serve exited {server.proc.returncode} on SIGTERM")
    server.proc.stdout.close()
    return subprocess.run([args.raidkit, "check"] + members, capture_output=True, text=True,
                          timeout=300)


def final_sync_check(args, server, members, work, log, expected, initial, rng):
    """Once the sync is done: stop cleanly, `raidkit check` finds nothing,
    and with a member left out every block reads as before. Returns the
    blocks lost."""
    deadline = time.time() + 120
    while not server.in_sync(args.raidkit):
        if time.time() > deadline:
            raise RuntimeError("the initial sync did not finish within 120 s")
        time.sleep(0.5)
    r = stop_and_check(args, server, members)
    if r.returncode != 0:
        print(f"check after the sync: exit {r.returncode}: {r.stdout.strip()} "
              f"{r.stderr.strip()}", flush=True)
        return 1
    gone = rng.randrange(len(members))
    degraded = Server(args.raidkit, [m for i, m in enumerate(members) if i != gone],
                      work, log, args.serve_arg)
    try:
        h = connect(degraded.uri)
        bad = check(h, expected, {}, initial)
        del h
    finally:
        degraded.kill9()
    print(f"after the sync: check clean, member {gone} left out: {len(bad)} bad blocks",
          flush=True)
    return len(bad)


def status(raidkit, control):
    import json
    r = subprocess.run([raidkit, "status", "--json", "--control", control],
                       capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"status: {r.stderr}")
    return json.loads(r.stdout)


def parse_size(text):
    """Bytes of a size as raidkit takes it: digits, then K, M or G."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper()
    return int(t[:-1]) * units[t[-1]] if t[-1] in units else int(t)


def final_grow_check(args, server, members, grown_to):
    """The reshape finishes (unthrottled): one more member, the new size,
    and `raidkit check` clean after a clean stop. Returns 1 if not."""
    if grown_to is None:
        raise RuntimeError("the array was never grown")
    subprocess.run([args.raidkit, "speed", "--control", server.control,
                    "--rebuild-min", "0", "--rebuild-max", "0"],
                   check=True, stdout=subprocess.DEVNULL, timeout=60)
    deadline = time.time() + 120
    while True:
        st = status(args.raidkit, server.control)
        if st.get("reshape") is None and st["state"] == "optimal":
            break
        if time.time() > deadline:
            raise RuntimeError(f"the reshape did not finish within 120 s: {st['state']}")
        time.sleep(0.3)
    n = len(st["members"])
    chunk_ok = args.chunk is None or st["array"]["chunk"] == parse_size(args.chunk)
    print(f"after the reshape: chunk {st['array']['chunk']}", flush=True)
    last = st["last_recovery"] or {}
    # None: the reshape ended under an earlier server.
    print(f"after the reshape: {n} members, size {st['array']['size']}, "
          f"last recovery here: {last.get('kind')} ({last.get('result')})", flush=True)
    r = stop_and_check(args, server, members)
    ok = r.returncode == 0 and n == grown_to and chunk_ok
    print(f"after the reshape: check {'clean' if r.returncode == 0 else 'FAILED: ' + r.stdout}",
          flush=True)
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--level", default="5")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sabotage", action="store_true",
                    help="scribble over the first 64 KiB of every member's data after the first kill "
                    "(an array without checksums): the check must see it")
    ap.add_argument("--old-copy", action="store_true",
                    help="put an old copy of a member back in its place every fourth cycle")
    ap.add_argument("--sync-cut", action="store_true",
                    help="members full of random bytes, create killed during its initial sync")
    ap.add_argument("--grow", action="store_true",
                    help="grow the array by a member in the first cycle, kills during its reshape")
    ap.add_argument("--chunk",
                    help="change the chunk to this size in the first cycle, kills during its reshape")
    ap.add_argument("--devices",
                    help="comma-separated block devices to use as the members instead of files")
    ap.add_argument("--sequential", action="store_true",
                    help="write in sequence, one request at a time (what serve "
                         "writes behind the client on devices)")
    ap.add_argument("--members", type=int,
                    help="members to create the array with (default 4 for RAID-5, 5 for RAID-6)")
    ap.add_argument("--policy",
                    help="the consistency policy to create with (create --consistency-policy)")
    ap.add_argument("--kill-min", type=float, default=0.2,
                    help="the shortest time a server lives after its first writes are acknowledged "
                         "before its kill (drawn up to 1.5 s)")
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="pass this argument to every `raidkit serve` (for the tests: "
                    "--serve-arg=--read-only must make the run fail)")
    ap.add_argument("--raidkit", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "target", "release", "raidkit"))
    args = ap.parse_args()
    rng = random.Random(args.seed)
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    work = tempfile.mkdtemp(prefix="raidkit-torture.", dir=base)
    server = None
    try:
        n = args.members or (4 if args.level == "5" else 5)
        members = [os.path.join(work, f"d{i}.img") for i in range(n)]
        if args.devices:
            members = args.devices.split(",")
            if len(members) != n:
                raise RuntimeError(f"--devices: RAID-{args.level} here takes {n} devices, "
                                   f"not {len(members)}")
            if args.grow or args.chunk or args.sync_cut:
                raise RuntimeError("--devices does not go with --grow, --chunk or --sync-cut")
            for m in members:
                if not stat.S_ISBLK(os.stat(m).st_mode):
                    raise RuntimeError(f"--devices: {m} is not a block device")
        create = [args.raidkit, "create", "--level", args.level, "--size", "48M",
                  "--chunk", "64K", "--bitmap-region", "1M", "--name", "torture"]
        if args.devices:
            create.append("--force")  # whatever the devices held goes
        if args.policy:
            create += ["--consistency-policy", args.policy]
        if args.sabotage:
            # With checksums a scribble is healed or refused (EIO), never
            # returned: the planted loss, which must be seen as wrong data,
            # needs an array without them.
            create += ["--checksums", "off"]
        initial = None
        unsynced = None  # a member that may not be in sync yet ("all": the initial sync)
        if args.sync_cut:
            initial = {}
            size = 256 << 20  # big enough for the sync to take about a second
            for m in members:
                with open(m, "wb") as f:
                    f.write(os.urandom(size))
            p = subprocess.Popen(create[:5] + [str(size), "--force"] + create[6:] + members,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            # Killed a moment after the superblocks are written (the sync
            # follows them).
            deadline = time.time() + 60
            while p.poll() is None and time.time() < deadline and subprocess.run(
                    [args.raidkit, "examine", members[-1]], capture_output=True,
                    timeout=60).returncode != 0:
                time.sleep(0.01)
            time.sleep(rng.uniform(0.05, 0.3))
            p.kill()
            p.wait()
            r = subprocess.run([args.raidkit, "detail", "--json"] + members,
                               capture_output=True, text=True, timeout=60)
            if '"resync_offset"' not in r.stdout:
                raise RuntimeError("create finished its sync before the kill: "
                                   "nothing left to resume\n" + r.stdout + r.stderr)
            print("create killed during its initial sync", flush=True)
            unsynced = "all"
        else:
            subprocess.run(create + members, check=True, stdout=subprocess.DEVNULL)
        log = open(os.path.join(work, "serve.log"), "ab")
        expected, maybe = {}, {}
        seed_counter = 0
        acked_total = losses = 0
        copies = None
        growing = False
        reshaping = bool(args.grow or args.chunk)
        grown_to = None
        for cycle in range(args.cycles):
            present = list(members)
            missing = None
            put_back = None
            if args.old_copy and cycle % 4 == 0:
                copies = work + "/copies"
                os.makedirs(copies, exist_ok=True)
                for m in members:
                    shutil.copyfile(m, os.path.join(copies, os.path.basename(m)))
            leave_out = cycle % (4 if args.old_copy else 2) == (3 if args.old_copy else 1)
            if args.old_copy and cycle % 4 == 2 and copies and unsynced is None:
                # A member the array holds in sync (one it knows to be
                # gone or resyncing would be refused for that alone).
                put_back = rng.randrange(n)
                shutil.copyfile(os.path.join(copies, os.path.basename(members[put_back])),
                                members[put_back])
            elif leave_out and unsynced != "all" and not growing and not (
                    reshaping and cycle == 0):
                # Leave a member out; while one is still being resynced,
                # only that one can be (the array needs all the others).
                missing = unsynced if unsynced is not None else rng.randrange(n)
                present = [m for i, m in enumerate(members) if i != missing]
            # While the reshape runs, slowly from the start of each server.
            slow = ["--rebuild-min", "12M", "--rebuild-max", "12M"] if reshaping else []
            server = Server(args.raidkit, present, work, log, args.serve_arg + slow)
            h = connect(server.uri)
            bad = check(h, expected, maybe, initial)
            losses += len(bad)
            if args.grow and cycle == 0:
                new = os.path.join(work, f"d{len(members)}.img")
                r = subprocess.run([args.raidkit, "grow", "--json", "--control", server.control,
                                    "--add", new], capture_output=True, text=True, timeout=60)
                if r.returncode != 0:
                    raise RuntimeError(f"grow failed: {r.stdout} {r.stderr}")
                members.append(new)
                grown_to = len(members)
                print(f"grown: {r.stdout.strip()}", flush=True)
            if args.chunk and cycle == 0:
                r = subprocess.run([args.raidkit, "grow", "--json", "--control", server.control,
                                    "--chunk", args.chunk], capture_output=True, text=True,
                                   timeout=60)
                if r.returncode != 0:
                    raise RuntimeError(f"grow --chunk failed: {r.stdout} {r.stderr}")
                grown_to = len(members)
                print(f"chunk changing: {r.stdout.strip()}", flush=True)
            if reshaping:
                st = status(args.raidkit, server.control)
                growing = st.get("reshape") is not None
            # Write and flush until killed. The kill is timed from the
            # first batch acknowledged: the first batch after a restart (a
            # degraded array replaying its journal, on a loaded disk) can
            # take longer than a kill drawn near its lower bound, and a
            # cycle that wrote nothing tests nothing. A server that does
            # not acknowledge a first batch within FIRST_BATCH seconds is
            # killed and the run fails.
            kill_after = rng.uniform(args.kill_min, 1.5)
            synced = []

            def kill(srv=server):
                synced.append(srv.in_sync(args.raidkit))
                srv.kill9()
            killer = threading.Timer(FIRST_BATCH, server.kill9)
            killer.start()
            first = True
            acked = 0
            next_start = 0
            try:
                while True:
                    pending = {}
                    for _ in range(rng.randrange(1, 12)):
                        if args.sequential:
                            # 64 KiB requests, each where the last ended.
                            nb = 16
                            if next_start + nb > SPAN_BLOCKS:
                                next_start = 0
                            start = next_start
                            next_start += nb
                        else:
                            nb = rng.randrange(1, 17)
                            start = rng.randrange(0, SPAN_BLOCKS - nb)
                        seed_counter += 1
                        buf = b"".join(content(seed_counter, start + i) for i in range(nb))
                        for i in range(nb):
                            maybe.setdefault(start + i, set()).add(seed_counter)
                        h.pwrite(buf, start * BLOCK)
                        for i in range(nb):
                            pending[start + i] = seed_counter
                    h.flush()
                    # Acknowledged and flushed: these are now the contents.
                    for b, s in pending.items():
                        expected[b] = s
                        maybe.pop(b, None)
                    acked += len(pending)
                    if first:
                        first = False
                        killer.cancel()
                        killer.join()
                        if server.killed:
                            break
                        killer = threading.Timer(kill_after, kill)
                        killer.start()
            except nbd.Error as e:
                # Whether the kill had begun when the error came (read
                # before waiting for the timer, which kills in any case).
                dead = server.killed
                killer.cancel()
                killer.join()
                if not dead:
                    # Not the planned kill: the server refused or failed a
                    # request while alive. That is a failure, not a cycle.
                    raise RuntimeError(f"cycle {cycle + 1}: NBD error while the server "
                                       f"was alive: {e}") from e
            killer.join()
            if first:
                raise RuntimeError(f"cycle {cycle + 1}: no write was acknowledged "
                                   f"in {FIRST_BATCH}s")
            del h
            if args.sabotage and cycle == 0:
                for m in members:
                    with open(m, "r+b") as f:
                        f.seek(1 << 20)
                        f.write(b"\xa5" * (64 << 10))
            if missing is not None:
                unsynced = missing
            elif synced and synced[0]:
                unsynced = None
            elif put_back is not None:
                unsynced = put_back
            acked_total += acked
            print(f"cycle {cycle + 1}: killed after {kill_after:.2f}s, {acked} blocks acknowledged "
                  f"and flushed{'' if missing is None else f', member {missing} left out'}"
                  f"{', during the reshape' if growing else ''}"
                  f"{'' if put_back is None else f', old copy of member {put_back} put back'}; "
                  f"check at start: {len(bad)} bad blocks", flush=True)
        # A last restart with every member: everything must be there.
        server = Server(args.raidkit, members, work, log, args.serve_arg)
        h = connect(server.uri)
        bad = check(h, expected, maybe, initial)
        losses += len(bad)
        del h
        if args.sync_cut:
            losses += final_sync_check(args, server, members, work, log, expected, initial, rng)
        if reshaping:
            losses += final_grow_check(args, server, members, grown_to)
        server.kill9()
        server = None
        if acked_total == 0:
            raise RuntimeError(f"no write was acknowledged in {args.cycles} cycles")
        print(f"summary: {args.cycles} cycles, {acked_total} blocks acknowledged and flushed, "
              f"losses: {losses}")
        return 1 if losses else 0
    except Exception:
        traceback.print_exc()
        logf = os.path.join(work, "serve.log")
        if os.path.exists(logf):
            sys.stderr.write("--- server log (tail) ---\n")
            sys.stderr.write(open(logf, errors="replace").read()[-3000:])
        print("error: the torture run failed (not a loss)", flush=True)
        return 2
    finally:
        if server is not None and server.proc.poll() is None:
            server.kill9()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
