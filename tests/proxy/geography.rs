//! Areas drawn as GeoJSON regions, with real geography (Natural Earth country outlines).

use std::path::Path;

use geo::Contains;
use shedgate::policy;

use super::support::*;

fn countries_text() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("data/countries.geojson"))
        .unwrap()
}

/// The outline of one country as geo types.
fn outline(name: &str) -> geo::MultiPolygon<f64> {
    let doc: geojson::FeatureCollection = countries_text().parse().unwrap();
    let f = doc
        .features
        .into_iter()
        .find(|f| f.property("name").and_then(|v| v.as_str()) == Some(name))
        .unwrap();
    let value = f.geometry.unwrap().value;
    match &value {
        geojson::GeometryValue::Polygon { .. } => {
            geo::MultiPolygon(vec![geo::Polygon::try_from(&value).unwrap()])
        }
        _ => geo::MultiPolygon::try_from(&value).unwrap(),
    }
}

/// A policy directory holding countries.geojson and the given areas.toml.
fn country_policy(areas: &str) -> PolicyDir {
    let dir = PolicyDir::new(SEED_STREAMS, Some(areas));
    std::fs::create_dir_all(dir.path().join("areas")).unwrap();
    std::fs::write(dir.path().join("areas/countries.geojson"), countries_text()).unwrap();
    dir
}

/// Uniform points in a bounding box that fall inside `shape`, from a fixed seed.
fn points_inside(shape: &geo::MultiPolygon<f64>, n: usize, seed: u64) -> Vec<(f64, f64)> {
    use geo::BoundingRect;
    let bbox = shape.bounding_rect().unwrap();
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut out = Vec::new();
    while out.len() < n {
        let lon = bbox.min().x + rng.f64() * bbox.width();
        let lat = bbox.min().y + rng.f64() * bbox.height();
        if shape.contains(&geo::Point::new(lon, lat)) {
            out.push((lat, lon));
        }
    }
    out
}

#[test]
fn every_point_inside_germany_gets_germanys_rank() {
    let dir = country_policy(
        "default_rank = 50\n[[areas]]\nname = \"germany\"\nrank = 7\ngeojson = \"areas/countries.geojson\"\nfeature = \"Germany\"\n",
    );
    let p = policy::load_dir(dir.path()).unwrap().policy;
    let germany = outline("Germany");
    for (lat, lon) in points_inside(&germany, 2000, 1).into_iter().chain([
        BERLIN,
        MUNICH,
        (53.55, 9.99),
        (51.15, 14.99),
        (47.56, 7.59),
    ]) {
        let (area, rank) = p.area_at(lat, lon);
        assert_eq!(
            rank.get(),
            7,
            "({lat}, {lon}) inside Germany got rank {rank}"
        );
        assert_eq!(p.area(area.unwrap()).name, "germany");
    }
    // Far outside: the default rank.
    for (lat, lon) in [(30.0, -40.0), (-33.87, 151.21), (40.71, -74.0)] {
        assert_eq!(p.area_at(lat, lon), (None, p.default_rank()));
    }
}

#[test]
fn fiji_on_both_sides_of_the_antimeridian() {
    let dir = country_policy(
        "[[areas]]\nname = \"fiji\"\nrank = 3\ngeojson = \"areas/countries.geojson\"\nfeature = \"Fiji\"\n",
    );
    let p = policy::load_dir(dir.path()).unwrap().policy;
    let fiji = outline("Fiji");
    let points = points_inside(&fiji, 300, 2);
    assert!(
        points.iter().any(|(_, lon)| *lon > 179.0),
        "samples east of 179"
    );
    assert!(
        points.iter().any(|(_, lon)| *lon < -179.0),
        "samples west of -179"
    );
    for (lat, lon) in points {
        assert_eq!(p.area_at(lat, lon).1.get(), 3, "({lat}, {lon}) inside Fiji");
    }
    // Suva, and Taveuni's east coast across the line.
    assert_eq!(p.area_at(-18.14, 178.44).1.get(), 3);
}

#[test]
fn every_country_outline_compiles_as_a_policy() {
    let doc: geojson::FeatureCollection = countries_text().parse().unwrap();
    let mut areas = String::from("default_rank = 50\n");
    for (i, f) in doc.features.iter().enumerate() {
        let name = f.property("name").and_then(|v| v.as_str()).unwrap();
        let label: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '-'
                }
            })
            .collect();
        areas.push_str(&format!(
            "[[areas]]\nname = \"{label}-{i}\"\nrank = {}\ngeojson = \"areas/countries.geojson\"\nfeature = {:?}\n",
            1 + i % 100,
            name
        ));
    }
    let dir = country_policy(&areas);
    let c = policy::load_dir(dir.path()).unwrap();
    assert_eq!(c.policy.areas().len(), doc.features.len());
    assert!(c.policy.areas().iter().all(|a| a.cells > 0));
    // Neighbours share border cells: check reports those overlaps.
    assert!(c.warnings.iter().any(|w| w.message.contains("overlap")));
    // Land covers tens of thousands of resolution-4 cells.
    assert!(c.policy.cell_count() > 50_000, "{}", c.policy.cell_count());
}

