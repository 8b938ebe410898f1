//! Per-policy counters: labelled with one policy's stream, area and route names, and
//! registered the first time each label set is used.

use std::sync::{Arc, OnceLock};

use metrics::{Counter, Histogram, Label};

use super::{
    ADMITTED, DEVICE_GAP, DEVICE_SILENCE, DEVICE_UNTRUSTED, EVENT_AGE, EVENT_LEAD, FRESHNESS, Fact,
    Metrics, NO_ROUTE, NO_UPSTREAM, OPAQUE, Outcome, REQUESTS, SHED, UNREADABLE, WOULD_SHED,
};
use crate::admission::{FloorVerdict, ShedReason, Untrusted, Verdict};
use crate::policy::{AreaId, Policy, StreamId, UNCONFIGURED_AREA, UNKNOWN_STREAM, UpstreamId};

/// The label values a policy gives series: its stream names, area names, route prefixes and
/// upstream names in id order, each followed by the reserved name of "none of them"
/// (`unknown`, `unconfigured`, `none`, `none`). One list for the counters and for the render
/// filter.
pub(super) struct LabelNames {
    pub(super) streams: Vec<String>,
    pub(super) areas: Vec<String>,
    pub(super) routes: Vec<String>,
    pub(super) upstreams: Vec<String>,
}

impl LabelNames {
    pub(super) fn of(policy: &Policy) -> Self {
        let with = |mut names: Vec<String>, reserved: &str| {
            names.push(reserved.to_owned());
            names
        };
        LabelNames {
            streams: with(
                policy.streams().iter().map(|s| s.name.clone()).collect(),
                UNKNOWN_STREAM,
            ),
            areas: with(
                policy.areas().iter().map(|a| a.name.clone()).collect(),
                UNCONFIGURED_AREA,
            ),
            routes: with(
                policy.routes().iter().map(|r| r.prefix.clone()).collect(),
                NO_ROUTE,
            ),
            upstreams: with(
                policy.upstreams().iter().map(|u| u.name.clone()).collect(),
                NO_UPSTREAM,
            ),
        }
    }
}

/// Per-policy counters, labelled with the policy's stream and area names and registered the
/// first time each label set is used (a policy of many areas would otherwise export
/// thousands of zero series).
pub struct PolicyMetrics {
    metrics: Arc<Metrics>,
    stream_names: Vec<String>,
    area_names: Vec<String>,
    /// Route prefixes, then `none`.
    route_names: Vec<String>,
    /// Upstream names in [`UpstreamId`] order, then `none`.
    upstream_names: Vec<String>,
    /// `[slot × upstreams + upstream][outcome]`.
    requests: Vec<[OnceLock<Counter>; 4]>,
    /// `[slot][area][reason]`, flattened; `would` doubles it for warn mode.
    sheds: Vec<OnceLock<Counter>>,
    /// `[route]`.
    opaque: Vec<OnceLock<Counter>>,
    /// `[slot × areas + area]`.
    admitted: Vec<OnceLock<Counter>>,
    /// `[slot]`.
    ages: Vec<OnceLock<Histogram>>,
    /// `[slot]`: leads of times in the future.
    leads: Vec<OnceLock<Histogram>>,
    /// `[area]`: time between a device's admitted fixes.
    gaps: Vec<OnceLock<Histogram>>,
    /// `[slot][admitted, denied]`: the freshness floor's verdicts.
    floor: Vec<[OnceLock<Counter>; 2]>,
    /// `[slot]`: the silence each delivered fix ended.
    silences: Vec<OnceLock<Histogram>>,
    /// `[slot × routes + route][fact]`.
    unreadable: Vec<[OnceLock<Counter>; 5]>,
    /// `[slot][reason]`.
    untrusted: Vec<[OnceLock<Counter>; 2]>,
    /// `[slot]`: the `/stats` counts of each stream.
    counts: Vec<Arc<crate::stats::Counts>>,
}

impl std::fmt::Debug for PolicyMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyMetrics").finish_non_exhaustive()
    }
}

