//! `raidkit`: software RAID in user space. This binary only parses the
//! command line and wires the library crates together.

mod admin;
mod arrays;
mod bench;
mod cli;
mod commands;
mod config;
mod events;
mod export;
mod http;
mod monitor;
mod say;
mod scan;
mod serve;
mod units;

fn main() {
    let matches = <cli::Cli as clap::CommandFactory>::command().get_matches();
    let mut args = match <cli::Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(a) => a,
        Err(e) => e.exit(),
    };
    if let (cli::Command::Serve(a), Some(("serve", m))) = (&mut args.command, matches.subcommand())
    {
        // What the command line gave, for what a config file also sets:
        // the command line wins, the file wins over the defaults.
        a.given = m
            .ids()
            .filter(|id| {
                m.value_source(id.as_str()) == Some(clap::parser::ValueSource::CommandLine)
            })
            .map(|id| id.as_str().to_string())
            .collect();
    }
    let offline_report = match &args.command {
        cli::Command::Examine(_)
        | cli::Command::Detail(_)
        | cli::Command::Read(_)
        | cli::Command::Check(_) => true,
        cli::Command::Bench(b) => matches!(b.command, Some(cli::BenchCommand::Compare(_))),
        _ => false,
    };
    if offline_report {
        // Reports cut short by their reader (`raidkit detail | head`) end
        // quietly, as other tools' do, not with a panic on EPIPE. Only for
        // the offline commands, whose sole other file is a member: a server
        // must live through a client that goes away, and a command talking
        // to a server must report a server that went.
        // SAFETY: setting a signal's disposition to the default, before any
        // thread is started.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    // A command that reports and exits stops quietly when its reader has
    // gone (`raidkit status | head -1`), as other Unix tools do, instead of
    // panicking on the broken pipe. Servers (whose sockets must not kill
    // them) and bench (an NBD client, also over Unix sockets, that reports
    // a server's failure) keep the signal ignored.
    if !matches!(
        args.command,
        cli::Command::Serve(_) | cli::Command::Export(_) | cli::Command::Bench(_)
    ) {
        // SAFETY: restoring a signal's default disposition at start-up,
        // before any thread is started.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    // A server's log is the record of what happened to its array (every
    // recovery, every connection that ended in an error, a client's failed
    // TLS handshake): info, for an export's server too. Other
    // commands report for themselves: warnings only.
    let default_level = if matches!(
        args.command,
        cli::Command::Serve(_) | cli::Command::Export(_)
    ) {
        "info"
    } else {
        "warn"
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("RAIDKIT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    // A log line that cannot be written is dropped: a server whose stderr
    // reader went away (`serve --daemon 2>&1 | head -1`, a log collector
    // restarted) must go on serving. With the subscriber's own report of
    // the failure on, that report's `eprintln!` panicked on the same
    // broken stderr, in whichever thread logged: the one failing a member,
    // with the metadata lock held, so the array hung.
    let log = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .log_internal_errors(false)
        .with_writer(std::io::stderr);
    match args.log_format {
        // Colour only for a person at a terminal, never into a log file.
        cli::LogFormat::Text => log
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        cli::LogFormat::Json => {
            log.json().init();
            say::json_logs();
        }
    }
    if let Err(e) = commands::run(args) {
        // A check that could not finish exits 2, so that a script tells it
        // from one that found something wrong (1).
        let (unfinished, e) = match e.downcast::<say::Unfinished>() {
            Ok(u) => (true, u.0),
            Err(e) => (false, e),
        };
        // One clear message: the error and its causes, outermost first.
        let msg = admin::in_use_message(e.as_ref()).unwrap_or_else(|| say::causes(&e));
        say::error(&msg);
        // A bench run whose requirements failed completed: 3 tells it
        // from a run that did not.
        let failed_requirements = e
            .downcast_ref::<bench::storage::require::Failed>()
            .is_some();
        std::process::exit(if failed_requirements {
            3
        } else if unfinished {
            2
        } else {
            1
        });
    }
}
