//! `shedgate preview`: a candidate policy directory decided in shadow by a running proxy.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use shedgate::config::HumanDuration;

/// Arguments of `shedgate preview`.
#[derive(Debug, clap::Args)]
pub(crate) struct PreviewArgs {
    /// The candidate policy directory (its routes and read modes are not used: requests are
    /// read the live way).
    dir: PathBuf,
    /// The proxy's admin listener.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9901")]
    admin: String,
    /// How long the proxy decides in the candidate's shadow (at most 24h).
    #[arg(long = "for", value_name = "DURATION", default_value = "10m")]
    window: HumanDuration,
    /// Start it and return; read the counts later with `GET /policy/preview`.
    #[arg(long)]
    no_wait: bool,
    /// Print the counts as JSON.
    #[arg(long)]
    json: bool,
}

/// Exit 0: the preview ran (and its counts are printed); 1: the candidate does not compile or
/// the proxy refused it; 2: the proxy cannot be reached.
pub(crate) fn run(args: &PreviewArgs, runtime: &tokio::runtime::Runtime) -> ExitCode {
    // Compiled here first: the errors name the files on this machine.
    let files = match shedgate::policy::PolicyFiles::read(&args.dir) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = shedgate::policy::compile(&files) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let body = shedgate::admin::preview::Start {
        files: files.files(),
        seconds: Some(args.window.0.as_secs().max(1)),
    };
    let body = match serde_json::to_vec(&body) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let started = match call(&args.admin, http::Method::POST, Some(body)).await {
            Ok((status, text)) if status.is_success() => text,
            Ok((status, text)) => {
                eprintln!("error: the proxy answered {status}: {text}");
                return ExitCode::FAILURE;
            }
            Err(e) => {
                eprintln!("error: {}: {e}", args.admin);
                return ExitCode::from(2);
            }
        };
        let started: serde_json::Value = serde_json::from_str(&started).unwrap_or_default();
        eprintln!(
            "preview of {} (live: {}) running until {}",
            started["candidate"].as_str().unwrap_or("?"),
            started["live"].as_str().unwrap_or("?"),
            started["until"].as_str().unwrap_or("?"),
        );
        if args.no_wait {
            return ExitCode::SUCCESS;
        }
        tokio::time::sleep(args.window.0 + Duration::from_millis(200)).await;
        match call(&args.admin, http::Method::GET, None).await {
            Ok((status, text)) if status.is_success() => {
                print_report(&text, args.json);
                ExitCode::SUCCESS
            }
            Ok((status, text)) => {
                eprintln!("error: the proxy answered {status}: {text}");
                ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("error: {}: {e}", args.admin);
                ExitCode::from(2)
            }
        }
    })
}

fn print_report(text: &str, json: bool) {
    if json {
        println!("{text}");
        return;
    }
    let report: serde_json::Value = serde_json::from_str(text).unwrap_or_default();
    println!(
        "candidate {} over {:.0} s of live traffic (then: the live policy; now: the candidate)",
        report["candidate"].as_str().unwrap_or("?"),
        report["seconds"].as_f64().unwrap_or(0.0)
    );
    println!(
        "{:<24} {:<20} {:>6} {:>12} {:>12} {:>12} {:>12} {:>11}",
        "stream", "area", "band", "admitted", "shed", "admitted", "shed", "undecidable"
    );
    println!(
        "{:<24} {:<20} {:>6} {:>12} {:>12} {:>12} {:>12} {:>11}",
        "", "", "", "(live)", "(live)", "(candidate)", "(candidate)", ""
    );
    for row in report["rows"].as_array().into_iter().flatten() {
        let n = |k: &str| row[k].as_f64().unwrap_or(0.0);
        println!(
            "{:<24} {:<20} {:>6} {:>12.0} {:>12.0} {:>12.0} {:>12.0} {:>11.0}",
            row["stream"].as_str().unwrap_or("?"),
            row["area"].as_str().unwrap_or("?"),
            row["band"].as_str().unwrap_or("?"),
            n("then_admitted"),
            n("then_shed"),
            n("now_admitted"),
            n("now_shed"),
            n("undecidable"),
        );
    }
}

/// One request to the admin listener's `/policy/preview`: its status and body text.
async fn call(
    admin: &str,
    method: http::Method,
    body: Option<Vec<u8>>,
) -> Result<(http::StatusCode, String), String> {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let request = http::Request::builder()
        .method(method)
        .uri(format!("http://{admin}/policy/preview"))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .map_err(|e| e.to_string())?;
    let response = client.request(request).await.map_err(|e| e.to_string())?;
    let status = response.status();
    let text = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&text).into_owned()))
}
