//! A step's HTTP call beyond `method`: its verb, a path under the
//! target's base URL, query parameters and headers, each a template whose
//! `{<CEL>}` placeholders are filled from the step's scope when it runs.
//!
//! Containment: a path's own text is checked when the definition compiles
//! (plain segments: no `.` or `..`, no empty segment, no `?`, `#`, `%` or
//! `\`), and every value a placeholder gives is percent-encoded whole into
//! the segment it sits in, so nothing the job's data holds reaches another
//! path, the query or the host. Header values refuse CR, LF and NUL, in the
//! text and in what placeholders give. `{secrets.<name>}` is not CEL: it
//! names one of the target's secrets, filled in by the target itself, and
//! is allowed in header values only (a path and a query are shown in the
//! console and kept in checkpoints).

use std::fmt::Write as _;

use serde_json::Value as Json;

use crate::expr::{Expression, Scope};
use crate::model::{StepDefinition, Verb};

/// The longest text of one query or header value template.
pub const MAX_VALUE_TEMPLATE_CHARS: usize = 1024;
/// The most query parameters, and the most headers, of one step.
pub const MAX_PARAMETERS: usize = 32;

/// Headers a step may not set: the connection's own, the body's framing,
/// and the ones the engine sets itself.
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
    "proxy-connection",
    "idempotency-key",
    "traceparent",
    "tracestate",
];

/// One piece of a template.
#[derive(Debug)]
enum Piece {
    Text(String),
    Value(Expression),
    Secret(String),
}

/// A template: text with placeholders.
#[derive(Debug)]
pub struct Template {
    pieces: Vec<Piece>,
}

/// One piece of a resolved header value: text, or a secret the target
/// fills in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderPiece {
    Text(String),
    Secret(String),
}

/// A step's call shape, compiled.
#[derive(Debug)]
pub struct CallShape {
    pub verb: Option<Verb>,
    path: Option<Template>,
    query: Vec<(String, Template)>,
    headers: Vec<(String, Template)>,
}

/// A call shape filled from a step's scope: what the target sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedCall {
    /// The step's verb; `None`: the target's default.
    pub verb: Option<Verb>,
    /// The path under the base URL, percent-encoded, starting with `/`.
    pub path: Option<String>,
    /// Query parameters, as given (the target encodes them).
    pub query: Vec<(String, String)>,
    pub headers: Vec<(String, Vec<HeaderPiece>)>,
}

impl ResolvedCall {
    /// The query string, percent-encoded; `None` without parameters.
    #[must_use]
    pub fn query_string(&self) -> Option<String> {
        if self.query.is_empty() {
            return None;
        }
        let mut text = String::new();
        for (name, value) in &self.query {
            if !text.is_empty() {
                text.push('&');
            }
            let _ = write!(text, "{}={}", encode(name), encode(value));
        }
        Some(text)
    }

    /// `GET /orders/42?expand=lines`: the call as the console and the
    /// checkpoint show it (never its headers), under `verb` when the step
    /// names none.
    #[must_use]
    pub fn shown(&self, default_verb: Verb) -> String {
        let verb = self.verb.unwrap_or(default_verb);
        let mut shown = format!("{} {}", verb.as_str(), self.path.as_deref().unwrap_or("/"));
        if let Some(query) = self.query_string() {
            shown.push('?');
            shown.push_str(&query);
        }
        shown
    }
}

impl Template {
    /// Every expression in it.
    pub fn expressions(&self) -> impl Iterator<Item = &Expression> {
        self.pieces.iter().filter_map(|piece| match piece {
            Piece::Value(expression) => Some(expression),
            _ => None,
        })
    }

