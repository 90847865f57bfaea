//! The budget of one CEL evaluation. The `cel` crate has no cost limits,
//! so every compiled expression is instrumented: each comprehension
//! (`map`, `filter`, `all`, `exists`, `exists_one`) charges a step per
//! iteration (what it evaluates once per item is wrapped in `@tick`), and
//! each `+` charges the size of what it built (wrapped in `@grow`: strings
//! and bytes by length, lists and maps by entries, which share their
//! elements).
//! Charges check the time too. The same pass has every comprehension
//! iterate a map in sorted key order (its range wrapped in `@in_key_order`):
//! the crate iterates a map in its hash order, which differs from one
//! evaluation to the next, so `input.m.map(k, k)` would give a `for_each`
//! a list in another order on every segment. The names start with `@`,
//! which CEL source cannot write, so no expression can call or shadow them.
//!
//! An evaluation runs with a budget set on its thread ([`Budget::run`]);
//! what it spends is tracked there and an exhausted budget fails the
//! evaluation with [`Exhausted`], which the engine treats as the job's own
//! verdict, never as an outage or a lease loss.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use cel::common::ast::{CallExpr, ComprehensionExpr, EntryExpr, Expr, operators};
use cel::{ExecutionError, IdedExpr, Value};

/// What one evaluation may spend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Comprehension iterations, nested ones included.
    pub steps: u64,
    /// Bytes of what `+` builds (strings, bytes), entries of lists and maps
    /// counted as 16 bytes each.
    pub bytes: u64,
    /// Wall-clock time, checked at each charge.
    pub time: Duration,
}

/// Steps, bytes and time of an evaluation, unless configured.
pub const DEFAULT_BUDGET: Budget = Budget {
    steps: 100_000,
    bytes: 8 * 1024 * 1024,
    time: Duration::from_secs(1),
};

/// An evaluation spent its whole budget.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the expression budget is exhausted: {0}")]
pub struct Exhausted(pub String);

const TICK: &str = "@tick";
const GROW: &str = "@grow";
const IN_KEY_ORDER: &str = "@in_key_order";

/// What is left of the budget of the evaluation running on this thread.
struct Left {
    steps: u64,
    bytes: u64,
    deadline: Instant,
    budget: Budget,
    exhausted: Option<Exhausted>,
}

thread_local! {
    static LEFT: RefCell<Option<Left>> = const { RefCell::new(None) };
}

impl Budget {
    /// Runs `evaluate` with this budget on this thread; `Err` when the
    /// budget ran out (whatever `evaluate` returned then).
    ///
    /// # Errors
    /// [`Exhausted`], naming what ran out.
    pub fn run<T>(self, evaluate: impl FnOnce() -> T) -> Result<T, Exhausted> {
        LEFT.with(|left| {
            *left.borrow_mut() = Some(Left {
                steps: self.steps,
                bytes: self.bytes,
                deadline: Instant::now() + self.time,
                budget: self,
                exhausted: None,
            });
        });
        let outcome = evaluate();
        let left = LEFT.with(|left| left.borrow_mut().take());
        match left.and_then(|left| left.exhausted) {
            Some(exhausted) => Err(exhausted),
            None => Ok(outcome),
        }
    }
}

/// Charges `steps` and `bytes` against the running budget (nothing when no
/// budget runs: a test evaluating directly).
fn charge(steps: u64, bytes: u64) -> Result<(), ExecutionError> {
    LEFT.with(|left| {
        let mut left = left.borrow_mut();
        let Some(left) = left.as_mut() else {
            return Ok(());
        };
        let why = if left.exhausted.is_some() {
            None
        } else if left.steps < steps {
            Some(format!("more than {} iterations", left.budget.steps))
        } else if left.bytes < bytes {
            Some(format!("more than {} bytes built", left.budget.bytes))
        } else if Instant::now() > left.deadline {
            Some(format!("longer than {} ms", left.budget.time.as_millis()))
        } else {
            left.steps -= steps;
            left.bytes -= bytes;
            return Ok(());
        };
        if let Some(why) = why {
            left.exhausted = Some(Exhausted(why));
        }
        let message = left
            .exhausted
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default();
        Err(ExecutionError::function_error(TICK, message))
    })
}