#[test]
fn region_errors_are_refused_with_the_area_named() {
    for (areas, expect) in [
        (
            "[[areas]]\nname = \"x\"\nrank = 5\ngeojson = \"areas/countries.geojson\"\nfeature = \"Atlantis\"\n",
            "Atlantis",
        ),
        (
            "[[areas]]\nname = \"x\"\nrank = 5\ngeojson = \"areas/missing.geojson\"\n",
            "missing.geojson",
        ),
        (
            "[[areas]]\nname = \"x\"\nrank = 5\ngeojson = \"../etc/passwd\"\n",
            "inside the policy directory",
        ),
        (
            "[[areas]]\nname = \"x\"\nrank = 5\n",
            "neither cells nor geojson",
        ),
    ] {
        let dir = country_policy(areas);
        let e = policy::load_dir(dir.path()).unwrap_err().to_string();
        assert!(e.contains(expect), "{e}");
        assert!(e.contains("areas.toml"), "{e}");
    }
}

/// Geometry that is not what it says: the issue's ring (an edge wider than 180°, which h3o
/// would read as crossing the antimeridian and tile the Pacific) and a bow tie are refused by
/// `check` with the file, the area's field, the feature and the reason; nothing is tiled.
#[test]
fn geometry_that_is_not_what_it_says_is_refused() {
    for (ring, expect) in [
        (
            "[[-120,-10],[120,-10],[120,10],[-120,10],[-120,-10]]",
            "spans more than 180° of longitude",
        ),
        (
            "[[10,10],[12,12],[12,10],[10,12],[10,10]]",
            "crosses itself",
        ),
    ] {
        let doc = format!(
            r#"{{"type":"FeatureCollection","features":[{{"type":"Feature","properties":{{"name":"band"}},"geometry":{{"type":"Polygon","coordinates":[{ring}]}}}}]}}"#
        );
        let dir =
            country_policy("[[areas]]\nname = \"x\"\nrank = 5\ngeojson = \"areas/band.geojson\"\n");
        std::fs::write(dir.path().join("areas/band.geojson"), doc).unwrap();
        let e = policy::load_dir(dir.path()).unwrap_err().to_string();
        for part in ["areas.toml", "areas[0].geojson", "feature \"band\"", expect] {
            assert!(e.contains(part), "{part:?} missing: {e}");
        }
    }
}

/// Compiling is bounded: a region file over 16 MiB is refused before it is parsed, and
/// region files holding more than 500,000 positions together are refused before they are
/// tiled, with file and field. (A live proxy keeps its last good policy on any refusal:
/// `reload.rs`.)
#[test]
fn oversized_regions_are_refused_before_they_cost_memory() {
    let areas = "[[areas]]\nname = \"x\"\nrank = 5\ngeojson = \"areas/big.geojson\"\n";
    let dir = country_policy(areas);
    let padded = format!(
        r#"{{"type":"Polygon","coordinates":[[[0,0],[1,0],[1,1],[0,0]]]{}}}"#,
        " ".repeat(policy::MAX_REGION_FILE_BYTES)
    );
    std::fs::write(dir.path().join("areas/big.geojson"), padded).unwrap();
    let e = policy::load_dir(dir.path()).unwrap_err().to_string();
    assert!(
        e.contains("areas[0].geojson") && e.contains("16 MiB"),
        "{e}"
    );
    // A ring of 500,001 positions (an 11 MB file).
    let n = u32::try_from(policy::MAX_REGION_POSITIONS).unwrap();
    let mut ring: Vec<String> = (0..n)
        .map(|i| {
            let a = std::f64::consts::TAU * f64::from(i) / f64::from(n);
            format!("[{:.6},{:.6}]", 10.0 + 4.0 * a.cos(), 51.0 + 3.0 * a.sin())
        })
        .collect();
    ring.push(ring[0].clone());
    let doc = format!(
        r#"{{"type":"Polygon","coordinates":[[{}]]}}"#,
        ring.join(",")
    );
    std::fs::write(dir.path().join("areas/big.geojson"), doc).unwrap();
    let e = policy::load_dir(dir.path()).unwrap_err().to_string();
    assert!(
        e.contains("areas[0].geojson") && e.contains("500000"),
        "{e}"
    );
}

