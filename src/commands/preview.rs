//! `shedgate preview`: a candidate policy directory decided in shadow by a running proxy.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use shedgate::config::HumanDuration;
use shedgate::signals::Signals;

/// Arguments of `shedgate preview`.
#[derive(Debug, clap::Args)]
pub(crate) struct PreviewArgs {
    /// The candidate policy directory (its routes and read modes are not used: requests are
    /// read the live way).
    dir: PathBuf,
    /// The proxy's admin listener.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9901")]
    admin: String,
    /// File holding the proxy's `--admin-token-file` token, sent as `Authorization: Bearer`:
    /// needed when the admin listener is reached from beyond its loopback [default: none].
    #[arg(long, value_name = "FILE")]
    admin_token_file: Option<PathBuf>,
    /// How long the proxy decides in the candidate's shadow (at most 24h).
    #[arg(long = "for", value_name = "DURATION", default_value = "10m")]
    window: HumanDuration,
    /// Start it, print its id and return; read the counts later with
    /// `GET /policy/preview?id=ID`.
    #[arg(long)]
    no_wait: bool,
    /// Print the counts as JSON.
    #[arg(long)]
    json: bool,
}

/// Exit 0: the preview ran (and its counts are printed); 1: the candidate does not compile,
/// the proxy refused it (another preview runs: its holder is printed), or it was stopped by
/// someone else before its counts were read; 2: the proxy cannot be reached, or the token
/// file cannot be used; 130 interrupted (SIGINT or SIGTERM), after stopping its own preview,
/// and only its own.
pub(crate) fn run(
    args: &PreviewArgs,
    runtime: &tokio::runtime::Runtime,
    signals: &Signals,
) -> ExitCode {
    let token = match args
        .admin_token_file
        .as_deref()
        .map(shedgate::admin::guard::read_token)
    {
        None => None,
        Some(Ok(token)) => Some(token),
        Some(Err(e)) => {
            eprintln!("error: --admin-token-file {e}");
            return ExitCode::from(2);
        }
    };
    let token = token.as_deref();
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
        by: Some(owner()),
    };
    let body = match serde_json::to_vec(&body) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if !args.no_wait {
        // From the POST on, an interrupt stops this command's preview (and no other) before
        // it exits: one that came while the POST was answered is seen once it has its id.
        signals.serving();
    }
    runtime.block_on(async {
        let post = call(&args.admin, token, http::Method::POST, "", Some(body));
        tokio::pin!(post);
        let answer = tokio::select! {
            answer = &mut post => answer,
            // Interrupted while the POST is out: its answer (if it comes soon) names the
            // preview to stop.
            () = signals.terminated() => {
                match tokio::time::timeout(Duration::from_secs(5), &mut post).await {
                    Ok(answer) => answer,
                    Err(_) => {
                        eprintln!("interrupted before the proxy answered the POST");
                        return ExitCode::from(130);
                    }
                }
            }
        };
        let started = match answer {
            Ok((status, text)) if status.is_success() => text,
            Ok((http::StatusCode::CONFLICT, text)) => {
                let problem: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                eprintln!(
                    "error: the proxy runs another preview: {}",
                    problem["detail"].as_str().unwrap_or(&text)
                );
                return ExitCode::FAILURE;
            }
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
        let Some(id) = started["id"].as_str() else {
            eprintln!("error: the proxy's answer names no preview id: {started}");
            return ExitCode::FAILURE;
        };
        let query = format!("?id={id}");
        eprintln!(
            "preview {id} of {} (live: {}) running until {}",
            started["candidate"].as_str().unwrap_or("?"),
            started["live"].as_str().unwrap_or("?"),
            started["until"].as_str().unwrap_or("?"),
        );
        if args.no_wait {
            println!("{id}");
            return ExitCode::SUCCESS;
        }
        tokio::select! {
            () = tokio::time::sleep(args.window.0 + Duration::from_millis(200)) => {}
            () = signals.terminated() => {
                match call(&args.admin, token, http::Method::DELETE, &query, None).await {
                    Ok((status, _)) if status.is_success() => {
                        eprintln!("interrupted: preview {id} stopped");
                    }
                    Ok((status, text)) => {
                        eprintln!("interrupted: stopping preview {id}: the proxy answered {status}: {text}");
                    }
                    Err(e) => eprintln!("interrupted: stopping preview {id}: {}: {e}", args.admin),
                }
                return ExitCode::from(130);
            }
        }
        match call(&args.admin, token, http::Method::GET, &query, None).await {
            Ok((status, text)) if status.is_success() => {
                print_report(&text, args.json);
                ExitCode::SUCCESS
            }
            Ok((status, text)) => {
                let problem: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                eprintln!(
                    "error: no counts: the proxy answered {status}: {}",
                    problem["detail"].as_str().unwrap_or(&text)
                );
                ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("error: {}: {e}", args.admin);
                ExitCode::from(2)
            }
        }
    })
}

/// Who starts a preview, for an operator whose `POST` is refused: `user@host (shedgate
/// preview, pid N)`, from `USER` (or `LOGNAME`) and the kernel's host name.
fn owner() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "?".to_owned());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "?".to_owned());
    let owner = format!(
        "{user}@{host} (shedgate preview, pid {})",
        std::process::id()
    );
    // The proxy refuses control characters and more than MAX_BY characters.
    owner
        .chars()
        .filter(|c| !c.is_control())
        .take(shedgate::admin::preview::MAX_BY)
        .collect()
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
        "{:<24} {:<20} {:>6} {:>12} {:>12} {:>12} {:>12} {:>11} {:>7}",
        "stream", "area", "band", "admitted", "shed", "admitted", "shed", "undecidable", "moved"
    );
    println!(
        "{:<24} {:<20} {:>6} {:>12} {:>12} {:>12} {:>12} {:>11} {:>7}",
        "", "", "", "(live)", "(live)", "(candidate)", "(candidate)", "", ""
    );
    for row in report["rows"].as_array().into_iter().flatten() {
        let n = |k: &str| row[k].as_f64().unwrap_or(0.0);
        println!(
            "{:<24} {:<20} {:>6} {:>12.0} {:>12.0} {:>12.0} {:>12.0} {:>11.0} {:>7.0}",
            row["stream"].as_str().unwrap_or("?"),
            row["area"].as_str().unwrap_or("?"),
            row["band"].as_str().unwrap_or("?"),
            n("then_admitted"),
            n("then_shed"),
            n("now_admitted"),
            n("now_shed"),
            n("undecidable"),
            n("moved"),
        );
    }
    if report["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|row| row["moved"].as_f64().unwrap_or(0.0) > 0.0)
    {
        println!(
            "moved: requests the candidate sends to another upstream than the live one, not \
             decided (that upstream's pressure is not the one the live decision read)"
        );
    }
}

/// One request to the admin listener's `/policy/preview`, with the token if there is one: its
/// status and body text.
async fn call(
    admin: &str,
    token: Option<&str>,
    method: http::Method,
    query: &str,
    body: Option<Vec<u8>>,
) -> Result<(http::StatusCode, String), String> {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let mut request = http::Request::builder()
        .method(method)
        .uri(format!("http://{admin}/policy/preview{query}"))
        .header(http::header::CONTENT_TYPE, "application/json");
    if let Some(token) = token {
        request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = request
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