/// The bytes a value built by `+` costs (a number or a duration builds
/// nothing that grows).
fn size(value: &Value) -> u64 {
    let len = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    match value {
        Value::String(text) => len(text.len()),
        Value::Bytes(bytes) => len(bytes.len()),
        Value::List(items) => len(items.len()).saturating_mul(ENTRY_BYTES),
        Value::Map(map) => len(map.map.len()).saturating_mul(ENTRY_BYTES),
        _ => 0,
    }
}

/// What one list or map entry, or one JSON value, is charged.
const ENTRY_BYTES: u64 = 16;

/// Charges one JSON value made from a result (lists whose elements are
/// shared cost nothing to build, and much to expand): `Err` once the
/// running budget is spent.
pub(super) fn charge_json_value() -> Result<(), String> {
    charge(0, ENTRY_BYTES).map_err(|e| e.to_string())
}

/// Adds the budget's functions to an evaluation's context.
pub(super) fn install(context: &mut cel::Context<'_, '_>) {
    // The names cannot clash: CEL source cannot write `@`.
    let _ = context.add_function(TICK, |condition: Value| -> Result<Value, ExecutionError> {
        charge(1, 0)?;
        Ok(condition)
    });
    let _ = context.add_function(GROW, |built: Value| -> Result<Value, ExecutionError> {
        charge(0, size(&built))?;
        Ok(built)
    });
    let _ = context.add_function(
        IN_KEY_ORDER,
        |range: Value| -> Result<Value, ExecutionError> { Ok(in_key_order(range)) },
    );
}

/// What a comprehension iterates: a map's keys as a sorted list (which a
/// comprehension iterates as it would the map), anything else as it is.
fn in_key_order(range: Value) -> Value {
    match range {
        Value::Map(map) => {
            let mut keys: Vec<cel::objects::Key> = map.map.keys().cloned().collect();
            keys.sort_unstable();
            Value::List(std::sync::Arc::new(
                keys.into_iter().map(Value::from).collect(),
            ))
        }
        other => other,
    }
}

/// Instruments `expr` in place: every comprehension charges a step per
/// iteration and iterates a map in sorted key order, every `+` charges the
/// size of what it built.
pub(super) fn instrument(expr: &mut IdedExpr) {
    let id = expr.id;
    match &mut expr.expr {
        Expr::Call(call) => {
            if let Some(target) = call.target.as_mut() {
                instrument(target);
            }
            for arg in &mut call.args {
                instrument(arg);
            }
            if call.func_name == operators::ADD && !appends_to_accumulator(call) {
                let added = std::mem::take(&mut expr.expr);
                expr.expr = wrap(GROW, id, added);
            }
        }
        Expr::Comprehension(comprehension) => {
            instrument(&mut comprehension.iter_range);
            instrument(&mut comprehension.accu_init);
            instrument(&mut comprehension.loop_cond);
            instrument(&mut comprehension.loop_step);
            instrument(&mut comprehension.result);
            tick_each_iteration(comprehension);
            wrap_in(IN_KEY_ORDER, &mut comprehension.iter_range);
        }
        Expr::List(list) => list.elements.iter_mut().for_each(instrument),
        Expr::Map(map) => map
            .entries
            .iter_mut()
            .for_each(|entry| instrument_entry(&mut entry.expr)),
        Expr::Struct(structure) => structure
            .entries
            .iter_mut()
            .for_each(|entry| instrument_entry(&mut entry.expr)),
        Expr::Select(select) => instrument(&mut select.operand),
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
    }
}

/// A macro's own `@result + ...`: the accumulator of a comprehension,
/// whose items are charged as iterations (and whose name, starting with
/// `@`, no source can write).
fn appends_to_accumulator(call: &CallExpr) -> bool {
    matches!(call.args.first().map(|arg| &arg.expr), Some(Expr::Ident(name)) if name.starts_with('@'))
}

