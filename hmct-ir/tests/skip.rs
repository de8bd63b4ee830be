//! The test-skip helper: a skip shows on the terminal even though cargo captures test
//! output, and `HMCT_REQUIRE_SHARED=1` turns it into a failure. The helper is run in a
//! child process (this test binary, filtered to `probe`), as cargo would run it.

use std::process::{Command, Output};

use hmct_ir::testing::{REQUIRE_SHARED, shared_path};

/// Skips on a folder that is never there; does nothing unless the parent test asks.
#[test]
fn probe() {
    if std::env::var_os("HMCT_SKIP_PROBE").is_some() {
        assert!(shared_path("no-such-folder").is_none());
    }
}

fn run_probe(require: Option<&str>) -> Output {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["probe", "--exact", "--test-threads", "2"])
        .env("HMCT_SKIP_PROBE", "1")
        .env_remove(REQUIRE_SHARED);
    if let Some(v) = require {
        cmd.env(REQUIRE_SHARED, v);
    }
    cmd.output().unwrap()
}

#[test]
fn skips_are_visible_and_can_be_required() {
    let out = run_probe(None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("test probe SKIPPED: ../shared/no-such-folder not found"),
        "{stderr}"
    );

    let out = run_probe(Some("1"));
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{all}");
    assert!(
        all.contains("../shared/no-such-folder not found, and HMCT_REQUIRE_SHARED=1 says it must not be skipped"),
        "{all}"
    );
}