/// pygeoapi#2010, gdal PR #3311: a region file whose `crs` names EPSG:4326 holds `[lat, lon]`
/// and passed `check` and live reload, moving Berlin into the Gulf of Aden. Now `check`
/// refuses it with the file, the feature and the advice to write `[lon, lat]`, and a live
/// proxy keeps its policy.
#[tokio::test]
async fn a_region_file_naming_another_crs_is_refused_and_the_live_policy_stays() {
    let berlin_lat_lon = r#"{"type":"FeatureCollection","crs":{"type":"name","properties":{"name":"urn:ogc:def:crs:EPSG::4326"}},
        "features":[{"type":"Feature","properties":{"name":"Berlin"},"geometry":{"type":"Polygon",
        "coordinates":[[[52.3,13.1],[52.3,13.8],[52.7,13.8],[52.7,13.1],[52.3,13.1]]]}}]}"#;
    let areas =
        "default_rank = 50\n[[areas]]\nname = \"berlin\"\nrank = 5\ngeojson = \"berlin.geojson\"\n";
    let dir = PolicyDir::new(SEED_STREAMS, Some(BERLIN_AREA));
    let upstream = MockUpstream::start().await;
    let proxy = spawn_proxy(&upstream.url(), dir.path()).await;
    let live = admin_get(&proxy, "/policy").await.json()["version"].clone();
    std::fs::write(dir.path().join("berlin.geojson"), berlin_lat_lon).unwrap();
    std::fs::write(dir.path().join("areas.toml"), areas).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shedgate"))
        .arg("check")
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    for part in ["berlin.geojson", "the file", "EPSG::4326", "[lon, lat]"] {
        assert!(err.contains(part), "{part} in {err}");
    }
    let reload = http::Request::post(format!("http://{}/reload", proxy.admin_addr))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    assert_eq!(send(reload).await.status, 422);
    assert_eq!(admin_get(&proxy, "/policy").await.json()["version"], live);
    // Written as RFC 7946 says, without the member, the same file is Berlin.
    let fixed = berlin_lat_lon
        .replace(
            r#""crs":{"type":"name","properties":{"name":"urn:ogc:def:crs:EPSG::4326"}},"#,
            "",
        )
        .replace("[52.3,13.1]", "[13.1,52.3]")
        .replace("[52.3,13.8]", "[13.8,52.3]")
        .replace("[52.7,13.8]", "[13.8,52.7]")
        .replace("[52.7,13.1]", "[13.1,52.7]");
    std::fs::write(dir.path().join("berlin.geojson"), fixed).unwrap();
    let policy = policy::load_dir(dir.path()).unwrap().policy;
    let (_, rank) = policy.area_at(52.52, 13.405);
    assert_eq!(rank.get(), 5);
}

/// Event bodies are read the same way: a `crs` other than CRS84 on a Feature, its geometry or
/// a FeatureCollection makes the coordinates unreadable (counted; the default rank), never
/// read as `[lon, lat]`; a position with a third and fourth element is lon, lat.
#[tokio::test]
async fn event_bodies_naming_another_crs_have_no_readable_coordinates() {
    let upstream = MockUpstream::start().await;
    let proxy = spawn_proxy(&upstream.url(), &cases_policy()).await;
    pin(&proxy, 0.75).await;
    let now = now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let epsg = r#"{"type":"name","properties":{"name":"EPSG:4326"}}"#;
    let send_body = |body: String| {
        let url = format!("http://{}/ingest/geojson", proxy.proxy_addr);
        async move {
            let req = http::Request::post(url)
                .header("x-stream", "sensor.reading")
                .header("content-type", "application/geo+json")
                .body(http_body_util::Full::new(bytes::Bytes::from(body)))
                .unwrap();
            send(req).await
        }
    };
    // Berlin written [lon, lat] beside a crs that says otherwise: not believed either way.
    let feature = |crs_at_feature: &str, crs_at_geometry: &str, position: &str| {
        format!(
            r#"{{"type":"Feature"{crs_at_feature},"geometry":{{"type":"Point"{crs_at_geometry},"coordinates":{position}}},"properties":{{"time":"{now}"}}}}"#
        )
    };
    let on_feature = feature(&format!(r#","crs":{epsg}"#), "", "[13.405,52.52]");
    let on_geometry = feature("", &format!(r#","crs":{epsg}"#), "[13.405,52.52]");
    let collection = format!(
        r#"{{"type":"FeatureCollection","crs":{epsg},"features":[{}]}}"#,
        feature("", "", "[13.405,52.52]")
    );
    for body in [on_feature, on_geometry, collection] {
        let a = send_body(body.clone()).await;
        assert_eq!(a.status, 503, "{body}");
        assert_eq!(a.json()["rank"], 50, "{body}");
    }
    let unreadable = metric(
        &scrape(&proxy).await,
        "shedgate_unreadable_facts_total",
        &[("fact", "coordinates")],
    );
    assert_eq!(unreadable, 3.0);
    // Altitude and a measure after [lon, lat]: Berlin, rank 5, kept at 0.75.
    let a = send_body(feature("", "", "[13.405,52.52,34.5,7]")).await;
    assert_eq!(a.status, 200);
    // So is a CRS84 name.
    let crs84 = r#"{"type":"name","properties":{"name":"urn:ogc:def:crs:OGC:1.3:CRS84"}}"#;
    let a = send_body(feature(&format!(r#","crs":{crs84}"#), "", "[13.405,52.52]")).await;
    assert_eq!(a.status, 200);
}
