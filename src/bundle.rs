//! Whether the browser bundle a server serves comes from the same build as
//! the server. They are two compilations of this crate (`cargo leptos
//! build` makes both); a server binary from one build (say `cargo build
//! --release` for the benchmark) with the site of another (a debug
//! `target/site`) serves pages that never hydrate. Each compilation carries
//! the stamp `<commit>-<profile>` (see `build.rs`): the server reads the
//! bundle's stamp from its `.wasm` at start-up and says so in its log and
//! on every page; the browser compares its own stamp with the page's and
//! does not hydrate a page of another build.

/// This build's stamp: `<commit>-<profile>`.
pub const BUILD: &str = env!("LEASEKEEPER_BUILD");

/// The stamp as it lies in the compiled bytes, found by [`stamp_in`].
pub const MARKED: &str = concat!("leasekeeper-build:", env!("LEASEKEEPER_BUILD"), ";");

const MARKER: &[u8] = b"leasekeeper-build:";

/// The longest stamp looked for.
const MAX_STAMP: usize = 96;

/// This compilation's stamp, read from [`MARKED`] at run time (so the
/// marked string stays in the bundle's bytes for the server to find).
pub fn own_build() -> String {
    let marked: &str = std::hint::black_box(MARKED);
    marked
        .strip_prefix("leasekeeper-build:")
        .and_then(|s| s.strip_suffix(';'))
        .unwrap_or(marked)
        .to_string()
}

/// The first well-formed stamp marked in `bytes` (a compiled bundle), if
/// any. (The marker may also occur alone, e.g. where a literal of it was
/// kept: such occurrences are passed over.)
pub fn stamp_in(bytes: &[u8]) -> Option<String> {
    let mut from = 0;
    while let Some(found) = bytes[from..]
        .windows(MARKER.len())
        .position(|w| w == MARKER)
    {
        let start = from + found + MARKER.len();
        let rest = &bytes[start..bytes.len().min(start + MAX_STAMP + 1)];
        let stamp = rest
            .iter()
            .position(|&b| b == b';')
            .and_then(|end| std::str::from_utf8(&rest[..end]).ok())
            .filter(|s| {
                !s.is_empty()
                    && s.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            });
        if let Some(stamp) = stamp {
            return Some(stamp.to_string());
        }
        from = start;
    }
    None
}

/// What the server found about the bundle it serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BundleCheck {
    /// The same stamp as the server's.
    Same,
    /// Another build's bundle (its stamp).
    Different(String),
    /// No bundle, or none with a stamp (why).
    Unknown(String),
}

/// Compares the stamp in `wasm` (the bundle's file) with [`BUILD`].
#[cfg(feature = "ssr")]
pub fn check(wasm: &std::path::Path) -> BundleCheck {
    match std::fs::read(wasm) {
        Err(e) => BundleCheck::Unknown(format!("cannot read {}: {e}", wasm.display())),
        Ok(bytes) => match stamp_in(&bytes) {
            None => BundleCheck::Unknown(format!("{} carries no build stamp", wasm.display())),
            Some(stamp) if stamp == BUILD => BundleCheck::Same,
            Some(stamp) => BundleCheck::Different(stamp),
        },
    }
}

/// The bundle file of `options`: `<site_root>/<site_pkg_dir>/<output_name>.wasm`.
#[cfg(feature = "ssr")]
pub fn wasm_path(options: &leptos::config::LeptosOptions) -> std::path::PathBuf {
    std::path::Path::new(&*options.site_root)
        .join(&*options.site_pkg_dir)
        .join(format!("{}.wasm", options.output_name))
}

#[cfg(feature = "ssr")]
static CHECKED: std::sync::OnceLock<BundleCheck> = std::sync::OnceLock::new();

/// Checks the bundle of `options` once, at start-up, and logs a mismatch.
#[cfg(feature = "ssr")]
pub fn check_at_start(options: &leptos::config::LeptosOptions) -> &'static BundleCheck {
    CHECKED.get_or_init(|| {
        let path = wasm_path(options);
        let found = check(&path);
        match &found {
            BundleCheck::Same => tracing::info!(build = BUILD, "browser bundle from this build"),
            BundleCheck::Different(other) => tracing::warn!(
                server = BUILD,
                bundle = %other,
                path = %path.display(),
                "the browser bundle comes from another build: pages will not hydrate. Build both with one `cargo leptos build` (add --release for a release server)"
            ),
            BundleCheck::Unknown(why) => tracing::warn!(%why, "cannot tell which build the browser bundle comes from"),
        }
        found
    })
}

