//! Live policy through symlinks: a release directory swapped with `ln -sfn` (the link last on
//! the path or in its middle), edits inside the new release, and a policy file that is a link
//! out of the directory. The periodic re-check is an hour here (`spawn_watched`), so every
//! change seen within [`WATCH_DEADLINE`](super::reload::WATCH_DEADLINE) was the watcher's.
#![cfg(unix)]

use std::os::unix::fs::symlink;
use std::path::Path;

use super::reload::{areas_with_default, default_rank, failures, spawn_watched, wait_for};
use super::support::*;

/// A release directory `base/NAME/policies` with the seed streams and `rank` as default.
fn release(base: &Path, name: &str, rank: u8) {
    let dir = base.join(name).join("policies");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("streams.toml"), SEED_STREAMS).unwrap();
    std::fs::write(dir.join("areas.toml"), areas_with_default(rank)).unwrap();
}

/// `ln -sfn TARGET base/current`: a new link renamed over the old one.
fn swap_current(base: &Path, target: &str) {
    let tmp = base.join("current.tmp");
    symlink(target, &tmp).unwrap();
    std::fs::rename(&tmp, base.join("current")).unwrap();
}

/// The deploy a Capistrano- or Ansible-style release makes, with the proxy given
/// `policies` (relative to the folder holding `current`).
async fn swap_then_edit(policies: &str, release_link: &str) {
    let root = tempfile::tempdir().unwrap();
    let base = root.path();
    release(base, "v1", 50);
    release(base, "v2", 60);
    symlink(format!("v1{release_link}"), base.join("current")).unwrap();
    let upstream = MockUpstream::start().await;
    let proxy = spawn_watched(&upstream, &base.join(policies)).await;
    let rank = |r: u64| move |p: &serde_json::Value| default_rank(p) == r;
    wait_for(&proxy, "first load", rank(50)).await;
    std::fs::write(base.join("v1/policies/areas.toml"), areas_with_default(51)).unwrap();
    wait_for(&proxy, "an edit in the first release", rank(51)).await;

    swap_current(base, &format!("v2{release_link}"));
    wait_for(&proxy, "the release link swapped", rank(60)).await;

    let v2 = base.join("v2/policies");
    std::fs::write(v2.join("areas.toml"), areas_with_default(61)).unwrap();
    wait_for(&proxy, "an edit in the new release", rank(61)).await;

    // The areas file becomes a link to a file shared by releases, outside the directory.
    let shared = base.join("shared-areas.toml");
    std::fs::write(&shared, areas_with_default(62)).unwrap();
    std::fs::remove_file(v2.join("areas.toml")).unwrap();
    symlink(&shared, v2.join("areas.toml")).unwrap();
    wait_for(&proxy, "areas.toml made a link", rank(62)).await;
    std::fs::write(&shared, areas_with_default(63)).unwrap();
    wait_for(&proxy, "an edit to the link's target", rank(63)).await;

    // Back to the first release, whose files are plain again.
    swap_current(base, &format!("v1{release_link}"));
    wait_for(&proxy, "the link swapped back", rank(51)).await;
    assert_eq!(failures(&proxy).await, 0.0);
}

/// `--policies current` with `current -> v1/policies`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swapped_policy_link_and_edits_behind_it_take_effect() {
    swap_then_edit("current", "/policies").await;
}

/// `--policies current/policies` with `current -> v1`: the link is in the middle of the path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swapped_link_in_the_middle_of_the_path_takes_effect() {
    swap_then_edit("current/policies", "").await;
}
