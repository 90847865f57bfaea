//! Which steps an expression names: `steps.<name>`, `has(steps.<name>)`
//! and `steps["<name>"]`.
//!
//! Registration refuses an expression naming a step that does not end
//! before its own step starts (`graph.rs`, ancestors). A read it cannot
//! name (`steps[key]`, `steps` as a whole) is allowed: at run time a step's
//! `steps` holds its ancestors only, so such a read sees nothing more.

use std::collections::BTreeSet;

use cel::IdedExpr;
use cel::common::ast::{Expr, LiteralValue, operators};

use super::budget::children;

/// The variable that holds the checkpointed steps.
const STEPS: &str = "steps";

/// The step names `expr` reads by name.
pub(super) fn steps_named(expr: &IdedExpr) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    collect(expr, &mut names);
    names
}

fn collect(expr: &IdedExpr, names: &mut BTreeSet<String>) {
    match &expr.expr {
        Expr::Select(select) if is_steps(&select.operand) => {
            names.insert(select.field.clone());
            return;
        }
        Expr::Call(call) if call.func_name == operators::INDEX && call.args.len() == 2 => {
            if let (true, Expr::Literal(LiteralValue::String(name))) =
                (is_steps(&call.args[0]), &call.args[1].expr)
            {
                names.insert(name.inner().to_owned());
                return;
            }
        }
        // A macro's own variable called `steps` hides the workflow's
        // inside the loop: only its range and start read the real one.
        Expr::Comprehension(c)
            if c.iter_var == STEPS
                || c.accu_var == STEPS
                || c.iter_var2.as_deref() == Some(STEPS) =>
        {
            collect(&c.iter_range, names);
            collect(&c.accu_init, names);
            return;
        }
        _ => {}
    }
    for child in children(expr) {
        collect(child, names);
    }
}

fn is_steps(expr: &IdedExpr) -> bool {
    matches!(&expr.expr, Expr::Ident(name) if name == STEPS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(source: &str) -> Vec<String> {
        let program = cel::Program::compile(source).unwrap();
        steps_named(program.expression()).into_iter().collect()
    }

    #[test]
    fn selections_tests_and_literal_indexes_are_named() {
        assert_eq!(
            named(r#"steps.fetch.total + steps["score card"].value > 3 && has(steps.fraud)"#),
            ["fetch", "fraud", "score card"]
        );
    }

    #[test]
    fn reads_that_cannot_be_named_and_other_variables_name_nothing() {
        assert!(named("steps[input.which].x + size(steps)").is_empty());
        assert!(named("input.steps.fetch").is_empty());
    }

    #[test]
    fn a_macro_variable_called_steps_hides_the_workflows() {
        assert_eq!(
            named("steps.a.items.map(steps, steps.b) + [steps.c]"),
            ["a", "c"]
        );
    }
}
