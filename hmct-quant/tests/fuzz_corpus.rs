//! The corpus of the `onnx_loader` fuzz target (fuzz/corpus/onnx_loader: seeds, what
//! fuzzing kept, and the inputs of past crashes) through the same entry point, without
//! a fuzzing engine: loading and planning may fail, never panic.

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
fn onnx_loader_corpus_never_panics() {
    let mut planned = 0;
    for file in corpus("onnx_loader") {
        let bytes = std::fs::read(&file).unwrap();
        let result = std::panic::catch_unwind(|| {
            hmct_ir::load_model_from_bytes(&bytes)
                .ok()
                .map(|model| hmct_quant::plan_model(&model).is_ok())
        });
        match result {
            Ok(Some(true)) => planned += 1,
            Ok(_) => {}
            Err(_) => panic!("{} panicked", file.display()),
        }
    }
    // The seeds made from real models must get through, or the corpus tests nothing.
    assert!(planned >= 5, "only {planned} corpus models planned");
}
