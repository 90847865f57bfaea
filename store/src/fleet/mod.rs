//! What the fleet's members write about themselves: workers' heartbeats
//! (`workers`), relays' buckets (`buckets`), the tally of finished jobs
//! (`finished`) and of dead letters (`dead_letters`), and the one-way
//! features every live member must read before one is used (`features`).

pub mod buckets;
pub mod dead_letters;
pub mod features;
pub mod finished;
pub mod workers;
