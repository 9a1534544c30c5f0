//! The axum routes of `/ui`: sign-in (the token goes into an HttpOnly cookie: EventSource
//! cannot send an Authorization header, and a cookie lets a page come rendered in one
//! request), the pages (read from the local catalog, or from the Machines API called
//! in-process with the viewer's token, so every check and forward of the API applies),
//! the actions (a POST that calls the Machines API; it needs the `x-bazaar-ui` header,
//! which a cross-site form cannot send, on top of the cookie's `SameSite=Strict`), the live
//! log tail and the change stream as server-sent events. Every answer carries
//! [`CONTENT_SECURITY_POLICY`] (scripts and styles from this origin's files only, no
//! framing), `X-Content-Type-Options: nosniff` and `Referrer-Policy: no-referrer`.

use crate::access;
use crate::render::{self, MachineDetail, Viewer};
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, Method, Request, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bazaar_catalog::{Change, MachineFilter};
use bazaar_node::NodeHandle;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use tower::ServiceExt;

/// The cookie holding the signed-in token.
const COOKIE: &str = "bazaar_ui";

/// What a dashboard page may load: its own script and style files, nothing inline (the
/// pages carry no inline script, handler or style), no plugins, and no page may frame it.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; object-src 'none'; \
     base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// Largest API answer read into a page (a machine's events, its config).
const MAX_API_BODY: usize = 8 * 1024 * 1024;

#[derive(Clone, Debug)]
struct Ui {
    node: NodeHandle,
    /// The Machines API router of this node, called in-process.
    api: Router,
}

/// The `/ui` routes. `api` is this node's Machines API router (`bazaar_api::router`).
pub fn router(node: NodeHandle, api: Router) -> Router {
    Router::new()
        .route("/ui", get(fleet))
        .route("/ui/", get(fleet))
        .route("/ui/signin", get(sign_in))
        .route("/ui/session", post(session))
        .route("/ui/apps", get(apps))
        .route("/ui/apps/{app}", get(app))
        .route("/ui/apps/{app}/machines/{id}", get(machine))
        .route("/ui/apps/{app}/machines/{id}/logs", get(logs))
        .route(
            "/ui/apps/{app}/machines/{id}/actions/{action}",
            post(action),
        )
        .route("/ui/placements", get(placements))
        .route("/ui/events", get(events))
        .route("/ui/assets/{name}", get(asset))
        .with_state(Ui { node, api })
        .layer(axum::middleware::map_response(security_headers))
}

/// The headers of every `/ui` answer (see [`CONTENT_SECURITY_POLICY`]).
async fn security_headers(mut resp: Response) -> Response {
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        header::HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        header::HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        header::HeaderValue::from_static("no-referrer"),
    );
    resp
}

/// The token of the request's cookie, if the API accepts it.
fn signed_in(ui: &Ui, headers: &HeaderMap) -> Option<String> {
    let token = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|kv| kv.trim().strip_prefix(COOKIE)?.strip_prefix('='))?;
    access::may_view(&*ui.node, token).then(|| token.to_string())
}

/// A page, or the sign-in page when the viewer is not signed in (200: the script signs in
/// from a `#token=` fragment on any page).
async fn with_viewer<F, Fut>(ui: Ui, headers: &HeaderMap, page: F) -> Response
where
    F: FnOnce(Ui, String, Viewer) -> Fut,
    Fut: std::future::Future<Output = Response>,
{
    match signed_in(&ui, headers) {
        Some(token) => {
            let viewer = Viewer {
                may_act: access::may_act(&*ui.node, &token),
            };
            page(ui, token, viewer).await
        }
        None => Html(render::sign_in(None)).into_response(),
    }
}

/// The page shown while the catalog is not attached yet (the agent is starting).
fn starting() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Html(render::failure(
            "Starting",
            "the catalog is not running yet; reload in a moment",
        )),
    )
        .into_response()
}

/// Calls the Machines API in-process as the viewer.
async fn call_api(
    ui: &Ui,
    token: &str,
    method: Method,
    uri: &str,
    body: Option<Value>,
) -> Response {
    let mut req = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::AUTHORIZATION, format!("Bearer {token}"));
    if body.is_some() {
        req = req.header(header::CONTENT_TYPE, "application/json");
    }
    let body = body.map_or_else(Body::empty, |b| Body::from(b.to_string()));
    match req.body(body) {
        Ok(req) => match ui.api.clone().oneshot(req).await {
            Ok(resp) => resp,
            Err(never) => match never {},
        },
        Err(e) => error(StatusCode::BAD_REQUEST, &e.to_string()),
    }
}

