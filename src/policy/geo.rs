//! GeoJSON regions tiled to resolution-4 cells (docs/decision.md "Areas").
//!
//! Input: RFC 7946 GeoJSON — a Geometry, a Feature or a FeatureCollection — of Polygons and
//! MultiPolygons in `[lon, lat]` order. Every polygon is tiled with h3o's `Covers`
//! containment: every cell the region touches belongs to it, so every point inside the region
//! maps to one of its cells (a centroid-only tiling drops border towns and small islands).
//! Longitudes are normalised into `[-180, 180]` first: h3o's antimeridian handling works on
//! GeoJSON-style input (179 → −179) but breaks on 179 → 181 (docs/dependencies.md "h3o").

use geojson::{GeoJson, GeometryValue};
use h3o::CellIndex;
use h3o::geom::{ContainmentMode, TilerBuilder};

use super::AREA_RESOLUTION;

/// A region that cannot be tiled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegionError {
    /// Not GeoJSON.
    #[error("not valid GeoJSON: {0}")]
    Parse(String),
    /// A geometry other than Polygon or MultiPolygon.
    #[error("{0} geometries are not areas: use Polygon or MultiPolygon")]
    Kind(String),
    /// A position out of range.
    #[error("position [{lon}, {lat}] is out of range: GeoJSON is [lon, lat], lat in [-90, 90]")]
    Position {
        /// Longitude as written.
        lon: String,
        /// Latitude as written.
        lat: String,
    },
    /// A polygon h3o refuses (open ring, too few points, non-finite numbers).
    #[error("invalid polygon: {0}")]
    Invalid(String),
    /// `feature` named no feature of the file.
    #[error("no feature has properties.name = {0:?}")]
    NoFeature(String),
    /// The region yields no cells at all.
    #[error(
        "the region covers no resolution-4 cell (check the [lon, lat] order and the antimeridian)"
    )]
    Empty,
}

/// The regions of one GeoJSON document: `(properties.name, geometry)` per feature (a bare
/// geometry has no name).
#[derive(Debug, Clone)]
pub struct Regions(Vec<(Option<String>, Option<GeometryValue>)>);

impl Regions {
    /// Parses a GeoJSON document.
    ///
    /// # Errors
    /// [`RegionError::Parse`] when it is not GeoJSON.
    pub fn parse(text: &str) -> Result<Self, RegionError> {
        let doc: GeoJson = text
            .parse()
            .map_err(|e: geojson::Error| RegionError::Parse(e.to_string()))?;
        let name_of = |f: &geojson::Feature| -> Option<String> {
            f.property("name")
                .and_then(|v| v.as_str())
                .map(str::to_owned)
        };
        Ok(Regions(match doc {
            GeoJson::Geometry(g) => vec![(None, Some(g.value))],
            GeoJson::Feature(f) => vec![(name_of(&f), f.geometry.map(|g| g.value))],
            GeoJson::FeatureCollection(fc) => fc
                .features
                .into_iter()
                .map(|f| (name_of(&f), f.geometry.map(|g| g.value)))
                .collect(),
        }))
    }
}

/// Tiles the polygons of a GeoJSON document, optionally only the features whose
/// `properties.name` equals `feature`. Returns resolution-4 cells, sorted, without duplicates.
///
/// # Errors
/// [`RegionError`] for unparsable GeoJSON, a non-areal geometry, a position out of range, an
/// invalid polygon, an unmatched `feature`, or a region that covers nothing.
pub fn tile_geojson(text: &str, feature: Option<&str>) -> Result<Vec<CellIndex>, RegionError> {
    tile(&Regions::parse(text)?, feature)
}

/// Tiles parsed regions; see [`tile_geojson`].
///
/// # Errors
/// As [`tile_geojson`].
pub fn tile(regions: &Regions, feature: Option<&str>) -> Result<Vec<CellIndex>, RegionError> {
    let mut geometries: Vec<&GeometryValue> = Vec::new();
    let mut matched = false;
    for (name, geometry) in &regions.0 {
        if feature.is_none_or(|want| name.as_deref() == Some(want)) {
            matched = true;
            geometries.extend(geometry.as_ref());
        }
    }
    if let (Some(want), false) = (feature, matched) {
        return Err(RegionError::NoFeature(want.to_owned()));
    }
    let mut tiler = TilerBuilder::new(AREA_RESOLUTION)
        .containment_mode(ContainmentMode::Covers)
        .build();
    for value in geometries {
        let polygons: Vec<geo_types::Polygon<f64>> = match value {
            GeometryValue::Polygon { .. } => {
                vec![
                    geo_types::Polygon::try_from(value)
                        .map_err(|e| RegionError::Invalid(e.to_string()))?,
                ]
            }
            GeometryValue::MultiPolygon { .. } => {
                geo_types::MultiPolygon::try_from(value)
                    .map_err(|e| RegionError::Invalid(e.to_string()))?
                    .0
            }
            other => return Err(RegionError::Kind(other.type_name().to_owned())),
        };
        for mut polygon in polygons {
            normalise(&mut polygon)?;
            tiler
                .add(polygon)
                .map_err(|e| RegionError::Invalid(e.to_string()))?;
        }
    }
    let mut cells: Vec<CellIndex> = tiler.into_coverage().collect();
    cells.sort_unstable();
    cells.dedup();
    if cells.is_empty() {
        return Err(RegionError::Empty);
    }
    Ok(cells)
}

