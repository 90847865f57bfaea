//! The shape of a workflow: which steps each step needs.
//!
//! A step without `needs` needs the step before it (the first step none),
//! so a definition written as a list keeps its meaning: a chain. `needs:
//! []` makes a step a root. A step may start once every step it needs has
//! ended (completed or skipped); what it may read is its *ancestors*, the
//! steps it needs and theirs, all of them ended before it starts.
//!
//! Built once per compiled definition; every problem (an unknown or
//! repeated need, a step needing itself, a cycle, too many edges) is
//! reported with the step it is in.

use std::collections::HashMap;

use super::model::StepDefinition;

/// The most edges (needs, counted over every step) a definition may have.
pub const MAX_EDGES: usize = 10_000;

/// The resolved graph, by step index (the definition's order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Graph {
    needs: Vec<Vec<usize>>,
    dependants: Vec<Vec<usize>>,
    /// Bit j of `ancestors[i]`: step j ends before step i may start.
    ancestors: Vec<Vec<u64>>,
}

/// A problem with the graph, found in step `step` (by name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphProblem {
    pub step: Option<String>,
    pub message: String,
}

impl Graph {
    /// Resolves every step's needs by name.
    ///
    /// # Errors
    /// Every problem found; names are checked elsewhere (blank, repeated),
    /// and a repeated name resolves to its first step here.
    pub fn resolve(steps: &[StepDefinition]) -> Result<Self, Vec<GraphProblem>> {
        let mut index: HashMap<&str, usize> = HashMap::with_capacity(steps.len());
        for (i, step) in steps.iter().enumerate() {
            index.entry(step.name.as_str()).or_insert(i);
        }
        let mut problems = Vec::new();
        let edges: usize = steps
            .iter()
            .map(|s| s.needs.as_ref().map_or(1, Vec::len))
            .sum();
        if edges > MAX_EDGES {
            problems.push(GraphProblem {
                step: None,
                message: format!("{edges} needs in all, over the limit of {MAX_EDGES}"),
            });
            return Err(problems);
        }
        let mut needs = Vec::with_capacity(steps.len());
        for (i, step) in steps.iter().enumerate() {
            let problem = |message: String| GraphProblem {
                step: Some(step.name.clone()),
                message,
            };
            let Some(named) = &step.needs else {
                needs.push(i.checked_sub(1).into_iter().collect());
                continue;
            };
            let mut resolved: Vec<usize> = Vec::with_capacity(named.len());
            for name in named {
                match index.get(name.as_str()) {
                    None => problems.push(problem(format!("needs {name:?}, which is no step"))),
                    Some(&j) if j == i => problems.push(problem("needs itself".into())),
                    Some(j) if resolved.contains(j) => {
                        problems.push(problem(format!("needs {name:?} twice")));
                    }
                    Some(&j) => resolved.push(j),
                }
            }
            needs.push(resolved);
        }
        let mut dependants = vec![Vec::new(); steps.len()];
        for (i, of) in needs.iter().enumerate() {
            for &j in of {
                dependants[j].push(i);
            }
        }
        let Some(order) = topological_order(&needs, &dependants) else {
            let on_cycle = on_a_cycle(&needs, &dependants);
            problems.extend(on_cycle.into_iter().map(|i| GraphProblem {
                step: Some(steps[i].name.clone()),
                message: "is on a cycle of needs".into(),
            }));
            return Err(problems);
        };
        if !problems.is_empty() {
            return Err(problems);
        }
        let words = steps.len().div_ceil(64);
        let mut ancestors = vec![vec![0u64; words]; steps.len()];
        for &i in &order {
            // Every need comes earlier in the order, its set already whole.
            let mut of_i = vec![0u64; words];
            for &j in &needs[i] {
                for (word, of_j) in of_i.iter_mut().zip(&ancestors[j]) {
                    *word |= of_j;
                }
                of_i[j / 64] |= 1 << (j % 64);
            }
            ancestors[i] = of_i;
        }
        Ok(Self {
            needs,
            dependants,
            ancestors,
        })
    }

    /// How many steps.
    #[must_use]
    pub fn len(&self) -> usize {
        self.needs.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.needs.is_empty()
    }

    /// The steps `step` needs.
    #[must_use]
    pub fn needs(&self, step: usize) -> &[usize] {
        &self.needs[step]
    }

    /// The steps that need `step`.
    #[must_use]
    pub fn dependants(&self, step: usize) -> &[usize] {
        &self.dependants[step]
    }

    /// Whether `ancestor` ends before `step` may start.
    #[must_use]
    pub fn is_ancestor(&self, ancestor: usize, step: usize) -> bool {
        self.ancestors[step][ancestor / 64] & (1 << (ancestor % 64)) != 0
    }

    /// Whether this is a chain in definition order (every step needs the
    /// one before it and nothing else): the shape every definition had
    /// before graphs, which a worker of an earlier release runs too.
    #[must_use]
    pub fn is_chain(&self) -> bool {
        self.needs
            .iter()
            .enumerate()
            .all(|(i, needs)| needs.as_slice() == i.checked_sub(1).as_slice())
    }
}