/// Calls the API and reads its JSON answer: `Ok` for a 2xx, else the API's error text.
async fn api_json(
    ui: &Ui,
    token: &str,
    method: Method,
    uri: &str,
    body: Option<Value>,
) -> Result<Value, (StatusCode, String)> {
    let resp = call_api(ui, token, method, uri, body).await;
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), MAX_API_BODY)
        .await
        .unwrap_or_default();
    let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    if status.is_success() {
        Ok(value)
    } else {
        let why = value["error"].as_str().map_or_else(
            || String::from_utf8_lossy(&bytes).into_owned(),
            str::to_string,
        );
        Err((status, why))
    }
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({ "error": message }))).into_response()
}

async fn sign_in() -> Response {
    (
        [(
            header::SET_COOKIE,
            format!("{COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0"),
        )],
        Html(render::sign_in(None)),
    )
        .into_response()
}

#[derive(Deserialize)]
struct SessionRequest {
    token: String,
}

/// Signs in: checks the token and sets the cookie (204), or 401 / 400.
async fn session(State(ui): State<Ui>, body: Bytes) -> Response {
    let Ok(req) = serde_json::from_slice::<SessionRequest>(&body) else {
        return error(
            StatusCode::BAD_REQUEST,
            "expected a JSON body {\"token\": \"...\"}",
        );
    };
    let token = req.token.trim();
    if token.is_empty()
        || !token
            .bytes()
            .all(|b| b.is_ascii_graphic() && !b";,\"\\".contains(&b))
    {
        return error(
            StatusCode::BAD_REQUEST,
            "the token is empty or has characters a cookie cannot carry",
        );
    }
    if !access::may_view(&*ui.node, token) {
        // Say why a token the API refuses is refused (the cluster secret: not an API token).
        let why = match ui.node.caller(token) {
            Err(denied) => format!("this token is not accepted here: {denied}"),
            Ok(_) => "this token is not accepted here".to_string(),
        };
        return error(StatusCode::UNAUTHORIZED, &why);
    }
    (
        StatusCode::NO_CONTENT,
        [(
            header::SET_COOKIE,
            format!("{COOKIE}={token}; Path=/ui; HttpOnly; SameSite=Strict"),
        )],
    )
        .into_response()
}

async fn fleet(State(ui): State<Ui>, headers: HeaderMap) -> Response {
    with_viewer(ui, &headers, |ui, _, _| async move {
        let Some(catalog) = ui.node.catalog() else {
            return starting();
        };
        let hosts = catalog.hosts();
        let per_host: BTreeMap<String, usize> = hosts
            .iter()
            .map(|h| (h.record.id.clone(), h.record.num_machines as usize))
            .collect();
        Html(render::fleet(&hosts, &per_host)).into_response()
    })
    .await
}

async fn apps(State(ui): State<Ui>, headers: HeaderMap) -> Response {
    with_viewer(ui, &headers, |ui, _, _| async move {
        let Some(catalog) = ui.node.catalog() else {
            return starting();
        };
        // Counted in place: no machine row is copied out of the catalog.
        let counts: std::cell::RefCell<BTreeMap<String, (usize, usize)>> = Default::default();
        catalog.machines_where(&MachineFilter::default(), |m| {
            let mut counts = counts.borrow_mut();
            let c = counts.entry(m.app.clone()).or_default();
            c.0 += 1;
            c.1 += usize::from(m.state == "started");
            false
        });
        Html(render::apps(&catalog.apps(), &counts.into_inner())).into_response()
    })
    .await
}

async fn app(State(ui): State<Ui>, Path(name): Path<String>, headers: HeaderMap) -> Response {
    with_viewer(ui, &headers, |ui, _, viewer| async move {
        let Some(catalog) = ui.node.catalog() else {
            return starting();
        };
        if catalog.app(&name).is_none() {
            let page = render::failure("Not found", &format!("app {name} not found"));
            return (StatusCode::NOT_FOUND, Html(page)).into_response();
        }
        let machines = catalog.machines(&MachineFilter::app(name.as_str()));
        Html(render::app(&name, &machines, viewer)).into_response()
    })
    .await
}

