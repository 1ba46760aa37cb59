//! Tests of `upstream`: in a file of their own so that their `use super::*`
//! names this module (tools that read imports by file take a nested test
//! module's `super` for the parent).

use super::*;

fn secret(s: &str) -> Secret {
    Secret::new(s.into()).unwrap()
}

fn policy() -> Arc<ForwardPolicy> {
    Arc::new(ForwardPolicy::new(&["x-team-*".into()]))
}

#[test]
fn beta_lines_go_byte_for_byte_but_for_the_oauth_flag() {
    let mut h = HeaderMap::new();
    h.append("anthropic-beta", "claude-code-20250219, oauth-2025-04-20,  x-b".parse().unwrap());
    h.append("anthropic-beta", "interleaved-thinking-2025-05-14 ,zz-probe".parse().unwrap());
    let sent = |kind| {
        let t = Target::new("http://h", kind, &secret("k"), policy()).unwrap();
        t.headers(&h).get_all("anthropic-beta").iter().map(|v| v.to_str().unwrap().to_string()).collect::<Vec<_>>()
    };
    // A seat's request: every line as it came; the flag is already there.
    assert_eq!(
        sent(AccountKind::Oauth),
        ["claude-code-20250219, oauth-2025-04-20,  x-b", "interleaved-thinking-2025-05-14 ,zz-probe"]
    );
    // An API key's: the OAuth flag and its separator out, nothing else.
    assert_eq!(sent(AccountKind::ApiKey), ["claude-code-20250219,  x-b", "interleaved-thinking-2025-05-14 ,zz-probe"]);
    // No client flag: a seat's request gains it at the end of the last line.
    let bare = Target::new("http://h", AccountKind::Oauth, &secret("k"), policy()).unwrap();
    assert_eq!(bare.headers(&HeaderMap::new()).get("anthropic-beta").unwrap(), OAUTH_BETA);
    let mut cc = HeaderMap::new();
    cc.append("anthropic-beta", "a, b".parse().unwrap());
    cc.append("anthropic-beta", "c,".parse().unwrap());
    let lines =
        |h: HeaderMap| h.get_all("anthropic-beta").iter().map(|v| v.to_str().unwrap().to_string()).collect::<Vec<_>>();
    assert_eq!(lines(bare.headers(&cc)), ["a, b", "c,oauth-2025-04-20"]);
    cc.remove("anthropic-beta");
    cc.append("anthropic-beta", "a".parse().unwrap());
    assert_eq!(lines(bare.headers(&cc)), ["a,oauth-2025-04-20"]);
    let key = Target::new("http://h", AccountKind::ApiKey, &secret("k"), policy()).unwrap();
    assert!(key.headers(&HeaderMap::new()).get("anthropic-beta").is_none());
    // A line that held only the flag is dropped for an API key.
    assert_eq!(beta_line(&HeaderValue::from_static(" oauth-2025-04-20 "), AccountKind::ApiKey), None);
    assert!(has_oauth_flag(&HeaderValue::from_static("a,oauth-2025-04-20")));
    assert!(!has_oauth_flag(&HeaderValue::from_static("a,oauth-2025-04-20x")));
}

#[test]
fn retry_after_goes_out_in_whole_seconds() {
    let after = |v: &str| {
        let mut h = HeaderMap::new();
        h.insert(header::RETRY_AFTER, v.parse().unwrap());
        integer_retry_after(&mut h, 1_000_000_000_000);
        h.get(header::RETRY_AFTER).map(|v| v.to_str().unwrap().to_string())
    };
    assert_eq!(after("7").as_deref(), Some("7"));
    assert_eq!(after("1.2").as_deref(), Some("2"));
    // 2001-09-09T01:46:40Z is 1e12 ms; ten seconds later:
    assert_eq!(after("Sun, 09 Sep 2001 01:46:50 GMT").as_deref(), Some("10"));
    assert_eq!(after("soon"), None);
}

#[test]
fn hop_by_hop_headers_are_not_forwarded() {
    let mut h = HeaderMap::new();
    h.insert("connection", "keep-alive".parse().unwrap());
    h.insert("transfer-encoding", "chunked".parse().unwrap());
    h.insert("anthropic-version", "2023-06-01".parse().unwrap());
    retain_forwardable(&mut h);
    assert!(h.get("connection").is_none() && h.get("transfer-encoding").is_none());
    assert!(h.get("anthropic-version").is_some());
}

#[test]
fn a_header_the_connection_header_names_stays() {
    let t = Target::new("http://h", AccountKind::ApiKey, &secret("k"), policy()).unwrap();
    let mut client = HeaderMap::new();
    client.insert("connection", "X-Team-Hop".parse().unwrap());
    client.insert("x-team-hop", "1".parse().unwrap());
    client.insert("x-team-id", "7".parse().unwrap());
    let h = t.headers(&client);
    assert!(h.get("x-team-hop").is_none() && h.get("x-team-id").is_some());
}

