//! Routes and content modes: how a route's or stream's format is read, with the policy's
//! pointer overrides.

use std::path::Path;

use super::upstreams::UpstreamTable;
use super::{
    Location, Lookup, PolicyError, Route, RouteMode, StreamId, StreamSource, Warning, file,
};
use crate::extract::formats::{ContentMode, Format, PresetStream};
use crate::extract::{Extractor, JsonPointer, Shape};

/// How a content mode of `format` is read, with the policy's pointer overrides (relative to
/// the event's data) applied: its shape, where the preset names the stream, and its time
/// header, which an explicit `time` pointer overrides (`ce-time`). One rule for routes and
/// streams.
pub(super) fn mode_reading(
    format: Format,
    mode: ContentMode,
    lat: Option<JsonPointer>,
    lon: Option<JsonPointer>,
    time: Option<JsonPointer>,
    device: Option<JsonPointer>,
) -> (Shape, PresetStream, Option<&'static str>) {
    let (mut shape, preset, time_header) = format.preset(mode);
    let time_header = time_header.filter(|_| time.is_none());
    override_pointers(&mut shape, format.data_root(mode), [lat, lon, time, device]);
    (shape, preset, time_header)
}

/// The headers naming the device in `mode` of `format`, unless the policy gives the device a
/// pointer of its own.
pub(super) fn device_headers(
    format: Format,
    mode: ContentMode,
    device: Option<&JsonPointer>,
) -> Vec<http::HeaderName> {
    if device.is_some() {
        return Vec::new();
    }
    format
        .device_headers(mode)
        .iter()
        .map(|h| http::HeaderName::from_static(h))
        .collect()
}

/// Replaces a shape's pointers with the ones given, which are relative to the event's data:
/// under `root` (see [`Format::data_root`]) when the mode has one.
fn override_pointers(shape: &mut Shape, root: Option<&str>, given: [Option<JsonPointer>; 4]) {
    let rooted = |p: Option<JsonPointer>| match (p, root) {
        (Some(p), Some(root)) => JsonPointer::parse(&format!("{root}{}", p.as_str())).ok(),
        (p, _) => p,
    };
    let [lat, lon, time, device] = given.map(rooted);
    if device.is_some() {
        shape.device = device;
    }
    if lat.is_some() || lon.is_some() {
        shape.lonlat = None;
        let (dlat, dlon, _) = Extractor::default_pointers();
        shape.lat = Some(lat.or_else(|| shape.lat.clone()).unwrap_or(dlat));
        shape.lon = Some(lon.or_else(|| shape.lon.clone()).unwrap_or(dlon));
    }
    if let Some(t) = time {
        shape.time = vec![t];
    }
}

