//! `GET /openapi.json` on a running agent: served without a token, a well-formed OpenAPI
//! document whose `$ref`s all resolve, and whose paths are the routes the agent really
//! serves (every operation answers something other than the router's "no such endpoint"
//! or 405, on a machine that does not exist and on one that does).

use bazaar_testkit::{start_cluster, TEST_SECRET};
use reqwest::{Client, Method, StatusCode};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::Duration;

const EXPECTED: &[(&str, &str)] = &[
    ("get", "/v1/apps"),
    ("post", "/v1/apps"),
    ("get", "/v1/apps/{app}"),
    ("delete", "/v1/apps/{app}"),
    ("get", "/v1/apps/{app}/machines"),
    ("post", "/v1/apps/{app}/machines"),
    ("post", "/v1/apps/{app}/machines/batch"),
    ("get", "/v1/apps/{app}/machines/{id}"),
    ("post", "/v1/apps/{app}/machines/{id}"),
    ("put", "/v1/apps/{app}/machines/{id}"),
    ("delete", "/v1/apps/{app}/machines/{id}"),
    ("post", "/v1/apps/{app}/machines/{id}/start"),
    ("post", "/v1/apps/{app}/machines/{id}/stop"),
    ("post", "/v1/apps/{app}/machines/{id}/restart"),
    ("post", "/v1/apps/{app}/machines/{id}/signal"),
    ("post", "/v1/apps/{app}/machines/{id}/suspend"),
    ("get", "/v1/apps/{app}/machines/{id}/wait"),
    ("get", "/v1/apps/{app}/machines/{id}/lease"),
    ("post", "/v1/apps/{app}/machines/{id}/lease"),
    ("delete", "/v1/apps/{app}/machines/{id}/lease"),
    ("post", "/v1/apps/{app}/machines/{id}/cordon"),
    ("post", "/v1/apps/{app}/machines/{id}/uncordon"),
    ("get", "/v1/apps/{app}/machines/{id}/metadata"),
    ("put", "/v1/apps/{app}/machines/{id}/metadata"),
    ("patch", "/v1/apps/{app}/machines/{id}/metadata"),
    ("get", "/v1/apps/{app}/machines/{id}/metadata/{key}"),
    ("post", "/v1/apps/{app}/machines/{id}/metadata/{key}"),
    ("delete", "/v1/apps/{app}/machines/{id}/metadata/{key}"),
    ("get", "/v1/apps/{app}/machines/{id}/events"),
    ("get", "/v1/apps/{app}/machines/{id}/versions"),
    ("post", "/v1/apps/{app}/machines/{id}/exec"),
    ("get", "/v1/apps/{app}/machines/{id}/logs"),
    ("get", "/v1/apps/{app}/machines/{id}/placement"),
    ("get", "/v1/platform/regions"),
    ("post", "/v1/platform/placements"),
    ("get", "/v1/catalog/hosts"),
    ("get", "/v1/catalog/machines"),
];

const METHODS: &[&str] = &[
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

/// Every `(method, path)` of the document, destructive calls on a machine or an app last.
fn operations(doc: &Value) -> Vec<(String, String)> {
    let mut ops: Vec<(String, String)> = doc["paths"]
        .as_object()
        .expect("paths")
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .expect("path item")
                .keys()
                .filter(|k| METHODS.contains(&k.as_str()))
                .map(move |m| (m.clone(), path.clone()))
        })
        .collect();
    let last = |(m, p): &(String, String)| {
        m == "delete" && (p.ends_with("/{id}") || p.ends_with("/{app}"))
    };
    ops.sort_by_key(|op| (last(op), op.1.ends_with("/{app}")));
    ops
}

