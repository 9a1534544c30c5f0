//! The cluster token key (ed25519; the private half stays with the operator, every agent
//! has the public half), minting a token, narrowing one offline, and reading what a token
//! says without the key.

use crate::{Error, Scope, PREFIX};
use biscuit_auth::builder::{Algorithm, BlockBuilder};
use biscuit_auth::{KeyPair, PrivateKey, PublicKey, UnverifiedBiscuit};

/// The cluster token key pair.
#[derive(Debug)]
pub struct TokenKey(KeyPair);

impl TokenKey {
    /// A new random key.
    pub fn generate() -> TokenKey {
        TokenKey(KeyPair::new())
    }

    /// The key from its private half in hex (as [`TokenKey::private_hex`] writes it).
    pub fn from_private_hex(text: &str) -> Result<TokenKey, Error> {
        let key = PrivateKey::from_bytes_hex(text.trim(), Algorithm::Ed25519)
            .map_err(|e| Error::Key(e.to_string()))?;
        Ok(TokenKey(KeyPair::from(&key)))
    }

    /// The private half in hex (keep it secret: it mints org tokens).
    pub fn private_hex(&self) -> String {
        self.0.private().to_bytes_hex()
    }

    /// The public half in hex (every agent's `--token-public-key`).
    pub fn public_hex(&self) -> String {
        self.0.public().to_bytes_hex()
    }

    pub(crate) fn public(&self) -> PublicKey {
        self.0.public()
    }
}

/// A public key from hex.
pub(crate) fn public_from_hex(text: &str) -> Result<PublicKey, Error> {
    PublicKey::from_bytes_hex(text.trim(), Algorithm::Ed25519)
        .map_err(|e| Error::Key(e.to_string()))
}

/// A new token with `scope`, signed by `key`. Its first block holds the scope's checks and,
/// if `scope.process`, the grant of the process driver.
pub fn mint(key: &TokenKey, scope: &Scope) -> Result<String, Error> {
    let mut block = BlockBuilder::new().code(r#"bazaar_token("v1");"#)?;
    if scope.process {
        block = block.code("process_driver(true);")?;
    }
    let block = scope.add_checks(block)?;
    let token = biscuit_auth::Biscuit::builder()
        .merge(block)
        .build(&key.0)?;
    Ok(format!("{PREFIX}{}", token.to_base64()?))
}

/// `token` narrowed to `scope`, offline (no key): a new block of checks. `scope.process ==
/// false` takes the process driver away; nothing in `scope` can give back what the token
/// lacks.
pub fn attenuate(token: &str, scope: &Scope) -> Result<String, Error> {
    let biscuit = UnverifiedBiscuit::from_base64(strip(token)?)?;
    let mut block = scope.add_checks(BlockBuilder::new())?;
    if !scope.process {
        block = block.code(r#"check if driver("none");"#)?;
    }
    Ok(format!("{PREFIX}{}", biscuit.append(block)?.to_base64()?))
}

/// What a token says (read without the key: [`crate::Verifier`] is what trusts it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Description {
    /// The token's id ([`crate::Verified::id`]).
    pub id: String,
    /// Each block's Datalog, first (the scope it was created with) to last.
    pub blocks: Vec<String>,
    /// Each block's revocation id.
    pub revocation_ids: Vec<String>,
}

/// Reads a token's blocks and ids.
pub fn describe(token: &str) -> Result<Description, Error> {
    let biscuit = UnverifiedBiscuit::from_base64(strip(token)?)?;
    let blocks = (0..biscuit.block_count())
        .map(|i| biscuit.print_block_source(i))
        .collect::<Result<Vec<_>, _>>()?;
    let revocation_ids: Vec<String> = biscuit
        .revocation_identifiers()
        .iter()
        .map(hex::encode)
        .collect();
    Ok(Description {
        id: revocation_ids.last().cloned().unwrap_or_default(),
        blocks,
        revocation_ids,
    })
}

/// The biscuit of a token string.
pub(crate) fn strip(token: &str) -> Result<&str, Error> {
    token.trim().strip_prefix(PREFIX).ok_or(Error::NotScoped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_reads_back_from_its_hex() {
        let key = TokenKey::generate();
        let again = TokenKey::from_private_hex(&key.private_hex()).unwrap();
        assert_eq!(key.public_hex(), again.public_hex());
        assert!(TokenKey::from_private_hex("zz").is_err());
        assert!(public_from_hex(&key.public_hex()).is_ok());
    }

    #[test]
    fn narrowing_adds_a_block_and_an_id() {
        let key = TokenKey::generate();
        let token = mint(&key, &Scope::default()).unwrap();
        let narrowed = attenuate(
            &token,
            &Scope {
                read_only: true,
                ..Scope::default()
            },
        )
        .unwrap();
        let (a, b) = (describe(&token).unwrap(), describe(&narrowed).unwrap());
        assert_eq!(b.revocation_ids, [a.id.clone(), b.id.clone()]);
        assert_eq!((a.blocks.len(), b.blocks.len()), (1, 2));
        assert!(
            b.blocks[1].contains(r#"operation("read")"#),
            "{:?}",
            b.blocks
        );
        assert!(matches!(describe("abc"), Err(Error::NotScoped)));
    }
}
