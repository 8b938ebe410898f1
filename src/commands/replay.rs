//! `shedgate replay`: a log's decisions made again under a policy directory.

use std::path::PathBuf;
use std::process::ExitCode;

use shedgate::record::replay::{Outcome, ReadError, Run};

/// Arguments of `shedgate replay`.
#[derive(Debug, clap::Args)]
pub(crate) struct ReplayArgs {
    /// The access log (`--access-log`'s file, or a gzip-compressed one, known by its bytes; `-`
    /// for standard input).
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

/// Exit codes (docs/configuration.md "Exit codes"): 0 every decision of the policy given
/// reproduced; 1 a decision came out otherwise; 2 the input cannot be read as a log (an I/O
/// error, gzip that does not decompress, another compression, a line that is not an
/// access-log line) or the policy does not compile; 3 not one access-log line to replay. A torn
/// last line is skipped with a warning on standard error.
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
        std::fs::File::open(&args.log)
            .map_err(ReadError::from)
            .and_then(|f| {
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
    if let Some(torn) = &run.torn {
        eprintln!("warning: {source}: {torn}");
    }
    if args.json {
        println!("{}", run.json());
    } else {
        print!("{}", run.text(&source));
    }
    match run.outcome() {
        Outcome::Reproduced => ExitCode::SUCCESS,
        Outcome::Differ => ExitCode::FAILURE,
        Outcome::Unreadable => {
            let n = run.errors.len();
            let what = if n == 1 {
                "line is not an access-log line"
            } else {
                "lines are not access-log lines"
            };
            eprintln!("error: {source}: {n} {what}");
            ExitCode::from(2)
        }
        Outcome::Empty => {
            eprintln!("error: {source} holds no access-log line: nothing was replayed");
            ExitCode::from(3)
        }
    }
}
