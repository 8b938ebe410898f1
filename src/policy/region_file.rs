//! Reading a GeoJSON region file (RFC 7946) lean: straight into `geo_types` rings, one
//! 16-byte coordinate per position (a ring's positions are read into one `Vec` that becomes
//! the ring), without a document tree, and stopped as soon as the policy's position budget
//! is spent.
//!
//! The `geojson` crate parses a document into a `serde_json::Value` tree first and then into
//! `Vec<f64>` positions (a heap allocation each): a 25 MB outline of 1.2 million positions
//! peaked at 282 MiB and took 8.8 s in `shedgate check` (release build, 2-core machine),
//! over the 256 Mi memory limit of our own Kubernetes manifest, and every replica reloads the
//! same file at once. Read here, the same file peaks at the figure README states ("Policy
//! files", limits). Only what areas need is read: `type`, `features`, `geometry`,
//! `properties.name` and `coordinates`; every other member is skipped unparsed.

use std::cell::Cell;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, SeqAccess, Visitor};

use crate::extract::crs::Crs;

/// One region of a file: its `properties.name` (a bare geometry has none) and its polygons,
/// or the type of a geometry that is no area.
#[derive(Debug, Clone)]
pub(super) struct Region {
    pub(super) name: Option<String>,
    pub(super) geometry: Option<Geometry>,
}

/// A region's geometry.
#[derive(Debug, Clone)]
pub(super) enum Geometry {
    /// Polygons (a Polygon is one).
    Polygons(Vec<geo_types::Polygon<f64>>),
    /// Another geometry type, by name: not an area.
    Other(String),
}

/// A GeoJSON object as far as areas read it. Members are optional so that their order in the
/// file does not matter (`coordinates` may come before `type`).
#[derive(Deserialize)]
struct Object {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    features: Option<Vec<Object>>,
    #[serde(default)]
    geometry: Option<Box<Object>>,
    #[serde(default)]
    coordinates: Option<Nested>,
    #[serde(default)]
    properties: Option<Properties>,
    /// GeoJSON 2008's `crs` member ([`Crs`]): only CRS84 (or none) is read.
    #[serde(default)]
    crs: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct Properties {
    #[serde(default)]
    name: Option<serde_json::Value>,
}

/// Nested coordinate arrays of any depth: a position (`[lon, lat]`, further numbers such as
/// altitude ignored), a list of positions (a ring, held as coordinates), or a list of lists.
enum Nested {
    Position(geo_types::Coord<f64>),
    Positions(Vec<geo_types::Coord<f64>>),
    List(Vec<Nested>),
}

thread_local! {
    /// Positions the parse on this thread may still read (see [`parse`]).
    static BUDGET: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// Takes one position from the budget; `false` when it is spent.
fn spend() -> bool {
    BUDGET.with(|b| match b.get().checked_sub(1) {
        Some(left) => {
            b.set(left);
            true
        }
        None => false,
    })
}

/// An element of a coordinate array: a number (of a position) or a deeper array.
enum Item {
    Number(f64),
    Nested(Nested),
}

impl<'de> Deserialize<'de> for Nested {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Item::deserialize(deserializer)? {
            Item::Nested(n) => Ok(n),
            Item::Number(_) => Err(de::Error::custom("coordinates must be an array")),
        }
    }
}

impl<'de> Deserialize<'de> for Item {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ItemVisitor)
    }
}

struct ItemVisitor;

impl<'de> Visitor<'de> for ItemVisitor {
    type Value = Item;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a number or an array of coordinates")
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Item, E> {
        Ok(Item::Number(v))
    }

    #[expect(clippy::cast_precision_loss, reason = "beyond 2^53 is out of range")]
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Item, E> {
        Ok(Item::Number(v as f64))
    }

