//! Test only: every route the Machines API serves is documented, and nothing documented is
//! missing from the routers. The routes are read from the router code itself: the API's
//! router (`crate::router`), the machine routes of the host interface that the API forwards
//! (`bazaar_agent::http`, `/host/v1/machines/{id}...` → `/v1/apps/{app}/machines/{id}...`),
//! the catalog view (`/v1/catalog`) and the proxy's forwarded traffic route. A route added
//! to any of them without a row in `routes.rs` fails here.

use std::collections::BTreeSet;

const API_ROUTER: &str = include_str!("../lib.rs");
const HOST_ROUTER: &str = include_str!("../../../agent/src/http.rs");
const PROXY_ROUTES: &str = include_str!("../../../proxy/src/lib.rs");

const METHODS: &[&str] = &["get", "post", "put", "delete", "patch", "any"];

/// `(path, methods)` of every `.route("path", ...)` call in `src`.
fn routes(src: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let mut rest = src;
    while let Some(at) = rest.find(".route(") {
        rest = &rest[at + ".route(".len()..];
        // The call's arguments, up to the matching parenthesis.
        let mut depth = 1;
        let end = rest
            .char_indices()
            .find_map(|(i, c)| {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
                (depth == 0).then_some(i)
            })
            .expect("balanced parentheses");
        let args = &rest[..end];
        let path = args
            .split('"')
            .nth(1)
            .expect("a route's first argument is a string literal")
            .to_string();
        let handlers = &args[args.find(',').expect("a route has a handler")..];
        let methods = METHODS
            .iter()
            .filter(|m| {
                handlers.match_indices(&format!("{m}(")).any(|(i, _)| {
                    !handlers[..i]
                        .chars()
                        .next_back()
                        .is_some_and(|c| c.is_alphanumeric() || c == '_')
                })
            })
            .map(|m| m.to_string())
            .collect();
        out.push((path, methods));
        rest = &rest[end..];
    }
    out
}

/// The text between `from` and the next `to` in `src`.
fn section<'a>(src: &'a str, from: &str, to: &str) -> &'a str {
    let start = src
        .find(from)
        .unwrap_or_else(|| panic!("{from:?} not found: update coverage.rs to the router's code"));
    let len = src[start..]
        .find(to)
        .unwrap_or_else(|| panic!("{to:?} not found after {from:?}"));
    &src[start..start + len]
}

/// Every `(METHOD, path)` a client of the Machines API can call.
fn served() -> BTreeSet<(String, String)> {
    let mut served = BTreeSet::new();
    let mut add = |path: &str, methods: &[String]| {
        for m in methods.iter().filter(|m| *m != "any") {
            served.insert((m.to_ascii_uppercase(), path.to_string()));
        }
    };
    let mut forwarded = false;
    for (path, methods) in routes(section(API_ROUTER, "pub fn router(", "\n}\n")) {
        if methods.iter().any(|m| m == "any") {
            // The forwarders: what they serve is the host's machine routes, below.
            forwarded = true;
            continue;
        }
        add(&path, &methods);
    }
    assert!(forwarded, "the API no longer forwards machine calls?");
    let host = section(HOST_ROUTER, "let host = Router::new()", "let catalog");
    let proxy = section(PROXY_ROUTES, "let traffic = ", ".with_state(");
    for (path, methods) in routes(host).into_iter().chain(
        routes(proxy)
            .into_iter()
            .filter_map(|(p, m)| Some((p.strip_prefix("/host/v1")?.to_string(), m))),
    ) {
        let Some(rest) = path.strip_prefix("/machines/{id}") else {
            continue; // host-only: bids, claims, volumes, images, the machine list
        };
        let mut methods = methods;
        if rest.is_empty() && methods.iter().any(|m| m == "post") {
            // `PUT` on a machine is an update too (`machines::forward_root`).
            methods.push("put".into());
        }
        add(&format!("/v1/apps/{{app}}/machines/{{id}}{rest}"), &methods);
    }
    let catalog = section(HOST_ROUTER, "let catalog = Router::new()", ".layer(");
    for (path, methods) in routes(catalog) {
        add(&format!("/v1/catalog{path}"), &methods);
    }
    served
}

#[test]
fn the_parser_reads_chained_and_multiline_routes() {
    let src = r#"Router::new()
        .route("/a/{id}", get(x).post(y))
        .route(
            "/b",
            get(z)
                .put(w)
                .delete(v),
        )
        .route("/c", axum::routing::get(target_get))
        .route("/d/{*rest}", any(f))"#;
    assert_eq!(
        routes(src),
        vec![
            ("/a/{id}".into(), vec!["get".into(), "post".into()]),
            (
                "/b".into(),
                vec!["get".into(), "put".into(), "delete".into()]
            ),
            ("/c".into(), vec!["get".into()]),
            ("/d/{*rest}".into(), vec!["any".into()]),
        ]
    );
}

#[test]
fn every_served_route_is_documented_and_every_documented_route_is_served() {
    let served = served();
    let documented: BTreeSet<(String, String)> = super::operations()
        .iter()
        .map(|op| (op.method.to_string(), op.path.to_string()))
        .collect();
    let undocumented: Vec<_> = served.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "served but not in openapi/routes.rs: {undocumented:?}"
    );
    let unserved: Vec<_> = documented.difference(&served).collect();
    assert!(
        unserved.is_empty(),
        "documented but served by no router: {unserved:?}"
    );
    assert!(served.len() > 40, "only {} routes found", served.len());
}
