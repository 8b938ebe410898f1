//! Where a policy's areas may be: a grid of one degree of latitude by one of longitude,
//! marking every square that one of the areas' resolution-4 cells reaches into. A point in an
//! unmarked square is in no area (its rank is the default) without its H3 cell computed:
//! h3o's `LatLng::to_cell` costs 2,780 instructions on the harness's body (callgrind,
//! `scripts/instructions.sh`), the grid's look-up about 20.
//!
//! Built from each cell's vertices (h3o's `CellIndex::boundary`). A cell's edges are
//! great-circle arcs: between two vertices an arc keeps to the vertices' longitudes (it
//! crosses no pole) and bows past their latitudes by less than a thousandth of a degree at
//! resolution 4 below 80 degrees, so a small margin in latitude covers it. A cell that spans
//! more than half the longitudes between its vertices (across the antimeridian, or around a
//! pole) and one beyond 80 degrees mark every longitude of their rows, up to the pole.

use h3o::CellIndex;

/// Rows: one per degree of latitude, from -90.
const ROWS: usize = 180;
/// Columns: one per degree of longitude, from -180.
const COLS: usize = 360;
/// Degrees added around a cell's vertices: an edge's bow (see the module docs) and rounding.
const MARGIN: f64 = 0.01;
/// Beyond this latitude (north or south) a cell's rows are marked at every longitude, up to
/// the pole.
const POLAR: f64 = 80.0;

/// The squares of the grid that the areas' cells reach into (one bit each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coverage {
    squares: Box<[u64]>,
}

impl Coverage {
    /// The grid of `cells`: resolution 4 or finer (the margin covers an edge's bow only
    /// there; at resolutions 0 to 2 an edge bows up to about 0.2 degrees).
    pub fn of(cells: impl IntoIterator<Item = CellIndex>) -> Self {
        let mut squares = vec![0u64; (ROWS * COLS).div_ceil(64)].into_boxed_slice();
        for cell in cells {
            let (mut south, mut north, mut west, mut east) = (90f64, -90f64, 180f64, -180f64);
            for vertex in cell.boundary().iter() {
                south = south.min(vertex.lat());
                north = north.max(vertex.lat());
                west = west.min(vertex.lng());
                east = east.max(vertex.lng());
            }
            let every_longitude = east - west > 180.0 || north > POLAR || south < -POLAR;
            let north = if north > POLAR { 90.0 } else { north + MARGIN };
            let south = if south < -POLAR {
                -90.0
            } else {
                south - MARGIN
            };
            let (west, east) = if every_longitude {
                (-180.0, 180.0)
            } else {
                (west - MARGIN, east + MARGIN)
            };
            for row in row(south)..=row(north) {
                for col in col(west)..=col(east) {
                    let bit = row * COLS + col;
                    squares[bit / 64] |= 1 << (bit % 64);
                }
            }
        }
        Coverage { squares }
    }

    /// Whether a point (degrees, in range) may be in one of the cells: `false` means in none.
    #[inline]
    pub fn may_hold(&self, lat: f64, lon: f64) -> bool {
        let bit = row(lat) * COLS + col(lon);
        self.squares
            .get(bit / 64)
            .is_some_and(|word| word >> (bit % 64) & 1 == 1)
    }
}

/// The row of a latitude (degrees; clamped to the grid).
#[inline]
fn row(lat: f64) -> usize {
    square(lat + 90.0, ROWS)
}

/// The column of a longitude (degrees; clamped to the grid).
#[inline]
fn col(lon: f64) -> usize {
    square(lon + 180.0, COLS)
}

