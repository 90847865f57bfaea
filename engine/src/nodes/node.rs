//! What one call of a segment is: a step, an item, a page or a poll.

/// A step, one item of a `for_each` step, one page of a paged step, or
/// one call of a repeating step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Node {
    pub(super) step: usize,
    pub(super) item: Option<usize>,
    pub(super) page: Option<u32>,
    pub(super) poll: Option<u32>,
}

impl Node {
    pub(super) fn step(step: usize) -> Self {
        Self {
            step,
            item: None,
            page: None,
            poll: None,
        }
    }

    /// The part of its step this call is, as its idempotency key says it.
    pub(super) fn part(self) -> Option<String> {
        match (self.item, self.page, self.poll) {
            (Some(item), _, _) => Some(format!("item-{item}")),
            (None, Some(page), _) => Some(format!("page-{page}")),
            (None, None, Some(poll)) => Some(format!("poll-{poll}")),
            (None, None, None) => None,
        }
    }

    /// Whether this call is the step's first (its `when` decides).
    pub(super) fn is_first(self) -> bool {
        self.item.is_none() && self.page.unwrap_or(0) == 0 && self.poll.unwrap_or(0) == 0
    }
}