/// The check made at start-up (`None` before, and in tests that never
/// started a server).
#[cfg(feature = "ssr")]
pub fn checked() -> Option<&'static BundleCheck> {
    CHECKED.get()
}

/// The banner's text for a bundle of build `bundle`.
pub fn mismatch_text(bundle: &str) -> String {
    format!(
        "This server (build {BUILD}) serves a browser bundle of another build ({bundle}), so this page will not update live or answer its controls. Build both together with one `cargo leptos build` (add --release for a release server) and run that build's target/<profile>/leasekeeper."
    )
}

/// In the browser: this page's stamp (the server's), from its
/// `<meta name="leasekeeper-build">`.
#[cfg(feature = "hydrate")]
pub fn served_build() -> Option<String> {
    web_sys::window()?
        .document()?
        .query_selector(r#"meta[name="leasekeeper-build"]"#)
        .ok()??
        .get_attribute("content")
}

/// In the browser: puts the mismatch banner at the top of the page (unless
/// the server already did).
#[cfg(feature = "hydrate")]
pub fn show_mismatch(served: &str) {
    let Some(document) = web_sys::window().and_then(|w| w.document()) else {
        return;
    };
    if document
        .query_selector(r#"[data-testid="bundle-mismatch"]"#)
        .ok()
        .flatten()
        .is_some()
    {
        return;
    }
    let text = format!(
        "This page comes from a server of build {served}, but this browser bundle is build {}: it will not update live or answer its controls. Build both together with one `cargo leptos build` and run that build's target/<profile>/leasekeeper.",
        own_build()
    );
    if let Ok(banner) = document.create_element("p") {
        banner.set_text_content(Some(&text));
        let _ = banner.set_attribute("data-testid", "bundle-mismatch");
        let _ = banner.set_attribute("role", "alert");
        let _ = banner.set_attribute(
            "style",
            "margin:0;padding:12px;background:#fef2f2;border-bottom:1px solid #fca5a5;font:14px sans-serif",
        );
        if let Some(body) = document.body() {
            let _ = body.prepend_with_node_1(&banner);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_is_found_in_bytes_and_only_a_well_formed_one() {
        let mut bytes = b"\0\x01garbage".to_vec();
        bytes.extend_from_slice(b"leasekeeper-build:0123abcd-release;more");
        assert_eq!(stamp_in(&bytes).as_deref(), Some("0123abcd-release"));
        assert_eq!(stamp_in(b"no marker here"), None);
        assert_eq!(stamp_in(b"leasekeeper-build:unterminated"), None);
        assert_eq!(stamp_in(b"leasekeeper-build:bad stamp;"), None);
        assert_eq!(
            stamp_in(b"leasekeeper-build:\0\0leasekeeper-build:abc-debug;").as_deref(),
            Some("abc-debug"),
            "a lone marker first"
        );
        assert_eq!(
            stamp_in(b"leasekeeper-build:leasekeeper-build:abc-debug;").as_deref(),
            Some("abc-debug"),
            "a lone marker right before the marked stamp (as the linker lays them out)"
        );
        assert_eq!(stamp_in(MARKED.as_bytes()).as_deref(), Some(BUILD));
        assert_eq!(own_build(), BUILD);
        assert!(
            BUILD.ends_with("-debug") || BUILD.ends_with("-release"),
            "{BUILD}"
        );
    }

    #[test]
    fn the_server_tells_a_bundle_of_its_own_build_from_another() {
        let dir = std::env::temp_dir().join(format!("lk-bundle-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ours = dir.join("ours.wasm");
        std::fs::write(&ours, format!("\0asm{MARKED}\0")).unwrap();
        assert_eq!(check(&ours), BundleCheck::Same);
        let theirs = dir.join("theirs.wasm");
        std::fs::write(&theirs, b"\0asmleasekeeper-build:feedface0000-release;\0").unwrap();
        assert_eq!(
            check(&theirs),
            BundleCheck::Different("feedface0000-release".into())
        );
        let old = dir.join("old.wasm");
        std::fs::write(&old, b"\0asm no stamp").unwrap();
        assert!(matches!(check(&old), BundleCheck::Unknown(_)));
        assert!(matches!(
            check(&dir.join("missing.wasm")),
            BundleCheck::Unknown(_)
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
