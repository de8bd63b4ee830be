//! The `.npy` reader on arbitrary bytes: errors are fine, panics are not.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = hmct_tensor::read_npy_bytes(data, "fuzz.npy");
});