pub(super) fn compile_routes(
    sections: Vec<file::RouteSection>,
    streams: &Lookup<String, StreamId>,
    upstreams: &mut UpstreamTable<'_>,
    path: &Path,
    text: &str,
    warnings: &mut Vec<Warning>,
) -> Result<Vec<Route>, PolicyError> {
    let mut routes: Vec<Route> = Vec::with_capacity(sections.len());
    for (i, mut r) in sections.into_iter().enumerate() {
        let upstream = upstreams.resolve(r.upstream.take(), format!("routes[{i}].upstream"))?;
        let err = |f: &str, message: String| PolicyError {
            location: Location {
                file: path.to_owned(),
                line_col: None,
                field: Some(format!("routes[{i}].{f}")),
            },
            message,
        };
        if !r.prefix.starts_with('/') {
            return Err(err(
                "prefix",
                format!("prefix {:?} must start with '/'", r.prefix),
            ));
        }
        if super::path::route_path(&r.prefix) != r.prefix.as_str() {
            return Err(err(
                "prefix",
                format!(
                    "prefix {:?} is not a normalised path (requests are matched on {:?}: no \
                     dot segments, repeated slashes or encoded unreserved characters)",
                    r.prefix,
                    super::path::route_path(&r.prefix)
                ),
            ));
        }
        if routes.iter().any(|o| o.prefix == r.prefix) {
            return Err(err(
                "prefix",
                format!("duplicate route prefix {:?}", r.prefix),
            ));
        }
        let sources = [
            r.stream.is_some(),
            r.stream_header.is_some(),
            r.stream_field.is_some(),
        ];
        if sources.iter().filter(|s| **s).count() > 1 {
            return Err(err(
                "stream",
                "give at most one of stream, stream_header, stream_field".into(),
            ));
        }
        if (r.stream_prefix.is_some() || r.stream_map.is_some()) && r.stream_field.is_none() {
            let (_, preset, _) = r.format.unwrap_or_default().preset(ContentMode::Structured);
            if r.stream.is_some()
                || r.stream_header.is_some()
                || !matches!(preset, PresetStream::Field(..))
            {
                return Err(err(
                    "stream_map",
                    "stream_prefix and stream_map apply to a stream named in the body                      (stream_field, or a preset's own: owntracks `_type`, cloudevents `type`                      and `ce-type`, standard-webhooks `type`), not to `stream` or                      `stream_header`"
                        .into(),
                ));
            }
        }
        let known = |name: &str, warnings: &mut Vec<Warning>| {
            if !streams.contains_key(name) {
                warnings.push(Warning {
                    file: path.to_owned(),
                    message: format!(
                        "route {:?} names stream {name:?}, which the policy does not classify: \
                         its events are never shed",
                        r.prefix
                    ),
                });
            }
        };
        if let Some(name) = &r.stream {
            known(name, warnings);
        }
        for name in r.stream_map.iter().flat_map(|m| m.values()) {
            known(name, warnings);
        }
        // GPSLogger's custom URL as first written (`ser=%SER`): `Build.SERIAL` is `unknown`
        // for apps from Android 8 on, so every phone would send one id.
        if let Some(key) = r.params.as_ref().and_then(|p| p.device.as_deref())
            && key.eq_ignore_ascii_case("ser")
        {
            warnings.push(Warning {
                file: path.to_owned(),
                message: format!(
                    "route {:?} reads devices from the key {key:?}: GPSLogger's %SER is \
                     \"unknown\" on Android 8 and later, a placeholder that names no device, so \
                     those phones are decided without a device; send %AID (the Android ID, one \
                     per phone) as the device key instead",
                    r.prefix
                ),
            });
        }
        let format = r.format.unwrap_or_default();
        let stream_pointers = format == Format::Pointers
            && r.lat.is_none()
            && r.lon.is_none()
            && r.time.is_none()
            && r.device.is_none()
            && r.params.is_none();
        let params = r.params.as_ref().map(|p| crate::extract::ParamKeys {
            lat: p.lat.clone(),
            lon: p.lon.clone(),
            time: p.time.iter().cloned().collect(),
            device: p.device.iter().cloned().collect(),
        });
        let mut modes = Vec::new();
        for &mode in format.modes() {
            let (mut shape, preset, time_header) = mode_reading(
                format,
                mode,
                r.lat.clone(),
                r.lon.clone(),
                r.time.clone(),
                r.device.clone(),
            );
            if params.is_some() {
                shape.params.clone_from(&params);
            }
            let source = if let Some(name) = &r.stream {
                StreamSource::Fixed(name.clone())
            } else if let Some(h) = &r.stream_header {
                StreamSource::Header(
                    http::HeaderName::try_from(h.as_str())
                        .map_err(|_| err("stream_header", format!("{h:?} is not a header name")))?,
                )
            } else if let Some(field) = &r.stream_field {
                shape.stream = Some(field.clone());
                StreamSource::Field {
                    map: r.stream_map.clone().unwrap_or_default(),
                    prefix: r.stream_prefix.clone().unwrap_or_default(),
                }
            } else {
                match preset {
                    PresetStream::Header => StreamSource::DefaultHeader,
                    PresetStream::NamedHeader(h) => StreamSource::MappedHeader {
                        name: http::HeaderName::from_static(h),
                        map: r.stream_map.clone().unwrap_or_default(),
                        prefix: r.stream_prefix.clone().unwrap_or_default(),
                    },
                    PresetStream::Field(field, prefix) => {
                        shape.stream = Some(field);
                        StreamSource::Field {
                            map: r.stream_map.clone().unwrap_or_default(),
                            prefix: r.stream_prefix.clone().unwrap_or_else(|| prefix.to_owned()),
                        }
                    }
                }
            };
            let extractor = Extractor::new(shape).map_err(|e| err("lat", e.to_string()))?;
            modes.push((
                mode,
                RouteMode {
                    extractor,
                    stream: source,
                    time_header: time_header.map(http::HeaderName::from_static),
                    device_headers: device_headers(format, mode, r.device.as_ref()),
                    stream_pointers: stream_pointers && r.stream_field.is_none(),
                },
            ));
        }
        let stale_body = match r.stale_body {
            Some(body) => {
                if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(body.get_ref()) {
                    let mut e = err(
                        "stale_body",
                        format!(
                            "stale_body must be a JSON text (it is served as application/json): {e}"
                        ),
                    );
                    e.location.line_col = Some(super::error::line_col(text, body.span().start));
                    return Err(e);
                }
                Some(bytes::Bytes::from(body.into_inner()))
            }
            None => format
                .success_body()
                .map(|b| bytes::Bytes::from_static(b.as_bytes())),
        };
        routes.push(Route {
            prefix: r.prefix,
            format,
            stale_body,
            max_silence: r.max_silence.map(|v| v.0),
            upstream,
            modes,
        });
    }
    Ok(routes)
}
