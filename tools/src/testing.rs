//! For the tools' own tests: running `leasekeeper-tools` as a newcomer
//! would (from the workspace root, on its embedded databases under
//! `target/`, the committed `Leptos.toml`) and reading the JSON report it
//! writes.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root: where the README's commands run.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tools/ is in the workspace")
        .to_path_buf()
}

/// One run of the tool.
pub struct Run {
    /// It exited with status 0.
    pub ok: bool,
    /// What it printed: results on stdout, phases and errors on stderr.
    pub stdout: String,
    pub stderr: String,
    /// Both, for messages.
    pub text: String,
    report: Option<Value>,
}

impl Run {
    /// The JSON report (`--json`); panics with the run's output when it
    /// wrote none.
    pub fn report(&self) -> &Value {
        self.report
            .as_ref()
            .unwrap_or_else(|| panic!("no JSON report:\n{}", self.text))
    }

    /// The JSON report of a run that must have succeeded.
    pub fn succeeded(&self) -> &Value {
        assert!(self.ok, "the run failed:\n{}", self.text);
        self.report()
    }
}

/// Runs `exe <args> --json <a file of its own>` (`exe`: the test's
/// `CARGO_BIN_EXE_leasekeeper-tools`), without `DATABASE_URL` (the tools
/// start their own databases), and reads the report.
pub fn run(exe: &str, args: &[&str]) -> Run {
    let json = std::env::temp_dir().join(format!(
        "leasekeeper-tools-{}-{}.json",
        std::process::id(),
        args.join("_").replace(['-', ',', '/', ' '], "")
    ));
    let _ = std::fs::remove_file(&json);
    let out = Command::new(exe)
        .args(args)
        .arg("--json")
        .arg(&json)
        .current_dir(root())
        .env_remove("DATABASE_URL")
        .env("RUST_LOG", "error")
        .env("LEASEKEEPER_CONFIG", root().join("Leptos.toml"))
        .output()
        .unwrap_or_else(|e| panic!("running leasekeeper-tools {args:?}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let text = format!("{stdout}\n{stderr}");
    let report = std::fs::read_to_string(&json)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok());
    let _ = std::fs::remove_file(&json);
    Run {
        ok: out.status.success(),
        stdout,
        stderr,
        text,
        report,
    }
}
