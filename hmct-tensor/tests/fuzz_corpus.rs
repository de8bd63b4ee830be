//! The corpus of the `npy_reader` fuzz target (fuzz/corpus/npy_reader: seeds, what
//! fuzzing kept, and the inputs of past crashes) through the same entry point, without
//! a fuzzing engine: reading may fail, never panic.

use std::path::{Path, PathBuf};

fn corpus(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{}: empty corpus", dir.display());
    files
}

#[test]
fn npy_reader_corpus_never_panics() {
    let mut read = 0;
    for file in corpus("npy_reader") {
        let bytes = std::fs::read(&file).unwrap();
        match std::panic::catch_unwind(|| hmct_tensor::read_npy_bytes(&bytes, "corpus.npy")) {
            Ok(Ok(_)) => read += 1,
            Ok(Err(_)) => {}
            Err(_) => panic!("{} panicked", file.display()),
        }
    }
    // The seeds are valid files of every accepted layout: most must read.
    assert!(read >= 8, "only {read} corpus files read");
}
