//! leasekeeper: time-bound leases in PostgreSQL, made visible.
//!
//! The dashboard: adapters over the library `leasekeeper-core`, which owns
//! the domain (see ARCHITECTURE.md). The crate builds twice: with feature
//! `ssr` it is the server (REST API, server functions, page rendering, the
//! simulated fleet, the command line); with feature `hydrate` it is the
//! browser bundle that hydrates the pages. Modules that touch the database
//! or the network exist only on the server.

pub mod app;
pub mod bundle;
pub mod error;
pub mod generator;
pub mod overview;
pub mod worker;

#[cfg(feature = "ssr")]
pub mod auth;
#[cfg(feature = "ssr")]
pub mod cli;
#[cfg(feature = "ssr")]
pub mod http;
#[cfg(feature = "ssr")]
pub mod ops;
#[cfg(feature = "ssr")]
pub mod reads;
#[cfg(feature = "ssr")]
pub mod server;
#[cfg(feature = "ssr")]
pub mod settings;
#[cfg(feature = "ssr")]
pub mod signals;
#[cfg(feature = "ssr")]
pub mod state;

/// Browser entry point: hydrates the server-rendered dashboard.
#[cfg(feature = "hydrate")]
#[wasm_bindgen::prelude::wasm_bindgen]
pub fn hydrate() {
    console_error_panic_hook::set_once();
    // A page of another build would fail to hydrate half-way: say why
    // instead, and leave the server-rendered page as it is.
    if let Some(served) = bundle::served_build()
        && served != bundle::own_build()
    {
        bundle::show_mismatch(&served);
        return;
    }
    leptos::mount::hydrate_body(app::App);
    // Said once every control answers: a press before this is a plain
    // form's post (or nothing), not the hydrated page's. The end-to-end
    // tests wait for it before they press anything.
    if let Some(root) = web_sys::window()
        .and_then(|w| w.document())
        .and_then(|d| d.document_element())
    {
        let _ = root.set_attribute("data-hydrated", "");
    }
}