/// `degrees` from the grid's edge as a square's index, below `len`.
#[inline]
fn square(degrees: f64, len: usize) -> usize {
    #[expect(
        clippy::cast_possible_truncation,
        reason = "saturates; clamped below `len`"
    )]
    #[expect(clippy::cast_sign_loss, reason = "saturates: below 0 (and NaN) is 0")]
    let index = degrees as usize;
    index.min(len - 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use h3o::{LatLng, Resolution};

    /// Every point whose cell is one of the cells lies in a marked square, at the cells'
    /// vertices, centres and along their edges, the antimeridian and the poles included.
    #[test]
    fn every_point_of_a_cell_is_in_a_marked_square() {
        let places = [
            (52.52, 13.405),
            (0.0, 180.0),
            (0.0, -179.99),
            (-16.5, 179.9),
            (89.99, 0.0),
            (-89.99, 45.0),
            (84.0, -100.0),
            (0.0, 0.0),
            (-33.87, 151.21),
        ];
        for (lat, lon) in places {
            let home = LatLng::new(lat, lon).unwrap().to_cell(Resolution::Four);
            let cells: Vec<CellIndex> = home.grid_disk(1);
            let coverage = Coverage::of(cells.iter().copied());
            for &cell in &cells {
                let boundary = cell.boundary();
                let centre = LatLng::from(cell);
                for (i, a) in boundary.iter().enumerate() {
                    let b = boundary[(i + 1) % boundary.len()];
                    // Along the edge, and a little inside it towards the centre.
                    for step in 0..=20 {
                        let t = f64::from(step) / 20.0;
                        for inward in [0.0, 1e-6, 0.01, 0.5] {
                            let lat = a.lat() + (b.lat() - a.lat()) * t;
                            let mut dlon = b.lng() - a.lng();
                            if dlon.abs() > 180.0 {
                                dlon -= 360.0 * dlon.signum();
                            }
                            let lon = a.lng() + dlon * t;
                            let lat = lat + (centre.lat() - lat) * inward;
                            let lon = lon + (centre.lng() - lon) * inward;
                            let lon = if lon > 180.0 { lon - 360.0 } else { lon };
                            let lon = if lon < -180.0 { lon + 360.0 } else { lon };
                            let Ok(point) = LatLng::new(lat, lon) else {
                                continue;
                            };
                            if cells.contains(&point.to_cell(Resolution::Four)) {
                                assert!(coverage.may_hold(lat, lon), "({lat}, {lon}) near {cell}");
                            }
                        }
                    }
                }
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// A point whose cell is one of the cells around a place is never in an unmarked
        /// square, anywhere on the globe.
        #[test]
        fn no_point_of_the_cells_is_left_out(
            lat in -90.0f64..=90.0,
            lon in -180.0f64..=180.0,
            dlat in -0.6f64..0.6,
            dlon in -0.6f64..0.6,
        ) {
            let home = LatLng::new(lat, lon).unwrap().to_cell(Resolution::Four);
            let cells: Vec<CellIndex> = home.grid_disk(2);
            let coverage = Coverage::of(cells.iter().copied());
            let (plat, plon) = ((lat + dlat).clamp(-90.0, 90.0), lon + dlon);
            let plon = if plon > 180.0 {
                plon - 360.0
            } else if plon < -180.0 {
                plon + 360.0
            } else {
                plon
            };
            let point = LatLng::new(plat, plon).unwrap().to_cell(Resolution::Four);
            if cells.contains(&point) {
                proptest::prop_assert!(
                    coverage.may_hold(plat, plon),
                    "({}, {}) in {}",
                    plat,
                    plon,
                    point
                );
            }
        }
    }

    #[test]
    fn a_point_far_from_every_cell_is_in_an_unmarked_square() {
        let berlin = LatLng::new(52.52, 13.405)
            .unwrap()
            .to_cell(Resolution::Three);
        let coverage = Coverage::of(berlin.children(Resolution::Four));
        assert!(coverage.may_hold(52.52, 13.405));
        // Munich, Tokyo, the antimeridian, the poles.
        assert!(!coverage.may_hold(48.1372, 11.5756));
        assert!(!coverage.may_hold(35.68, 139.69));
        assert!(!coverage.may_hold(0.0, 180.0));
        assert!(!coverage.may_hold(90.0, 0.0));
        assert!(!coverage.may_hold(-90.0, 0.0));
        assert!(!Coverage::of([]).may_hold(52.52, 13.405));
    }
}
