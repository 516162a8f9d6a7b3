#[test]
fn dump() {
    std::fs::write(
        std::env::var("DUMP").unwrap(),
        leasekeeper::http::openapi::document(),
    )
    .unwrap();
}
