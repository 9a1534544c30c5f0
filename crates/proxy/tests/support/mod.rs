//! Helpers of the proxy's tests.

pub mod hyper_reference;
