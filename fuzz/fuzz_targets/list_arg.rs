//! The list-argument parser on arbitrary text. Besides not panicking, a parsed list
//! printed in canonical form must parse back to the same value.
#![no_main]

use hmct_cli::listarg::{ListArg, parse_list};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    if let Ok(list) = parse_list(text) {
        let empty_name = list.names().iter().any(|n| n.is_empty());
        if !empty_name && list != ListArg::Nested(Vec::new()) {
            let canonical = list.to_string();
            assert_eq!(parse_list(&canonical).as_ref(), Ok(&list), "{canonical}");
        }
    }
});
