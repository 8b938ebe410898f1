//! Series of names that left the policy: the exporter has no way to unregister a series, so
//! a render leaves out every series labelled with a stream, area, route or upstream the live
//! policy no longer has (and `shedgate_policy_info` of versions no longer live, the disabled gauge of
//! streams no longer there, and the gauge of schedules no longer there). A name that comes back
//! continues its old count, which counters allow.

use std::collections::HashSet;

use crate::policy::Policy;

/// The label values of the live policy.
#[derive(Debug, Default)]
pub(super) struct LiveNames {
    streams: HashSet<String>,
    areas: HashSet<String>,
    routes: HashSet<String>,
    upstreams: HashSet<String>,
    schedules: HashSet<String>,
    version: String,
}

impl LiveNames {
    /// The names `policy` labels series with, the reserved ones included.
    pub(super) fn of(policy: &Policy) -> Self {
        let names = super::per_policy::LabelNames::of(policy);
        LiveNames {
            streams: names.streams.into_iter().collect(),
            areas: names.areas.into_iter().collect(),
            routes: names.routes.into_iter().collect(),
            upstreams: names.upstreams.into_iter().collect(),
            schedules: policy.schedules().iter().map(|s| s.name.clone()).collect(),
            version: policy.version().to_owned(),
        }
    }

    /// Whether a sample line of the exposition names only live names.
    fn keeps(&self, line: &str) -> bool {
        let Some(labels) = line.split_once('{').map(|(_, rest)| rest) else {
            return true;
        };
        let info = line.starts_with(super::POLICY_INFO);
        let disabled = line.starts_with(super::DISABLED_UNTIL);
        let mut stream_scope = false;
        labels_of(labels).all(|(key, value)| match key {
            "stream" => self.streams.contains(&value),
            "area" => self.areas.contains(&value),
            "route" => self.routes.contains(&value),
            "upstream" => self.upstreams.contains(&value),
            "schedule" => self.schedules.contains(&value),
            "version" if info => value == self.version,
            // `scope` comes before `name` in the disabled gauge's labels.
            "scope" if disabled => {
                stream_scope = value == "stream";
                true
            }
            "name" if stream_scope => self.streams.contains(&value),
            _ => true,
        })
    }

    /// `text` without the sample lines that name a name no longer live.
    pub(super) fn filter(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        for line in text.split_inclusive('\n') {
            if line.starts_with('#') || self.keeps(line) {
                out.push_str(line);
            }
        }
        out
    }
}

/// The `key="value"` pairs of a label set, from just after its `{`, values unescaped (`\\`,
/// `\"`, `\n`, as the text exposition format escapes them). Stops at `}` or at anything it
/// cannot read.
fn labels_of(text: &str) -> impl Iterator<Item = (&str, String)> {
    let mut rest = text;
    std::iter::from_fn(move || {
        let (key, after) = rest.split_once("=\"")?;
        let key = key.trim_start_matches(',');
        let mut value = String::new();
        let mut chars = after.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, other)) => value.push(other),
                    None => return None,
                },
                '"' => {
                    rest = &after[i + 1..];
                    if rest.starts_with('}') {
                        rest = "";
                    }
                    return Some((key, value));
                }
                c => value.push(c),
            }
        }
        None
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_read_with_escapes() {
        let pairs: Vec<_> = labels_of(r#"stream="a\"b",area="c\\d",route="/x"} 3"#).collect();
        assert_eq!(
            pairs,
            vec![
                ("stream", "a\"b".to_owned()),
                ("area", "c\\d".to_owned()),
                ("route", "/x".to_owned())
            ]
        );
    }

    #[test]
    fn series_of_departed_names_are_left_out() {
        let live = LiveNames {
            streams: ["v".to_owned(), "unknown".to_owned()].into(),
            areas: ["berlin".to_owned()].into(),
            routes: ["none".to_owned()].into(),
            upstreams: ["default".to_owned(), "none".to_owned()].into(),
            schedules: ["peak".to_owned()].into(),
            version: "abc".to_owned(),
        };
        let text = "# TYPE x counter\nx{stream=\"v\",area=\"berlin\"} 1\nx{stream=\"v\",area=\"old\"} 2\nshedgate_policy_info{version=\"abc\"} 1\nshedgate_policy_info{version=\"old\"} 0\nshedgate_disabled_until_timestamp_seconds{scope=\"stream\",name=\"gone\"} 0\nshedgate_disabled_until_timestamp_seconds{scope=\"class\",name=\"critical\"} 0\nshedgate_schedule_active{schedule=\"peak\"} 1\nshedgate_schedule_active{schedule=\"gone\"} 0\nshedgate_pressure{upstream=\"default\"} 0.5\nshedgate_pressure{upstream=\"removed\"} 0.9\nshedgate_requests_total{stream=\"v\",outcome=\"shed\",upstream=\"none\"} 1\nshedgate_requests_total{stream=\"v\",outcome=\"shed\",upstream=\"removed\"} 4\ny 5\n";
        assert_eq!(
            live.filter(text),
            "# TYPE x counter\nx{stream=\"v\",area=\"berlin\"} 1\nshedgate_policy_info{version=\"abc\"} 1\nshedgate_disabled_until_timestamp_seconds{scope=\"class\",name=\"critical\"} 0\nshedgate_schedule_active{schedule=\"peak\"} 1\nshedgate_pressure{upstream=\"default\"} 0.5\nshedgate_requests_total{stream=\"v\",outcome=\"shed\",upstream=\"none\"} 1\ny 5\n"
        );
    }
}