impl PolicyMetrics {
    /// Tables for `policy`'s streams (plus `unknown`) and areas (plus `unconfigured`).
    pub fn new(metrics: &Arc<Metrics>, policy: &Policy) -> Self {
        let LabelNames {
            streams: stream_names,
            areas: area_names,
            routes: route_names,
            upstreams: upstream_names,
        } = LabelNames::of(policy);
        let slots = stream_names.len();
        let sheds = (0..slots * area_names.len() * ShedReason::ALL.len() * 2)
            .map(|_| OnceLock::new())
            .collect();
        let counts = stream_names
            .iter()
            .map(|n| metrics.stats.counts(n))
            .collect();
        PolicyMetrics {
            counts,
            metrics: Arc::clone(metrics),
            requests: (0..slots * upstream_names.len())
                .map(|_| Default::default())
                .collect(),
            opaque: (0..route_names.len()).map(|_| OnceLock::new()).collect(),
            admitted: (0..slots * area_names.len())
                .map(|_| OnceLock::new())
                .collect(),
            ages: (0..slots).map(|_| OnceLock::new()).collect(),
            leads: (0..slots).map(|_| OnceLock::new()).collect(),
            gaps: (0..area_names.len()).map(|_| OnceLock::new()).collect(),
            floor: (0..slots).map(|_| Default::default()).collect(),
            silences: (0..slots).map(|_| OnceLock::new()).collect(),
            unreadable: (0..slots * route_names.len())
                .map(|_| Default::default())
                .collect(),
            untrusted: (0..slots).map(|_| Default::default()).collect(),
            sheds,
            stream_names,
            area_names,
            route_names,
            upstream_names,
        }
    }

    /// The process-wide metrics.
    pub fn global(&self) -> &Metrics {
        &self.metrics
    }

    /// The route's label index (`none` last).
    fn route_slot(&self, route: Option<usize>) -> usize {
        let none = self.route_names.len() - 1;
        route.filter(|r| *r < none).unwrap_or(none)
    }

    /// The area's label index (`unconfigured` last).
    fn area_slot(&self, area: Option<AreaId>) -> usize {
        area.map_or(self.area_names.len() - 1, AreaId::index)
    }

    /// The upstream's label index (`none` last, also for an id another policy issued).
    fn upstream_slot(&self, upstream: Option<UpstreamId>) -> usize {
        let none = self.upstream_names.len() - 1;
        upstream
            .map(UpstreamId::index)
            .filter(|u| *u < none)
            .unwrap_or(none)
    }

    fn slot(&self, stream: Option<StreamId>) -> usize {
        stream.map_or(self.stream_names.len() - 1, StreamId::index)
    }

    /// Counts a request outcome of `stream` at `upstream`, the one chosen for it (`None`:
    /// answered before one was, labelled `none`).
    pub fn request(
        &self,
        stream: Option<StreamId>,
        upstream: Option<UpstreamId>,
        outcome: Outcome,
    ) {
        let slot = self.slot(stream);
        let u = self.upstream_slot(upstream);
        let i = Outcome::ALL.iter().position(|o| *o == outcome).unwrap_or(0);
        self.requests[slot * self.upstream_names.len() + u][i]
            .get_or_init(|| {
                self.metrics.counter(
                    REQUESTS,
                    vec![
                        Label::new("stream", self.stream_names[slot].clone()),
                        Label::new("outcome", outcome.as_str()),
                        Label::new("upstream", self.upstream_names[u].clone()),
                    ],
                )
            })
            .increment(1);
    }

    /// Counts a shed or a would-shed, labelled with the stream, the area and the reason.
    pub fn shed(&self, stream: Option<StreamId>, area: Option<AreaId>, verdict: Verdict) {
        let (reason, would) = match verdict {
            Verdict::Admit => return,
            Verdict::Shed(r) => (r, false),
            Verdict::WouldShed(r) => (r, true),
        };
        let slot = self.slot(stream);
        let area = self.area_slot(area);
        let i = ((usize::from(would) * self.stream_names.len() + slot) * self.area_names.len()
            + area)
            * ShedReason::ALL.len()
            + reason.index();
        self.sheds[i]
            .get_or_init(|| {
                self.metrics.counter(
                    if would { WOULD_SHED } else { SHED },
                    vec![
                        Label::new("stream", self.stream_names[slot].clone()),
                        Label::new("area", self.area_names[area].clone()),
                        Label::new("reason", reason.as_str()),
                    ],
                )
            })
            .increment(1);
    }