/// Wraps what a comprehension evaluates once per iteration in `@tick`.
///
/// The crate runs `map` and `filter` in place when their loop condition is
/// a literal and their step appends `[item]` to the accumulator; that shape
/// is kept (the tick goes on the guard or the item), or both would turn
/// quadratic. A loop condition that is not a literal (`all`, `exists`) is
/// ticked itself: it runs before each step, so an exhausted budget ends
/// the loop at once (those loops hold back errors of their steps).
fn tick_each_iteration(comprehension: &mut ComprehensionExpr) {
    if !matches!(comprehension.loop_cond.expr, Expr::Literal(_)) {
        tick(&mut comprehension.loop_cond);
        return;
    }
    let step = &mut comprehension.loop_step;
    if let Expr::Call(call) = &mut step.expr {
        if call.func_name == operators::CONDITIONAL
            && let Some(guard) = call.args.first_mut()
        {
            return tick(guard);
        }
        if call.func_name == operators::ADD
            && appends_to_accumulator(call)
            && let Some(IdedExpr {
                expr: Expr::List(items),
                ..
            }) = call.args.get_mut(1)
            && !items.elements.is_empty()
        {
            return items.elements.iter_mut().for_each(tick);
        }
    }
    tick(step);
}

fn tick(expr: &mut IdedExpr) {
    wrap_in(TICK, expr);
}

/// Replaces `expr` with `function(expr)`.
fn wrap_in(function: &str, expr: &mut IdedExpr) {
    let inner = std::mem::take(&mut expr.expr);
    expr.expr = wrap(function, expr.id, inner);
}

fn instrument_entry(entry: &mut EntryExpr) {
    match entry {
        EntryExpr::MapEntry(entry) => {
            instrument(&mut entry.key);
            instrument(&mut entry.value);
        }
        EntryExpr::StructField(field) => instrument(&mut field.value),
    }
}

/// `function(inner)`, the call keeping `inner`'s id.
fn wrap(function: &str, id: u64, inner: Expr) -> Expr {
    Expr::Call(CallExpr {
        func_name: function.to_owned(),
        target: None,
        args: vec![IdedExpr { id, expr: inner }],
    })
}

/// How deeply `expr` nests (calls, comprehensions, lists, maps, selects).
pub(super) fn depth(expr: &IdedExpr) -> usize {
    1 + children(expr).into_iter().map(depth).max().unwrap_or(0)
}

