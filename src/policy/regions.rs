//! Region files within bounds: read at most [`MAX_REGION_FILE_BYTES`] each, parsed once, and
//! counted against [`MAX_REGION_POSITIONS`] before any tiling time is spent.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use super::{Location, PolicyError, geo};

/// Largest region file, bytes (16 MiB): refused before it is parsed.
pub const MAX_REGION_FILE_BYTES: usize = 16 << 20;

/// Most positions all the region files of a policy may hold together (500,000). Compiling
/// costs about 180 bytes and 6 µs per position at its peak (measured on the 2-core build
/// machine: a 500,000-position outline peaks at 100 MiB and takes 2.8 s in `shedgate check`,
/// release build; 1.2 million took 263 MiB and 8.1 s), so a policy at the limit compiles
/// beside a running proxy within the 256 Mi of our own Kubernetes manifest. A policy over it
/// is refused, and a live proxy keeps its last good policy.
pub const MAX_REGION_POSITIONS: usize = 500_000;

/// Reads a region file, at most [`MAX_REGION_FILE_BYTES`] of it: a larger file is refused
/// before it is held in memory.
pub(super) fn read_region(path: &Path) -> Result<String, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let limit = u64::try_from(MAX_REGION_FILE_BYTES).unwrap_or(u64::MAX);
    let mut text = String::new();
    file.take(limit + 1)
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    if text.len() > MAX_REGION_FILE_BYTES {
        return Err(format!(
            "over the limit of {MAX_REGION_FILE_BYTES} bytes (16 MiB) for one region file: \
             simplify the outline"
        ));
    }
    Ok(text)
}

/// Parses every region file the areas name, once each, within [`MAX_REGION_FILE_BYTES`] per
/// file and [`MAX_REGION_POSITIONS`] per policy, both for the positions the files hold and
/// for the positions the areas will tile (a file tiled by many areas counts each time).
/// `regions` are the policy's region files as its source holds them (`PolicyFiles`): relative
/// path → contents, or the read error. Returns the parsed files by path and the positions
/// they hold.
pub(super) fn parse_regions(
    regions: &BTreeMap<String, Result<String, String>>,
    areas: &[super::file::AreaSection],
    areas_path: &Path,
) -> Result<(HashMap<String, geo::Regions>, usize), PolicyError> {
    let mut parsed: HashMap<String, geo::Regions> = HashMap::new();
    let (mut held, mut tiled) = (0usize, 0usize);
    let over_limit = |what: &str| {
        format!(
            "the areas {what} more than {MAX_REGION_POSITIONS} region positions together, the \
             limit per policy (compiling costs about 180 bytes and 6 µs per position): simplify \
             the outlines"
        )
    };
    for (i, a) in areas.iter().enumerate() {
        let Some(path) = &a.geojson else { continue };
        let refuse = |message: String| PolicyError {
            location: Location {
                file: areas_path.to_owned(),
                line_col: None,
                field: Some(format!("areas[{i}].geojson")),
            },
            message: format!("{}: {message}", path.0),
        };
        if !parsed.contains_key(&path.0) {
            let text = match regions.get(&path.0) {
                Some(Ok(text)) => text,
                Some(Err(e)) => return Err(refuse(format!("cannot read: {e}"))),
                None => return Err(refuse("not read".into())),
            };
            // `PolicyFiles::read` stops reading past the limit; text given otherwise is
            // checked here.
            if text.len() > MAX_REGION_FILE_BYTES {
                return Err(refuse(format!(
                    "{} bytes, over the limit of {MAX_REGION_FILE_BYTES} bytes (16 MiB) for one \
                     region file: simplify the outline",
                    text.len()
                )));
            }
            let (regions, used) =
                geo::Regions::parse(text, MAX_REGION_POSITIONS - held).map_err(|err| {
                    refuse(match err {
                        geo::RegionError::TooManyPositions => over_limit("hold"),
                        err => err.to_string(),
                    })
                })?;
            held += used;
            parsed.insert(path.0.clone(), regions);
        }
        tiled += parsed[&path.0].positions(a.feature.as_deref());
        if tiled > MAX_REGION_POSITIONS {
            return Err(refuse(over_limit("tile")));
        }
    }
    Ok((parsed, held))
}
