//! `raidkit`: software RAID in user space. This binary only parses the
//! command line and wires the library crates together.

mod admin;
mod arrays;
mod bench;
mod cli;
mod commands;
mod serve;
mod units;

use clap::Parser;

fn main() {
    let args = cli::Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RAIDKIT_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = commands::run(args) {
        // One clear message: the error and its causes, outermost first.
        let mut msg = e.to_string();
        for cause in e.chain().skip(1) {
            let c = cause.to_string();
            if !msg.contains(&c) {
                msg.push_str(": ");
                msg.push_str(&c);
            }
        }
        eprintln!("raidkit: error: {msg}");
        std::process::exit(1);
    }
}
