//! Stamps the build with `LEASEKEEPER_BUILD` = `<commit>-<profile>` (the
//! commit from git, `unknown` outside a checkout). The server binary and the
//! browser bundle are two compilations of this crate; a server serving a
//! bundle with another stamp (another commit, or another profile) says so
//! instead of failing to hydrate silently (see `src/bundle.rs`).

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

fn main() {
    let profile = std::env::var("PROFILE").unwrap_or_else(|_| "unknown".into());
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=LEASEKEEPER_BUILD={commit}-{profile}");
    // Run again when HEAD moves: HEAD itself, the branch it names, and the
    // packed refs. Only files that exist (cargo treats a missing one as
    // always changed, which would rebuild the crate every time).
    let mut watch: Vec<PathBuf> = Vec::new();
    for path in ["HEAD", "packed-refs"] {
        if let Some(p) = git(&["rev-parse", "--git-path", path]) {
            watch.push(p.into());
        }
    }
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"])
        && let Some(p) = git(&["rev-parse", "--git-path", &branch])
    {
        watch.push(p.into());
    }
    for path in watch.into_iter().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    println!("cargo:rerun-if-changed=build.rs");
}
