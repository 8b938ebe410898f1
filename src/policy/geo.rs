//! GeoJSON regions tiled to resolution-4 cells (docs/decision.md "Areas").
//!
//! Input: RFC 7946 GeoJSON — a Geometry, a Feature or a FeatureCollection — of Polygons and
//! MultiPolygons in `[lon, lat]` order. Every polygon is tiled with h3o's `Covers`
//! containment: every cell the region touches belongs to it, so every point inside the region
//! maps to one of its cells (a centroid-only tiling drops border towns and small islands).
//! Longitudes are normalised into `[-180, 180]` first: h3o's antimeridian handling works on
//! GeoJSON-style input (179 → −179) but breaks on 179 → 181 (docs/dependencies.md "h3o").
//!
//! Geometry that is not what it says is refused, naming the feature:
//! - an edge spanning more than 180° of longitude whose ends are not both near the
//!   antimeridian (h3o reads such an edge as crossing it, the short way, and would tile the
//!   other side of the globe: `[-120,-10] → [120,-10]` covers the Pacific, not Africa);
//!   near the antimeridian it is read as a crossing, with a warning (RFC 7946 section 3.1.9
//!   asks writers to split such polygons);
//! - a ring that crosses itself (geo's sweep-line segment intersections).
//!
//! And a warning when the tiled cells' area is far from the polygons' own (spherical) area,
//! which no valid reading produces.

use h3o::CellIndex;
use h3o::geom::{ContainmentMode, TilerBuilder};

use super::AREA_RESOLUTION;
use super::region_file::{self, Geometry, Region};

/// A region that cannot be tiled.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
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
    /// An edge wider than 180° of longitude away from the antimeridian.
    #[error(
        "feature {feature}: the edge [{from_lon}, {lat}] → [{to_lon}, {lat2}] spans more than 180° of longitude; it would be read as crossing the antimeridian and tile the other side of the globe: split the polygon so that no edge spans more than 180° (RFC 7946 section 3.1.9)"
    )]
    WideEdge {
        /// The feature (`properties.name`, else its index in the file).
        feature: String,
        /// Longitude of the edge's start.
        from_lon: f64,
        /// Latitude of the edge's start.
        lat: f64,
        /// Longitude of the edge's end.
        to_lon: f64,
        /// Latitude of the edge's end.
        lat2: f64,
    },
    /// More positions than the policy's limit allows (the parse stopped there).
    #[error("more positions than the policy's limit allows")]
    TooManyPositions,
    /// A ring that crosses itself.
    #[error("feature {0}: a ring crosses itself, so its inside is not defined")]
    SelfIntersecting(String),
    /// The region yields no cells at all.
    #[error(
        "the region covers no resolution-4 cell (check the [lon, lat] order and the antimeridian)"
    )]
    Empty,
}

/// The regions of one GeoJSON document: `(properties.name, geometry)` per feature (a bare
/// geometry has no name), read lean (see `region_file.rs`).
#[derive(Debug, Clone)]
pub struct Regions(Vec<Region>);

impl Regions {
    /// Parses a GeoJSON document of at most `budget` positions; returns it and the positions
    /// it holds.
    ///
    /// # Errors
    /// [`RegionError::Parse`] when it is not GeoJSON of the forms areas read;
    /// [`RegionError::TooManyPositions`] past `budget` (the parse stops there).
    pub fn parse(text: &str, budget: usize) -> Result<(Self, usize), RegionError> {
        match region_file::parse(text, budget) {
            Ok((regions, used)) => Ok((Regions(regions), used)),
            Err(region_file::ReadError::Invalid(why)) => Err(RegionError::Parse(why)),
            Err(region_file::ReadError::OverBudget) => Err(RegionError::TooManyPositions),
        }
    }

    /// The regions `feature` selects (all without one), with their index in the file.
    fn selected<'a>(
        &'a self,
        feature: Option<&'a str>,
    ) -> impl Iterator<Item = (usize, &'a Region)> {
        self.0
            .iter()
            .enumerate()
            .filter(move |(_, r)| feature.is_none_or(|want| r.name.as_deref() == Some(want)))
    }

    /// Positions in the rings of the features `feature` selects (all without one): what
    /// tiling them costs.
    pub fn positions(&self, feature: Option<&str>) -> usize {
        self.selected(feature)
            .filter_map(|(_, r)| match &r.geometry {
                Some(Geometry::Polygons(ps)) => Some(ps),
                _ => None,
            })
            .flatten()
            .map(|p| p.exterior().0.len() + p.interiors().iter().map(|r| r.0.len()).sum::<usize>())
            .sum()
    }
}

/// Cells of a region, and what looked wrong but can be legitimate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tiled {
    /// Resolution-4 cells, sorted, without duplicates.
    pub cells: Vec<CellIndex>,
    /// Warnings, each naming its feature.
    pub warnings: Vec<String>,
}

