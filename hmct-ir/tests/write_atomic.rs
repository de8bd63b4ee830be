//! `write_atomic` on targets that are not plain regular files.

use std::path::Path;

fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".hmct-save-"))
        .collect()
}

#[cfg(unix)]
#[test]
fn a_symlink_is_followed_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("real.bin");
    std::fs::write(&target, b"old").unwrap();
    let link = dir.path().join("link.bin");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    hmct_ir::write_atomic(&link, b"new").unwrap();
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(std::fs::read(&target).unwrap(), b"new");
    assert!(leftovers(dir.path()).is_empty());
}

/// A full disk, through a link so that a regression replaces the link and not the
/// device (as root, renaming over `/dev/full` itself would succeed).
#[cfg(target_os = "linux")]
#[test]
fn a_device_is_written_in_place_and_a_full_one_is_an_error() {
    use std::os::unix::fs::FileTypeExt;
    let is_char_device = |p: &str| {
        std::fs::metadata(p)
            .map(|m| m.file_type().is_char_device())
            .unwrap_or(false)
    };
    if !is_char_device("/dev/full") || !is_char_device("/dev/null") {
        hmct_ir::testing::skip("/dev/full or /dev/null is not a device here");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let full = dir.path().join("full.onnx");
    std::os::unix::fs::symlink("/dev/full", &full).unwrap();
    let e = hmct_ir::write_atomic(&full, b"bytes")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("full.onnx") && e.contains("No space left"),
        "{e}"
    );
    assert!(
        std::fs::symlink_metadata(&full)
            .unwrap()
            .file_type()
            .is_symlink(),
        "the link was replaced"
    );
    let null = dir.path().join("null.onnx");
    std::os::unix::fs::symlink("/dev/null", &null).unwrap();
    hmct_ir::write_atomic(&null, b"bytes").unwrap();
    assert!(is_char_device("/dev/full") && is_char_device("/dev/null"));
    assert!(leftovers(dir.path()).is_empty());
    assert!(leftovers(Path::new("/dev")).is_empty());
}