/// The expressions directly inside `expr`.
pub(super) fn children(expr: &IdedExpr) -> Vec<&IdedExpr> {
    match &expr.expr {
        Expr::Call(call) => call
            .target
            .iter()
            .map(AsRef::as_ref)
            .chain(&call.args)
            .collect(),
        Expr::Comprehension(c) => vec![
            &c.iter_range,
            &c.accu_init,
            &c.loop_cond,
            &c.loop_step,
            &c.result,
        ],
        Expr::List(list) => list.elements.iter().collect(),
        Expr::Map(map) => map
            .entries
            .iter()
            .flat_map(|entry| match &entry.expr {
                EntryExpr::MapEntry(entry) => vec![&entry.key, &entry.value],
                EntryExpr::StructField(field) => vec![&field.value],
            })
            .collect(),
        Expr::Struct(structure) => structure
            .entries
            .iter()
            .flat_map(|entry| match &entry.expr {
                EntryExpr::MapEntry(entry) => vec![&entry.key, &entry.value],
                EntryExpr::StructField(field) => vec![&field.value],
            })
            .collect(),
        Expr::Select(select) => vec![select.operand.as_ref()],
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::expr::{Expression, Scope};

    fn evaluate(
        source: &str,
        input: &serde_json::Value,
        budget: Budget,
    ) -> Result<serde_json::Value, String> {
        let expression = Expression::compile(source).unwrap();
        let scope = Scope::default().with("input", input);
        match budget.run(|| expression.evaluate(&scope)) {
            Ok(value) => value,
            Err(exhausted) => Err(exhausted.to_string()),
        }
    }

    fn list(n: i64) -> serde_json::Value {
        json!({ "l": (0..n).collect::<Vec<_>>() })
    }

    #[test]
    fn ordinary_comprehensions_fit_the_default_budget() {
        let input = list(1000);
        let doubled = evaluate("input.l.map(x, x * 2)", &input, DEFAULT_BUDGET).unwrap();
        assert_eq!(doubled.as_array().unwrap().len(), 1000);
        let evens = evaluate(
            "input.l.filter(x, x % 2 == 0).size()",
            &input,
            DEFAULT_BUDGET,
        );
        assert_eq!(evens, Ok(json!(500)));
        assert_eq!(
            evaluate("input.l.all(x, x >= 0)", &input, DEFAULT_BUDGET),
            Ok(json!(true))
        );
        assert_eq!(
            evaluate("input.l.exists_one(x, x == 7)", &input, DEFAULT_BUDGET),
            Ok(json!(true))
        );
        assert_eq!(
            evaluate("'a' + 'b'", &input, DEFAULT_BUDGET),
            Ok(json!("ab"))
        );
    }

    #[test]
    fn nested_comprehensions_run_out_of_steps() {
        // 1,000 × 1,000 iterations: a million, over the default 100,000.
        let error = evaluate(
            "input.l.map(a, input.l.map(b, a))",
            &list(1000),
            DEFAULT_BUDGET,
        )
        .unwrap_err();
        assert!(error.contains("more than 100000 iterations"), "{error}");
        // `all` holds back the errors of its steps; its loop condition is
        // charged too, so it stops at once rather than iterating on.
        let error = evaluate(
            "input.l.all(a, input.l.all(b, input.l.all(c, true)))",
            &list(1000),
            DEFAULT_BUDGET,
        )
        .unwrap_err();
        assert!(error.contains("iterations"), "{error}");
    }

    #[test]
    fn what_addition_builds_is_charged_by_size() {
        let budget = Budget {
            bytes: 1024,
            ..DEFAULT_BUDGET
        };
        // Each element appends the whole text so far: quadratic growth.
        let error = evaluate(
            "input.l.map(x, 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa' + 'b')",
            &list(100),
            budget,
        )
        .unwrap_err();
        assert!(error.contains("more than 1024 bytes built"), "{error}");
    }

    #[test]
    fn a_long_evaluation_runs_out_of_time() {
        let budget = Budget {
            steps: u64::MAX,
            time: Duration::from_millis(50),
            ..DEFAULT_BUDGET
        };
        let error = evaluate(
            "input.l.map(a, input.l.map(b, input.l.map(c, a)))",
            &list(200),
            budget,
        )
        .unwrap_err();
        assert!(error.contains("longer than 50 ms"), "{error}");
    }

    /// The crate builds `map` and `filter` results in place; were the
    /// instrumentation to break that shape, each iteration would copy the
    /// list so far, and 90,000 items would take far more than the second.
    #[test]
    fn a_map_over_a_long_list_stays_linear() {
        let mapped = evaluate("input.l.map(x, x).size()", &list(90_000), DEFAULT_BUDGET);
        assert_eq!(mapped, Ok(json!(90_000)));
        let kept = evaluate(
            "input.l.filter(x, x >= 0).size()",
            &list(90_000),
            DEFAULT_BUDGET,
        );
        assert_eq!(kept, Ok(json!(90_000)));
    }

    /// Repeating a list costs nothing to build (the elements are shared)
    /// and much to turn into JSON: every value made is charged, across all
    /// the expressions of one evaluation.
    #[test]
    fn results_turned_into_json_share_one_budget() {
        let budget = Budget {
            bytes: 16 * 1_000,
            ..DEFAULT_BUDGET
        };
        let input = list(600);
        let expression = Expression::compile("[input.l]").unwrap();
        let scope = Scope::default().with("input", &input);
        let one = budget.run(|| expression.evaluate(&scope));
        assert!(matches!(one, Ok(Ok(_))), "{one:?}");
        let two = budget.run(|| {
            let first = expression.evaluate(&scope);
            let second = expression.evaluate(&scope);
            (first, second)
        });
        let exhausted = two.unwrap_err();
        assert!(exhausted.0.contains("bytes built"), "{exhausted}");
    }

    #[test]
    fn numbers_build_nothing() {
        let sum = ["1"; 5].join(" + ");
        // Room for the result's one JSON value, none for the additions.
        let budget = Budget {
            bytes: ENTRY_BYTES,
            ..DEFAULT_BUDGET
        };
        assert_eq!(evaluate(&sum, &json!({}), budget), Ok(json!(5)));
    }

    #[test]
    fn the_budget_functions_cannot_be_written_in_source() {
        assert!(Expression::compile("@tick(1)").is_err());
        assert!(Expression::compile("input.l.map(x, @grow(x))").is_err());
    }

    #[test]
    fn expressions_too_long_or_too_deep_are_refused() {
        let long = format!("'{}'", "a".repeat(2_000));
        assert!(
            Expression::compile(&long)
                .unwrap_err()
                .contains("characters long")
        );
        let deep = format!("{}1{}", "[".repeat(40), "]".repeat(40));
        assert!(Expression::compile(&deep).unwrap_err().contains("nested"));
    }
}
