//! Policy errors and warnings, with the file, line, column and field they point to.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// Where a policy error is: file, line and column (1-based), and the field's path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The file.
    pub file: PathBuf,
    /// Line and column, when the error points into the file.
    pub line_col: Option<(usize, usize)>,
    /// Dotted path of the field (`streams."vehicle.position".stale_after`), when known.
    pub field: Option<String>,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some((line, col)) = self.line_col {
            write!(f, ":{line}:{col}")?;
        }
        if let Some(field) = &self.field {
            write!(f, ": field `{field}`")?;
        }
        Ok(())
    }
}

/// A policy that cannot be loaded: where, and what is wrong.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{location}: {message}")]
pub struct PolicyError {
    /// Where.
    pub location: Location,
    /// What is wrong.
    pub message: String,
}

/// Risky but valid content that `check` reports (docs/operations.md "Policy files and hot reload").
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Warning {
    /// The file the warning is about.
    pub file: PathBuf,
    /// What is risky.
    pub message: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: warning: {}", self.file.display(), self.message)
    }
}

pub(super) fn io_error(path: &Path, e: &std::io::Error) -> PolicyError {
    PolicyError {
        location: Location {
            file: path.to_owned(),
            line_col: None,
            field: None,
        },
        message: format!("cannot read: {e}"),
    }
}

/// Parses one TOML file into its schema, reporting file, line, column and field path.
pub(super) fn parse_toml<T: serde::de::DeserializeOwned>(
    path: &Path,
    text: &str,
) -> Result<T, PolicyError> {
    let location = |span: Option<std::ops::Range<usize>>, field: Option<String>| Location {
        file: path.to_owned(),
        line_col: span.map(|s| line_col(text, s.start)),
        field,
    };
    if text.trim().is_empty() {
        return Err(PolicyError {
            location: location(None, None),
            message: "the file is empty (a truncated save is never a valid policy)".into(),
        });
    }
    let de = toml::de::Deserializer::parse(text).map_err(|e| PolicyError {
        location: location(e.span(), None),
        message: e.message().trim().to_owned(),
    })?;
    serde_path_to_error::deserialize(de).map_err(|e| {
        // A `toml::Spanned` value adds its private inner key to the path: not the user's.
        let field = e
            .path()
            .to_string()
            .replace(".$__serde_spanned_private_value", "");
        let field = (field != "." && !field.is_empty()).then_some(field);
        let inner = e.into_inner();
        PolicyError {
            location: location(inner.span(), field),
            message: inner.message().trim().to_owned(),
        }
    })
}

/// 1-based line and column of a byte offset.
pub(super) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before
        .rfind('\n')
        .map_or(before.len(), |i| before.len() - i - 1)
        + 1;
    (line, col)
}

/// Best effort: the line and column of the table header `[table."name"]` (or with the name
/// bare or single-quoted) in `text`, for errors about a table key.
pub(super) fn table_line(text: &str, table: &str, name: &str) -> Option<(usize, usize)> {
    let basic = name.replace('\\', "\\\\").replace('"', "\\\"");
    let forms = [
        format!("[{table}.\"{basic}\"]"),
        format!("[{table}.'{name}']"),
        format!("[{table}.{name}]"),
    ];
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let compact: String = line.chars().filter(|c| !c.is_whitespace()).collect();
        let starts = |f: &String| {
            let f: String = f.chars().filter(|c| !c.is_whitespace()).collect();
            compact.starts_with(&f)
        };
        if forms.iter().any(starts) {
            return Some(line_col(text, offset));
        }
        offset += line.len();
    }
    None
}