async fn machine(
    State(ui): State<Ui>,
    Path((app, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    with_viewer(ui, &headers, |ui, token, viewer| async move {
        let base = format!("/v1/apps/{app}/machines/{id}");
        let (events_uri, placement_uri) = (format!("{base}/events"), format!("{base}/placement"));
        let (machine, events, placement) = tokio::join!(
            api_json(&ui, &token, Method::GET, &base, None),
            api_json(&ui, &token, Method::GET, &events_uri, None),
            api_json(&ui, &token, Method::GET, &placement_uri, None),
        );
        let machine = match machine {
            Ok(m) => m,
            Err((status, why)) => {
                return (status, Html(render::failure("Machine", &why))).into_response()
            }
        };
        let detail = MachineDetail {
            app: &app,
            id: &id,
            machine,
            events: events.unwrap_or(Value::Null),
            placement: placement.ok(),
        };
        Html(render::machine(&detail, viewer)).into_response()
    })
    .await
}

/// The machine's log, followed: the API's JSON lines, relayed as they come.
async fn logs(
    State(ui): State<Ui>,
    Path((app, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let Some(token) = signed_in(&ui, &headers) else {
        return error(StatusCode::UNAUTHORIZED, "sign in first");
    };
    let uri = format!("/v1/apps/{app}/machines/{id}/logs?follow=true&max_bytes=16384");
    call_api(&ui, &token, Method::GET, &uri, None).await
}

/// A button: calls the Machines API as the viewer and relays its answer.
async fn action(
    State(ui): State<Ui>,
    Path((app, id, action)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let Some(token) = signed_in(&ui, &headers) else {
        return error(StatusCode::UNAUTHORIZED, "sign in first");
    };
    if !headers.contains_key("x-bazaar-ui") {
        return error(
            StatusCode::FORBIDDEN,
            "actions are sent by the dashboard's script (x-bazaar-ui header missing)",
        );
    }
    if !access::may_act(&*ui.node, &token) {
        return error(StatusCode::FORBIDDEN, "this token is read-only");
    }
    let base = format!("/v1/apps/{app}/machines/{id}");
    let (method, uri) = match action.as_str() {
        "start" | "stop" | "restart" | "cordon" => (Method::POST, format!("{base}/{action}")),
        "destroy" => (Method::DELETE, format!("{base}?force=true")),
        other => {
            return error(
                StatusCode::NOT_FOUND,
                &format!("unknown action {other:?}: start, stop, restart, cordon or destroy"),
            )
        }
    };
    call_api(&ui, &token, method, &uri, None).await
}

#[derive(Deserialize)]
struct DryRun {
    size: Option<String>,
    region: Option<String>,
}

async fn placements(State(ui): State<Ui>, Query(q): Query<DryRun>, headers: HeaderMap) -> Response {
    with_viewer(ui, &headers, |ui, token, _| async move {
        let size = q.size.unwrap_or_default();
        let region = q.region.unwrap_or_default();
        if size.is_empty() && region.is_empty() {
            return Html(render::placements("", "", None)).into_response();
        }
        let mut body = json!({});
        if !size.is_empty() {
            body["size"] = json!(size);
        }
        if !region.is_empty() {
            body["region"] = json!(region);
        }
        let answer = api_json(
            &ui,
            &token,
            Method::POST,
            "/v1/platform/placements",
            Some(body),
        )
        .await;
        let shown = answer.as_ref().map_err(|(_, why)| why.as_str());
        Html(render::placements(&size, &region, Some(shown))).into_response()
    })
    .await
}

/// The catalog's change stream as server-sent events: `{"kind": "machine", "id", "app"}`,
/// `{"kind": "host", "id"}`, `{"kind": "app", "id"}`, `{"kind": "volume", ...}`, or
/// `{"kind": "all"}` after falling behind.
async fn events(State(ui): State<Ui>, headers: HeaderMap) -> Response {
    if signed_in(&ui, &headers).is_none() {
        return error(StatusCode::UNAUTHORIZED, "sign in first");
    }
    let Some(catalog) = ui.node.catalog() else {
        return starting();
    };
    let changes = catalog.subscribe();
    let stream = futures_util::stream::unfold(changes, |mut changes| async move {
        use tokio::sync::broadcast::error::RecvError;
        let data = loop {
            break match changes.recv().await {
                Ok(Change::Machine { id, app }) => json!({"kind": "machine", "id": id, "app": app}),
                Ok(Change::Volume { id, app }) => json!({"kind": "volume", "id": id, "app": app}),
                Ok(Change::Host(id)) => json!({"kind": "host", "id": id}),
                Ok(Change::App(id)) => json!({"kind": "app", "id": id}),
                // Not shown by the dashboard.
                Ok(Change::Certificate(_) | Change::Challenge(_)) => continue,
                Err(RecvError::Lagged(_)) => json!({"kind": "all"}),
                Err(RecvError::Closed) => return None,
            };
        };
        let event = Event::default().event("change").data(data.to_string());
        Some((Ok::<_, std::convert::Infallible>(event), changes))
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// The embedded assets.
async fn asset(Path(name): Path<String>) -> Response {
    let (body, kind): (&'static [u8], &str) = match name.as_str() {
        "dashboard.js" => (
            include_bytes!("../assets/dashboard.js"),
            "text/javascript; charset=utf-8",
        ),
        "dashboard.css" => (
            include_bytes!("../assets/dashboard.css"),
            "text/css; charset=utf-8",
        ),
        _ => return error(StatusCode::NOT_FOUND, "no such asset"),
    };
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}