    #[expect(clippy::cast_precision_loss, reason = "beyond 2^53 is out of range")]
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Item, E> {
        Ok(Item::Number(v as f64))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Item, A::Error> {
        let Some(first) = seq.next_element::<Item>()? else {
            return Ok(Item::Nested(Nested::List(Vec::new())));
        };
        match first {
            Item::Number(x) => {
                let Some(Item::Number(y)) = seq.next_element::<Item>()? else {
                    return Err(de::Error::custom(
                        "a position needs at least two numbers, [lon, lat]",
                    ));
                };
                // Altitude and beyond: read and dropped.
                while let Some(item) = seq.next_element::<Item>()? {
                    if !matches!(item, Item::Number(_)) {
                        return Err(de::Error::custom("a position holds only numbers"));
                    }
                }
                if !spend() {
                    return Err(de::Error::custom(OVER_BUDGET));
                }
                Ok(Item::Nested(Nested::Position(geo_types::Coord { x, y })))
            }
            Item::Nested(Nested::Position(c)) => {
                // A list of positions: a ring, read straight into coordinates.
                let mut ring = vec![c];
                while let Some(item) = seq.next_element::<Item>()? {
                    match item {
                        Item::Nested(Nested::Position(c)) => ring.push(c),
                        _ => {
                            return Err(de::Error::custom(
                                "an array mixes positions and other values",
                            ));
                        }
                    }
                }
                ring.shrink_to_fit();
                Ok(Item::Nested(Nested::Positions(ring)))
            }
            Item::Nested(n) => {
                let mut list = vec![n];
                while let Some(item) = seq.next_element::<Item>()? {
                    match item {
                        Item::Nested(n @ (Nested::List(_) | Nested::Positions(_))) => list.push(n),
                        _ => {
                            return Err(de::Error::custom("an array mixes lists and other values"));
                        }
                    }
                }
                Ok(Item::Nested(Nested::List(list)))
            }
        }
    }
}

/// The message of a parse stopped by the budget (recognised in [`parse`]).
const OVER_BUDGET: &str = "more positions than the policy's limit allows";

/// Why a region file gives no regions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ReadError {
    /// Not GeoJSON of the forms areas read: what and where.
    Invalid(String),
    /// More positions than the budget: the parse stopped there.
    OverBudget,
}

/// Reads a region file: a Geometry, a Feature or a FeatureCollection, of at most `budget`
/// positions. Returns the regions and the positions read.
///
/// # Errors
/// A message with serde_json's line and column for text that is not such a GeoJSON object,
/// coordinates of the wrong depth for their type ([`ReadError::Invalid`]), or more than
/// `budget` positions ([`ReadError::OverBudget`]; the parse stops there).
pub(super) fn parse(text: &str, budget: usize) -> Result<(Vec<Region>, usize), ReadError> {
    BUDGET.with(|b| b.set(budget));
    let parsed = serde_json::from_str::<Object>(text);
    let left = BUDGET.with(|b| b.replace(usize::MAX));
    let root = parsed.map_err(|e| {
        if left == 0 && e.to_string().starts_with(OVER_BUDGET) {
            ReadError::OverBudget
        } else {
            ReadError::Invalid(e.to_string())
        }
    })?;
    regions(root)
        .map(|r| (r, budget - left))
        .map_err(ReadError::Invalid)
}

/// Refuses a `crs` other than CRS84 on `what` (the file, a feature, a geometry).
fn lon_lat(crs: Option<&serde_json::Value>, what: &str) -> Result<(), String> {
    match Crs::of(crs) {
        Crs::LonLat => Ok(()),
        Crs::Other(name) => Err(format!(
            "{what}: crs {name:?} is not CRS84: GeoJSON positions are [lon, lat] in WGS 84 \
             (RFC 7946 section 4), and a file that names another crs may hold [lat, lon] (as \
             EPSG:4326's axis order is), which would move the area; write the positions as \
             [lon, lat] and remove the crs member"
        )),
    }
}

