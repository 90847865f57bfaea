//! CEL expressions (through the `cel` crate): compiling (bounded in length
//! and depth, and instrumented for the evaluation budget, `budget.rs`), the
//! evaluation scope, and the conversions between JSON documents and CEL
//! values.
//!
//! JSON integers become CEL `int` (not `uint`) so that `input.n + 1` works as
//! a workflow author expects; only integers beyond `i64` become `uint`.
//! A JSON object becomes a CEL map, which a comprehension iterates in
//! sorted key order (`budget.rs` arranges it), so an expression gives the
//! same list on every evaluation.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

/// A CEL value, as rules and expressions see JSON.
pub use cel::Value as Cel;
use cel::{Context, Env, IdedExpr};
use serde_json::Value as Json;

use super::budget;

/// The longest expression accepted, in characters.
pub const MAX_EXPRESSION_CHARS: usize = 2_000;
/// The deepest expression accepted (calls, comprehensions, literals and
/// field selections nested in each other).
pub const MAX_EXPRESSION_DEPTH: usize = 32;

/// A compiled expression and its source, for error messages.
#[derive(Debug)]
pub struct Expression {
    source: String,
    /// The program, instrumented for the evaluation budget.
    instrumented: IdedExpr,
    /// The steps it reads by name (`references.rs`).
    steps_named: std::collections::BTreeSet<String>,
    /// What it is when its outermost form cannot give a boolean.
    surely_not_boolean: Option<&'static str>,
    /// Whether its outermost form is a comparison, `!`, `&&`, `||` or a
    /// boolean literal.
    outermost_boolean: bool,
}

/// What an expression is when its outermost form is a literal, a
/// collection or arithmetic, none of which gives a boolean.
fn outermost_not_boolean(expr: &IdedExpr) -> Option<&'static str> {
    use cel::common::ast::{Expr, LiteralValue, operators};
    match &expr.expr {
        Expr::Literal(LiteralValue::Boolean(_)) => None,
        Expr::Literal(LiteralValue::String(_)) => Some("a string"),
        Expr::Literal(LiteralValue::Null) => Some("null"),
        Expr::Literal(LiteralValue::Bytes(_)) => Some("bytes"),
        Expr::Literal(_) => Some("a number"),
        Expr::List(_) => Some("a list"),
        Expr::Map(_) | Expr::Struct(_) => Some("a map"),
        Expr::Call(call)
            if [
                operators::ADD,
                operators::SUBSTRACT,
                operators::MULTIPLY,
                operators::DIVIDE,
                operators::MODULO,
                operators::NEGATE,
            ]
            .contains(&call.func_name.as_str()) =>
        {
            Some("arithmetic")
        }
        _ => None,
    }
}

/// Whether an expression's outermost form surely gives a boolean.
fn outermost_is_boolean(expr: &IdedExpr) -> bool {
    use cel::common::ast::{Expr, LiteralValue, operators};
    match &expr.expr {
        Expr::Literal(LiteralValue::Boolean(_)) => true,
        Expr::Call(call) => [
            operators::LOGICAL_AND,
            operators::LOGICAL_OR,
            operators::LOGICAL_NOT,
            operators::EQUALS,
            operators::NOT_EQUALS,
            operators::LESS,
            operators::LESS_EQUALS,
            operators::GREATER,
            operators::GREATER_EQUALS,
            operators::IN,
        ]
        .contains(&call.func_name.as_str()),
        _ => false,
    }
}

fn env() -> Arc<Env> {
    static ENV: OnceLock<Arc<Env>> = OnceLock::new();
    ENV.get_or_init(|| Arc::new(Env::stdlib())).clone()
}

impl Expression {
    /// Compiles `source`.
    ///
    /// # Errors
    /// The parser's message when `source` is not valid CEL.
    pub fn compile(source: &str) -> Result<Self, String> {
        let chars = source.chars().count();
        if chars > MAX_EXPRESSION_CHARS {
            return Err(format!(
                "{chars} characters long, over the limit of {MAX_EXPRESSION_CHARS}"
            ));
        }
        // Checked before the parser sees it: the parser recurses per
        // bracket, parentheses included (which leave no trace in the tree).
        let brackets = bracket_depth(source);
        if brackets > MAX_EXPRESSION_DEPTH {
            return Err(format!(
                "brackets nested {brackets} deep, over the limit of {MAX_EXPRESSION_DEPTH}"
            ));
        }
        let program = env().compile(source).map_err(|e| e.to_string())?;
        let depth = budget::depth(program.expression());
        if depth > MAX_EXPRESSION_DEPTH {
            return Err(format!(
                "nested {depth} deep, over the limit of {MAX_EXPRESSION_DEPTH}"
            ));
        }
        let steps_named = super::references::steps_named(program.expression());
        let surely_not_boolean = outermost_not_boolean(program.expression());
        let outermost_boolean = outermost_is_boolean(program.expression());
        let mut instrumented = program.expression().clone();
        budget::instrument(&mut instrumented);
        Ok(Self {
            source: source.to_owned(),
            instrumented,
            steps_named,
            surely_not_boolean,
            outermost_boolean,
        })
    }

