//! Load reports as upstreams send them, and the malformed ones.

use http::{HeaderMap, HeaderValue};

use super::{HEADER, HEADER_BIN, HEADER_JSON, LoadReportError, LoadReportField, read};

fn headers(values: &[&str]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for v in values {
        h.append(HEADER, HeaderValue::from_str(v).unwrap());
    }
    h
}

fn app() -> LoadReportField {
    LoadReportField::Application
}

#[test]
fn fields_parse_as_orca_names_them() {
    assert_eq!("application_utilization".parse(), Ok(app()));
    assert_eq!("cpu_utilization".parse(), Ok(LoadReportField::Cpu));
    assert_eq!(
        "named_metrics.queue".parse(),
        Ok(LoadReportField::Named("queue".into()))
    );
    for bad in [
        "",
        "named_metrics.",
        "mem_utilization",
        "Application_Utilization",
    ] {
        let err = bad.parse::<LoadReportField>().unwrap_err();
        assert!(err.contains("named_metrics.NAME"), "{bad}: {err}");
    }
    assert_eq!(
        LoadReportField::Named("kv".into()).to_string(),
        "named_metrics.kv"
    );
}

#[test]
fn the_text_form_as_envoy_documents_it() {
    let h = headers(&[
        "TEXT cpu_utilization=0.3, mem_utilization=0.8, rps_fractional=10.0, eps=1, \
         named_metrics.custom_metric_util=0.4, application_utilization=1.25",
    ]);
    assert_eq!(read(&h, &app()), Ok(Some(1.25)));
    assert_eq!(read(&h, &LoadReportField::Cpu), Ok(Some(0.3)));
    let named = LoadReportField::Named("custom_metric_util".into());
    assert_eq!(read(&h, &named), Ok(Some(0.4)));
}