fn regions(root: Object) -> Result<Vec<Region>, String> {
    if root.kind != "Feature" {
        lon_lat(root.crs.as_ref(), "the file")?;
    }
    match root.kind.as_str() {
        "FeatureCollection" => root
            .features
            .ok_or("a FeatureCollection needs `features`")?
            .into_iter()
            .map(feature)
            .collect(),
        "Feature" => Ok(vec![feature(root)?]),
        _ => Ok(vec![Region {
            name: None,
            geometry: Some(geometry(root)?),
        }]),
    }
}

fn feature(object: Object) -> Result<Region, String> {
    if object.kind != "Feature" {
        return Err(format!(
            "a FeatureCollection holds Features, not {:?}",
            object.kind
        ));
    }
    let name = object
        .properties
        .and_then(|p| p.name)
        .and_then(|n| n.as_str().map(str::to_owned));
    let what = match &name {
        Some(n) => format!("feature {n:?}"),
        None => "a feature without a name".to_owned(),
    };
    lon_lat(object.crs.as_ref(), &what)?;
    if let Some(g) = &object.geometry {
        lon_lat(g.crs.as_ref(), &format!("{what}'s geometry"))?;
    }
    let geometry = object.geometry.map(|g| geometry(*g)).transpose()?;
    Ok(Region { name, geometry })
}

fn geometry(object: Object) -> Result<Geometry, String> {
    let Object {
        kind, coordinates, ..
    } = object;
    let need = |c: Option<Nested>| c.ok_or_else(|| format!("a {kind} needs `coordinates`"));
    match kind.as_str() {
        "Polygon" => Ok(Geometry::Polygons(vec![polygon(need(coordinates)?)?])),
        "MultiPolygon" => match need(coordinates)? {
            Nested::List(polygons) => Ok(Geometry::Polygons(
                polygons
                    .into_iter()
                    .map(polygon)
                    .collect::<Result<_, _>>()?,
            )),
            _ => Err("MultiPolygon coordinates are a list of polygons".into()),
        },
        "Point" | "MultiPoint" | "LineString" | "MultiLineString" | "GeometryCollection" => {
            Ok(Geometry::Other(kind.clone()))
        }
        other => Err(format!("{other:?} is not a GeoJSON geometry type")),
    }
}

