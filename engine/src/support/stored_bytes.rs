//! The bound on what one job keeps of its answers. Every claim reads a
//! job's whole checkpoint list, and Postgres builds no jsonb value past
//! 256 MB: a job allowed to grow without bound would cost every claim,
//! read and replay more and more, and past that size could not be read at
//! all. So each checkpoint is admitted against a per-job budget
//! (`FLOTILLA_MAX_STORED_BYTES`) before it is written; the one that would
//! cross it ends the job with a verdict naming the bound.

use flotilla_store::runs::Checkpoint;
use serde_json::Value as Json;

use flotilla_targets::StepFailure;

/// The default budget: 64 MiB, a quarter of what a jsonb value may hold.
pub const DEFAULT_MAX_STORED_BYTES: u64 = 64 * 1024 * 1024;

/// The bytes a job's checkpoints take, and the most they may.
#[derive(Debug)]
pub(crate) struct StoredBytes {
    used: u64,
    limit: u64,
}

impl StoredBytes {
    /// A budget of `limit` for a job whose stored list is `stored`.
    pub(crate) fn new(limit: u64, stored: &Json) -> Self {
        Self {
            used: serialized_len(stored),
            limit,
        }
    }

    /// Counts `checkpoint` in, or says which bound it would cross.
    pub(crate) fn admit(&mut self, checkpoint: &Checkpoint) -> Result<(), StepFailure> {
        let size =
            serde_json::to_value(checkpoint).map_or(u64::MAX, |entry| serialized_len(&entry));
        let total = self.used.saturating_add(size);
        if total > self.limit {
            return Err(StepFailure::Verdict {
                message: format!(
                    "step {}: storing its answer ({size} bytes) would take the job's stored answers to {total} bytes, over the bound of {} (FLOTILLA_MAX_STORED_BYTES)",
                    checkpoint.name, self.limit
                ),
                violations: vec![format!("max_stored_bytes: {}", self.limit)],
            });
        }
        self.used = total;
        Ok(())
    }
}

/// The length of `value` written as JSON, without writing it anywhere.
fn serialized_len(value: &impl serde::Serialize) -> u64 {
    struct Count(u64);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        Err(_) => u64::MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(name: &str, bytes: usize) -> Checkpoint {
        Checkpoint {
            name: name.into(),
            skipped: false,
            response: Json::String("x".repeat(bytes)),
            item: None,
            page: None,
            signal: None,
            child: None,
            list: None,
            timed_out: false,
            call: None,
            poll: None,
        }
    }

    #[test]
    fn counts_what_is_stored_and_refuses_the_answer_that_crosses_the_bound() {
        let stored = serde_json::json!([{"name": "a", "response": "y".repeat(400)}]);
        let mut budget = StoredBytes::new(1_000, &stored);
        assert!(budget.used > 400 && budget.used < 500, "{}", budget.used);
        budget.admit(&answer("b", 300)).unwrap();
        let refused = budget.admit(&answer("c", 300)).unwrap_err();
        let StepFailure::Verdict { message, .. } = refused else {
            panic!("not a verdict: {refused:?}");
        };
        assert!(
            message.starts_with("step c: storing its answer ("),
            "{message}"
        );
        assert!(message.contains("over the bound of 1000"), "{message}");
        // Refused answers are not counted: a small one still fits.
        budget.admit(&answer("d", 10)).unwrap();
    }

    #[test]
    fn serialized_len_is_the_length_of_the_json_text() {
        let value = serde_json::json!({"k": [1, "two", null]});
        assert_eq!(
            serialized_len(&value),
            serde_json::to_vec(&value).unwrap().len() as u64
        );
    }
}
