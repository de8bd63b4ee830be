// Each test binary uses part of these helpers.
#![allow(dead_code)]

pub mod kernel;
pub mod node_cases;
