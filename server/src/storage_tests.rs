//! Unit tests of [`super`]: path rules, hashing while receiving, clean failures, sealing.

use super::*;
use futures_util::stream;

fn chunks(parts: &[&'static [u8]]) -> impl Stream<Item = Result<&'static [u8], String>> {
    stream::iter(parts.iter().map(|part| Ok::<_, String>(*part)).collect::<Vec<_>>())
}

#[test]
fn plain_relative_paths_pass() {
    for good in ["model_best.pt", "results/metrics.csv", "a/b/c.d", "..hidden", "x..y", ".config"] {
        assert!(check_relative_path(good).is_ok(), "{good:?} refused");
    }
}

#[test]
fn paths_that_could_escape_or_are_ambiguous_are_refused() {
    let long_segment = "x".repeat(256);
    let long_path = vec!["y"; 2049].join("/");
    for bad in [
        "",
        "/etc/passwd",
        "../../etc/passwd",
        "a/../b",
        "./a",
        "a/./b",
        "a//b",
        "a/",
        "a\\..\\b",
        "a\0b",
        long_segment.as_str(),
        long_path.as_str(),
    ] {
        assert!(check_relative_path(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn version_paths_are_relative_to_the_data_dir() {
    assert_eq!(Layout::version_path("vaep-grid", 3, 1), "results/vaep-grid/3/v1");
    let layout = Layout::new(Path::new("/data"));
    assert_eq!(layout.absolute("results/s/0/v2/a/b.pt"), Path::new("/data/results/s/0/v2/a/b.pt"));
    assert_eq!(layout.staging(JobId::new(4), 2), Path::new("/data/results/.staging/4-2"));
}

#[test]
fn a_project_sweep_has_one_flat_directory_beside_the_others() {
    assert_eq!(Layout::sweep_path("myproj/sweep"), "results/myproj+sweep");
    assert_eq!(Layout::version_path("myproj/sweep-2", 0, 1), "results/myproj+sweep-2/0/v1");
    // Not under `results/myproj/`, where a sweep named `myproj` keeps its index directories.
    assert_eq!(Layout::version_path("myproj/0", 1, 1), "results/myproj+0/1/v1");
    assert_eq!(Layout::version_path("myproj", 0, 1), "results/myproj/0/v1");
    assert!(check_relative_path(&Layout::version_path("myproj/sweep", 0, 1)).is_ok());
}

#[tokio::test]
async fn a_received_file_is_hashed_as_it_arrives() {
    let dir = tempfile::tempdir().unwrap();
    let received = receive(dir.path(), chunks(&[b"hello ", b"world"]), 100).await.unwrap();
    assert_eq!(received.size, 11);
    // sha256("hello world")
    assert_eq!(received.sha256, "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9");
    assert_eq!(std::fs::read(&received.temp).unwrap(), b"hello world");
}

#[tokio::test]
async fn an_over_large_or_broken_upload_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let error = receive(dir.path(), chunks(&[b"12345", b"67890"]), 8).await.unwrap_err();
    assert!(matches!(error, ReceiveError::TooLarge(8)), "{error}");
    let broken = stream::iter(vec![Ok::<&[u8], String>(b"part"), Err("connection reset".to_string())]);
    let error = receive(dir.path(), broken, 100).await.unwrap_err();
    assert!(error.to_string().contains("connection reset"), "{error}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "a partial file was left behind");
}

#[tokio::test]
async fn a_full_disk_is_reported_as_such() {
    // Linux's /dev/full fails every write with ENOSPC, the error a full disk gives.
    let Ok(full) = tokio::fs::OpenOptions::new().write(true).open("/dev/full").await else { return };
    let error = write_hashed(chunks(&[&[7u8; 4096]]), full, 1 << 20).await.unwrap_err();
    let ReceiveError::Disk(error) = error else { panic!("not a disk error: {error}") };
    assert!(is_disk_full(&error), "{error:?}");
}

#[tokio::test]
async fn placing_refuses_paths_that_clash_with_uploaded_files() {
    let dir = tempfile::tempdir().unwrap();
    let staging = dir.path().join("staging");
    let incoming = dir.path().join("incoming");
    let first = receive(&incoming, chunks(&[b"a"]), 10).await.unwrap();
    place(&first, &staging, "a/b").await.unwrap();
    let second = receive(&incoming, chunks(&[b"b"]), 10).await.unwrap();
    assert!(matches!(place(&second, &staging, "a/b/c").await, Err(PlaceError::Clash(_))));
    assert!(matches!(place(&second, &staging, "a").await, Err(PlaceError::Clash(_))));
    place(&second, &staging, "a/b").await.unwrap();
    assert_eq!(std::fs::read(staging.join("a/b")).unwrap(), b"b", "a re-upload replaces the file");
}

fn entry(path: &str, size: u64) -> ManifestEntry {
    ManifestEntry { path: path.into(), size, sha256: String::new() }
}

#[test]
fn sealing_keeps_the_manifest_files_only_and_never_replaces_a_version() {
    let dir = tempfile::tempdir().unwrap();
    let staging = dir.path().join("staging");
    std::fs::create_dir_all(staging.join("sub/empty")).unwrap();
    std::fs::write(staging.join("keep.txt"), b"keep").unwrap();
    std::fs::write(staging.join("sub/also.txt"), b"also").unwrap();
    std::fs::write(staging.join("sub/stray.txt"), b"stray").unwrap();
    std::fs::write(staging.join("stray"), b"stray").unwrap();
    let version = dir.path().join("results/s/0/v1");
    let wrong = [entry("keep.txt", 5)];
    assert!(matches!(seal(&staging, &version, &wrong, b"[]", b"{}"), Err(SealError::Mismatch(_))));
    let missing = [entry("gone.txt", 1)];
    assert!(matches!(seal(&staging, &version, &missing, b"[]", b"{}"), Err(SealError::Mismatch(_))));
    assert!(staging.join("stray").exists(), "a refused seal removed files");
    let manifest = [entry("keep.txt", 4), entry("sub/also.txt", 4)];
    seal(&staging, &version, &manifest, b"[]", b"{}").unwrap();
    assert!(!staging.exists());
    let mut files: Vec<String> = walk(&version);
    files.sort();
    assert_eq!(files, [".app/manifest.json", ".app/result.json", "keep.txt", "sub/also.txt"]);
    std::fs::create_dir_all(&staging).unwrap();
    assert!(matches!(seal(&staging, &version, &[], b"[]", b"{}"), Err(SealError::AlreadyStored)));
}

fn walk(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type().unwrap().is_dir() {
            found.extend(walk(&entry.path()).into_iter().map(|inner| format!("{name}/{inner}")));
        } else {
            found.push(name);
        }
    }
    found
}

#[test]
fn room_reserved_by_an_upload_in_progress_counts_as_used_until_it_ends() {
    let dir = tempfile::tempdir().unwrap();
    let stat = nix::sys::statvfs::statvfs(dir.path()).unwrap();
    let free = stat.blocks_available() * stat.fragment_size();
    let half = free / 2 + 1;
    let first = ensure_room(dir.path(), Some(half), || "the first".into()).expect("half the free space fits");
    let refused = ensure_room(dir.path(), Some(half), || "the second".into()).err().expect("two halves do not");
    assert!(refused.to_string().contains("no space for the second"), "{refused}");
    assert!(ensure_room(dir.path(), Some(free), || "all of it".into()).is_err(), "the headroom stays free");
    drop(first);
    let _second = ensure_room(dir.path(), Some(half), || "the second".into()).expect("fits once the first ended");
    assert!(ensure_room(dir.path(), None, || "unknown".into()).is_ok(), "an undeclared length is not refused here");
}

#[tokio::test]
async fn a_shared_directory_keeps_the_uploads_in_flight_and_drops_those_of_a_server_gone() {
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout::new(dir.path());
    layout.prepare(true).await.unwrap();
    // One upload received and not yet placed (its server alive), one part a killed server of
    // this host left, and two parts of another host's server, whose locks may not be seen
    // here: one written a minute ago (maybe in flight), one left for eleven.
    let in_flight = receive(&layout.incoming(), chunks(&[b"kept"]), 10).await.unwrap();
    assert_eq!(in_flight.temp.extension().unwrap(), "part");
    let left = layout.incoming().join(format!("gone-1@{}.part", this_host()));
    let (recent, old) = (layout.incoming().join("a-1@elsewhere.part"), layout.incoming().join("a-2@elsewhere.part"));
    for (path, age) in [(&left, 0), (&recent, 60), (&old, 660)] {
        std::fs::write(path, b"half").unwrap();
        let written = std::time::SystemTime::now() - std::time::Duration::from_secs(age);
        std::fs::File::options().write(true).open(path).unwrap().set_modified(written).unwrap();
    }
    layout.prepare(true).await.unwrap();
    assert!(in_flight.temp.exists(), "an upload in flight is another server's to place");
    assert!(!left.exists(), "a part of this host no one holds is left over");
    assert!(recent.exists(), "another host's lock may be invisible here: its part waits");
    assert!(!old.exists(), "another host's part untouched for ten minutes is left over");
    // Once it is placed or given up, it is no one's.
    let temp = in_flight.temp.clone();
    drop(in_flight);
    assert_eq!(layout.remove_abandoned_parts().await.unwrap(), 1);
    assert!(!temp.exists());
    assert!(recent.exists());
}