    /// The `/stats` counts of a stream (`None`: unknown).
    pub fn counts(&self, stream: Option<StreamId>) -> &Arc<crate::stats::Counts> {
        &self.counts[self.slot(stream)]
    }

    /// Counts an unreadable fact of a request of `stream` that came on `route` (an index
    /// into the policy's routes; `None`: no route), so that a sender's format change shows
    /// up on its own route.
    pub fn unreadable(&self, stream: Option<StreamId>, route: Option<usize>, fact: Fact) {
        let slot = self.slot(stream);
        let r = self.route_slot(route);
        self.unreadable[slot * self.route_names.len() + r][fact as usize]
            .get_or_init(|| {
                self.metrics.counter(
                    UNREADABLE,
                    vec![
                        Label::new("stream", self.stream_names[slot].clone()),
                        Label::new("route", self.route_names[r].clone()),
                        Label::new("fact", fact.as_str()),
                    ],
                )
            })
            .increment(1);
    }

    /// Counts a sheddable request of `stream` whose device id was not trusted.
    pub fn device_untrusted(&self, stream: Option<StreamId>, why: Untrusted) {
        let slot = self.slot(stream);
        self.untrusted[slot][why.index()]
            .get_or_init(|| {
                self.metrics.counter(
                    DEVICE_UNTRUSTED,
                    vec![
                        Label::new("stream", self.stream_names[slot].clone()),
                        Label::new("reason", why.as_str()),
                    ],
                )
            })
            .increment(1);
    }

    /// Counts an opaque envelope that came on `route` (an index into the policy's routes).
    pub fn opaque(&self, route: Option<usize>) {
        let r = self.route_slot(route);
        self.opaque[r]
            .get_or_init(|| {
                self.metrics.counter(
                    OPAQUE,
                    vec![Label::new("route", self.route_names[r].clone())],
                )
            })
            .increment(1);
    }

    /// Records an event's age at its decision, milliseconds: an age (0 or more) in
    /// [`EVENT_AGE`], a time in the future as its lead in [`EVENT_LEAD`]. Two histograms, so
    /// that neither `_sum` ever decreases: a negative observation makes `rate()` read the sum
    /// as a counter reset (client_golang#850, prometheus#6669).
    pub fn event_age(&self, stream: Option<StreamId>, age_ms: i64) {
        let slot = self.slot(stream);
        let (histograms, name, ms) = if age_ms >= 0 {
            (&self.ages, EVENT_AGE, age_ms)
        } else {
            (&self.leads, EVENT_LEAD, age_ms.saturating_neg())
        };
        histograms[slot]
            .get_or_init(|| {
                self.metrics.histogram(
                    name,
                    vec![Label::new("stream", self.stream_names[slot].clone())],
                )
            })
            .record(crate::clock::millis_to_secs(ms));
    }

    /// Records the time between two admitted fixes of one device, by the area of the second
    /// (never by device: the label would be a client's value).
    pub fn device_gap(&self, area: Option<AreaId>, gap: std::time::Duration) {
        let a = self.area_slot(area);
        self.gaps[a]
            .get_or_init(|| {
                self.metrics.histogram(
                    DEVICE_GAP,
                    vec![Label::new("area", self.area_names[a].clone())],
                )
            })
            .record(gap.as_secs_f64());
    }