/// Kahn's order, or `None` when the needs have a cycle.
fn topological_order(needs: &[Vec<usize>], dependants: &[Vec<usize>]) -> Option<Vec<usize>> {
    let mut waiting: Vec<usize> = needs.iter().map(Vec::len).collect();
    let mut ready: Vec<usize> = (0..needs.len()).filter(|&i| waiting[i] == 0).collect();
    let mut order = Vec::with_capacity(needs.len());
    while let Some(i) = ready.pop() {
        order.push(i);
        for &d in &dependants[i] {
            waiting[d] -= 1;
            if waiting[d] == 0 {
                ready.push(d);
            }
        }
    }
    (order.len() == needs.len()).then_some(order)
}

/// The steps on a cycle: what is left after peeling steps with no needs
/// left (forwards) and no dependants left (backwards), in index order.
fn on_a_cycle(needs: &[Vec<usize>], dependants: &[Vec<usize>]) -> Vec<usize> {
    let n = needs.len();
    let mut alive = vec![true; n];
    loop {
        let mut peeled = false;
        for i in 0..n {
            if !alive[i] {
                continue;
            }
            let no_needs = needs[i].iter().all(|&j| !alive[j]);
            let no_dependants = dependants[i].iter().all(|&j| !alive[j]);
            if no_needs || no_dependants {
                alive[i] = false;
                peeled = true;
            }
        }
        if !peeled {
            break;
        }
    }
    (0..n).filter(|&i| alive[i]).collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn steps(shape: &[(&str, Option<&[&str]>)]) -> Vec<StepDefinition> {
        shape
            .iter()
            .map(|(name, needs)| {
                let mut step = json!({"name": name, "target": "t", "method": "m"});
                if let Some(needs) = needs {
                    step["needs"] = json!(needs);
                }
                serde_json::from_value(step).unwrap()
            })
            .collect()
    }

    #[test]
    fn a_list_without_needs_is_a_chain() {
        let graph = Graph::resolve(&steps(&[("a", None), ("b", None), ("c", None)])).unwrap();
        assert!(graph.is_chain());
        assert_eq!(graph.needs(2), &[1]);
        assert!(graph.is_ancestor(0, 2), "a ends before c");
        assert!(!graph.is_ancestor(2, 0));
    }

    #[test]
    fn fan_out_and_fan_in() {
        let graph = Graph::resolve(&steps(&[
            ("start", None),
            ("left", Some(&["start"])),
            ("right", Some(&["start"])),
            ("join", Some(&["left", "right"])),
            ("alone", Some(&[])),
        ]))
        .unwrap();
        assert!(!graph.is_chain());
        assert_eq!(graph.dependants(0), &[1, 2]);
        assert_eq!(graph.needs(3), &[1, 2]);
        assert!(
            graph.is_ancestor(0, 3),
            "start is the join's ancestor through both"
        );
        assert!(!graph.is_ancestor(1, 2), "the branches are independent");
        assert!(graph.needs(4).is_empty());
        assert!(!graph.is_ancestor(3, 4));
    }

    #[test]
    fn a_need_that_comes_later_in_the_list_is_allowed() {
        let graph =
            Graph::resolve(&steps(&[("late", Some(&["early"])), ("early", Some(&[]))])).unwrap();
        assert!(graph.is_ancestor(1, 0));
    }

    #[test]
    fn unknown_repeated_and_own_needs_name_their_step() {
        let problems = Graph::resolve(&steps(&[
            ("a", Some(&["ghost"])),
            ("b", Some(&["a", "a"])),
            ("c", Some(&["c"])),
        ]))
        .unwrap_err();
        let found: Vec<(Option<&str>, &str)> = problems
            .iter()
            .map(|p| (p.step.as_deref(), p.message.as_str()))
            .collect();
        assert_eq!(
            found,
            [
                (Some("a"), "needs \"ghost\", which is no step"),
                (Some("b"), "needs \"a\" twice"),
                (Some("c"), "needs itself"),
            ]
        );
    }

    #[test]
    fn a_cycle_names_the_steps_on_it_and_not_the_others() {
        let problems = Graph::resolve(&steps(&[
            ("root", Some(&[])),
            ("x", Some(&["root", "z"])),
            ("y", Some(&["x"])),
            ("z", Some(&["y"])),
            ("after", Some(&["z"])),
        ]))
        .unwrap_err();
        let on_cycle: Vec<&str> = problems.iter().filter_map(|p| p.step.as_deref()).collect();
        assert_eq!(on_cycle, ["x", "y", "z"]);
        assert!(
            problems
                .iter()
                .all(|p| p.message == "is on a cycle of needs")
        );
    }

    #[test]
    fn too_many_edges_are_refused_before_anything_is_resolved() {
        let names: Vec<String> = (0..101).map(|i| format!("s{i}")).collect();
        let all: Vec<&str> = names.iter().map(String::as_str).collect();
        let shape: Vec<(&str, Option<&[&str]>)> =
            names.iter().map(|n| (n.as_str(), Some(&all[..]))).collect();
        let problems = Graph::resolve(&steps(&shape)).unwrap_err();
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0].message.contains("10201 needs in all"),
            "{problems:?}"
        );
    }
}
