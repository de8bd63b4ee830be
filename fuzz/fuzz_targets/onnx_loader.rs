//! The ONNX loader on arbitrary bytes, and the interpreter's planning of whatever
//! it accepts: errors are fine, panics and hangs are not.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(model) = hmct_ir::load_model_from_bytes(data) {
        let _ = hmct_quant::plan_model(&model);
    }
});
