//! `GET /openapi.json` on a running agent: served without a token, a well-formed OpenAPI
//! document whose `$ref`s all resolve, and whose paths are the routes the agent really
//! serves (every operation answers something other than the router's "no such endpoint"
//! or 405, on a machine that does not exist and on one that does).

use bazaar_testkit::{api_token, start_cluster, TEST_SECRET};
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
    ("get", "/v1/apps/{app}/audit"),
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
    // The catalog view takes the cluster secret, the Machines API an API token.
    let token = if path.starts_with("/v1/catalog/") {
        TEST_SECRET
    } else {
        api_token()
    };
    let mut req = http
        .request(m.clone(), &url)
        .bearer_auth(token)
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
        .bearer_auth(api_token())
        .json(&json!({"app_name": "openapi", "org_slug": "personal"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let resp = http
        .post(format!("{base}/v1/apps/openapi/machines"))
        .bearer_auth(api_token())
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
        .bearer_auth(api_token())
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

/// The schema `s` with its `$ref` resolved against the document.
fn resolve<'a>(doc: &'a Value, s: &'a Value) -> &'a Value {
    match s["$ref"].as_str() {
        Some(r) => {
            let name = r.strip_prefix("#/components/schemas/").expect("local $ref");
            resolve(doc, &doc["components"]["schemas"][name])
        }
        None => s,
    }
}

/// Where `value` lacks a property that `schema` requires (recursively, through objects,
/// arrays and `anyOf` alternatives): `None` when it has them all.
fn missing_required(doc: &Value, schema: &Value, value: &Value, at: &str) -> Option<String> {
    let schema = resolve(doc, schema);
    if let Some(alternatives) = schema["anyOf"].as_array().or(schema["oneOf"].as_array()) {
        let misses: Vec<String> = alternatives
            .iter()
            .filter_map(|a| missing_required(doc, a, value, at))
            .collect();
        return (misses.len() == alternatives.len()).then(|| misses.join(" / "));
    }
    if let (Some(items), Some(list)) = (schema.get("items"), value.as_array()) {
        return list
            .iter()
            .enumerate()
            .find_map(|(i, v)| missing_required(doc, items, v, &format!("{at}[{i}]")));
    }
    let object = value.as_object()?;
    for key in schema["required"].as_array().into_iter().flatten() {
        let key = key.as_str().unwrap();
        if !object.contains_key(key) {
            return Some(format!("{at}.{key}"));
        }
    }
    let properties = schema["properties"].as_object()?;
    object.iter().find_map(|(k, v)| {
        let s = properties.get(k)?;
        missing_required(doc, s, v, &format!("{at}.{k}"))
    })
}

/// Real answers of the main operations carry every property the document says is required.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_answers_have_the_documented_required_properties() {
    let agents = start_cluster(
        std::path::Path::new(env!("CARGO_BIN_EXE_bazaar")),
        1,
        |_, _| {},
    )
    .expect("agent starts");
    let base = agents[0].url();
    let http = Client::new();
    let doc: Value = http
        .get(format!("{base}/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let call = |method: Method, path: String, body: Option<Value>| {
        let mut req = http
            .request(method, format!("{base}{path}"))
            .bearer_auth(api_token());
        if let Some(b) = body {
            req = req.json(&b);
        }
        async move {
            let resp = req.send().await.unwrap();
            let status = resp.status();
            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    // Checks one answer against the documented schema of `method path` for its status.
    let check = |method: &str, path: &str, status: StatusCode, answer: &Value| {
        let schema = &doc["paths"][path][method]["responses"][status.as_str()]["content"]
            ["application/json"]["schema"];
        assert!(
            schema.is_object(),
            "{method} {path}: {status} is not documented with a body"
        );
        if let Some(miss) = missing_required(&doc, schema, answer, "answer") {
            panic!("{method} {path}: {miss} is documented as required but missing: {answer}");
        }
    };
    let (s, app) = call(
        Method::POST,
        "/v1/apps".into(),
        Some(json!({"app_name": "shapes", "org_slug": "personal"})),
    )
    .await;
    check("post", "/v1/apps", s, &app);
    let (s, v) = call(Method::GET, "/v1/apps/shapes".into(), None).await;
    check("get", "/v1/apps/{app}", s, &v);
    let (s, v) = call(Method::GET, "/v1/apps".into(), None).await;
    check("get", "/v1/apps", s, &v);

    let config = json!({"image": "process", "driver": "process", "init": {"exec": ["sleep", "100"]},
                        "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256}});
    let (s, m) = call(
        Method::POST,
        "/v1/apps/shapes/machines".into(),
        Some(json!({"config": config})),
    )
    .await;
    check("post", "/v1/apps/{app}/machines", s, &m);
    let id = m["id"].as_str().unwrap().to_string();
    let (s, _) = call(
        Method::GET,
        format!("/v1/apps/shapes/machines/{id}/wait?state=started&timeout=30"),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let machine = "/v1/apps/{app}/machines/{id}";
    let (s, v) = call(Method::GET, format!("/v1/apps/shapes/machines/{id}"), None).await;
    check("get", machine, s, &v);
    for query in ["", "?summary=true", "?include_leases=true"] {
        let (s, v) = call(
            Method::GET,
            format!("/v1/apps/shapes/machines{query}"),
            None,
        )
        .await;
        assert_eq!(v.as_array().map(Vec::len), Some(1), "{query}: {v}");
        check("get", "/v1/apps/{app}/machines", s, &v);
    }
    let lease = format!("{machine}/lease");
    let (s, v) = call(
        Method::POST,
        format!("/v1/apps/shapes/machines/{id}/lease"),
        Some(json!({"ttl": 30})),
    )
    .await;
    check("post", &lease, s, &v);
    let (s, v) = call(
        Method::GET,
        format!("/v1/apps/shapes/machines/{id}/lease"),
        None,
    )
    .await;
    check("get", &lease, s, &v);

    let (s, vol) = call(
        Method::POST,
        "/v1/apps/shapes/volumes".into(),
        Some(json!({"name": "data", "size_gb": 1, "region": "local"})),
    )
    .await;
    check("post", "/v1/apps/{app}/volumes", s, &vol);
    let vid = vol["id"].as_str().unwrap();
    let (s, v) = call(Method::GET, format!("/v1/apps/shapes/volumes/{vid}"), None).await;
    check("get", "/v1/apps/{app}/volumes/{id}", s, &v);
    let (s, v) = call(Method::GET, "/v1/apps/shapes/volumes".into(), None).await;
    check("get", "/v1/apps/{app}/volumes", s, &v);
}
