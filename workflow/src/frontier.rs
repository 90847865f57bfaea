//! Which steps of a job may start: the frontier of one segment.
//!
//! A step is *pending*, *started* or *ended*. It ends when its checkpoint
//! (completed or skipped) has committed, never earlier, so a dependant is
//! called only on what is durable. A pending step whose needs have all
//! ended is ready; ready steps are handed out in definition order, so a
//! graph runs the same way every time. Pure: the engine's segment (`engine/src/run/segment.rs`)
//! calls targets and writes checkpoints, this only keeps count.

use std::collections::BTreeSet;

use crate::Graph;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Pending,
    Started,
    Ended,
}

#[derive(Debug)]
pub struct Frontier<'g> {
    graph: &'g Graph,
    state: Vec<State>,
    /// Per step, how many of its needs have not ended.
    waiting: Vec<usize>,
    ready: BTreeSet<usize>,
    ended: usize,
}

impl<'g> Frontier<'g> {
    /// A frontier where the steps in `ended` have their checkpoints.
    pub fn new(graph: &'g Graph, ended: impl IntoIterator<Item = usize>) -> Self {
        let mut frontier = Self {
            graph,
            state: vec![State::Pending; graph.len()],
            waiting: (0..graph.len()).map(|i| graph.needs(i).len()).collect(),
            ready: BTreeSet::new(),
            ended: 0,
        };
        for step in ended {
            frontier.end(step);
        }
        frontier.ready = (0..graph.len())
            .filter(|&i| frontier.state[i] == State::Pending && frontier.waiting[i] == 0)
            .collect();
        frontier
    }

    /// The first ready step, now started.
    pub fn start_next(&mut self) -> Option<usize> {
        let step = self.ready.pop_first()?;
        self.state[step] = State::Started;
        Some(step)
    }

    /// `step`'s checkpoint committed: its dependants may become ready.
    pub fn end(&mut self, step: usize) {
        if self.state[step] == State::Ended {
            return;
        }
        self.state[step] = State::Ended;
        self.ready.remove(&step);
        self.ended += 1;
        for &dependant in self.graph.dependants(step) {
            self.waiting[dependant] -= 1;
            if self.waiting[dependant] == 0 && self.state[dependant] == State::Pending {
                self.ready.insert(dependant);
            }
        }
    }

    /// Whether every step has ended.
    pub fn all_ended(&self) -> bool {
        self.ended == self.state.len()
    }

    /// Whether ending `step` would end the job's last step.
    pub fn is_last(&self, step: usize) -> bool {
        self.state[step] != State::Ended && self.ended + 1 == self.state.len()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::StepDefinition;

    fn graph(needs: &[&[&str]]) -> Graph {
        let steps: Vec<StepDefinition> = needs
            .iter()
            .enumerate()
            .map(|(i, needs)| {
                serde_json::from_value(
                    json!({"name": format!("s{i}"), "target": "t", "method": "m", "needs": needs}),
                )
                .unwrap()
            })
            .collect();
        Graph::resolve(&steps).unwrap()
    }

    fn drain(frontier: &mut Frontier) -> Vec<usize> {
        std::iter::from_fn(|| frontier.start_next()).collect()
    }

    #[test]
    fn a_fan_out_starts_together_and_the_join_waits_for_every_branch() {
        // s0 → s1, s2, s3 → s4
        let graph = graph(&[&[], &["s0"], &["s0"], &["s0"], &["s1", "s2", "s3"]]);
        let mut frontier = Frontier::new(&graph, []);
        assert_eq!(drain(&mut frontier), [0]);
        frontier.end(0);
        assert_eq!(drain(&mut frontier), [1, 2, 3]);
        frontier.end(3);
        frontier.end(1);
        assert_eq!(
            drain(&mut frontier),
            [] as [usize; 0],
            "s2 is still running"
        );
        assert!(!frontier.is_last(2));
        frontier.end(2);
        assert_eq!(drain(&mut frontier), [4]);
        assert!(frontier.is_last(4));
        frontier.end(4);
        assert!(frontier.all_ended());
    }

    #[test]
    fn a_resumed_schedule_starts_exactly_the_steps_without_a_checkpoint() {
        // Two roots, each with a follower; s0 and s3 ended in that order.
        let graph = graph(&[&[], &["s0"], &[], &["s2"]]);
        let mut frontier = Frontier::new(&graph, [0, 2, 3]);
        assert_eq!(drain(&mut frontier), [1]);
        assert!(frontier.is_last(1));
    }

    #[test]
    fn a_step_started_is_never_handed_out_again() {
        let graph = graph(&[&[], &[]]);
        let mut frontier = Frontier::new(&graph, []);
        assert_eq!(frontier.start_next(), Some(0));
        assert_eq!(frontier.start_next(), Some(1));
        assert_eq!(frontier.start_next(), None);
        frontier.end(0);
        frontier.end(0);
        assert!(!frontier.all_ended(), "ending a step twice counts once");
    }
}
