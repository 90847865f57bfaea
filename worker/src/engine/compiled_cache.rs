//! Compiled definitions, kept by the SHA-256 of their text so the next
//! job of the same definition skips compiling. Bounded by what the entries
//! weigh, not only by their number: inline definitions come from any
//! submitter with the `define` scope, each up to the body limit in size.

use std::collections::HashMap;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::workflow::CompiledWorkflow;

/// What the cache may weigh, unless configured.
pub(super) const DEFAULT_CACHE_BYTES: usize = 64 * 1024 * 1024;
/// Entries kept at most, whatever they weigh.
const MAX_ENTRIES: usize = 1024;
/// A compiled definition weighs about this many times its text: the
/// parsed definition, the document kept for events, the programs.
const WEIGHT_PER_BYTE: usize = 4;

/// The cache: when an entry would not fit it starts over (it refills with
/// the definitions still in use, one compile each).
#[derive(Debug)]
pub(super) struct CompiledCache {
    entries: HashMap<[u8; 32], (Arc<CompiledWorkflow>, usize)>,
    weight: usize,
    limit: usize,
}

impl CompiledCache {
    pub(super) fn new(limit: usize) -> Self {
        Self {
            entries: HashMap::new(),
            weight: 0,
            limit,
        }
    }

    /// The key of a definition's `text`.
    pub(super) fn key(text: &str) -> [u8; 32] {
        Sha256::digest(text.as_bytes()).into()
    }

    pub(super) fn get(&self, key: &[u8; 32]) -> Option<Arc<CompiledWorkflow>> {
        self.entries.get(key).map(|(compiled, _)| compiled.clone())
    }

    /// Keeps `compiled`, whose text is `text_len` bytes; one heavier than
    /// the whole limit is not kept.
    pub(super) fn insert(
        &mut self,
        key: [u8; 32],
        compiled: Arc<CompiledWorkflow>,
        text_len: usize,
    ) {
        let weight = text_len.saturating_mul(WEIGHT_PER_BYTE);
        if weight > self.limit {
            return;
        }
        if self.weight + weight > self.limit || self.entries.len() >= MAX_ENTRIES {
            self.entries.clear();
            self.weight = 0;
        }
        if let Some((_, replaced)) = self.entries.insert(key, (compiled, weight)) {
            self.weight -= replaced;
        }
        self.weight += weight;
    }

    #[cfg(test)]
    fn weight(&self) -> usize {
        self.weight
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn compiled(name: &str) -> (String, Arc<CompiledWorkflow>) {
        let document = serde_json::json!({
            "name": name,
            "input_schema": {"type": "object"},
            "steps": [{"name": "s", "target": "t", "method": "m"}]
        });
        let known: HashSet<String> = ["t".to_owned()].into();
        let compiled = CompiledWorkflow::compile(&document, &known).unwrap();
        (document.to_string(), Arc::new(compiled))
    }

    #[test]
    fn the_cache_never_weighs_more_than_its_limit() {
        let (text, one) = compiled("one");
        let limit = text.len() * WEIGHT_PER_BYTE * 3;
        let mut cache = CompiledCache::new(limit);
        for i in 0..100 {
            let (text, compiled) = compiled(&format!("w{i:03}"));
            let key = CompiledCache::key(&text);
            cache.insert(key, compiled, text.len());
            assert!(cache.weight() <= limit, "{} > {limit}", cache.weight());
            assert!(cache.get(&key).is_some(), "the newest entry is kept");
        }
        // One heavier than the whole cache is compiled each time, not kept.
        let key = CompiledCache::key("huge");
        cache.insert(key, one, limit);
        assert!(cache.get(&key).is_none());
    }
}
