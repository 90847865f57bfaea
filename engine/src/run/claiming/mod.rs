//! How a claim loop gets a job: the loops and their wake-ups
//! (`claim_loop.rs`), the claims they share (`claims.rs`), and the jobs a
//! submission wrote already claimed and hands to an idle loop (`eager.rs`).

pub(crate) mod claim_loop;
pub(crate) mod claims;
pub(crate) mod eager;
