//! The reference documents against what they describe: docs/configuration.md against the
//! binary's own command tree (clap's `--help` of every subcommand) and the `--config` file's
//! keys (the settings definition's own list of them), and every relative link in README.md and
//! docs/ against the files and headings it points at.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn shedgate(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_shedgate"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("the binary runs")
}

/// The subcommands `shedgate --help` lists, `help` aside.
fn subcommands() -> Vec<String> {
    let help = String::from_utf8(shedgate(&["--help"]).stdout).unwrap();
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

/// The long flags (`--listen`) and positional arguments (`<DIR>`, `<ID>` for `<ID>...`) of
/// `shedgate SUB --help`, `--help` and `--version` aside.
fn arguments(sub: &str) -> BTreeSet<String> {
    let help = String::from_utf8(shedgate(&[sub, "--help"]).stdout).unwrap();
    let mut out = BTreeSet::new();
    for line in help.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if !(2..=6).contains(&indent) {
            continue;
        }
        let first = trimmed.split_whitespace().next().unwrap_or("");
        let name = if let Some(rest) = first.strip_prefix("-") {
            // `-h, --help`: the long form follows a short one.
            if rest.len() == 2 && rest.ends_with(',') {
                trimmed.split_whitespace().nth(1).unwrap_or("")
            } else {
                first
            }
        } else {
            first
        };
        // A positional taking several values is `<ID>...`.
        let name = name.trim_end_matches("...");
        let is_arg = name.starts_with("--") || (name.starts_with('<') && name.ends_with('>'));
        if is_arg && name != "--help" && name != "--version" {
            out.insert(name.to_owned());
        }
    }
    out
}

/// The first cell of every table row in `section` of `doc`, when it is a `--flag` or `<ARG>`
/// in backticks.
fn documented(doc: &str, section: &str) -> Option<BTreeSet<String>> {
    let heading = format!("## `shedgate {section}`");
    let start = doc.lines().position(|l| l.trim() == heading)?;
    Some(
        doc.lines()
            .skip(start + 1)
            .take_while(|l| !l.starts_with("## "))
            .filter_map(|l| l.strip_prefix("| `"))
            .filter_map(|l| l.split('`').next())
            .map(|name| name.trim_end_matches("..."))
            .filter(|name| name.starts_with("--") || name.starts_with('<'))
            .map(str::to_owned)
            .collect(),
    )
}

/// Subcommands a build without a feature lacks; their sections stay in the document.
const FEATURED: &[&str] = &["curve", "demo"];

#[test]
fn configuration_reference_matches_the_command_tree() {
    let doc = std::fs::read_to_string(root().join("docs/configuration.md")).unwrap();
    let subs = subcommands();
    assert!(subs.contains(&"serve".to_owned()), "{subs:?}");
    for sub in &subs {
        let flags = arguments(sub);
        let rows = documented(&doc, sub).unwrap_or_else(|| {
            panic!("docs/configuration.md has no section \"## `shedgate {sub}`\"")
        });
        let missing: Vec<_> = flags.difference(&rows).collect();
        let gone: Vec<_> = rows.difference(&flags).collect();
        assert!(
            missing.is_empty() && gone.is_empty(),
            "docs/configuration.md, `shedgate {sub}`: flags without a row: {missing:?}; rows \
             for flags the binary does not have: {gone:?}"
        );
    }
    // A section for a subcommand the binary lacks is only a feature left out of this build.
    for line in doc.lines() {
        if let Some(name) = line
            .strip_prefix("## `shedgate ")
            .and_then(|l| l.strip_suffix('`'))
        {
            assert!(
                subs.iter().any(|s| s == name) || FEATURED.contains(&name),
                "docs/configuration.md documents `shedgate {name}`, which does not exist"
            );
        }
    }
}

/// Every `serve` flag but `--config` is a key of the `--config` file of the same name, and
/// there are no other keys: the file's own error for an unknown key lists the keys it knows.
#[test]
fn config_file_keys_are_the_serve_flags() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("shedgate.toml");
    std::fs::write(&file, "no-such-key = 1\n").unwrap();
    let out = shedgate(&["serve", "--config", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    let listed = err
        .split_once("expected one of")
        .unwrap_or_else(|| panic!("no key list in: {err}"))
        .1;
    let keys: BTreeSet<String> = listed
        .split(',')
        .filter_map(|k| k.trim().strip_prefix('`')?.split('`').next())
        .map(|k| format!("--{k}"))
        .collect();
    let mut flags = arguments("serve");
    flags.remove("--config");
    assert_eq!(keys, flags, "config file keys against serve's flags");
}

/// A heading's anchor as GitHub makes it: lower case, spaces to `-`, punctuation but `-` and
/// `_` dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown file's headings (outside fenced code).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced && line.starts_with('#') {
            out.insert(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// The relative link targets of a Markdown file (`[text](target)` outside fenced code and
/// inline code; web, mail and in-page-only links aside).
fn links(text: &str) -> Vec<(usize, String)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Inline code spans hold examples, not links.
        let prose: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, part)| part)
            .collect::<Vec<_>>()
            .join(" ");
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = rest[..end].split_whitespace().next().unwrap_or("");
            rest = &rest[end..];
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            out.push((n + 1, target.to_owned()));
        }
    }
    out
}

fn markdown_files() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

#[test]
fn relative_links_in_readme_and_docs_resolve() {
    let mut broken = Vec::new();
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        let dir = file.parent().unwrap_or(Path::new("."));
        for (line, target) in links(&text) {
            let (path, fragment) = match target.split_once('#') {
                Some((p, f)) => (p, Some(f)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                file.clone()
            } else {
                dir.join(path)
            };
            let shown = file.strip_prefix(root()).unwrap_or(&file).display();
            if !resolved.exists() {
                broken.push(format!("{shown}:{line}: {target}: no such file"));
                continue;
            }
            if let Some(fragment) = fragment
                && resolved.extension().is_some_and(|e| e == "md")
            {
                let heads = anchors(&std::fs::read_to_string(&resolved).unwrap());
                if !heads.contains(fragment) {
                    broken.push(format!("{shown}:{line}: {target}: no such heading"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}