    /// Counts what the freshness floor did with a fix the curve shed, by stream.
    pub fn floor(&self, stream: Option<StreamId>, verdict: FloorVerdict) {
        let slot = self.slot(stream);
        let (i, outcome) = match verdict {
            FloorVerdict::Admitted => (0, "admitted"),
            FloorVerdict::Denied => (1, "denied"),
        };
        self.floor[slot][i]
            .get_or_init(|| {
                self.metrics.counter(
                    FRESHNESS,
                    vec![
                        Label::new("stream", self.stream_names[slot].clone()),
                        Label::new("outcome", outcome),
                    ],
                )
            })
            .increment(1);
    }

    /// Records the silence a delivered fix of `stream` ended (the time since its device's
    /// previous delivered fix).
    pub fn silence(&self, stream: Option<StreamId>, silence: std::time::Duration) {
        let slot = self.slot(stream);
        self.silences[slot]
            .get_or_init(|| {
                self.metrics.histogram(
                    DEVICE_SILENCE,
                    vec![Label::new("stream", self.stream_names[slot].clone())],
                )
            })
            .record(silence.as_secs_f64());
    }

    /// Counts a sheddable request the decision admitted, by stream and area.
    pub fn admitted(&self, stream: Option<StreamId>, area: Option<AreaId>) {
        let slot = self.slot(stream);
        let area = self.area_slot(area);
        self.admitted[slot * self.area_names.len() + area]
            .get_or_init(|| {
                self.metrics.counter(
                    ADMITTED,
                    vec![
                        Label::new("stream", self.stream_names[slot].clone()),
                        Label::new("area", self.area_names[area].clone()),
                    ],
                )
            })
            .increment(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{PolicyFiles, compile};

    fn policy(streams: &str) -> Policy {
        compile(&PolicyFiles::from_texts(
            streams,
            Some("default_rank = 50\n"),
        ))
        .unwrap()
        .policy
    }

    const TWO: &str = r#"
[upstreams.tracking]
url = "http://127.0.0.1:3001"

[streams."vehicle.position"]
supersession = "self-superseding"
upstream = "tracking"
"#;

    /// `shedgate_requests_total` counts each upstream's requests apart, and those answered
    /// before one was chosen as `upstream="none"`; a reload that removes an upstream takes
    /// its series out of the render.
    #[test]
    fn requests_are_counted_by_upstream_and_removed_ones_leave_the_render() {
        let metrics = Arc::new(Metrics::new());
        let two = policy(TWO);
        metrics.policy_loaded(&two, crate::clock::UnixMillis(0));
        let pm = PolicyMetrics::new(&metrics, &two);
        let stream = two.stream("vehicle.position");
        let tracking = two.upstream("tracking");
        assert!(tracking.is_some());
        pm.request(stream, tracking, Outcome::Shed);
        pm.request(stream, tracking, Outcome::Shed);
        pm.request(stream, Some(UpstreamId::DEFAULT), Outcome::Shed);
        pm.request(stream, None, Outcome::Rejected);
        let text = metrics.render();
        for line in [
            r#"shedgate_requests_total{stream="vehicle.position",outcome="shed",upstream="tracking"} 2"#,
            r#"shedgate_requests_total{stream="vehicle.position",outcome="shed",upstream="default"} 1"#,
            r#"shedgate_requests_total{stream="vehicle.position",outcome="rejected",upstream="none"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        let tracking_metrics = super::super::UpstreamMetrics::new(&metrics, "tracking");
        tracking_metrics.pressure.set(0.9);
        assert!(
            metrics
                .render()
                .contains("shedgate_pressure{upstream=\"tracking\"} 0.9")
        );

        let one = policy(
            &TWO.replace(
                "[upstreams.tracking]\nurl = \"http://127.0.0.1:3001\"\n",
                "",
            )
            .replace("upstream = \"tracking\"\n", ""),
        );
        assert!(one.upstream("tracking").is_none());
        metrics.policy_loaded(&one, crate::clock::UnixMillis(1));
        let text = metrics.render();
        assert!(!text.contains("upstream=\"tracking\""), "{text}");
        assert!(
            text.contains(
                r#"shedgate_requests_total{stream="vehicle.position",outcome="shed",upstream="default"} 1"#
            ),
            "{text}"
        );
    }
}
