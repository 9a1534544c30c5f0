//! The cluster token key of test agents (as [`crate::TEST_SECRET`] is their cluster secret):
//! every agent the kit starts verifies scoped tokens with its public half, and tests mint
//! tokens with [`mint`] (or `bazaar token create --key-file` on [`write_key_file`]).
//! [`admin`] is the org token tests call the Machines API with: the cluster secret is not
//! an API token (it opens only the host interface and the catalog view).

use bazaar_auth::{Scope, TokenKey};
use std::path::Path;
use std::sync::OnceLock;

/// The private half, in hex (a test key: never use it for a real cluster).
pub const TEST_TOKEN_KEY: &str = "7465737420636c757374657220746f6b656e206b657920303132333435363738";

/// The test token key.
pub fn key() -> TokenKey {
    TokenKey::from_private_hex(TEST_TOKEN_KEY).expect("the test token key is valid")
}

/// Its public half, in hex (what test agents get as `BAZAAR_TOKEN_PUBLIC_KEY`).
pub fn public_key_hex() -> String {
    key().public_hex()
}

/// A token with `scope`, signed by the test key.
pub fn mint(scope: &Scope) -> String {
    bazaar_auth::mint(&key(), scope).expect("minting a test token")
}

/// Writes the test key where `bazaar token create --key-file` reads it.
pub fn write_key_file(path: &Path) -> std::io::Result<()> {
    std::fs::write(path, format!("{TEST_TOKEN_KEY}\n"))
}

/// An org token (no limits, the process driver included) signed by the test key, the same
/// for the whole test process: what tests and benchmarks call the Machines API with.
pub fn admin() -> &'static str {
    static ADMIN: OnceLock<String> = OnceLock::new();
    ADMIN.get_or_init(|| mint(&Scope::default()))
}

/// The id of [`admin`] (its audit records name it).
pub fn admin_id() -> String {
    bazaar_auth::describe(admin())
        .expect("the admin token describes itself")
        .id
}
