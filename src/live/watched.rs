//! What the policy watcher watches: the policy directory resolved through its symlinks, and
//! every place outside it that a symlink on the way makes part of the policy
//! (docs/operations.md "Policy files and hot reload").
//!
//! inotify resolves a symlink once, when a watch is added: a watch on `current/` (a link)
//! stays on the old release after `ln -sfn v2 current`, and a policy file that is a link out
//! of the directory is watched only where the link itself lies, so an edit to its target
//! makes no event (vector PR #2034, nginx_config_reloader#74). So the watcher watches
//! canonical places, each where its change makes an event:
//! - the policy directory's target, with everything under it;
//! - each directory holding a symlink met on the way to it (`ln -sfn` renames a new link
//!   over the old one there), for that link's name only;
//! - the target of each symlink under the directory that leaves it: a directory with
//!   everything under it, a file by its name in its own directory, and the links met on the
//!   way there as above.
//!
//! The set is computed again after each reload; when it changed (a link swapped), the
//! watcher moves to the new places.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ffi::OsString;
use std::io;
use std::path::{Component, Path, PathBuf};

/// Most symlinks followed to resolve one path, as Linux's `MAXSYMLINKS` (`ELOOP` past it).
const MAX_LINKS: usize = 40;
/// Deepest entry under a watched directory looked at for symlinks leaving it.
const MAX_DEPTH: usize = 16;
/// Most entries under the watched directories looked at for symlinks leaving them: a policy
/// directory holds a few files; a link to `/` must not make the reloader walk the disk.
const MAX_ENTRIES: usize = 10_000;

/// The canonical places whose changes can change the policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchSet {
    /// Directories watched with everything under them; the first is the policy directory's
    /// target.
    trees: Vec<PathBuf>,
    /// Directories watched for some of their entries only: directory → entry names (a link
    /// on the way to the policy, or a policy file's target outside the trees).
    entries: BTreeMap<PathBuf, BTreeSet<OsString>>,
}

impl WatchSet {
    /// Resolves `dir` (the `--policies` path, absolute or relative to the working
    /// directory) and the symlinks under it.
    ///
    /// # Errors
    /// The error of resolving `dir` itself (missing, a dangling link, a link loop). A link
    /// under it that does not resolve is skipped: reading the policy reports it.
    pub fn of(dir: &Path) -> io::Result<WatchSet> {
        let root = resolve(dir)?;
        let mut set = WatchSet {
            trees: vec![root.target.clone()],
            entries: BTreeMap::new(),
        };
        set.add_links(&root.links);
        let mut queue = VecDeque::from([root.target]);
        let mut seen = 0usize;
        while let Some(tree) = queue.pop_front() {
            let walk = walkdir::WalkDir::new(&tree)
                .follow_links(false)
                .max_depth(MAX_DEPTH)
                .into_iter()
                .filter_map(Result::ok);
            for entry in walk {
                seen += 1;
                if seen > MAX_ENTRIES {
                    tracing::warn!(dir = %dir.display(), "over {MAX_ENTRIES} entries under the policy directory: symlinks past them are not watched at their targets");
                    return Ok(set.pruned());
                }
                if !entry.path_is_symlink() {
                    continue;
                }
                let Ok(link) = resolve(entry.path()) else {
                    continue;
                };
                set.add_links(&link.links);
                if set.covers(&link.target) {
                    continue;
                }
                if link.target.is_dir() {
                    set.trees.push(link.target.clone());
                    queue.push_back(link.target);
                } else {
                    set.add_entry(&link.target);
                }
            }
        }
        Ok(set.pruned())
    }

    /// The policy directory's canonical path.
    pub fn root(&self) -> Option<&Path> {
        self.trees.first().map(PathBuf::as_path)
    }

    /// Directories to watch with everything under them.
    pub fn trees(&self) -> &[PathBuf] {
        &self.trees
    }

