//! The policy's source: the raw contents of a policy directory, read from disk or given by
//! name, and the version hashed from them.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::error::io_error;
use super::file::AreasFile;
use super::{AREAS_FILE, PolicyError, STREAMS_FILE};

/// The raw contents of a policy directory: the two TOML files and every region file
/// `areas.toml` refers to. Its [`PolicyFiles::version`] is the policy's version, so a reload
/// can tell "unchanged" without compiling (tiling regions can take a while).
#[derive(Debug, Clone)]
pub struct PolicyFiles {
    pub(super) dir: PathBuf,
    pub(super) streams: String,
    pub(super) areas: Option<String>,
    /// Relative path → contents (or the read error, reported by the area that uses it).
    pub(super) regions: std::collections::BTreeMap<String, Result<String, String>>,
}

impl PolicyFiles {
    /// The directory the files were read from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Reads `dir`: `streams.toml` (required), `areas.toml` (optional), and the region files
    /// `areas.toml` names.
    ///
    /// # Errors
    /// [`PolicyError`] when `streams.toml` is missing or a file cannot be read.
    pub fn read(dir: &Path) -> Result<Self, PolicyError> {
        let streams_path = dir.join(STREAMS_FILE);
        let areas_path = dir.join(AREAS_FILE);
        let streams =
            std::fs::read_to_string(&streams_path).map_err(|e| io_error(&streams_path, &e))?;
        let areas = match std::fs::read_to_string(&areas_path) {
            Ok(t) => Some(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_error(&areas_path, &e)),
        };
        let mut regions = std::collections::BTreeMap::new();
        // A loose parse just for the region paths; the real parse reports any error.
        if let Some(af) = areas
            .as_deref()
            .and_then(|t| toml::from_str::<AreasFile>(t).ok())
        {
            for path in af.areas.iter().filter_map(|a| a.geojson.as_ref()) {
                regions
                    .entry(path.0.clone())
                    .or_insert_with(|| super::regions::read_region(&dir.join(&path.0)));
            }
        }
        Ok(PolicyFiles {
            dir: dir.to_owned(),
            streams,
            areas,
            regions,
        })
    }

    /// Policy files given by name, as a preview's upload carries them (`shedgate preview`):
    /// `streams.toml` (required), `areas.toml`, and each region file by the path
    /// `areas.toml` names it by; `dir` stands for their directory in errors. A region file
    /// `areas.toml` names that is not given is reported by the area that uses it.
    ///
    /// # Errors
    /// [`PolicyError`] when `streams.toml` is not given.
    pub fn from_files(
        dir: &Path,
        files: &std::collections::BTreeMap<String, String>,
    ) -> Result<Self, PolicyError> {
        let streams = files.get(STREAMS_FILE).cloned().ok_or_else(|| {
            io_error(
                &dir.join(STREAMS_FILE),
                &std::io::Error::from(std::io::ErrorKind::NotFound),
            )
        })?;
        let areas = files.get(AREAS_FILE).cloned();
        let mut regions = std::collections::BTreeMap::new();
        if let Some(af) = areas
            .as_deref()
            .and_then(|t| toml::from_str::<AreasFile>(t).ok())
        {
            for path in af.areas.iter().filter_map(|a| a.geojson.as_ref()) {
                let text = match files.get(&path.0) {
                    None => Err("not given with the policy".to_owned()),
                    Some(t) if t.len() > super::MAX_REGION_FILE_BYTES => Err(format!(
                        "over the limit of {} bytes (16 MiB) for one region file: simplify \
                         the outline",
                        super::MAX_REGION_FILE_BYTES
                    )),
                    Some(t) => Ok(t.clone()),
                };
                regions.entry(path.0.clone()).or_insert(text);
            }
        }
        Ok(PolicyFiles {
            dir: dir.to_owned(),
            streams,
            areas,
            regions,
        })
    }

    /// The files by name, as [`PolicyFiles::from_files`] reads them (region files that could
    /// not be read are left out).
    pub fn files(&self) -> std::collections::BTreeMap<String, String> {
        let mut files = std::collections::BTreeMap::new();
        files.insert(STREAMS_FILE.to_owned(), self.streams.clone());
        if let Some(areas) = &self.areas {
            files.insert(AREAS_FILE.to_owned(), areas.clone());
        }
        for (path, text) in &self.regions {
            if let Ok(text) = text {
                files.insert(path.clone(), text.clone());
            }
        }
        files
    }

    /// Policy contents given as text (tests, tools), as if read from a directory `p`.
    pub fn from_texts(streams: &str, areas: Option<&str>) -> Self {
        PolicyFiles {
            dir: PathBuf::from("p"),
            streams: streams.to_owned(),
            areas: areas.map(str::to_owned),
            regions: std::collections::BTreeMap::new(),
        }
    }

    /// Content hash: the first 12 hex digits of SHA-256 over each file's name and bytes.
    /// Equal contents give equal versions.
    pub fn version(&self) -> String {
        let mut hasher = Sha256::new();
        let mut add = |name: &str, text: &str| {
            hasher.update((name.len() as u64).to_le_bytes());
            hasher.update(name);
            hasher.update((text.len() as u64).to_le_bytes());
            hasher.update(text);
        };
        add(STREAMS_FILE, &self.streams);
        if let Some(areas) = &self.areas {
            add(AREAS_FILE, areas);
        }
        for (path, text) in &self.regions {
            add(path, text.as_deref().unwrap_or("<unreadable>"));
        }
        let digest = hasher.finalize();
        digest[..6].iter().map(|b| format!("{b:02x}")).collect()
    }
}