    #[must_use]
    pub fn source(&self) -> &str {
        &self.source
    }

    /// What it is (`a number`, `a list`, …) when its outermost form can
    /// never be a boolean; `None` when it may be one. CEL here is not
    /// type-checked: this catches what registration can see.
    #[must_use]
    pub fn surely_not_boolean(&self) -> Option<&'static str> {
        self.surely_not_boolean
    }

    /// What it is when its outermost form can never be a list: a
    /// literal, a map, a comparison or a boolean operator.
    #[must_use]
    pub fn surely_not_list(&self) -> Option<&'static str> {
        match self.surely_not_boolean {
            Some("a list") => None,
            Some(kind) => Some(kind),
            None if self.outermost_boolean => Some("a boolean"),
            None => None,
        }
    }

    /// The steps it reads by name: `steps.<name>`, `steps["<name>"]`.
    #[must_use]
    pub fn steps_named(&self) -> &std::collections::BTreeSet<String> {
        &self.steps_named
    }

    /// Evaluates against the variables of `scope`, as JSON.
    ///
    /// # Errors
    /// An evaluation error, or a value with no JSON form, named with the source.
    pub fn evaluate(&self, scope: &Scope) -> Result<Json, String> {
        let mut context = Context::with_env(env());
        budget::install(&mut context);
        for (name, value) in &scope.variables {
            context.add_variable_from_value(name.clone(), value.clone());
        }
        let value = Cel::resolve(&self.instrumented, &context)
            .map_err(|e| format!("`{}` failed: {e}", self.source))?;
        to_json(&value, &mut JSON_NODES.clone())
            .map_err(|e| format!("`{}` gave a value with no JSON form: {e}", self.source))
    }

    /// Evaluates to a boolean.
    ///
    /// # Errors
    /// As [`Expression::evaluate`], or a result that is not a boolean.
    pub fn evaluate_bool(&self, scope: &Scope) -> Result<bool, String> {
        match self.evaluate(scope)? {
            Json::Bool(b) => Ok(b),
            other => Err(format!("`{}` gave {other}, not a boolean", self.source)),
        }
    }
}

/// The variables an expression sees (`input`, `steps`, `response`, `result`).
#[derive(Debug, Default, Clone)]
pub struct Scope {
    variables: Vec<(String, Cel)>,
}

impl Scope {
    #[must_use]
    pub fn with(mut self, name: &str, value: &Json) -> Self {
        self.variables.push((name.to_owned(), to_cel(value)));
        self
    }

    /// As [`Scope::with`], for a value converted already: CEL's lists,
    /// maps and strings are shared, so this clone costs no copy.
    #[must_use]
    pub fn with_cel(mut self, name: &str, value: Cel) -> Self {
        self.variables.push((name.to_owned(), value));
        self
    }
}

/// Converts a JSON document to a CEL value.
#[must_use]
pub fn to_cel(value: &Json) -> Cel {
    match value {
        Json::Null => Cel::Null,
        Json::Bool(b) => Cel::Bool(*b),
        Json::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Cel::Int(i),
            (None, Some(u)) => Cel::UInt(u),
            _ => Cel::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Json::String(s) => Cel::String(Arc::new(s.clone())),
        Json::Array(items) => Cel::List(Arc::new(items.iter().map(to_cel).collect())),
        Json::Object(fields) => {
            let map: HashMap<String, Cel> =
                fields.iter().map(|(k, v)| (k.clone(), to_cel(v))).collect();
            Cel::from(map)
        }
    }
}

