//! The demo's real geography: GeoNames cities weighted by population, and a sample of rural
//! places (`data/`, CC BY 4.0), and weighted picks from them.

/// GeoNames cities with 15,000+ inhabitants (CC BY 4.0): `geonameid,name,country,lat,lon,population`.
pub const CITIES_CSV: &str = include_str!("../../data/cities15000.csv");
/// A fixed sample of GeoNames places under 2,000 inhabitants (CC BY 4.0), same columns.
pub const SMALL_PLACES_CSV: &str = include_str!("../../data/small-places.csv");

/// A place events come from.
#[derive(Debug, Clone)]
pub struct Place {
    /// Name.
    pub name: String,
    /// Latitude, degrees.
    pub lat: f64,
    /// Longitude, degrees.
    pub lon: f64,
    /// Inhabitants.
    pub population: u64,
}

/// Parses the GeoNames CSV extract (`geonameid,name,country,lat,lon,population`).
pub fn parse_places(csv: &str) -> Vec<Place> {
    csv.lines()
        .skip(1)
        .filter_map(|line| {
            // Names may hold commas inside quotes; the numeric columns are the last three.
            let mut cols = line.rsplitn(4, ',');
            let population = cols.next()?.trim().parse().ok()?;
            let lon = cols.next()?.trim().parse().ok()?;
            let lat = cols.next()?.trim().parse().ok()?;
            let rest = cols.next()?;
            let name = rest.split_once(',').map_or(rest, |(_, n)| n);
            let name = name
                .rsplit_once(',')
                .map_or(name, |(n, _)| n)
                .trim_matches('"');
            Some(Place {
                name: name.to_owned(),
                lat,
                lon,
                population,
            })
        })
        .collect()
}

/// The embedded geography: cities weighted by population, and rural places.
#[derive(Debug, Clone)]
pub struct Geography {
    cities: Vec<Place>,
    rural: Vec<Place>,
    /// Running population totals of `cities`, for weighted picks.
    cumulative: Vec<u64>,
}

impl Geography {
    /// Parses the embedded GeoNames extracts.
    pub fn embedded() -> Self {
        let cities = parse_places(CITIES_CSV);
        let mut total = 0u64;
        let cumulative = cities
            .iter()
            .map(|c| {
                total += c.population;
                total
            })
            .collect();
        Geography {
            cities,
            rural: parse_places(SMALL_PLACES_CSV),
            cumulative,
        }
    }

    /// A place: with probability `rural_share` a rural place (uniformly), else a city with
    /// probability proportional to its population. Returns the place and whether it is rural.
    pub fn pick(&self, rng: &mut fastrand::Rng, rural_share: f64) -> (&Place, bool) {
        if rng.f64() < rural_share {
            return (&self.rural[rng.usize(..self.rural.len())], true);
        }
        let total = self.cumulative.last().copied().unwrap_or(1).max(1);
        let target = rng.u64(..total);
        let i = self.cumulative.partition_point(|&c| c <= target);
        (&self.cities[i.min(self.cities.len() - 1)], false)
    }
}

/// A stream name drawn from a mix of `(name, share)` (shares summing to about 1; the first
/// stream takes any rest).
pub fn pick_stream<'a>(rng: &mut fastrand::Rng, mix: &[(&'a str, f64)]) -> &'a str {
    let mut pick = rng.f64();
    for (name, share) in mix {
        if pick < *share {
            return name;
        }
        pick -= share;
    }
    mix[0].0
}