/// Every `$ref` in `v`.
fn refs<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
    match v {
        Value::Object(o) => {
            if let Some(r) = o.get("$ref") {
                out.push(r.as_str().expect("$ref is a string"));
            }
            for x in o.values() {
                refs(x, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| refs(x, out)),
        _ => {}
    }
}

/// Calls `method path` (with `{app}`, `{id}` and `{key}` filled in) and checks the router
/// knew the route: not 405, not the fallback's 404 "no such endpoint".
async fn check_route(
    http: &Client,
    base: &str,
    method: &str,
    path: &str,
    (app, id): (&str, &str),
) -> (StatusCode, Value) {
    let mut url = format!(
        "{base}{}",
        path.replace("{app}", app)
            .replace("{id}", id)
            .replace("{key}", "some-key")
    );
    if path.ends_with("/wait") {
        url.push_str("?state=created,started,stopped&timeout=1");
    }
    let m = Method::from_bytes(method.to_ascii_uppercase().as_bytes()).unwrap();
    let mut req = http
        .request(m.clone(), &url)
        .bearer_auth(TEST_SECRET)
        .timeout(Duration::from_secs(30));
    if matches!(m, Method::POST | Method::PUT | Method::PATCH) {
        req = req.json(&json!({}));
    }
    let resp = req
        .send()
        .await
        .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    let body: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    assert_ne!(
        status,
        StatusCode::METHOD_NOT_ALLOWED,
        "{method} {url}: the route has no such method"
    );
    assert_ne!(
        status,
        StatusCode::UNAUTHORIZED,
        "{method} {url}: token refused"
    );
    if status == StatusCode::NOT_FOUND {
        let err = body["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{method} {url}: 404 without a Fly error body: {body}"));
        assert_ne!(err, "no such endpoint", "{method} {url}: no such route");
    }
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_document_describes_the_served_routes() {
    let agents = start_cluster(
        std::path::Path::new(env!("CARGO_BIN_EXE_bazaar")),
        1,
        |_, _| {},
    )
    .expect("agent starts");
    let base = agents[0].url();
    let http = Client::new();

    // Served without a token, as JSON.
    let resp = http
        .get(format!("{base}/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/json"));
    let doc: Value = resp.json().await.expect("the document is JSON");

    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    assert_eq!(doc["info"]["title"], "bazaar Machines API");
    assert!(!doc["info"]["version"].as_str().unwrap().is_empty());
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    let schemas = doc["components"]["schemas"].as_object().expect("schemas");
    for name in [
        "Machine",
        "MachineConfig",
        "ErrorBody",
        "GoDuration",
        "Signal",
        "Autostop",
    ] {
        assert!(schemas.contains_key(name), "schema {name} missing");
    }
    assert!(schemas["Machine"]["properties"]["config"].is_object());
    assert!(schemas["MachineConfig"]["properties"]["guest"].is_object());

    // Every expected route is documented, with the machine id and lease nonce parameters.
    let ops = operations(&doc);
    let documented: BTreeSet<(String, String)> = ops.iter().cloned().collect();
    for (m, p) in EXPECTED {
        assert!(
            documented.contains(&(m.to_string(), p.to_string())),
            "{m} {p} is not documented"
        );
    }
    let stop = &doc["paths"]["/v1/apps/{app}/machines/{id}/stop"]["post"];
    let names: Vec<&str> = stop["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["app", "id", "fly-machine-lease-nonce"]);
    assert!(stop["requestBody"]["content"]["application/json"]["schema"]["$ref"].is_string());
    for (m, p) in &ops {
        let op = &doc["paths"][p][m];
        assert!(op["responses"].as_object().is_some_and(|r| !r.is_empty()));
        if p.starts_with("/v1/") {
            assert_eq!(
                op["responses"]["401"]["content"]["application/json"]["schema"]["$ref"],
                "#/components/schemas/ErrorBody",
                "{m} {p}"
            );
        }
    }

    // Every $ref resolves.
    let mut all = Vec::new();
    refs(&doc, &mut all);
    assert!(all.len() > 50, "only {} $refs", all.len());
    for r in all {
        let name = r
            .strip_prefix("#/components/schemas/")
            .unwrap_or_else(|| panic!("unexpected $ref {r}"));
        assert!(schemas.contains_key(name), "$ref {r} does not resolve");
    }

    // Every documented operation is a route: first on an app and machine that do not exist
    // (the handlers answer their own 404s)...
    for (m, p) in &ops {
        check_route(&http, &base, m, p, ("no-such-app", "0123456789abcd")).await;
    }

    // ...then on a real machine, so forwarded sub-paths reach the owner's routes.
    let (s, _) = check_route(&http, &base, "post", "/v1/apps", ("", "")).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let resp = http
        .post(format!("{base}/v1/apps"))
        .bearer_auth(TEST_SECRET)
        .json(&json!({"app_name": "openapi", "org_slug": "personal"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let resp = http
        .post(format!("{base}/v1/apps/openapi/machines"))
        .bearer_auth(TEST_SECRET)
        .json(&json!({
            "skip_launch": true,
            "config": {
                "image": "process",
                "driver": "process",
                "init": {"exec": ["sleep", "30"]},
                "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256},
                "metadata": {"some-key": "v"},
            },
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let machine: Value = resp.json().await.unwrap();
    let id = machine["id"].as_str().unwrap().to_string();
    for key in ["id", "state", "config", "instance_id", "created_at"] {
        assert!(
            schemas["Machine"]["properties"].get(key).is_some(),
            "Machine schema lacks {key}"
        );
        assert!(machine.get(key).is_some());
    }
    // The check can fail: an undocumented sub-path reaches the owner's fallback.
    let resp = http
        .post(format!("{base}/v1/apps/openapi/machines/{id}/no-such-call"))
        .bearer_auth(TEST_SECRET)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"], "no such endpoint");
    for (m, p) in &ops {
        if p.contains("{id}") || p.ends_with("/{app}") {
            let (s, body) = check_route(&http, &base, m, p, ("openapi", &id)).await;
            // A call the machine's host answered: a documented status.
            let documented = &doc["paths"][p][m]["responses"][s.as_str()];
            assert!(
                documented.is_object(),
                "{m} {p} answered {s} ({body}), which is not documented"
            );
        }
    }
}