/// How deeply `(`, `[` and `{` nest in `source`, outside comments (`//`
/// to the end of the line) and string literals (quoted with `'` or `"`,
/// tripled or not, with `\` escapes unless raw: `r'…'`).
fn bracket_depth(source: &str) -> usize {
    let bytes = source.as_bytes();
    let (mut depth, mut deepest, mut at) = (0usize, 0usize, 0usize);
    while at < bytes.len() {
        match bytes[at] {
            b'(' | b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            b'/' if bytes.get(at + 1) == Some(&b'/') => {
                at = bytes[at..]
                    .iter()
                    .position(|b| *b == b'\n')
                    .map_or(bytes.len(), |end| at + end);
                continue;
            }
            quote @ (b'\'' | b'"') => {
                // A raw string's prefix (`r`, `R`, `br`, `rb`...) is just
                // before its quote.
                let prefix = &bytes[at.saturating_sub(2)..at];
                let raw = prefix.ends_with(b"r")
                    || prefix.ends_with(b"R")
                    || matches!(prefix, [b'r' | b'R', b'b' | b'B']);
                let tripled =
                    bytes.get(at + 1) == Some(&quote) && bytes.get(at + 2) == Some(&quote);
                let closing: &[u8] = if tripled { &[quote; 3] } else { &[quote] };
                at += closing.len();
                while at < bytes.len() && !bytes[at..].starts_with(closing) {
                    at += if bytes[at] == b'\\' && !raw { 2 } else { 1 };
                }
                at += closing.len();
                continue;
            }
            _ => {}
        }
        at += 1;
    }
    deepest
}

/// The most JSON nodes one expression's result may expand to: a result
/// whose lists share their elements (the same list repeated) is small in
/// memory and can be huge as JSON.
const JSON_NODES: u64 = 1_000_000;

/// Converts a CEL value to JSON, at most `nodes` values in all, each
/// charged to the running budget too (so every result of an evaluation
/// shares it, and its time is checked as the values are made).
fn to_json(value: &Cel, nodes: &mut u64) -> Result<Json, String> {
    *nodes = nodes
        .checked_sub(1)
        .ok_or_else(|| format!("its JSON form has more than {JSON_NODES} values"))?;
    budget::charge_json_value()?;
    Ok(match value {
        Cel::List(items) => Json::Array(
            items
                .iter()
                .map(|item| to_json(item, nodes))
                .collect::<Result<_, _>>()?,
        ),
        Cel::Map(map) => {
            let mut object = serde_json::Map::new();
            for (key, item) in map.map.iter() {
                // Keys as the crate's own conversion writes them.
                object.insert(key.to_string(), to_json(item, nodes)?);
            }
            Json::Object(object)
        }
        atom => atom.json().map_err(|e| e.to_string())?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brackets_are_counted_outside_string_literals() {
        assert_eq!(bracket_depth("f([1, {'a': (2)}])"), 4);
        assert_eq!(bracket_depth("'((((' + \"[[[\" + '''{{{'''"), 0);
        assert_eq!(bracket_depth(r"'\'((' + [1]"), 1);
        assert_eq!(bracket_depth("((("), 3);
        // A raw string ends at its first quote, a comment at the line's end:
        // neither hides the brackets after it.
        assert_eq!(bracket_depth(r"r'\' + (((1))) + ''"), 3);
        assert_eq!(bracket_depth("1 // '\n + (((1)))"), 3);
        assert_eq!(bracket_depth("1 // ((((("), 0);
    }

    /// The crate iterates a map in its hash order, a new one for every
    /// map: without the sort two evaluations of 30 keys would surely differ.
    #[test]
    fn comprehensions_over_a_map_see_its_keys_in_sorted_order_every_time() {
        let keys: Vec<String> = (0..30).rev().map(|i| format!("k{i:02}")).collect();
        let map: serde_json::Map<String, Json> =
            keys.iter().map(|k| (k.clone(), Json::from(1))).collect();
        let scope = Scope::default().with("m", &Json::Object(map));
        let mut sorted = keys.clone();
        sorted.sort();
        for source in [
            "m.map(k, k)",
            "m.filter(k, m[k] == 1)",
            "[1].map(x, m.map(k, k))[0]",
        ] {
            let expression = Expression::compile(source).unwrap();
            for _ in 0..5 {
                assert_eq!(
                    expression.evaluate(&scope).unwrap(),
                    Json::from(sorted.clone()),
                    "{source}"
                );
            }
        }
        // A list is iterated as it is.
        let list = Scope::default().with("l", &Json::from(keys.clone()));
        let kept = Expression::compile("l.map(x, x)").unwrap().evaluate(&list);
        assert_eq!(kept.unwrap(), Json::from(keys));
    }

    #[test]
    fn deep_nesting_is_refused_before_the_parser_sees_it() {
        // Deep enough to overflow a default thread's stack in the parser.
        for source in [
            format!("{}1{}", "(".repeat(5_000), ")".repeat(5_000)),
            format!("{}1{}", "[".repeat(500), "]".repeat(500)),
        ] {
            let refused = Expression::compile(&source[..source.len().min(MAX_EXPRESSION_CHARS)]);
            assert!(refused.unwrap_err().contains("nested"));
        }
    }
}
