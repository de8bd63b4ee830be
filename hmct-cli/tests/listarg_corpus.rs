//! The corpus of the `list_arg` fuzz target (fuzz/corpus/list_arg: seeds, what fuzzing
//! kept, and the inputs of past crashes) through the same checks, without a fuzzing
//! engine: parsing may fail, never panic, and a parsed list printed in canonical form
//! parses back to itself.

use std::path::{Path, PathBuf};

use hmct_cli::listarg::{ListArg, parse_list};

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
fn list_arg_corpus_never_panics_and_round_trips() {
    let (mut parsed, mut refused) = (0, 0);
    for file in corpus("list_arg") {
        let bytes = std::fs::read(&file).unwrap();
        // The fuzz target only sees valid UTF-8 (command-line arguments are strings).
        let Ok(text) = std::str::from_utf8(&bytes) else {
            continue;
        };
        let result = std::panic::catch_unwind(|| parse_list(text));
        let Ok(result) = result else {
            panic!("{} panicked", file.display());
        };
        match result {
            Ok(list) => {
                parsed += 1;
                if !list.names().iter().any(|n| n.is_empty()) && list != ListArg::Nested(vec![]) {
                    let canonical = list.to_string();
                    assert_eq!(parse_list(&canonical), Ok(list), "{}", file.display());
                }
            }
            Err(_) => refused += 1,
        }
    }
    // The seeds hold both valid and malformed lists.
    assert!(
        parsed >= 5 && refused >= 5,
        "{parsed} parsed, {refused} refused"
    );
}
