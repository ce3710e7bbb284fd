//! `shardlm`: run, inspect and (later) serve, bench and launch sharded models.

mod bench;
mod bench_power;
mod devices;
mod dist_args;
mod draft_args;
mod fetch;
mod inspect;
mod launch;
mod launch_output;
mod launch_probe;
mod launch_restart;
mod membw;
mod model_source;
mod plan;
mod progress;
mod quantize;
mod quantize_gguf;
mod quantize_hf_gguf;
mod quantize_hf_gguf_hybrid;
mod quantize_hf_gguf_moe;
mod quantize_mix;
mod reform;
mod run;
mod serve;
mod template_args;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "shardlm", version, about = "Run one large language model across several machines")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt.
    Run(Box<run::RunArgs>),
    /// Serve the OpenAI, Anthropic and Responses APIs over HTTP.
    Serve(Box<serve::ServeArgs>),
    /// Show a model's architecture, size, tensor types and template.
    Inspect(inspect::InspectArgs),
    /// Re-encode a checkpoint as nvfp4, mxfp4, fp8 (safetensors) or a ggml type (GGUF).
    Quantize(quantize::QuantizeArgs),
    /// Measure prompt and generation throughput (like mlx_lm.benchmark).
    Bench(Box<bench::BenchArgs>),
    /// List the GPUs --device gpu:N names (backend, memory, software or not).
    Devices(devices::DevicesArgs),
    /// Measure memory read bandwidth (1 and N threads).
    #[command(hide = true)]
    Membw(membw::MembwArgs),
    /// Start the ranks of a world, here (--local N) or on the hosts of a hostfile.
    Launch(Box<launch::LaunchArgs>),
    /// Will a model fit on these machines, and which split is fastest? (predicts memory, TTFT and decode)
    Plan(Box<plan::PlanArgs>),
    /// Measure this rank's machine and the links of a launched world (used by plan --calibrate).
    #[command(hide = true)]
    PlanProbe(plan::measure::ProbeArgs),
    /// Join a launched world and all-reduce the ranks (tests the launcher).
    #[command(hide = true)]
    LaunchProbe(launch_probe::ProbeArgs),
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("SHARDLM_LOG"))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    // A pool as wide as the process's CPUs pins its threads (kernels::affinity).
    kernels::affinity::allow_pinning();
    let result = match cli.command {
        Command::Run(a) => run::run(*a),
        Command::Serve(a) => serve::serve(*a),
        Command::Inspect(a) => inspect::inspect(a),
        Command::Bench(a) => bench::bench(*a),
        Command::Devices(a) => devices::devices(a),
        Command::Quantize(a) => quantize::quantize(a),
        Command::Membw(a) => membw::membw(a),
        Command::Launch(a) => launch::launch(*a),
        Command::Plan(a) => plan::plan(*a),
        Command::PlanProbe(a) => plan::measure::probe(a),
        Command::LaunchProbe(a) => launch_probe::probe(a),
    };
    dist_args::report_rss();
    if let Err(e) = result {
        // One line: the chain of causes joined by ": ".
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    /// Every flag and positional argument of every subcommand says what it does.
    #[test]
    fn every_argument_has_help() {
        let cli = Cli::command();
        let mut missing = Vec::new();
        for sub in cli.get_subcommands() {
            for arg in sub.get_arguments() {
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{} {}", sub.get_name(), arg.get_id()));
                }
            }
        }
        assert!(missing.is_empty(), "arguments without help: {missing:?}");
    }
}
