//! Rebuilds the crate when a migration is added or changed: `sqlx::migrate!`
//! embeds `migrations/` at compile time, and cargo does not watch a folder
//! the source does not name (as sqlx's documentation of the macro advises).

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