    /// Parses `source`: text, `{{` and `}}` for braces, and placeholders
    /// `{<CEL>}` (or `{secrets.<name>}` when `secrets` are allowed).
    fn parse(source: &str, secrets: bool) -> Result<Self, String> {
        let mut pieces = Vec::new();
        let mut text = String::new();
        let mut chars = source.char_indices().peekable();
        while let Some((at, c)) = chars.next() {
            match c {
                '{' if chars.peek().map(|&(_, next)| next) == Some('{') => {
                    chars.next();
                    text.push('{');
                }
                '}' if chars.peek().map(|&(_, next)| next) == Some('}') => {
                    chars.next();
                    text.push('}');
                }
                '}' => return Err(format!("a '}}' at {at} closes nothing (write '}}}}')")),
                '{' => {
                    let end = placeholder_end(source, at + 1)
                        .ok_or_else(|| format!("the '{{' at {at} is never closed"))?;
                    let inside = source[at + 1..end].trim();
                    while chars.peek().is_some_and(|&(i, _)| i <= end) {
                        chars.next();
                    }
                    if !text.is_empty() {
                        pieces.push(Piece::Text(std::mem::take(&mut text)));
                    }
                    pieces.push(placeholder(inside, secrets)?);
                }
                c => text.push(c),
            }
        }
        if !text.is_empty() {
            pieces.push(Piece::Text(text));
        }
        Ok(Self { pieces })
    }

    /// Its text with each placeholder's value as text (through `fill`).
    fn render(
        &self,
        scope: &Scope,
        mut fill: impl FnMut(&mut String, &str),
    ) -> Result<String, String> {
        let mut out = String::new();
        for piece in &self.pieces {
            match piece {
                Piece::Text(text) => out.push_str(text),
                Piece::Value(expression) => {
                    let value = expression.evaluate(scope)?;
                    fill(&mut out, &as_text(expression, &value)?);
                }
                Piece::Secret(name) => {
                    return Err(format!("{{secrets.{name}}} is for header values only"));
                }
            }
        }
        Ok(out)
    }

    /// The one expression it is made of, if it is nothing else.
    fn only_expression(&self) -> Option<&Expression> {
        match self.pieces.as_slice() {
            [Piece::Value(expression)] => Some(expression),
            _ => None,
        }
    }
}

/// Where the placeholder opened before `from` closes: the matching `}`,
/// past nested braces and quoted strings.
fn placeholder_end(source: &str, from: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in source[from..].char_indices() {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '"' | '\'' => quote = Some(c),
            '{' => depth += 1,
            '}' if depth == 0 => return Some(from + i),
            '}' => depth -= 1,
            _ => {}
        }
    }
    None
}

/// Whether `name` can name a secret: letters, digits, `_` and `-`.
#[must_use]
pub fn is_secret_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn placeholder(inside: &str, secrets: bool) -> Result<Piece, String> {
    if let Some(name) = inside.strip_prefix("secrets.") {
        if !secrets {
            return Err(format!(
                "{{secrets.{name}}}: secrets go in header values only (a path and a query are shown and kept)"
            ));
        }
        if !is_secret_name(name) {
            return Err(format!(
                "{{secrets.{name}}}: a secret's name is letters, digits, '_' and '-'"
            ));
        }
        return Ok(Piece::Secret(name.to_owned()));
    }
    if inside.is_empty() {
        return Err("an empty placeholder '{}' (write '{{}}' for braces)".to_owned());
    }
    Expression::compile(inside)
        .map(Piece::Value)
        .map_err(|e| format!("placeholder {{{inside}}}: CEL does not compile: {e}"))
}

/// A placeholder's value as text: a string as it is, a number or a
/// boolean as JSON writes it; anything else is refused.
fn as_text(expression: &Expression, value: &Json) -> Result<String, String> {
    match value {
        Json::String(text) => Ok(text.clone()),
        Json::Number(number) => Ok(number.to_string()),
        Json::Bool(flag) => Ok(flag.to_string()),
        other => Err(format!(
            "placeholder {{{}}} gives {}, not a string, number or boolean",
            expression.source(),
            kind_of(other)
        )),
    }
}

