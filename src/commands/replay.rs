//! `shedgate replay`: a log's decisions made again under a policy directory.

use std::path::PathBuf;
use std::process::ExitCode;

use shedgate::record::replay::Run;

/// Arguments of `shedgate replay`.
#[derive(Debug, clap::Args)]
pub(crate) struct ReplayArgs {
    /// The access log (`--access-log`'s file; `-` for standard input).
    #[arg(long, value_name = "FILE")]
    log: PathBuf,
    /// The policy directory to decide with: the one that was live reproduces every decision
    /// made under it; another is compared.
    #[arg(long, value_name = "DIR", default_value = "policies")]
    policies: PathBuf,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Exit 0: every decision of the policy given reproduced; 1: a mismatch or a line that is not
/// an access-log line; 2: the policy does not compile or the log cannot be read.
pub(crate) fn run(args: &ReplayArgs) -> ExitCode {
    let compiled = match shedgate::policy::load_dir(&args.policies) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let source = args.log.display().to_string();
    let read = if source == "-" {
        Run::read(std::io::stdin().lock(), &compiled.policy)
    } else {
        std::fs::File::open(&args.log).and_then(|f| {
            Run::read(
                std::io::BufReader::with_capacity(1 << 20, f),
                &compiled.policy,
            )
        })
    };
    let run = match read {
        Ok(run) => run,
        Err(e) => {
            eprintln!("error: {source}: {e}");
            return ExitCode::from(2);
        }
    };
    if args.json {
        println!("{}", run.json());
    } else {
        print!("{}", run.text(&source));
    }
    if run.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