#[test]
fn only_an_uncompressed_event_stream_is_framed() {
    let h = |pairs: &[(&str, &str)]| {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        m
    };
    assert!(is_plain_sse(&h(&[("content-type", "text/event-stream; charset=utf-8")])));
    assert!(is_plain_sse(&h(&[("content-type", "text/event-stream"), ("content-encoding", "identity")])));
    assert!(!is_plain_sse(&h(&[("content-type", "text/event-stream"), ("content-encoding", "gzip")])));
    assert!(!is_plain_sse(&h(&[("content-type", "text/event-stream"), ("content-encoding", "br")])));
    assert!(!is_plain_sse(&h(&[("content-type", "application/json")])));
}

#[test]
fn the_account_credential_replaces_the_clients() {
    let base = crate::config::base_prefix("https://api.example.test/base/").unwrap();
    let t = Target::new(&base, AccountKind::Oauth, &secret("tok"), policy()).unwrap();
    assert_eq!(t.prefix, "https://api.example.test/base");
    let mut client = HeaderMap::new();
    client.insert("x-api-key", "gateway-key".parse().unwrap());
    client.insert("authorization", "Bearer gateway-key".parse().unwrap());
    client.insert("x-poolgate-debug", "1".parse().unwrap());
    client.insert("connection", "close".parse().unwrap());
    client.insert("anthropic-version", "2023-06-01".parse().unwrap());
    client.insert("cookie", "session=1".parse().unwrap());
    client.insert("x-forwarded-for", "10.0.0.1".parse().unwrap());
    client.insert("x-foo", "1".parse().unwrap());
    client.insert("x-team-id", "7".parse().unwrap());
    let h = t.headers(&client);
    assert!(h.get("cookie").is_none() && h.get("x-forwarded-for").is_none() && h.get("x-foo").is_none());
    assert_eq!(h.get("x-team-id").unwrap(), "7");
    assert_eq!(h.get("authorization").unwrap(), "Bearer tok");
    assert!(h.get("authorization").unwrap().is_sensitive());
    assert!(h.get("x-api-key").is_none() && h.get("x-poolgate-debug").is_none() && h.get("connection").is_none());
    assert_eq!(h.get("anthropic-version").unwrap(), "2023-06-01");
    assert_eq!(h.get("anthropic-beta").unwrap(), OAUTH_BETA);

    let k = Target::new("http://127.0.0.1:9", AccountKind::ApiKey, &secret("sk-1"), policy()).unwrap();
    assert_eq!(k.prefix, "http://127.0.0.1:9");
    let h = k.headers(&client);
    assert_eq!(h.get("x-api-key").unwrap(), "sk-1");
    assert!(h.get("authorization").is_none());
}

#[test]
fn a_credential_a_header_cannot_carry_is_refused_without_showing_it() {
    let e = Target::new("http://h", AccountKind::ApiKey, &secret("bad\nkey"), policy()).err().unwrap();
    assert!(e.to_string().contains("header"), "{e}");
    assert!(!e.to_string().contains("bad\nkey"), "the credential is never in an error");
}

#[test]
fn a_request_uri_is_the_prefix_joined_with_the_clients_path_and_query() {
    let joined = |prefix: &str, path: &str| format!("{prefix}{path}").parse::<Uri>().unwrap();
    let prefixes =
        ["http://127.0.0.1:9", "https://api.example.test", "https://api.example.test/base", "http://h:80/a/b"];
    let paths = ["/v1/messages", "/v1/models?limit=2&after_id=x", "/", "/v1/messages/count_tokens?beta=true"];
    for prefix in prefixes {
        let t = Target::backend(prefix, None).unwrap();
        assert_eq!(t.origin.is_some(), !prefix.contains("/base") && !prefix.contains("/a/b"), "{prefix}");
        for path in paths {
            let client: Uri = path.parse().unwrap();
            let uri = t.uri(&client).unwrap();
            assert_eq!(uri, joined(prefix, path), "{prefix} + {path}");
            assert_eq!(uri.to_string(), joined(prefix, path).to_string());
        }
        // A client URI in absolute form: only its path and query go along.
        let absolute: Uri = "http://client.example/v1/messages?x=1".parse().unwrap();
        assert_eq!(t.uri(&absolute).unwrap(), joined(prefix, "/v1/messages?x=1"));
    }
    // A prefix written otherwise than it reads back (a trailing slash) is
    // joined as a string, as before.
    let t = Target::backend("http://h:1/", None).unwrap();
    assert!(t.origin.is_none());
    assert_eq!(t.uri(&"/v1/messages".parse().unwrap()).unwrap(), joined("http://h:1/", "/v1/messages"));
}
