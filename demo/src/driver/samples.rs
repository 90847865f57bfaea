//! The sample requests: one kind per behaviour the demo shows, each with the
//! final state it must reach.

use serde_json::{Value, json};

/// A behaviour of the fleet the demo shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// Three steps, straight through.
    Shipping,
    /// A transient failure (503) on the second step, retried from the
    /// first step's checkpoint: the first step is called once, the second
    /// twice.
    Retried,
    /// Parked for a human, approved through the API.
    Approved,
    /// A verdict: the target refuses the input (422).
    Refused,
    /// Every attempt fails transiently until none are left.
    Dead,
    /// Parked for a human, cancelled through the API instead.
    Cancelled,
    /// A graph: three roots side by side, a `for_each` over the order's
    /// lines, a check skipped for small orders, a 1 s timer, a fan-in.
    Graph,
    /// Waits for a signal the driver produces to the signal topic once the
    /// job is known (most arrive before the job reaches its wait, some
    /// after).
    Signalled,
    /// Starts a child workflow (`shipping`) and completes with its result.
    Parent,
    /// A step whose target is a pair of Kafka topics: the relay sends its
    /// request, the demo target answers on the reply topic.
    Screened,
    /// Any HTTP call: `GET`, `PUT` and `DELETE` on an order's path (its id
    /// percent-encoded), with an API key from the target's secrets.
    Returned,
    /// Polls an export every second until it is ready (`repeat`).
    Exported,
    /// One `shipping` child per line of the order, two at a time
    /// (`start` with `for_each`).
    Packed,
}

impl Kind {
    /// Every kind, and its share of the requests (in twentieths).
    pub const ALL: [(Kind, usize); 13] = [
        (Kind::Shipping, 1),
        (Kind::Retried, 2),
        (Kind::Approved, 2),
        (Kind::Refused, 2),
        (Kind::Dead, 2),
        (Kind::Cancelled, 2),
        (Kind::Graph, 2),
        (Kind::Signalled, 2),
        (Kind::Parent, 1),
        (Kind::Screened, 1),
        (Kind::Returned, 1),
        (Kind::Exported, 1),
        (Kind::Packed, 1),
    ];

    /// The fewest requests that hold one of each kind.
    pub const FEWEST: usize = Self::ALL.len();

    #[must_use]
    pub fn workflow(self) -> &'static str {
        match self {
            Kind::Shipping => "shipping",
            Kind::Retried => "payment",
            Kind::Approved | Kind::Cancelled => "onboarding",
            Kind::Refused => "kyc",
            Kind::Dead => "archive",
            Kind::Graph => "fulfilment",
            Kind::Signalled => "settlement",
            Kind::Parent => "order",
            Kind::Screened => "screening",
            Kind::Returned => "returns",
            Kind::Exported => "export",
            Kind::Packed => "packing",
        }
    }

    /// The state a job of this kind must end in.
    #[must_use]
    pub fn expected(self) -> &'static str {
        match self {
            Kind::Shipping
            | Kind::Retried
            | Kind::Approved
            | Kind::Graph
            | Kind::Signalled
            | Kind::Parent
            | Kind::Screened
            | Kind::Returned
            | Kind::Exported
            | Kind::Packed => "COMPLETED",
            Kind::Refused => "FAILED",
            Kind::Dead => "DEAD",
            Kind::Cancelled => "CANCELLED",
        }
    }

    #[must_use]
    pub fn describe(self) -> &'static str {
        match self {
            Kind::Shipping => "3 steps straight through",
            Kind::Retried => "capture 503 once, resumed from checkpoint",
            Kind::Approved => "parked for a human, approved",
            Kind::Refused => "verdict: the target refuses (422)",
            Kind::Dead => "503 on every attempt",
            Kind::Cancelled => "parked for a human, cancelled",
            Kind::Graph => "graph: fan-out, for_each, when, timer",
            Kind::Signalled => "waits for a signal sent to Kafka",
            Kind::Parent => "starts a child workflow, takes its result",
            Kind::Screened => "a step answered over Kafka topics",
            Kind::Returned => "GET, PUT, DELETE by path, secret header",
            Kind::Exported => "polls every 1 s until ready (repeat)",
            Kind::Packed => "a shipping child per line, two at a time",
        }
    }

    /// The target calls, per step, each job of this kind must have made, for
    /// the kinds whose target reports them (see [`reported_calls`]).
    #[must_use]
    pub fn expected_calls(self) -> Option<&'static [(&'static str, u64)]> {
        match self {
            Kind::Retried => Some(&[("authorize", 1), ("capture", 2)]),
            Kind::Graph => Some(&[
                ("stock", 1),
                ("price:item-0", 1),
                ("price:item-2", 1),
                ("dispatch", 1),
            ]),
            _ => None,
        }
    }

    /// The input of the `n`th request of this kind.
    #[must_use]
    pub fn input(self, n: usize) -> Value {
        let name = format!("customer-{n}");
        match self {
            Kind::Shipping | Kind::Approved | Kind::Cancelled | Kind::Parent => {
                json!({"name": name})
            }
            Kind::Retried | Kind::Signalled => json!({"amount": 100 + n}),
            Kind::Screened => json!({"name": name, "amount": 100 + n}),
            Kind::Refused => json!({"name": name, "age": 15}),
            Kind::Dead => json!({}),
            // A slash in the id: the path carries it percent-encoded.
            Kind::Returned | Kind::Exported => json!({"order_id": format!("A-{n}/1")}),
            Kind::Packed => {
                json!({"lines": [format!("{name}-a"), format!("{name}-b"), format!("{name}-c")]})
            }
            // Odd orders have five lines (reviewed), even ones three.
            Kind::Graph => {
                let lines = if n % 2 == 1 { 5 } else { 3 };
                let items: Vec<String> = (0..lines).map(|i| format!("sku-{i}")).collect();
                json!({"name": name, "items": items})
            }
        }
    }
}

