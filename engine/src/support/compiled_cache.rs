//! Compiled definitions, kept by the SHA-256 of their text so the next
//! job of the same definition skips compiling. Bounded by what the entries
//! weigh, not only by their number: inline definitions come from any
//! submitter with the `define` scope, each up to the body limit in size.

use std::collections::HashMap;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use flotilla_workflow::{CompiledWorkflow, InvalidDefinition};

use crate::Engine;

/// What the cache may weigh, unless configured.
pub(crate) const DEFAULT_CACHE_BYTES: usize = 64 * 1024 * 1024;
/// Entries kept at most, whatever they weigh.
const MAX_ENTRIES: usize = 1024;

/// One compiled definition, its weight and when it was last used.
#[derive(Debug)]
struct Entry {
    compiled: Arc<CompiledWorkflow>,
    weight: usize,
    used: u64,
}

/// The cache: past its limit the least recently used entries go, so a
/// flood of distinct inline definitions does not push out the stored
/// workflows every job uses.
#[derive(Debug)]
pub(crate) struct CompiledCache {
    entries: HashMap<[u8; 32], Entry>,
    weight: usize,
    limit: usize,
    /// A counter standing for time, for "least recently used".
    clock: u64,
}

impl CompiledCache {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            entries: HashMap::new(),
            weight: 0,
            limit,
            clock: 0,
        }
    }

    /// The key of a definition's `text`.
    pub(crate) fn key(text: &str) -> [u8; 32] {
        Sha256::digest(text.as_bytes()).into()
    }

    pub(crate) fn get(&mut self, key: &[u8; 32]) -> Option<Arc<CompiledWorkflow>> {
        self.clock += 1;
        let entry = self.entries.get_mut(key)?;
        entry.used = self.clock;
        Some(entry.compiled.clone())
    }

    /// Keeps `compiled`, which weighs `weight` bytes (see
    /// `CompiledWorkflow::weight`); one heavier than the whole limit is not
    /// kept.
    pub(crate) fn insert(&mut self, key: [u8; 32], compiled: Arc<CompiledWorkflow>, weight: usize) {
        if weight > self.limit {
            return;
        }
        if let Some(replaced) = self.entries.remove(&key) {
            self.weight -= replaced.weight;
        }
        while self.weight + weight > self.limit || self.entries.len() >= MAX_ENTRIES {
            let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, entry)| entry.used)
                .map(|(key, _)| *key)
            else {
                break;
            };
            if let Some(evicted) = self.entries.remove(&oldest) {
                self.weight -= evicted.weight;
            }
        }
        self.clock += 1;
        self.entries.insert(
            key,
            Entry {
                compiled,
                weight,
                used: self.clock,
            },
        );
        self.weight += weight;
    }

    #[cfg(test)]
    fn weight(&self) -> usize {
        self.weight
    }
}

impl Engine {
    fn compiled_cache(&self) -> std::sync::MutexGuard<'_, CompiledCache> {
        self.inner
            .compiled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Compiles a definition document against this worker's targets,
    /// reusing an earlier compilation. A compilation runs on the
    /// evaluation threads (`support/eval_pool.rs`): it can take a while (a schema's
    /// patterns), and the CEL parser needs their deep stacks.
    ///
    /// # Errors
    /// Every problem of the definition.
    pub async fn compile(
        &self,
        document: &serde_json::Value,
    ) -> Result<Arc<CompiledWorkflow>, InvalidDefinition> {
        self.compile_cached(document, false).await
    }

    /// Compiles a stored definition for a submission: it was checked against
    /// its registrar's targets, and this worker may lack some of them during
    /// a rolling deploy (placement decides at run time, see `run/placement.rs`).
    pub(crate) async fn compile_stored(
        &self,
        document: &serde_json::Value,
    ) -> Result<Arc<CompiledWorkflow>, InvalidDefinition> {
        self.compile_held(document, true).await
    }

    /// Compiles the definition a job runs (its row's): as [`Engine::compile`],
    /// but one accepted before this release's bounds on `max_attempts`
    /// and `deadline_ms` is held to them rather than refused
    /// (`limits::held_to_bounds`).
    ///
    /// # Errors
    /// Every problem of the definition.
    pub(crate) async fn compile_to_run(
        &self,
        document: &serde_json::Value,
    ) -> Result<Arc<CompiledWorkflow>, InvalidDefinition> {
        self.compile_held(document, false).await
    }

    /// [`Engine::compile_cached`] of `document` held to this release's
    /// bounds (`limits::held_to_bounds`).
    async fn compile_held(
        &self,
        document: &serde_json::Value,
        any_target: bool,
    ) -> Result<Arc<CompiledWorkflow>, InvalidDefinition> {
        match flotilla_workflow::limits::held_to_bounds(document) {
            Some(held) => {
                tracing::debug!(workflow = %held["name"], "a definition stored before the bounds on max_attempts and deadline_ms runs held to them");
                self.compile_cached(&held, any_target).await
            }
            None => self.compile_cached(document, any_target).await,
        }
    }

    async fn compile_cached(
        &self,
        document: &serde_json::Value,
        any_target: bool,
    ) -> Result<Arc<CompiledWorkflow>, InvalidDefinition> {
        let text = format!("{}{document}", if any_target { "*" } else { "" });
        let key = CompiledCache::key(&text);
        if let Some(compiled) = self.compiled_cache().get(&key) {
            return Ok(compiled);
        }
        let mut known = self.inner.targets.names();
        if any_target {
            known.extend(
                document["steps"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|step| step["target"].as_str().map(str::to_owned)),
            );
        }
        let owned = document.clone();
        let compiled = self
            .on_pool(move || CompiledWorkflow::compile(&owned, &known))
            .await?;
        let compiled = Arc::new(compiled);
        let weight = compiled.weight(text.len());
        self.compiled_cache().insert(key, compiled.clone(), weight);
        Ok(compiled)
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
    fn the_cache_never_weighs_more_than_its_limit_and_keeps_what_is_used() {
        let (text, one) = compiled("one");
        let weight = text.len() * 4;
        let limit = weight * 3;
        let mut cache = CompiledCache::new(limit);
        let used = CompiledCache::key(&text);
        cache.insert(used, one.clone(), weight);
        for i in 0..100 {
            let (text, compiled) = compiled(&format!("w{i:03}"));
            let key = CompiledCache::key(&text);
            cache.insert(key, compiled, weight);
            assert!(cache.weight() <= limit, "{} > {limit}", cache.weight());
            assert!(cache.get(&key).is_some(), "the newest entry is kept");
            // The definition every job uses stays while the flood passes.
            assert!(
                cache.get(&used).is_some(),
                "a used entry was evicted at {i}"
            );
        }
        // One heavier than the whole cache is compiled each time, not kept.
        let key = CompiledCache::key("huge");
        cache.insert(key, one, limit + 1);
        assert!(cache.get(&key).is_none());
    }
}
