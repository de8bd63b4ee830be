//! Developer tasks (`cargo xtask help`).
fn main() {}