/// Tiles the polygons of a GeoJSON document, optionally only the features whose
/// `properties.name` equals `feature`. Returns resolution-4 cells, sorted, without duplicates.
///
/// # Errors
/// [`RegionError`] for unparsable GeoJSON, a non-areal geometry, a position out of range, an
/// invalid polygon, an edge wider than 180° away from the antimeridian, a ring that crosses
/// itself, an unmatched `feature`, or a region that covers nothing.
pub fn tile_geojson(text: &str, feature: Option<&str>) -> Result<Vec<CellIndex>, RegionError> {
    tile(&Regions::parse(text, usize::MAX)?.0, feature).map(|t| t.cells)
}

/// Longest ring checked for crossing itself, positions: geo's sweep compares every pair of
/// segments whose longitude ranges overlap, quadratic for a comb-shaped ring, so longer
/// rings are tiled unchecked, with a warning. (Every country outline of
/// `data/countries.geojson` is far below it.)
const MAX_CHECKED_RING: usize = 20_000;

/// Longitude within which both ends of an edge wider than 180° read as an antimeridian
/// crossing: 30° of it.
const NEAR_ANTIMERIDIAN: f64 = 150.0;

/// Tiles parsed regions; see [`tile_geojson`].
///
/// # Errors
/// As [`tile_geojson`].
pub fn tile(regions: &Regions, feature: Option<&str>) -> Result<Tiled, RegionError> {
    let mut geometries: Vec<(String, &Geometry)> = Vec::new();
    let mut matched = false;
    for (i, region) in regions.selected(feature) {
        matched = true;
        let label = region
            .name
            .as_ref()
            .map_or_else(|| format!("#{i}"), |n| format!("{n:?}"));
        geometries.extend(region.geometry.as_ref().map(|g| (label, g)));
    }
    if let (Some(want), false) = (feature, matched) {
        return Err(RegionError::NoFeature(want.to_owned()));
    }
    let mut warnings = Vec::new();
    let mut tiler = TilerBuilder::new(AREA_RESOLUTION)
        .containment_mode(ContainmentMode::Covers)
        .build();
    let mut own_area_km2 = Some(0.0);
    for (label, value) in geometries {
        let polygons = match value {
            Geometry::Polygons(polygons) => polygons,
            Geometry::Other(kind) => return Err(RegionError::Kind(kind.clone())),
        };
        for polygon in polygons {
            let mut polygon = polygon.clone();
            check_edges(&polygon, &label, &mut warnings)?;
            // As h3o reads the edges: for the crossing check and the area, unwrapped once
            // (kept as open lines: a ring around a pole does not close once unwrapped).
            let rings: Vec<geo_types::LineString<f64>> = std::iter::once(polygon.exterior())
                .chain(polygon.interiors())
                .map(unwrapped)
                .collect();
            let longest = std::iter::once(polygon.exterior())
                .chain(polygon.interiors())
                .map(|r| r.0.len())
                .max()
                .unwrap_or(0);
            if longest > MAX_CHECKED_RING {
                warnings.push(format!(
                    "feature {label}: a ring of {longest} positions is not checked for crossing \
                     itself (only rings of up to {MAX_CHECKED_RING} are)"
                ));
            } else if crosses_itself(&rings) {
                return Err(RegionError::SelfIntersecting(label));
            }
            normalise(&mut polygon)?;
            own_area_km2 = own_area_km2
                .zip(spherical_area_km2(rings))
                .map(|(a, b)| a + b);
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
    let tiled_km2: f64 = cells.iter().map(|c| c.area_km2()).sum();
    // `Covers` tiling is never smaller than the region; a region many cells large is not many
    // times smaller than its tiling either.
    if let Some(own_area_km2) = own_area_km2
        && (tiled_km2 < own_area_km2 * 0.9
            || (own_area_km2 > 20.0 * 1770.0 && tiled_km2 > own_area_km2 * 3.0))
    {
        warnings.push(format!(
            "the tiled cells cover {tiled_km2:.0} km² but the polygons enclose {own_area_km2:.0} km²: check the ring order, the [lon, lat] order and the antimeridian"
        ));
    }
    Ok(Tiled { cells, warnings })
}

/// Refuses an edge wider than 180° of longitude unless both its ends are near the
/// antimeridian (then it is read as a crossing, with a warning). Longitudes as written.
fn check_edges(
    polygon: &geo_types::Polygon<f64>,
    label: &str,
    warnings: &mut Vec<String>,
) -> Result<(), RegionError> {
    let mut crossing = false;
    for ring in std::iter::once(polygon.exterior()).chain(polygon.interiors()) {
        for line in ring.lines() {
            let (a, b) = (line.start, line.end);
            if (b.x - a.x).abs() <= 180.0 {
                continue;
            }
            if a.x.abs() >= NEAR_ANTIMERIDIAN && b.x.abs() >= NEAR_ANTIMERIDIAN {
                crossing = true;
                continue;
            }
            return Err(RegionError::WideEdge {
                feature: label.to_owned(),
                from_lon: a.x,
                lat: a.y,
                to_lon: b.x,
                lat2: b.y,
            });
        }
    }
    if crossing {
        warnings.push(format!(
            "feature {label}: an edge crosses the antimeridian and is read so; RFC 7946 section 3.1.9 asks for such polygons to be split at ±180°"
        ));
    }
    Ok(())
}

/// Whether one of a polygon's `rings` (longitudes unwrapped, see [`unwrapped`]: a ring across the
/// antimeridian is checked as h3o reads it, and a ring around a pole stays open, its coast
/// checked as a line) crosses itself: two of its segments cross at a point inside both
/// (geo's sweep-line `Intersections`). Rings that only touch themselves at a vertex, or
/// run back along a segment (spikes, common in real outlines such as Natural Earth's
/// Antarctica), still have a defined inside and are kept.
fn crosses_itself(rings: &[geo_types::LineString<f64>]) -> bool {
    use geo::algorithm::sweep::Intersections;
    use geo::line_intersection::LineIntersection;
    rings.iter().any(|ring| {
        Intersections::from_iter(ring.lines().map(Segment)).any(|(_, _, hit)| {
            matches!(
                hit,
                LineIntersection::SinglePoint {
                    is_proper: true,
                    ..
                }
            )
        })
    })
}

/// A ring segment, for [`crosses_itself`].
#[derive(Debug, Clone, Copy)]
struct Segment(geo_types::Line<f64>);

impl geo::algorithm::sweep::Cross for Segment {
    type Scalar = f64;

    fn line(&self) -> geo_types::Line<f64> {
        self.0
    }
}

/// The polygon's area on a sphere, km² (Chamberlain and Duquette, "Some algorithms for
/// polygons on a sphere", JPL 2007, via geo).
/// The rings (exterior first) have their longitudes unwrapped (each step taken the short
/// way, as h3o reads an edge), so a ring across the antimeridian is measured as the region
/// h3o tiles; `None` for a ring around a pole.
fn spherical_area_km2(rings: Vec<geo_types::LineString<f64>>) -> Option<f64> {
    use geo::ChamberlainDuquetteArea;
    let mut rings = rings.into_iter();
    let exterior = rings.next()?;
    // A ring around a pole does not close once unwrapped: its area is not the ring's.
    if exterior.0.first() != exterior.0.last() {
        return None;
    }
    let polygon = geo_types::Polygon::new(exterior, rings.collect());
    Some(polygon.chamberlain_duquette_unsigned_area() / 1e6)
}

/// `ring` with each longitude step taken the short way (at most 180°), as h3o reads an edge.
fn unwrapped(ring: &geo_types::LineString<f64>) -> geo_types::LineString<f64> {
    let mut out = ring.clone();
    for i in 1..out.0.len() {
        let prev = out.0[i - 1].x;
        let mut x = out.0[i].x;
        while x - prev > 180.0 {
            x -= 360.0;
        }
        while prev - x > 180.0 {
            x += 360.0;
        }
        out.0[i].x = x;
    }
    out
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
    fn geometry_that_is_not_what_it_says_is_refused_or_warned_about() {
        let poly = |ring: &str| {
            format!(
                r#"{{"type":"Feature","properties":{{"name":"band"}},"geometry":{{"type":"Polygon","coordinates":[{ring}]}}}}"#
            )
        };
        // The issue's ring: a 240° band across Greenwich, which h3o would read as the Pacific.
        let wide = poly("[[-120,-10],[120,-10],[120,10],[-120,10],[-120,-10]]");
        let e = tile(&Regions::parse(&wide, usize::MAX).unwrap().0, None).unwrap_err();
        assert!(
            matches!(&e, RegionError::WideEdge { feature, .. } if feature == "\"band\""),
            "{e}"
        );
        assert!(e.to_string().contains("RFC 7946"), "{e}");
        // Written across the antimeridian GeoJSON-style: read as a crossing, with a warning.
        let fiji = poly("[[179,-17],[-179,-17],[-179,-16],[179,-16],[179,-17]]");
        let t = tile(&Regions::parse(&fiji, usize::MAX).unwrap().0, None).unwrap();
        assert!(t.cells.contains(&cell(-16.5, 179.5)) && t.cells.contains(&cell(-16.5, -179.5)));
        assert_eq!(t.warnings.len(), 1, "{:?}", t.warnings);
        assert!(t.warnings[0].contains("antimeridian"), "{:?}", t.warnings);
        assert!(
            t.cells.len() < 100,
            "not the whole globe: {}",
            t.cells.len()
        );
        // A bow tie crosses itself.
        let bowtie = poly("[[10,10],[12,12],[12,10],[10,12],[10,10]]");
        assert!(matches!(
            tile(&Regions::parse(&bowtie, usize::MAX).unwrap().0, None),
            Err(RegionError::SelfIntersecting(f)) if f == "\"band\""
        ));
        // A plain box: no warning.
        let plain = poly("[[10,10],[12,10],[12,12],[10,12],[10,10]]");
        let t = tile(&Regions::parse(&plain, usize::MAX).unwrap().0, None).unwrap();
        assert!(t.warnings.is_empty(), "{:?}", t.warnings);
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
