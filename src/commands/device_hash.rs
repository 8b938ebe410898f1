//! `shedgate device-hash`: a device id hashed as the access log writes it, for finding its
//! lines (docs/operations.md "Access log").

use std::path::PathBuf;
use std::process::ExitCode;

use shedgate::record::privacy::DeviceKey;

/// Arguments of `shedgate device-hash`.
#[derive(Debug, clap::Args)]
pub(crate) struct DeviceHashArgs {
    /// The secret file the proxy hashes device ids with (`serve --access-log-secret-file`),
    /// read as the proxy reads it.
    #[arg(long, value_name = "FILE")]
    access_log_secret_file: PathBuf,
    /// Device ids as the requests state them (a string's content, a number as written), each
    /// hashed byte for byte: `truck-7` and `Truck-7` are two devices. One hash a line, in order.
    #[arg(value_name = "ID", required = true, allow_hyphen_values = true)]
    ids: Vec<String>,
}

/// Exit 0: every id's hash printed; 2: the secret file cannot be read or is too short, or an
/// id is empty (a request with an empty id names no device).
pub(crate) fn run(args: &DeviceHashArgs) -> ExitCode {
    let key = match DeviceKey::read(&args.access_log_secret_file) {
        Ok(key) => key,
        Err(e) => {
            eprintln!("error: --access-log-secret-file {e}");
            return ExitCode::from(2);
        }
    };
    if args.ids.iter().any(String::is_empty) {
        eprintln!("error: an empty id names no device: the proxy hashes none");
        return ExitCode::from(2);
    }
    for id in &args.ids {
        println!("{}", key.hash(id));
    }
    ExitCode::SUCCESS
}