    /// Directories to watch for [`WatchSet::covers`]'s entries only (not recursively).
    pub fn entry_dirs(&self) -> impl Iterator<Item = &Path> {
        self.entries.keys().map(PathBuf::as_path)
    }

    /// Whether a change at `path` (as the watcher reports it: a watched directory joined
    /// with an entry's name) can change the policy.
    pub fn covers(&self, path: &Path) -> bool {
        self.trees.iter().any(|t| path.starts_with(t))
            || path
                .parent()
                .zip(path.file_name())
                .and_then(|(dir, name)| self.entries.get(dir).map(|n| n.contains(name)))
                .unwrap_or(false)
    }

    fn add_links(&mut self, links: &[PathBuf]) {
        for link in links {
            self.add_entry(link);
        }
    }

    fn add_entry(&mut self, path: &Path) {
        if let (Some(dir), Some(name)) = (path.parent(), path.file_name()) {
            self.entries
                .entry(dir.to_owned())
                .or_default()
                .insert(name.to_owned());
        }
    }

    /// Without the entries a tree watches anyway (a ConfigMap's `..data` link lies inside
    /// the policy directory).
    fn pruned(mut self) -> WatchSet {
        let trees = self.trees.clone();
        self.entries
            .retain(|dir, _| !trees.iter().any(|t| dir.starts_with(t)));
        self
    }
}

/// A path resolved as the kernel resolves it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Resolved {
    /// The canonical path (as [`std::fs::canonicalize`]).
    target: PathBuf,
    /// Each symlink met on the way, by its canonical directory and its name.
    links: Vec<PathBuf>,
}

/// Resolves `path` component by component, noting each symlink met on the way (which
/// [`std::fs::canonicalize`] does not tell).
fn resolve(path: &Path) -> io::Result<Resolved> {
    let absolute = std::path::absolute(path)?;
    let mut pending: VecDeque<OsString> = components(&absolute);
    let mut at = PathBuf::from("/");
    let mut links = Vec::new();
    while let Some(part) = pending.pop_front() {
        if part == "/" {
            at = PathBuf::from("/");
        } else if part == ".." {
            // `at` holds no symlink, so its parent is the real one.
            at.pop();
        } else {
            let next = at.join(&part);
            if std::fs::symlink_metadata(&next)?.is_symlink() {
                if links.len() == MAX_LINKS {
                    return Err(io::Error::other(format!(
                        "more than {MAX_LINKS} symlinks resolving {}",
                        path.display()
                    )));
                }
                let target = std::fs::read_link(&next)?;
                for part in components(&target).into_iter().rev() {
                    pending.push_front(part);
                }
                links.push(next);
            } else {
                at = next;
            }
        }
    }
    // The last component must exist (checked above for every component met).
    Ok(Resolved { target: at, links })
}

/// A path's components: `/` for the root, `..` kept, `.` dropped.
fn components(path: &Path) -> VecDeque<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::RootDir | Component::Prefix(_) => Some(OsString::from("/")),
            Component::CurDir => None,
            Component::ParentDir => Some(OsString::from("..")),
            Component::Normal(name) => Some(name.to_owned()),
        })
        .collect()
}

