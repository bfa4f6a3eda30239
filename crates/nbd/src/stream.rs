//! A connection over TCP or a Unix socket, for the server and the client.

use crate::proto::REQUEST_LEN;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// A connection over TCP or a Unix socket.
#[derive(Debug)]
pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

/// Payloads from this size on are sent apart from their header (see
/// `Stream::send_message`).
const SEPARATE_PAYLOAD: usize = 64 << 10;

/// Write all of `bufs`, in as few system calls as the socket takes.
fn write_all_vectored(w: &mut impl Write, mut bufs: &mut [io::IoSlice<'_>]) -> io::Result<()> {
    while !bufs.is_empty() {
        match w.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => io::IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl Stream {
    /// For the fuzzers: a connected pair whose peer has sent `data` (at
    /// most 64 KiB, all of it in the socket's buffer) and then closed its
    /// sending side: our end and the peer's.
    pub(crate) fn fed(data: &[u8]) -> Option<(Stream, Stream)> {
        let (ours, theirs) = UnixStream::pair().ok()?;
        let mut theirs = Stream::Unix(theirs);
        theirs.write_all(&data[..data.len().min(64 << 10)]).ok()?;
        theirs.shutdown(Shutdown::Write);
        Some((Stream::Unix(ours), theirs))
    }

    /// Send a message's header, then its payload. A large payload goes in
    /// a call of its own after the header was sent with MSG_MORE (the
    /// kernel holds the header back for the bytes that follow): measured
    /// over loopback TCP, a 1 MiB NBD write sent this way cost the kernel
    /// about 200 µs, against about 340 µs when header and payload were one
    /// writev (docs/performance.md). A small one goes in one writev, one
    /// system call for both.
    pub(crate) fn send_message(&mut self, header: &[u8], payload: &[u8]) -> io::Result<()> {
        if payload.len() < SEPARATE_PAYLOAD {
            return write_all_vectored(
                self,
                &mut [io::IoSlice::new(header), io::IoSlice::new(payload)],
            );
        }
        self.send_more(header)?;
        self.write_all(payload)
    }

    /// Write bytes that more of the same message follows at once (a reply
    /// or request header before its data): on TCP with MSG_MORE, so that
    /// the kernel holds them back and they leave in one segment with the
    /// data.
    pub(crate) fn send_more(&mut self, mut b: &[u8]) -> io::Result<()> {
        use nix::sys::socket::{send, MsgFlags};
        use std::os::fd::AsRawFd;
        let Stream::Tcp(s) = self else {
            return self.write_all(b);
        };
        let more = MsgFlags::from_bits_retain(nix::libc::MSG_MORE) | MsgFlags::MSG_NOSIGNAL;
        while !b.is_empty() {
            match send(s.as_raw_fd(), b, more) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => b = &b[n..],
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    pub(crate) fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }
    pub(crate) fn shutdown(&self, how: Shutdown) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(how),
            Stream::Unix(s) => s.shutdown(how),
        };
    }
    /// Read what has arrived, without waiting: `Ok(None)` when nothing has.
    pub(crate) fn read_now(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        use nix::sys::socket::{recv, MsgFlags};
        use std::os::fd::AsRawFd;
        let fd = match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        };
        match recv(fd, buf, MsgFlags::MSG_DONTWAIT) {
            Ok(n) => Ok(Some(n)),
            Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::EINTR) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether at least `n` bytes have arrived and can be read without waiting.
    pub(crate) fn has_bytes(&self, n: usize) -> bool {
        use nix::sys::socket::{recv, MsgFlags};
        use std::os::fd::AsRawFd;
        let fd = match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        };
        let mut probe = [0u8; REQUEST_LEN];
        let n = n.min(REQUEST_LEN);
        // A peek that neither consumes nor waits (the socket itself stays
        // blocking for the other threads that use it).
        matches!(
            recv(fd, &mut probe[..n], MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT),
            Ok(got) if got >= n
        )
    }

    /// Whether the peer has closed the connection or it has failed (a TCP
    /// keepalive that went unanswered), seen without reading or waiting:
    /// for a connection with nothing in flight, which nobody reads.
    pub(crate) fn gone(&self) -> Option<String> {
        use nix::errno::Errno;
        use nix::sys::socket::{recv, MsgFlags};
        use std::os::fd::AsRawFd;
        let mut probe = [0u8; 1];
        match recv(
            self.as_fd().as_raw_fd(),
            &mut probe,
            MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(0) => Some("the server closed the connection".into()),
            Ok(_) | Err(Errno::EAGAIN) | Err(Errno::EINTR) => None,
            Err(e) => Some(format!("connection lost: {e}")),
        }
    }

    /// End the connection for good, now: a TCP connection is reset (a
    /// connect to AF_UNSPEC, which std and nix do not offer), which drops
    /// whatever is still queued to send, so that writes given up on can
    /// never reach the server later, when a cut link comes back, after the
    /// data they carried was written again by other means. Then shut
    /// down, which wakes every thread blocked on it.
    pub(crate) fn abort(&self) {
        use std::os::fd::AsRawFd;
        if let Stream::Tcp(t) = self {
            let sa = libc::sockaddr {
                sa_family: libc::AF_UNSPEC as libc::sa_family_t,
                sa_data: [0; 14],
            };
            // SAFETY: a valid socket descriptor and a sockaddr of the
            // length given; the call only changes the socket's state.
            unsafe {
                libc::connect(
                    t.as_raw_fd(),
                    &sa,
                    std::mem::size_of::<libc::sockaddr>() as libc::socklen_t,
                );
            }
        }
        self.shutdown(Shutdown::Both);
    }

    /// TCP keepalive probes after `idle`, so that a link cut while no
    /// request is in flight is noticed within seconds, not hours.
    pub(crate) fn keepalive(&self, idle: Duration) {
        use nix::sys::socket::{setsockopt, sockopt};
        if let Stream::Tcp(t) = self {
            let secs = idle.as_secs().clamp(1, 3600) as u32;
            let _ = setsockopt(t, sockopt::KeepAlive, &true);
            let _ = setsockopt(t, sockopt::TcpKeepIdle, &secs);
            let _ = setsockopt(t, sockopt::TcpKeepInterval, &secs.div_ceil(2));
            let _ = setsockopt(t, sockopt::TcpKeepCount, &3);
        }
    }

    /// Peek at `buf.len()` bytes that arrive `skip` bytes after what the
    /// next read returns, if they are there already (never waits): with
    /// `SO_PEEK_OFF` (Unix sockets; TCP since Linux 6.9), which nix does
    /// not wrap. false also where the kernel lacks it. The peek offset is
    /// switched off again, so that other peeks start at the front.
    pub(crate) fn peek_at(&self, skip: usize, buf: &mut [u8]) -> bool {
        use std::os::fd::AsRawFd;
        let fd = self.as_fd().as_raw_fd();
        let Ok(off) = libc::c_int::try_from(skip) else {
            return false;
        };
        let set = |v| self.set_int_option(libc::SO_PEEK_OFF, v);
        if set(off) != 0 {
            return false;
        }
        // SAFETY: `buf` is writable for its length.
        let got = unsafe {
            libc::recv(
                fd,
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        set(-1);
        got == buf.len() as isize
    }

    /// Wait until `n` bytes have arrived (counted from what the next read
    /// returns), for at most `limit`. On TCP the kernel wakes the wait when
    /// they are there (`SO_RCVLOWAT`, which nix does not wrap); on a Unix
    /// socket, whose poll ignores the low mark, this only sleeps a little.
    /// Reading is unchanged afterwards.
    pub(crate) fn wait_for_bytes(&self, n: usize, limit: Duration) {
        use nix::poll::{ppoll, PollFd, PollFlags};
        let lowat = |v| self.set_int_option(libc::SO_RCVLOWAT, v);
        let Ok(want) = libc::c_int::try_from(n) else {
            return;
        };
        if !self.is_tcp() || lowat(want) != 0 {
            std::thread::sleep(limit.min(Duration::from_micros(50)));
            return;
        }
        let mut fds = [PollFd::new(self.as_fd(), PollFlags::POLLIN)];
        let _ = ppoll(&mut fds, Some(limit.into()), None);
        lowat(1);
    }

    /// Set a socket-level option of type int that nix does not wrap;
    /// returns what setsockopt(2) returns (0: done).
    fn set_int_option(&self, option: libc::c_int, v: libc::c_int) -> libc::c_int {
        use std::os::fd::AsRawFd;
        // SAFETY: a valid socket and a c_int option value of the right size.
        unsafe {
            libc::setsockopt(
                self.as_fd().as_raw_fd(),
                libc::SOL_SOCKET,
                option,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        }
    }

    /// The socket's receive buffer (`SO_RCVBUF`), in bytes; 0 if unknown.
    pub(crate) fn receive_buffer(&self) -> usize {
        use nix::sys::socket::{getsockopt, sockopt::RcvBuf};
        getsockopt(&self.as_fd(), RcvBuf).unwrap_or(0)
    }

    pub(crate) fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        match self {
            Stream::Tcp(s) => s.as_fd(),
            Stream::Unix(s) => s.as_fd(),
        }
    }

    /// A TCP connection from another machine (a peer that is not a loopback address).
    pub(crate) fn remote_tcp(&self) -> bool {
        match self {
            Stream::Tcp(s) => s.peer_addr().is_ok_and(|a| {
                let ip = match a.ip() {
                    std::net::IpAddr::V6(v6) => v6
                        .to_ipv4_mapped()
                        .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4),
                    v4 => v4,
                };
                !ip.is_loopback()
            }),
            Stream::Unix(_) => false,
        }
    }

    pub(crate) fn is_tcp(&self) -> bool {
        matches!(self, Stream::Tcp(_))
    }

    pub(crate) fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_nonblocking(on),
            Stream::Unix(s) => s.set_nonblocking(on),
        }
    }

    pub(crate) fn raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        }
    }

    pub(crate) fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(t),
            Stream::Unix(s) => s.set_write_timeout(t),
        }
    }
    pub(crate) fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(t),
            Stream::Unix(s) => s.set_read_timeout(t),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write_vectored(bufs),
            Stream::Unix(s) => s.write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            Stream::Unix(s) => s.flush(),
        }
    }
}
