//! Error texts that come from outside (a target's body, a URL, a library's
//! message) are made safe before they are stored and published: no NUL (the
//! store refuses it), no credentials or query strings from URLs (an API key
//! rides in a query as often as in user info), and a bounded length.

/// The longest error text stored, in characters.
pub const MAX_ERROR_CHARS: usize = 4096;

/// `text` with NULs replaced, URL credentials redacted, and cut to
/// [`MAX_ERROR_CHARS`] characters with a note of what was cut.
#[must_use]
pub(crate) fn error_text(text: &str) -> String {
    let redacted = redact_url_credentials(&text.replace('\0', "\u{FFFD}"));
    let chars = redacted.chars().count();
    if chars <= MAX_ERROR_CHARS {
        return redacted;
    }
    let kept: String = redacted.chars().take(MAX_ERROR_CHARS).collect();
    format!("{kept}… ({} more characters cut)", chars - MAX_ERROR_CHARS)
}

/// `scheme://user:password@host/path?query#fragment` →
/// `scheme://***@host/path`, wherever it appears.
fn redact_url_credentials(text: &str) -> String {
    // Where a URL quoted in prose ends.
    let ends = |c: char| c.is_whitespace() || matches!(c, '"' | '\'' | ')' | '>' | ',');
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (before, after) = rest.split_at(at + 3);
        out.push_str(before);
        let token_end = after.find(ends).unwrap_or(after.len());
        let token = &after[..token_end];
        // The query and fragment go; the user info is all before the last
        // `@` ahead of them (a `/` in a malformed password included: a
        // path's own `@` only costs some of the path).
        let kept_end = token.find(['?', '#']).unwrap_or(token.len());
        let kept = &token[..kept_end];
        match kept.rfind('@') {
            Some(user_end) => {
                out.push_str("***");
                out.push_str(&kept[user_end..]);
            }
            None => out.push_str(kept),
        }
        rest = &after[token_end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_in_urls_are_redacted_and_nuls_replaced() {
        assert_eq!(
            error_text("POST https://bob:s3cret@api.example/v1/x: 500 \0 from http://plain/y"),
            "POST https://***@api.example/v1/x: 500 \u{FFFD} from http://plain/y"
        );
        assert_eq!(
            error_text("see postgres://u:p@db:5432"),
            "see postgres://***@db:5432"
        );
    }

    #[test]
    fn a_password_holding_a_slash_is_redacted_whole() {
        assert_eq!(
            error_text("see https://bob:pa/ss@api.example/x now"),
            "see https://***@api.example/x now"
        );
    }

    #[test]
    fn query_strings_and_fragments_of_urls_are_dropped() {
        assert_eq!(
            error_text(
                "POST https://api.example/v1/x?code=k3y&a=b: 500 (see http://h/p#frag) done"
            ),
            "POST https://api.example/v1/x 500 (see http://h/p) done"
        );
        assert_eq!(error_text("what? no URL here?"), "what? no URL here?");
    }

    #[test]
    fn long_texts_are_cut_with_a_note() {
        let cut = error_text(&"é".repeat(MAX_ERROR_CHARS + 10));
        assert!(cut.ends_with("… (10 more characters cut)"), "{cut}");
        assert_eq!(cut.chars().filter(|c| *c == 'é').count(), MAX_ERROR_CHARS);
    }
}