/// A polygon from its rings (the first is the exterior); each ring's coordinates are moved,
/// not copied.
fn polygon(rings: Nested) -> Result<geo_types::Polygon<f64>, String> {
    let Nested::List(rings) = rings else {
        return Err("Polygon coordinates are a list of rings".into());
    };
    let mut rings = rings.into_iter().map(|ring| match ring {
        Nested::Positions(positions) => Ok(geo_types::LineString::new(positions)),
        _ => Err("a ring is a list of positions".to_owned()),
    });
    let exterior = rings.next().ok_or("a Polygon needs an exterior ring")??;
    let interiors = rings.collect::<Result<Vec<_>, _>>()?;
    Ok(geo_types::Polygon::new(exterior, interiors))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_in_every_form() {
        let fc = r#"{"features":[{"geometry":{"coordinates":[[[1,2,30],[3,4],[5,6],[1,2]]],"type":"Polygon"},"type":"Feature","properties":{"name":"a","pop":1}},
            {"type":"Feature","properties":null,"geometry":null},
            {"type":"Feature","properties":{"name":"m"},"geometry":{"type":"MultiPolygon","coordinates":[[[[0,0],[1,0],[1,1],[0,0]]],[[[5,5],[6,5],[6,6],[5,5]]]]}}],
            "type":"FeatureCollection","bbox":[0,0,1,1]}"#;
        let (regions, used) = parse(fc, 100).unwrap();
        assert_eq!(used, 12);
        assert_eq!(regions.len(), 3);
        assert_eq!(regions[0].name.as_deref(), Some("a"));
        let Some(Geometry::Polygons(p)) = &regions[0].geometry else {
            panic!()
        };
        assert_eq!(p[0].exterior().0[0], geo_types::Coord { x: 1.0, y: 2.0 });
        assert!(regions[1].geometry.is_none());
        let Some(Geometry::Polygons(m)) = &regions[2].geometry else {
            panic!()
        };
        assert_eq!(m.len(), 2);
        let (bare, _) = parse(r#"{"type":"Point","coordinates":[1,2]}"#, 100).unwrap();
        assert!(matches!(&bare[0].geometry, Some(Geometry::Other(k)) if k == "Point"));
        // The budget stops the parse.
        assert_eq!(parse(fc, 11).unwrap_err(), ReadError::OverBudget);
    }

    /// pygeoapi#2010, gdal PR #3311: a file naming EPSG:4326 may hold `[lat, lon]`; it is
    /// refused wherever the member is, naming the feature, never read as `[lon, lat]`.
    #[test]
    fn a_crs_other_than_crs84_is_refused_naming_the_feature() {
        let epsg = r#"{"type":"name","properties":{"name":"urn:ogc:def:crs:EPSG::4326"}}"#;
        let ring = r#"[[[52.5,13.3],[52.6,13.3],[52.6,13.5],[52.5,13.3]]]"#;
        let on_file = format!(
            r#"{{"type":"FeatureCollection","crs":{epsg},"features":[{{"type":"Feature","properties":{{"name":"Berlin"}},"geometry":{{"type":"Polygon","coordinates":{ring}}}}}]}}"#
        );
        let on_feature = format!(
            r#"{{"type":"Feature","crs":{epsg},"properties":{{"name":"Berlin"}},"geometry":{{"type":"Polygon","coordinates":{ring}}}}}"#
        );
        let on_geometry = format!(
            r#"{{"type":"FeatureCollection","features":[{{"type":"Feature","properties":{{"name":"Berlin"}},"geometry":{{"type":"Polygon","crs":{epsg},"coordinates":{ring}}}}}]}}"#
        );
        for (text, names) in [
            (on_file, "the file"),
            (on_feature, "feature \"Berlin\""),
            (on_geometry, "feature \"Berlin\"'s geometry"),
        ] {
            let ReadError::Invalid(why) = parse(&text, 100).unwrap_err() else {
                panic!()
            };
            assert!(why.contains(names), "{why}");
            assert!(
                why.contains("EPSG::4326") && why.contains("[lon, lat]"),
                "{why}"
            );
        }
        let crs84 = r#"{"type":"name","properties":{"name":"urn:ogc:def:crs:OGC:1.3:CRS84"}}"#;
        let fine = format!(
            r#"{{"type":"FeatureCollection","crs":{crs84},"features":[{{"type":"Feature","properties":{{"name":"Berlin"}},"geometry":{{"type":"Polygon","coordinates":{ring}}}}}]}}"#
        );
        assert!(parse(&fine, 100).is_ok());
    }

    /// Positions with a third or fourth element (altitude, a measure) are read as lon, lat.
    #[test]
    fn positions_with_more_elements_are_lon_lat() {
        let (regions, _) = parse(
            r#"{"type":"Polygon","coordinates":[[[13.3,52.5,34.0,7],[13.5,52.5,30],[13.5,52.6,1,2],[13.3,52.5,34.0,7]]]}"#,
            100,
        )
        .unwrap();
        let Some(Geometry::Polygons(p)) = &regions[0].geometry else {
            panic!()
        };
        assert_eq!(p[0].exterior().0[0], geo_types::Coord { x: 13.3, y: 52.5 });
    }

    #[test]
    fn errors_say_where() {
        for bad in [
            "{",
            r#"{"type":"Polygon"}"#,
            r#"{"type":"Polygon","coordinates":[[[1],[2,3]]]}"#,
            r#"{"type":"Polygon","coordinates":[[1,2]]}"#,
            r#"{"type":"Circle","coordinates":[]}"#,
            r#"{"type":"FeatureCollection","features":[{"type":"Polygon","coordinates":[]}]}"#,
        ] {
            assert!(parse(bad, 100).is_err(), "{bad}");
        }
        let ReadError::Invalid(why) = parse("{\n\"type\": 5}", 100).unwrap_err() else {
            panic!()
        };
        assert!(why.contains("line 2"), "{why}");
    }
}
