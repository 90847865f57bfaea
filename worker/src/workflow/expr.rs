//! CEL expressions (through the `cel` crate): compiling, the evaluation scope,
//! and the conversions between JSON documents and CEL values.
//!
//! JSON integers become CEL `int` (not `uint`) so that `input.n + 1` works as
//! a workflow author expects; only integers beyond `i64` become `uint`.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use cel::{Context, Env, Program, Value as Cel};
use serde_json::Value as Json;

/// A compiled expression and its source, for error messages.
#[derive(Debug)]
pub struct Expression {
    source: String,
    program: Program,
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
        let program = env().compile(source).map_err(|e| e.to_string())?;
        Ok(Self {
            source: source.to_owned(),
            program,
        })
    }

    #[must_use]
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Evaluates against the variables of `scope`, as JSON.
    ///
    /// # Errors
    /// An evaluation error, or a value with no JSON form, named with the source.
    pub fn evaluate(&self, scope: &Scope) -> Result<Json, String> {
        let mut context = Context::with_env(env());
        for (name, value) in &scope.variables {
            context.add_variable_from_value(name.clone(), value.clone());
        }
        let value = self
            .program
            .execute(&context)
            .map_err(|e| format!("`{}` failed: {e}", self.source))?;
        value
            .json()
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
