//! The GeoJSON `crs` member (GeoJSON 2008, section 3; removed by RFC 7946, whose positions are
//! always `[lon, lat]` in WGS 84, "CRS84", section 4). A document that still names a `crs`
//! other than CRS84 says its positions may be in another axis order: EPSG:4326 is officially
//! `[lat, lon]`, and files written by tools that honour it put Berlin in the Gulf of Aden when
//! read as `[lon, lat]` (pygeoapi#2010, gdal PR #3311). Such positions are never read one way
//! or the other: a policy region is refused, an event's coordinates are unreadable.

/// Names of CRS84 (OGC's WGS 84 longitude-latitude): the URN forms GeoJSON 2008 used, the OGC
/// URI, and the short forms WMS and GDAL print. Compared without case.
const CRS84_NAMES: [&str; 7] = [
    "urn:ogc:def:crs:OGC:1.3:CRS84",
    "urn:ogc:def:crs:OGC::CRS84",
    "http://www.opengis.net/def/crs/OGC/1.3/CRS84",
    "https://www.opengis.net/def/crs/OGC/1.3/CRS84",
    "OGC:CRS84",
    "CRS:84",
    "CRS84",
];

/// What a `crs` member says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Crs {
    /// Absent, `null`, or a named CRS84: positions are `[lon, lat]`.
    LonLat,
    /// Anything else (another name, a `link` crs, a malformed member): the name, or the member
    /// as written, for messages.
    Other(String),
}

impl Crs {
    /// Reads a `crs` member's value (`None`: the member is absent).
    pub fn of(value: Option<&serde_json::Value>) -> Crs {
        let Some(value) = value.filter(|v| !v.is_null()) else {
            return Crs::LonLat;
        };
        let name = value
            .get("properties")
            .and_then(|p| p.get("name"))
            .and_then(serde_json::Value::as_str)
            .filter(|_| value.get("type").and_then(serde_json::Value::as_str) == Some("name"));
        match name {
            Some(n) if CRS84_NAMES.iter().any(|c| c.eq_ignore_ascii_case(n.trim())) => Crs::LonLat,
            Some(n) => Crs::Other(n.to_owned()),
            None => Crs::Other(value.to_string()),
        }
    }

    /// Reads a `crs` member from its raw JSON text.
    pub fn of_raw(raw: &serde_json::value::RawValue) -> Crs {
        Crs::of_text(raw.get())
    }

    /// Reads a `crs` member from its JSON text as written.
    pub fn of_text(text: &str) -> Crs {
        match serde_json::from_str::<serde_json::Value>(text) {
            Ok(v) => Crs::of(Some(&v)),
            Err(_) => Crs::Other(text.to_owned()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_crs84_reads_as_lon_lat() {
        let named = |n: &str| serde_json::json!({"type": "name", "properties": {"name": n}});
        assert_eq!(Crs::of(None), Crs::LonLat);
        assert_eq!(Crs::of(Some(&serde_json::Value::Null)), Crs::LonLat);
        for n in [
            "urn:ogc:def:crs:OGC:1.3:CRS84",
            "urn:ogc:def:crs:ogc::crs84",
            "CRS84",
        ] {
            assert_eq!(Crs::of(Some(&named(n))), Crs::LonLat, "{n}");
        }
        for n in ["EPSG:4326", "urn:ogc:def:crs:EPSG::4326", "EPSG:3857"] {
            assert_eq!(Crs::of(Some(&named(n))), Crs::Other(n.to_owned()), "{n}");
        }
        let link = serde_json::json!({"type": "link", "properties": {"href": "x"}});
        assert!(matches!(Crs::of(Some(&link)), Crs::Other(_)));
        let raw = serde_json::value::RawValue::from_string(
            r#"{"type":"name","properties":{"name":"EPSG:4326"}}"#.to_owned(),
        )
        .unwrap();
        assert_eq!(Crs::of_raw(&raw), Crs::Other("EPSG:4326".to_owned()));
    }
}
