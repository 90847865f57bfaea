//! URLs as logs, rows and events may show them: without user info (a
//! password in `https://user:secret@host`), query (an API key in
//! `?code=`) or fragment.

use reqwest::Url;

/// `raw` without user info, query or fragment; a text that does not parse
/// as a URL is shown as its scheme and host part up to the first `/`
/// after it, without anything before an `@`.
#[must_use]
pub fn url(raw: &str) -> String {
    match Url::parse(raw) {
        Ok(mut url) if !url.cannot_be_a_base() => {
            // Both only fail for URLs that cannot be a base.
            let _ = url.set_username("");
            let _ = url.set_password(None);
            url.set_query(None);
            url.set_fragment(None);
            url.as_str().trim_end_matches('/').to_owned()
        }
        _ => {
            let (scheme, rest) = raw.split_once("://").unwrap_or(("", raw));
            let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
            let host = authority
                .rsplit_once('@')
                .map_or(authority, |(_, host)| host);
            if scheme.is_empty() {
                host.to_owned()
            } else {
                format!("{scheme}://{host}")
            }
        }
    }
}

/// The parts of `raw` that [`url`] drops, as `raw` writes them (the user
/// info with its `@`, the query with its `?`): what [`scrub`] removes from
/// a text that quotes the URL (an HTTP client's error, say).
#[must_use]
pub fn secrets_of(raw: &str) -> Vec<String> {
    let mut secrets = Vec::new();
    if let Some((_, rest)) = raw.split_once("://") {
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        if let Some((user_info, _)) = authority.rsplit_once('@') {
            secrets.push(format!("{user_info}@"));
        }
    }
    if let Some((_, query)) = raw.split_once('?') {
        let query = query.split('#').next().unwrap_or_default();
        if !query.is_empty() {
            secrets.push(format!("?{query}"));
        }
    }
    secrets
}

/// `text` without any of `secrets`.
#[must_use]
pub fn scrub(text: &str, secrets: &[String]) -> String {
    secrets.iter().fold(text.to_owned(), |text, secret| {
        text.replace(secret.as_str(), "")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_info_query_and_fragment_are_dropped() {
        assert_eq!(
            url("https://svc:hunter2@registry.example:8081/base/?key=k#f"),
            "https://registry.example:8081/base"
        );
        assert_eq!(url("http://t.example"), "http://t.example");
        // Not a URL the parser takes: still no secret.
        assert_eq!(url("https://svc:hunter2@[bad/x?y"), "https://[bad");
        assert_eq!(url("svc:hunter2@host/x"), "host");
    }

    #[test]
    fn a_text_quoting_the_url_loses_its_secrets() {
        let raw = "https://svc:hunter2@registry.example/?key=k";
        let secrets = secrets_of(raw);
        let text = format!("error sending request for url ({raw}subjects)");
        let scrubbed = scrub(&text, &secrets);
        assert!(
            !scrubbed.contains("hunter2") && !scrubbed.contains("key=k"),
            "{scrubbed}"
        );
        assert!(scrubbed.contains("registry.example"), "{scrubbed}");
        assert!(secrets_of("http://plain.example/x").is_empty());
    }
}
