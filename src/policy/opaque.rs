//! Opaque envelopes in policy checks: a stream that may receive an encrypted message, which
//! can hold a never-shed event, must itself be never.

use std::path::Path;

use super::{
    Location, Lookup, PolicyError, Route, StreamId, StreamPolicy, StreamSource, Supersession,
    Warning,
};
use crate::extract::formats::Format;

/// A format whose sender puts never-shed events in opaque envelopes (OwnTracks with
/// encryption: transitions too) must never feed a self-superseding stream: refused for a
/// stream read in that format, for a route's fixed stream, and for the stream a body-named
/// route maps an envelope's type to; warned about for a header-named route, whose stream
/// only the sender knows.
pub(super) fn check_opaque(
    streams: &[StreamPolicy],
    stream_index: &Lookup<String, StreamId>,
    routes: &[Route],
    path: &Path,
    warnings: &mut Vec<Warning>,
) -> Result<(), PolicyError> {
    let refuse = |field: String, what: String, format: Format| PolicyError {
        location: Location {
            file: path.to_owned(),
            line_col: None,
            field: Some(field),
        },
        message: format!(
            "{what}, which is self-superseding; format {} carries opaque envelopes (encrypted \
             messages) that may hold a geofence transition, so it must be never",
            format_name(format)
        ),
    };
    let sheddable = |name: &str| {
        stream_index
            .get(name)
            .is_some_and(|id| streams[id.index()].supersession == Supersession::SelfSuperseding)
    };
    for s in streams {
        if !s.format.opaque_values().is_empty() && s.supersession == Supersession::SelfSuperseding {
            return Err(refuse(
                format!("streams.{:?}.format", s.name),
                format!("stream {:?} is read in this format", s.name),
                s.format,
            ));
        }
    }
    for (i, r) in routes.iter().enumerate() {
        let values = r.format.opaque_values();
        if values.is_empty() {
            continue;
        }
        for j in 0..r.format.modes().len() {
            match &r.mode_at(j).stream {
                StreamSource::Fixed(name) if sheddable(name) => {
                    return Err(refuse(
                        format!("routes[{i}].stream"),
                        format!("route {:?} names stream {name:?}", r.prefix),
                        r.format,
                    ));
                }
                StreamSource::Header(_) | StreamSource::DefaultHeader => {
                    warnings.push(Warning {
                        file: path.to_owned(),
                        message: format!(
                            "route {:?} (format {}) takes its stream from a header: an \
                             encrypted envelope under a self-superseding stream would be shed",
                            r.prefix,
                            format_name(r.format)
                        ),
                    });
                }
                source => {
                    for value in values {
                        let name = source.map_field(value).filter(|n| sheddable(n));
                        if let Some(name) = name {
                            return Err(refuse(
                                format!("streams.{name:?}.supersession"),
                                format!(
                                    "route {:?} maps {value:?} envelopes to stream {name:?}",
                                    r.prefix
                                ),
                                r.format,
                            ));
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// A format's name as written in policy files.
fn format_name(format: Format) -> String {
    serde_json::to_value(format)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}