#[cfg(all(test, unix))]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn canonical_tempdir() -> (tempfile::TempDir, PathBuf) {
        let t = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(t.path()).unwrap();
        (t, base)
    }

    #[test]
    fn resolving_agrees_with_canonicalize_and_names_each_link() {
        let (_t, base) = canonical_tempdir();
        std::fs::create_dir_all(base.join("releases/v1/policies")).unwrap();
        symlink("releases/v1", base.join("current")).unwrap();
        symlink("../current/./policies", base.join("releases/p")).unwrap();
        let path = base.join("releases/p");
        let r = resolve(&path).unwrap();
        assert_eq!(r.target, std::fs::canonicalize(&path).unwrap());
        assert_eq!(r.links, vec![base.join("releases/p"), base.join("current")]);
    }

    #[test]
    fn a_link_loop_and_a_dangling_link_are_errors() {
        let (_t, base) = canonical_tempdir();
        symlink("b", base.join("a")).unwrap();
        symlink("a", base.join("b")).unwrap();
        symlink("missing", base.join("c")).unwrap();
        assert!(resolve(&base.join("a")).is_err());
        assert!(resolve(&base.join("c")).is_err());
        assert!(WatchSet::of(&base.join("c")).is_err());
    }

    /// `--policies /srv/app/current/policies` with `current` a link: the release's directory
    /// is watched whole, and `/srv/app` for the link's name only.
    #[test]
    fn a_link_on_the_way_is_watched_where_it_lies() {
        let (_t, base) = canonical_tempdir();
        std::fs::create_dir_all(base.join("v1/policies")).unwrap();
        std::fs::create_dir_all(base.join("v2/policies")).unwrap();
        symlink("v1", base.join("current")).unwrap();
        let dir = base.join("current/policies");
        let set = WatchSet::of(&dir).unwrap();
        assert_eq!(set.root(), Some(base.join("v1/policies").as_path()));
        assert_eq!(set.trees(), [base.join("v1/policies")]);
        assert_eq!(set.entry_dirs().collect::<Vec<_>>(), [base.as_path()]);
        assert!(set.covers(&base.join("current")));
        assert!(!set.covers(&base.join("v2")), "other names beside the link");
        assert!(set.covers(&base.join("v1/policies/areas.toml")));
        // `ln -sfn v2 current`: the set moves.
        symlink("v2", base.join("current.tmp")).unwrap();
        std::fs::rename(base.join("current.tmp"), base.join("current")).unwrap();
        let moved = WatchSet::of(&dir).unwrap();
        assert_ne!(moved, set);
        assert_eq!(moved.root(), Some(base.join("v2/policies").as_path()));
    }

    #[test]
    fn a_file_linked_out_of_the_directory_is_watched_at_its_target() {
        let (_t, base) = canonical_tempdir();
        std::fs::create_dir_all(base.join("policies")).unwrap();
        std::fs::create_dir_all(base.join("shared/regions")).unwrap();
        std::fs::write(base.join("shared/areas.toml"), "").unwrap();
        symlink("../shared/areas.toml", base.join("policies/areas.toml")).unwrap();
        symlink(base.join("shared/regions"), base.join("policies/regions")).unwrap();
        let set = WatchSet::of(&base.join("policies")).unwrap();
        assert_eq!(
            set.trees(),
            [base.join("policies"), base.join("shared/regions")]
        );
        assert!(set.covers(&base.join("shared/areas.toml")));
        assert!(!set.covers(&base.join("shared/other.toml")));
        assert!(set.covers(&base.join("shared/regions/city.geojson")));
    }

    /// The kubelet's layout: every link stays inside the directory, so the directory alone
    /// is watched, and a `..data` swap does not change the set.
    #[test]
    fn a_configmap_needs_nothing_beyond_its_directory() {
        let (_t, base) = canonical_tempdir();
        for v in ["..2026_1", "..2026_2"] {
            std::fs::create_dir(base.join(v)).unwrap();
            std::fs::write(base.join(v).join("streams.toml"), "").unwrap();
        }
        symlink("..2026_1", base.join("..data")).unwrap();
        symlink("..data/streams.toml", base.join("streams.toml")).unwrap();
        let set = WatchSet::of(&base).unwrap();
        assert_eq!(set.trees(), std::slice::from_ref(&base));
        assert_eq!(set.entry_dirs().count(), 0);
        symlink("..2026_2", base.join("..data_tmp")).unwrap();
        std::fs::rename(base.join("..data_tmp"), base.join("..data")).unwrap();
        assert_eq!(WatchSet::of(&base).unwrap(), set);
    }
}
