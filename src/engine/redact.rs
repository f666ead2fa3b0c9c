//! The one redaction helper: what may carry a secret (URL credentials and query strings,
//! bearer tokens) is masked before it reaches a log line, an error message, a dead letter,
//! the order history or a config error.
//!
//! - `scheme://user:password@host/path?query#fragment` becomes
//!   `scheme://***@host/path?***` (the fragment is dropped);
//! - `Bearer <token>` (any case) becomes `Bearer ***`.
//!
//! [`text`] applies both to free text (an error's message); [`url`] to one URL.

/// The mask written in place of a secret.
pub const MASK: &str = "***";

/// Longest error text kept with an entry (retry record, dead letter), in bytes.
pub const MAX_ERROR_BYTES: usize = 1000;

/// `text` with every URL's credentials and query string, and every bearer token, masked.
pub fn text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find("://") {
        // The scheme: the letters (and + - .) just before "://".
        let scheme_start = rest[..pos]
            .char_indices()
            .rev()
            .take_while(|(_, c)| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
            .last()
            .map_or(pos, |(i, _)| i);
        out.push_str(&mask_bearer(&rest[..scheme_start]));
        let end = rest[pos + 3..]
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | '`'))
            .map_or(rest.len(), |e| pos + 3 + e);
        // A URL quoted in an error ends before the punctuation that follows it.
        let mut url_end = end;
        while url_end > pos + 3
            && matches!(
                rest.as_bytes()[url_end - 1],
                b')' | b',' | b';' | b':' | b'.'
            )
        {
            url_end -= 1;
        }
        out.push_str(&url(&rest[scheme_start..url_end]));
        out.push_str(&rest[url_end..end]);
        rest = &rest[end..];
    }
    out.push_str(&mask_bearer(rest));
    out
}

/// One URL with its credentials masked and its query string replaced by the mask (the
/// fragment dropped). Text that is not a URL is returned as is.
pub fn url(u: &str) -> String {
    let Some(pos) = u.find("://") else {
        return u.to_owned();
    };
    let (scheme, rest) = (&u[..pos + 3], &u[pos + 3..]);
    let rest = rest.split('#').next().unwrap_or_default();
    let (before_query, query) = match rest.split_once('?') {
        Some((b, _)) => (b, true),
        None => (rest, false),
    };
    let authority_end = before_query.find('/').unwrap_or(before_query.len());
    let (authority, path) = before_query.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((_, host)) => format!("{MASK}@{host}"),
        None => authority.to_owned(),
    };
    let mut out = format!("{scheme}{authority}{path}");
    if query {
        out.push('?');
        out.push_str(MASK);
    }
    out
}

/// Masks `Bearer <token>` (case-insensitive scheme).
fn mask_bearer(s: &str) -> String {
    let lower = s.to_ascii_lowercase();
    let mut out = String::with_capacity(s.len());
    let mut from = 0;
    while let Some(i) = lower[from..].find("bearer ") {
        let start = from + i + "bearer ".len();
        out.push_str(&s[from..start]);
        let token_end = s[start..]
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | ',' | ';'))
            .map_or(s.len(), |e| start + e);
        if token_end > start {
            out.push_str(MASK);
        }
        from = token_end;
    }
    out.push_str(&s[from..]);
    out
}

/// An error message as it is stored with an entry: redacted, and cut to
/// [`MAX_ERROR_BYTES`] on a character boundary.
pub fn error(message: &str) -> String {
    let mut s = text(message);
    if s.len() > MAX_ERROR_BYTES {
        let mut cut = MAX_ERROR_BYTES;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_credentials_and_query() {
        assert_eq!(
            url("https://user:pw@hooks.example.com:8443/close?token=SECRET#x"),
            "https://***@hooks.example.com:8443/close?***"
        );
        assert_eq!(url("http://h/p"), "http://h/p");
        assert_eq!(
            url("redis://:pw@127.0.0.1:6379/0"),
            "redis://***@127.0.0.1:6379/0"
        );
        assert_eq!(url("not a url"), "not a url");
    }

    #[test]
    fn text_masks_every_url_and_bearer_token() {
        let t = text(
            "error sending request for url (http://h:1/hook?token=SECRET): connect to \
             postgres://app:PW@db/shop failed; Authorization: Bearer abc.def",
        );
        assert!(
            !t.contains("SECRET") && !t.contains("PW") && !t.contains("abc.def"),
            "{t}"
        );
        assert!(t.contains("(http://h:1/hook?***)"), "{t}");
        assert!(t.contains("postgres://***@db/shop"), "{t}");
        assert!(t.contains("Bearer ***"), "{t}");
        assert_eq!(text("plain message"), "plain message");
    }

    #[test]
    fn stored_errors_are_bounded() {
        let e = error(&"é".repeat(2000));
        assert!(e.len() <= MAX_ERROR_BYTES + '…'.len_utf8());
        assert!(e.ends_with('…'));
    }
}
