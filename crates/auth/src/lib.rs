//! Scoped API tokens (issue 15): attenuable bearer tokens ([biscuit](https://www.biscuitsec.org))
//! signed by the cluster token key, that every node verifies offline with the public key
//! alone. Pure: no I/O, no clock of its own (callers pass `now`).
//!
//! - [`scope`]: what a token may do ([`Op`], [`Scope`]) and the Datalog checks that say so.
//! - [`token`]: the cluster token key, minting, offline attenuation, inspection.
//! - [`verify`]: checking a token against one request ([`Verifier`], [`Access`]), with a
//!   cache of verified tokens so a request pays for the signatures once.
//!
//! A token is `bz1_` followed by the biscuit in URL-safe base64. Its first block (signed by
//! the cluster key) holds the scope it was created with; every later block, added by any
//! holder, only adds checks, so a token can be narrowed and never widened. Its id is the
//! revocation id of its last block (hex): tokens narrowed from it carry it too, so revoking
//! it revokes them all.
#![forbid(unsafe_code)]

pub mod scope;
pub mod token;
pub mod verify;

pub use scope::{Op, Scope};
pub use token::{attenuate, describe, mint, Description, TokenKey};
pub use verify::{Access, Denied, Verified, Verifier};

/// What starts every scoped token (tells them from legacy token-file tokens).
pub const PREFIX: &str = "bz1_";

/// Why a token could not be made, narrowed, read or verified.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("not a bazaar token (it must start with {PREFIX})")]
    NotScoped,
    #[error("invalid token: {0}")]
    Invalid(String),
    #[error("invalid key: {0}")]
    Key(String),
    #[error("invalid scope: {0}")]
    Scope(String),
}

impl From<biscuit_auth::error::Token> for Error {
    fn from(e: biscuit_auth::error::Token) -> Error {
        Error::Invalid(e.to_string())
    }
}

/// Whether `token` looks like a scoped token (rather than a token-file token).
pub fn is_scoped(token: &str) -> bool {
    token.starts_with(PREFIX)
}