#[test]
fn the_json_form_as_vllm_writes_it() {
    let h = headers(&[r#"JSON {"named_metrics": {"kv_cache_utilization": 0.4}, "eps": 1}"#]);
    let named = LoadReportField::Named("kv_cache_utilization".into());
    assert_eq!(read(&h, &named), Ok(Some(0.4)));
    assert_eq!(
        read(&h, &app()),
        Err(LoadReportError::Missing("application_utilization".into()))
    );
    let h = headers(&[r#"JSON {"application_utilization": 2.5}"#]);
    assert_eq!(read(&h, &app()), Ok(Some(2.5)));
}

#[test]
fn no_header_is_no_report() {
    assert_eq!(read(&HeaderMap::new(), &app()), Ok(None));
}

#[test]
fn a_report_that_cannot_be_read_as_one_utilisation_is_an_error() {
    let cases: &[(&[&str], LoadReportError)] = &[
        (
            &[
                "TEXT application_utilization=1",
                "TEXT application_utilization=2",
            ],
            LoadReportError::Duplicate("application_utilization".into()),
        ),
        (
            &[
                r#"JSON {"application_utilization": 1}"#,
                "TEXT cpu_utilization=1",
            ],
            LoadReportError::TwoHeaders,
        ),
        (
            &["TEXT application_utilization=1, application_utilization=2"],
            LoadReportError::Duplicate("application_utilization".into()),
        ),
        (&["CZqZmZmZmbk/MQAAAAAAAABA"], LoadReportError::NoFormat),
        (&["BIN CZqZmZmZmbk/MQAAAAAAAABA"], LoadReportError::Binary),
        (&["application_utilization:1"], LoadReportError::NoFormat),
        (
            &["TEXT cpu_utilization=0.5"],
            LoadReportError::Missing("application_utilization".into()),
        ),
    ];
    for (values, want) in cases {
        assert_eq!(
            read(&headers(values), &app()),
            Err(want.clone()),
            "{values:?}"
        );
    }
    for value in ["", "x", "nan", "inf", "-0.5", "1e400"] {
        let h = headers(&[&format!("TEXT application_utilization={value}")]);
        assert!(
            matches!(read(&h, &app()), Err(LoadReportError::Value { .. })),
            "{value}: {:?}",
            read(&h, &app())
        );
    }
    for json in [
        r#"JSON {"application_utilization": 1, "application_utilization": 2}"#,
        r#"JSON {"named_metrics": {"q": 1, "q": 2}}"#,
        r#"JSON {"application_utilization": "high"}"#,
        "JSON {",
    ] {
        let field = if json.contains("named") {
            LoadReportField::Named("q".into())
        } else {
            app()
        };
        assert!(
            matches!(
                read(&headers(&[json]), &field),
                Err(LoadReportError::Json(_))
            ),
            "{json}: {:?}",
            read(&headers(&[json]), &field)
        );
    }
    let mut h = HeaderMap::new();
    h.insert(HEADER, HeaderValue::from_bytes(b"TEXT a=\xff").unwrap());
    assert_eq!(read(&h, &app()), Err(LoadReportError::NotText));
    let h = headers(&[r#"JSON {"application_utilization": -1}"#]);
    assert!(matches!(
        read(&h, &app()),
        Err(LoadReportError::Value { .. })
    ));
}

#[test]
fn the_text_form_tolerates_spaces_and_empty_pairs() {
    for text in [
        "TEXT application_utilization = 1.5",
        "TEXT ,, application_utilization=1.5,",
        "TEXT cpu_utilization=0.2 ,application_utilization=1.5 , eps=3",
    ] {
        assert_eq!(read(&headers(&[text]), &app()), Ok(Some(1.5)), "{text}");
    }
}

/// RFC 9110 section 5.3: a list split over several lines is one list.
#[test]
fn a_text_report_over_several_lines_is_one_list() {
    let h = headers(&[
        "TEXT cpu_utilization=0.2",
        "TEXT application_utilization=1.5",
    ]);
    assert_eq!(read(&h, &app()), Ok(Some(1.5)));
    let h = headers(&[
        "TEXT application_utilization=1.5",
        "TEXT application_utilization=0.5",
    ]);
    assert_eq!(
        read(&h, &app()),
        Err(LoadReportError::Duplicate("application_utilization".into()))
    );
    let h = headers(&[
        "TEXT cpu_utilization=0.2",
        r#"JSON {"application_utilization": 1}"#,
    ]);
    assert_eq!(read(&h, &app()), Err(LoadReportError::TwoHeaders));
}

/// Envoy's other two headers: the JSON one is read, the binary one refused, and two forms in
/// one answer are refused rather than chosen between.
#[test]
fn the_other_orca_headers() {
    let mut h = HeaderMap::new();
    h.insert(
        HEADER_JSON,
        HeaderValue::from_static(r#"{"application_utilization": 0.75}"#),
    );
    assert_eq!(read(&h, &app()), Ok(Some(0.75)));
    h.insert(
        HEADER,
        HeaderValue::from_static("TEXT application_utilization=2"),
    );
    assert_eq!(read(&h, &app()), Err(LoadReportError::TwoHeaders));
    let mut h = HeaderMap::new();
    h.insert(
        HEADER_BIN,
        HeaderValue::from_static("CZqZmZmZmbk/MQAAAAAAAABA"),
    );
    assert_eq!(read(&h, &app()), Err(LoadReportError::Binary));
}

/// Protobuf's JSON printers write lowerCamelCase; Envoy reads both spellings, and a field
/// under both is given twice.
#[test]
fn the_json_form_in_protobufs_camel_case() {
    let h = headers(&[r#"JSON {"applicationUtilization": 1.1, "namedMetrics": {"q": 2}}"#]);
    assert_eq!(read(&h, &app()), Ok(Some(1.1)));
    assert_eq!(read(&h, &LoadReportField::Named("q".into())), Ok(Some(2.0)));
    let h = headers(&[r#"JSON {"applicationUtilization": 1, "application_utilization": 2}"#]);
    assert!(
        matches!(read(&h, &app()), Err(LoadReportError::Json(_))),
        "{:?}",
        read(&h, &app())
    );
}
