//! Helpers every folder of the engine uses and that use none of them: the
//! evaluation threads, the compiled-definition cache, schedule cadences,
//! digests, what the store can hold, error text, stored bytes, metric
//! names and the permits of rate-limited targets.

pub(crate) mod cadence;
pub(crate) mod compiled_cache;
pub(crate) mod digest;
pub(crate) mod eval_pool;
pub(crate) mod judge;
pub(crate) mod rate_limit;
pub(crate) mod sanitize;
pub(crate) mod storable;
pub(crate) mod stored_bytes;
pub(crate) mod telemetry;