/// Checks latitudes and brings longitudes into `[-180, 180]`.
fn normalise(polygon: &mut geo_types::Polygon<f64>) -> Result<(), RegionError> {
    let mut bad = None;
    polygon.exterior_mut(|ring| fix_ring(ring, &mut bad));
    polygon.interiors_mut(|rings| {
        for ring in rings {
            fix_ring(ring, &mut bad);
        }
    });
    match bad {
        Some((lon, lat)) => Err(RegionError::Position {
            lon: format!("{lon}"),
            lat: format!("{lat}"),
        }),
        None => Ok(()),
    }
}

fn fix_ring(ring: &mut geo_types::LineString<f64>, bad: &mut Option<(f64, f64)>) {
    for c in &mut ring.0 {
        if !(-90.0..=90.0).contains(&c.y) || !(-540.0..=540.0).contains(&c.x) {
            bad.get_or_insert((c.x, c.y));
            continue;
        }
        while c.x > 180.0 {
            c.x -= 360.0;
        }
        while c.x < -180.0 {
            c.x += 360.0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(lat: f64, lon: f64) -> CellIndex {
        h3o::LatLng::new(lat, lon).unwrap().to_cell(AREA_RESOLUTION)
    }

    #[test]
    fn a_small_island_inside_one_cell_is_still_covered() {
        // A 2 km square: smaller than a resolution-4 cell (~1,770 km²).
        let doc = r#"{"type":"Polygon","coordinates":[[[13.40,52.51],[13.42,52.51],[13.42,52.52],[13.40,52.52],[13.40,52.51]]]}"#;
        let cells = tile_geojson(doc, None).unwrap();
        assert!(cells.contains(&cell(52.515, 13.41)));
    }

    #[test]
    fn longitudes_past_180_are_normalised() {
        let across = r#"{"type":"Polygon","coordinates":[[[179.0,-17.0],[181.0,-17.0],[181.0,-16.0],[179.0,-16.0],[179.0,-17.0]]]}"#;
        let cells = tile_geojson(across, None).unwrap();
        assert!(cells.contains(&cell(-16.5, 179.5)));
        assert!(cells.contains(&cell(-16.5, -179.5)));
        // A box the same size elsewhere gives a similar count: no silent truncation.
        let plain = r#"{"type":"Polygon","coordinates":[[[10.0,-17.0],[12.0,-17.0],[12.0,-16.0],[10.0,-16.0],[10.0,-17.0]]]}"#;
        let n = tile_geojson(plain, None).unwrap().len();
        assert!(cells.len() * 10 >= n * 8, "{} vs {n}", cells.len());
    }

    #[test]
    fn errors() {
        assert!(matches!(
            tile_geojson("{", None),
            Err(RegionError::Parse(_))
        ));
        let point = r#"{"type":"Point","coordinates":[13.4,52.5]}"#;
        assert!(matches!(
            tile_geojson(point, None),
            Err(RegionError::Kind(_))
        ));
        let swapped = r#"{"type":"Polygon","coordinates":[[[52.5,130.4],[52.6,130.4],[52.6,130.5],[52.5,130.4]]]}"#;
        assert!(matches!(
            tile_geojson(swapped, None),
            Err(RegionError::Position { .. })
        ));
        let fc = r#"{"type":"FeatureCollection","features":[{"type":"Feature","properties":{"name":"a"},"geometry":null}]}"#;
        assert!(matches!(
            tile_geojson(fc, Some("b")),
            Err(RegionError::NoFeature(_))
        ));
        assert!(matches!(
            tile_geojson(fc, Some("a")),
            Err(RegionError::Empty)
        ));
    }
}