fn kind_of(value: &Json) -> &'static str {
    match value {
        Json::Null => "null",
        Json::Array(_) => "a list",
        Json::Object(_) => "a map",
        Json::String(_) => "a string",
        Json::Number(_) => "a number",
        Json::Bool(_) => "a boolean",
    }
}

/// Percent-encodes everything but the unreserved characters (RFC 3986):
/// a value cannot add a segment, a query or a fragment.
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// Why a path's own text cannot be used, if it cannot.
fn path_text_problem(template: &Template) -> Option<String> {
    // The text with each placeholder as one plain character, so the
    // segments' shape can be judged before any value is known.
    let mut shape = String::new();
    for piece in &template.pieces {
        match piece {
            Piece::Text(text) => shape.push_str(text),
            _ => shape.push('x'),
        }
    }
    let Some(rest) = shape.strip_prefix('/') else {
        return Some("starts with '/' (it is under the target's base_url)".to_owned());
    };
    if rest.is_empty() {
        return None;
    }
    for segment in rest.split('/') {
        if segment.is_empty() {
            return Some("has an empty segment ('//' or a trailing '/')".to_owned());
        }
        if segment == "." || segment == ".." {
            return Some(format!("has a {segment:?} segment"));
        }
        if let Some(bad) = segment.chars().find(|&c| !is_path_char(c)) {
            return Some(format!(
                "holds {bad:?}: a path's text is letters, digits and -._~!$&'()*+,;=:@ (values go in placeholders, queries in `query`)"
            ));
        }
    }
    None
}

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "-._~!$&'()*+,;=:@".contains(c)
}

fn header_name_problem(name: &str) -> Option<String> {
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if name.is_empty() || !name.chars().all(token) {
        return Some(format!("{name:?} is not a header name"));
    }
    RESERVED_HEADERS
        .contains(&name.to_ascii_lowercase().as_str())
        .then(|| format!("{name} is set by the engine or the connection, not by a step"))
}

fn has_line_break(text: &str) -> bool {
    text.contains(['\r', '\n', '\0'])
}

impl CallShape {
    /// Compiles `step`'s verb, path, query and headers; every problem is
    /// `(field, message)`. `None` for a step that shapes nothing.
    ///
    /// # Errors
    /// What is wrong, field by field.
    pub fn compile(step: &StepDefinition) -> Result<Option<Self>, Vec<(String, String)>> {
        if !step.shapes_its_call() {
            return Ok(None);
        }
        let mut problems = Vec::new();
        if step.path.is_some() && !step.method.is_empty() {
            problems.push((
                "path".to_owned(),
                "a step names its method or its path, not both".to_owned(),
            ));
        }
        if step.verb.is_some_and(|verb| !verb.has_body()) && !step.rules.is_empty() {
            problems.push((
                "rules".to_owned(),
                format!(
                    "a {} sends no body: put its values in `path` or `query`",
                    step.verb.map_or("", Verb::as_str)
                ),
            ));
        }
        let path = step.path.as_deref().and_then(|source| {
            match Template::parse(source, false) {
                Ok(template) => match path_text_problem(&template) {
                    None => return Some(template),
                    Some(problem) => problems.push(("path".to_owned(), problem)),
                },
                Err(problem) => problems.push(("path".to_owned(), problem)),
            }
            None
        });
        let mut values = |kind: &str, entries: &std::collections::BTreeMap<String, String>| {
            if entries.len() > MAX_PARAMETERS {
                problems.push((
                    kind.to_owned(),
                    format!(
                        "{} entries, over the limit of {MAX_PARAMETERS}",
                        entries.len()
                    ),
                ));
                return Vec::new();
            }
            let mut compiled = Vec::new();
            for (name, source) in entries {
                let field = format!("{kind}.{name}");
                let problem = if source.chars().count() > MAX_VALUE_TEMPLATE_CHARS {
                    Some(format!("over {MAX_VALUE_TEMPLATE_CHARS} characters"))
                } else if kind == "headers" {
                    header_name_problem(name).or_else(|| {
                        has_line_break(source)
                            .then(|| "holds a CR, LF or NUL: one header is one line".to_owned())
                    })
                } else {
                    name.is_empty().then(|| "a parameter has a name".to_owned())
                };
                if let Some(problem) = problem {
                    problems.push((field, problem));
                    continue;
                }
                match Template::parse(source, kind == "headers") {
                    Ok(template) => compiled.push((name.clone(), template)),
                    Err(problem) => problems.push((field, problem)),
                }
            }
            compiled
        };
        let query = values("query", &step.query);
        let headers = values("headers", &step.headers);
        if problems.is_empty() {
            Ok(Some(Self {
                verb: step.verb,
                path,
                query,
                headers,
            }))
        } else {
            Err(problems)
        }
    }

