//! raidkit's NBD server: the protocol (pure parsers and encoders in
//! [`proto`], fuzzed) and a threaded server ([`server`]) that serves any
//! [`raidkit_member::Member`] — in raidkit, an array — to Linux, QEMU,
//! libnbd tools and fio.
//!
//! Written here rather than taken from a crate because no Rust NBD server
//! crate does structured replies, multi-conn and concurrent requests within
//! a connection together.

pub mod client;
pub mod proto;
pub mod server;
mod stream;
pub mod tls;
mod uri;

pub use client::NbdClient;
pub use server::{
    Config, Export, Security, Server, Stats, Target, ZeroCopy, DEFAULT_MAX_CONNECTIONS,
};
pub use tls::{Allow, ClientTls, ServerTls};
pub use uri::{Address, Endpoint};
