// `sqlx::migrate!` embeds `migrations/` at build time, but cargo cannot see
// a new file there on its own: without this, adding a migration leaves
// every crate built before it with the old set (the fix sqlx documents).
fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