    /// Every expression its templates hold, with the field it is in.
    pub fn expressions(&self) -> impl Iterator<Item = (String, &Expression)> {
        let path = self
            .path
            .iter()
            .flat_map(|template| template.expressions().map(|e| ("path".to_owned(), e)));
        let query = self.query.iter().flat_map(|(name, template)| {
            template
                .expressions()
                .map(move |e| (format!("query.{name}"), e))
        });
        let headers = self.headers.iter().flat_map(|(name, template)| {
            template
                .expressions()
                .map(move |e| (format!("headers.{name}"), e))
        });
        path.chain(query).chain(headers)
    }

    /// The call this shape makes in `scope`.
    ///
    /// # Errors
    /// A placeholder that does not evaluate or gives no text, a path
    /// segment left empty, `.` or `..`, a header value with a line break:
    /// each named by its field.
    pub fn resolve(&self, scope: &Scope) -> Result<ResolvedCall, String> {
        let path = match &self.path {
            None => None,
            Some(template) => {
                let path = template
                    .render(scope, |out, value| out.push_str(&encode(value)))
                    .map_err(|e| format!("path: {e}"))?;
                if path != "/"
                    && path[1..]
                        .split('/')
                        .any(|segment| segment.is_empty() || segment == "." || segment == "..")
                {
                    return Err(format!(
                        "path: {path:?} has a segment that is empty, '.' or '..'"
                    ));
                }
                Some(path)
            }
        };
        let mut query = Vec::with_capacity(self.query.len());
        for (name, template) in &self.query {
            let at = |e: String| format!("query.{name}: {e}");
            let value = match template.only_expression() {
                // One placeholder: null leaves the parameter out.
                Some(expression) => match expression.evaluate(scope).map_err(at)? {
                    Json::Null => continue,
                    value => as_text(expression, &value).map_err(at)?,
                },
                None => template
                    .render(scope, |out, value| out.push_str(value))
                    .map_err(at)?,
            };
            query.push((name.clone(), value));
        }
        let mut headers = Vec::with_capacity(self.headers.len());
        for (name, template) in &self.headers {
            let mut pieces = Vec::new();
            for piece in &template.pieces {
                let text = match piece {
                    Piece::Text(text) => text.clone(),
                    Piece::Value(expression) => {
                        let value = expression
                            .evaluate(scope)
                            .map_err(|e| format!("headers.{name}: {e}"))?;
                        as_text(expression, &value).map_err(|e| format!("headers.{name}: {e}"))?
                    }
                    Piece::Secret(secret) => {
                        pieces.push(HeaderPiece::Secret(secret.clone()));
                        continue;
                    }
                };
                if has_line_break(&text) {
                    return Err(format!(
                        "headers.{name}: a value with a CR, LF or NUL cannot be sent"
                    ));
                }
                match pieces.last_mut() {
                    Some(HeaderPiece::Text(last)) => last.push_str(&text),
                    _ => pieces.push(HeaderPiece::Text(text)),
                }
            }
            headers.push((name.clone(), pieces));
        }
        Ok(ResolvedCall {
            verb: self.verb,
            path,
            query,
            headers,
        })
    }
}

#[cfg(test)]
mod tests;
