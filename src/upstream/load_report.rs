//! The upstream's own load report: the ORCA `endpoint-load-metrics` response header, read for
//! one metric the operator names (`--load-report`) as the upstream's utilisation, in-flight
//! over its concurrency (docs/pressure.md "Load reports"; `crate::pressure::report` is what
//! the controller does with it).
//!
//! Two of ORCA's encodings of one header are read, as Envoy's parser reads them
//! (`source/common/orca/orca_parser.cc`) and vLLM writes them:
//!
//! ```text
//! endpoint-load-metrics: TEXT application_utilization=1.2, named_metrics.queue=0.4
//! endpoint-load-metrics: JSON {"application_utilization": 1.2, "named_metrics": {"queue": 0.4}}
//! ```
//!
//! Envoy's older header `endpoint-load-metrics-json` (the JSON form without its prefix) is
//! read too. The binary form (`BIN`, and the `endpoint-load-metrics-bin` header) is a
//! serialized protobuf: not read (an error, counted). A text report split over several
//! header lines is one list (RFC 9110 section 5.3); a report that names the metric twice, or
//! an answer with reports in two forms, is an error, never a guess between the two values.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::fmt;

use http::HeaderMap;
use http::header::HeaderName;
use serde::Deserialize;

pub use crate::pressure::report::LoadReportField;

/// The header ORCA's text and JSON reports travel in.
pub const HEADER: &str = "endpoint-load-metrics";
/// Envoy's older header for the JSON form, without the `JSON ` prefix.
pub const HEADER_JSON: &str = "endpoint-load-metrics-json";
/// The header of the binary (protobuf) form, not read.
pub const HEADER_BIN: &str = "endpoint-load-metrics-bin";

impl LoadReportField {
    /// Whether `name`, as the text form writes it, is this metric (no allocation: this runs
    /// per answer).
    fn is(&self, name: &str) -> bool {
        match self {
            LoadReportField::Application => name == "application_utilization",
            LoadReportField::Cpu => name == "cpu_utilization",
            LoadReportField::Named(wanted) => {
                name.strip_prefix("named_metrics.") == Some(wanted.as_str())
            }
        }
    }
}

/// Why a report was not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadReportError {
    /// Reports in more than one form (or JSON twice) in one answer.
    #[error("more than one load report in one answer ({HEADER}, {HEADER_JSON}, {HEADER_BIN})")]
    TwoHeaders,
    /// Not visible ASCII.
    #[error("{HEADER} is not text")]
    NotText,
    /// The binary (protobuf) form.
    #[error("the binary (BIN, {HEADER_BIN}) load report is not read; send TEXT or JSON")]
    Binary,
    /// Neither `TEXT ` nor `JSON ` (nor `BIN `) first.
    #[error("{HEADER}: no TEXT or JSON prefix")]
    NoFormat,
    /// The metric is not in the report.
    #[error("{HEADER}: no {0}")]
    Missing(String),
    /// The metric appears twice.
    #[error("{HEADER}: {0} appears twice")]
    Duplicate(String),
    /// The value is not a number, or not a finite one at or above 0.
    #[error("{HEADER}: {field} is {value:?}, not a utilisation (a finite number at or above 0)")]
    Value {
        /// The metric.
        field: String,
        /// Its value as sent.
        value: String,
    },
    /// JSON that does not parse as an ORCA report.
    #[error("{HEADER}: JSON: {0}")]
    Json(String),
}

/// Reads `field` from the answer's load report: `Ok(None)` when the answer carries none.
///
/// # Errors
/// A [`LoadReportError`] for a report that is there but cannot be read as one utilisation.
pub fn read(headers: &HeaderMap, field: &LoadReportField) -> Result<Option<f64>, LoadReportError> {
    // Names built once: a `&str` key is parsed and checked on every lookup (cargo bench
    // --bench decision -- part/load-report: 470-500 ns a report looking three up by `&str`,
    // 300 ns with these).
    const TEXT: HeaderName = HeaderName::from_static(HEADER);
    const JSON: HeaderName = HeaderName::from_static(HEADER_JSON);
    const BIN: HeaderName = HeaderName::from_static(HEADER_BIN);
    let lines = headers.get_all(TEXT);
    let json = headers.get_all(JSON);
    let binary = headers.contains_key(BIN);
    let forms = usize::from(lines.iter().next().is_some())
        + usize::from(json.iter().next().is_some())
        + usize::from(binary);
    match forms {
        0 => return Ok(None),
        1 => {}
        _ => return Err(LoadReportError::TwoHeaders),
    }
    if binary {
        return Err(LoadReportError::Binary);
    }
    if let Some(value) = json.iter().next() {
        if json.iter().nth(1).is_some() {
            return Err(LoadReportError::TwoHeaders);
        }
        let text = value.to_str().map_err(|_| LoadReportError::NotText)?;
        return from_json(text, field).map(Some);
    }
    let mut each = lines.iter();
    let Some(first) = each.next() else {
        return Ok(None);
    };
    let first = first.to_str().map_err(|_| LoadReportError::NotText)?;
    if each.next().is_none() {
        return if let Some(pairs) = first.strip_prefix("TEXT ") {
            from_text([pairs], field).map(Some)
        } else if let Some(json) = first.strip_prefix("JSON ") {
            from_json(json, field).map(Some)
        } else if first.starts_with("BIN ") {
            Err(LoadReportError::Binary)
        } else {
            Err(LoadReportError::NoFormat)
        };
    }
    // Several lines: one text list split over them, each line with its prefix.
    let mut parts = Vec::new();
    for value in &lines {
        let text = value.to_str().map_err(|_| LoadReportError::NotText)?;
        parts.push(
            text.strip_prefix("TEXT ")
                .ok_or(LoadReportError::TwoHeaders)?,
        );
    }
    from_text(parts, field).map(Some)
}