/// The calls per step the demo target reported in a job's last checkpoint
/// (its answer's `calls`), in the order of `steps`; `None` when it reported
/// none.
#[must_use]
pub fn reported_calls(checkpoints: &Value, steps: &[(&str, u64)]) -> Option<Vec<u64>> {
    let calls = checkpoints.as_array()?.last()?["response"]["calls"].as_object()?;
    Some(
        steps
            .iter()
            .map(|(step, _)| calls.get(*step).and_then(Value::as_u64).unwrap_or(0))
            .collect(),
    )
}

/// `jobs` kinds (at least one of each once `jobs` >= [`Kind::FEWEST`]), by their shares,
/// interleaved so every kind is under way from the start.
#[must_use]
pub fn plan(jobs: usize) -> Vec<Kind> {
    let mut remaining: Vec<(Kind, usize)> = Kind::ALL
        .iter()
        .map(|(kind, share)| {
            let one = usize::from(jobs >= Kind::FEWEST);
            (*kind, (jobs * share / 20).max(one))
        })
        .collect();
    // What the rounding left out goes to the kinds in order.
    let mut i = 0;
    while remaining.iter().map(|(_, n)| n).sum::<usize>() < jobs {
        let kinds = remaining.len();
        remaining[i % kinds].1 += 1;
        i += 1;
    }
    while remaining.iter().map(|(_, n)| n).sum::<usize>() > jobs {
        let largest = remaining.iter_mut().max_by_key(|(_, n)| *n).unwrap();
        largest.1 -= 1;
    }
    let mut order = Vec::with_capacity(jobs);
    while order.len() < jobs {
        for (kind, n) in &mut remaining {
            if *n > 0 {
                *n -= 1;
                order.push(*kind);
            }
        }
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_appears_and_the_shares_hold() {
        let run = plan(300);
        assert_eq!(run.len(), 300);
        for (kind, share) in Kind::ALL {
            let n = run.iter().filter(|k| **k == kind).count();
            assert_eq!(n, 300 * share / 20, "{kind:?}");
        }
        let small = plan(Kind::FEWEST);
        for (kind, _) in Kind::ALL {
            assert!(
                small.contains(&kind),
                "{kind:?} missing from a run of {}",
                Kind::FEWEST
            );
        }
    }

    #[test]
    fn the_calls_come_from_the_last_checkpoint_in_the_order_asked() {
        let steps = Kind::Retried.expected_calls().unwrap();
        let checkpoints = json!([
            {"name": "authorize", "skipped": false, "response": {"authorization": "ok"}},
            {"name": "capture", "skipped": false,
             "response": {"captured": 101, "calls": {"capture": 2, "authorize": 1}}}
        ]);
        assert_eq!(reported_calls(&checkpoints, steps), Some(vec![1, 2]));
        let unfinished = json!([checkpoints[0].clone()]);
        assert_eq!(reported_calls(&unfinished, steps), None);
        assert_eq!(reported_calls(&Value::Null, steps), None);
    }
}
