//! `shardlm launch-probe` (hidden): a tiny rank program the launcher tests
//! start in place of a model run, so they check process handling, the
//! environment handshake and output forwarding in milliseconds.

use crate::launch::{exit_on_failure, relaunch_with_ranks, Backend};
use anyhow::{Context, Result};
use clap::Args;
use std::io::Write;
use std::time::Duration;

/// A tiny rank program for testing the launcher: joins the world from the
/// environment, all-reduces its rank and prints `rank R of N sum S`.
#[derive(Args, Debug)]
pub struct ProbeArgs {
    /// This rank exits with status 3 after the all-reduce.
    #[arg(long)]
    fail_rank: Option<usize>,
    /// This rank kills itself with SIGKILL after the all-reduce.
    #[arg(long)]
    signal_rank: Option<usize>,
    /// These ranks sleep `--sleep-ms` after the all-reduce.
    #[arg(long)]
    sleep_rank: Vec<usize>,
    /// How long the ranks of --sleep-rank sleep, in milliseconds.
    #[arg(long, default_value_t = 60_000)]
    sleep_ms: u64,
    /// Relaunch this command as N local ranks (like run's `--ranks`).
    #[arg(long)]
    ranks: Option<usize>,
    /// Transport between the ranks of --ranks.
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    backend: Backend,
}

/// One whole line to stderr in a single write. `eprintln!` writes a formatted
/// line piece by piece (stderr is unbuffered), so rank 0's lines could be cut
/// by the launcher's forwarded `[rank N] …` lines on the same terminal.
fn say(line: String) {
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// `shardlm launch-probe` (hidden).
pub fn probe(a: ProbeArgs) -> Result<()> {
    if let Some(n) = a.ranks {
        return exit_on_failure(relaunch_with_ranks(n, a.backend, 1, false)?);
    }
    let group = comm::Group::from_env(0).context("joining the world")?;
    let (rank, size) = (group.rank(), group.size());
    say(format!("probe rank {rank} of {size} pid {} joined\n", std::process::id()));
    for line in group.transport().cable_report() {
        say(format!("probe rank {rank} {line}\n"));
    }
    let mut x = [rank as f32];
    group.all_reduce_sum_f32(&mut x)?;
    println!("rank {rank} of {size} sum {}", x[0]);
    std::io::stdout().flush()?;
    group.barrier()?;
    if a.fail_rank == Some(rank) {
        say(format!("probe rank {rank} failing on purpose\n"));
        std::process::exit(3);
    }
    if a.signal_rank == Some(rank) {
        // SAFETY: plain system calls on our own pid.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
    if a.sleep_rank.contains(&rank) {
        std::thread::sleep(Duration::from_millis(a.sleep_ms));
    }
    Ok(())
}