/// `name=value` pairs, comma-separated, map fields as `map.key` (the ORCA text form).
///
/// Split by hand, with no allocation unless it fails (no crate reads ORCA's text form):
/// `cargo bench --bench decision -- part/load-report` measured 300 ns a report on the 2-core
/// build machine (404 ns when the metric's name was formatted per call), under 1% of the
/// ~50 µs of CPU a forwarded request costs shedgate (docs/benchmark-history.md), and only with
/// `--load-report` set. The JSON form goes through serde_json (a library, allocating) and
/// is not benched.
fn from_text<'a>(
    lines: impl IntoIterator<Item = &'a str>,
    field: &LoadReportField,
) -> Result<f64, LoadReportError> {
    let mut found = None;
    for pair in lines.into_iter().flat_map(|line| line.split(',')) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if !field.is(name.trim()) {
            continue;
        }
        if found.is_some() {
            return Err(LoadReportError::Duplicate(field.to_string()));
        }
        found = Some(value.trim());
    }
    let value = found.ok_or_else(|| LoadReportError::Missing(field.to_string()))?;
    utilisation(value.parse().ok(), field, || value.to_owned())
}

/// The fields of ORCA's `OrcaLoadReport` read here, in its JSON mapping (the proto's names,
/// or protobuf JSON's lowerCamelCase, as Envoy accepts both); others are ignored. A field
/// given twice, under either name, is a serde error (derive rejects duplicates), and so is a
/// named metric given twice ([`Unique`]).
#[derive(Deserialize)]
struct JsonReport {
    #[serde(alias = "cpuUtilization")]
    cpu_utilization: Option<f64>,
    #[serde(alias = "applicationUtilization")]
    application_utilization: Option<f64>,
    #[serde(default, alias = "namedMetrics")]
    named_metrics: Unique,
}

/// A JSON object of numbers whose keys must differ.
#[derive(Default)]
struct Unique(BTreeMap<String, f64>);

impl<'de> Deserialize<'de> for Unique {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Unique;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of numbers")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Unique, A::Error> {
                let mut out = BTreeMap::new();
                while let Some((key, value)) = map.next_entry::<String, f64>()? {
                    match out.entry(key) {
                        Entry::Occupied(e) => {
                            let twice = format!("{} appears twice", e.key());
                            return Err(serde::de::Error::custom(twice));
                        }
                        Entry::Vacant(e) => {
                            e.insert(value);
                        }
                    }
                }
                Ok(Unique(out))
            }
        }
        d.deserialize_map(Visitor)
    }
}

fn from_json(json: &str, field: &LoadReportField) -> Result<f64, LoadReportError> {
    let report: JsonReport =
        serde_json::from_str(json).map_err(|e| LoadReportError::Json(e.to_string()))?;
    let value = match field {
        LoadReportField::Application => report.application_utilization,
        LoadReportField::Cpu => report.cpu_utilization,
        LoadReportField::Named(name) => report.named_metrics.0.get(name).copied(),
    };
    let v = value.ok_or_else(|| LoadReportError::Missing(field.to_string()))?;
    utilisation(Some(v), field, || v.to_string())
}

/// `value` if it is a utilisation (a finite number at or above 0), else the error naming
/// `field` and the value as sent (`shown`, built only then).
fn utilisation(
    value: Option<f64>,
    field: &LoadReportField,
    shown: impl FnOnce() -> String,
) -> Result<f64, LoadReportError> {
    match value {
        Some(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(LoadReportError::Value {
            field: field.to_string(),
            value: shown(),
        }),
    }
}

#[cfg(test)]
mod tests;
