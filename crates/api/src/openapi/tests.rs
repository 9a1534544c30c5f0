//! The document as built from the routes: complete, consistent, with Fly's operation ids;
//! and no route of the crate registered around it.

use serde_json::Value;
use std::collections::BTreeSet;

/// Every operation id the document has had: Fly's names, which generated clients use.
const IDS: &[&str] = &[
    "AppQuotaSet",
    "AppQuotaShow",
    "AppSecretDelete",
    "AppSecretSet",
    "AppSecretShow",
    "AppSecretsList",
    "AppSecretsUpdate",
    "AppsAudit",
    "AppsCreate",
    "AppsDelete",
    "AppsList",
    "AppsShow",
    "CatalogAppsDelete",
    "CatalogDigest",
    "CatalogHosts",
    "CatalogMachines",
    "CertificatesAdd",
    "CertificatesAddAcme",
    "CertificatesCheck",
    "CertificatesList",
    "CertificatesRemove",
    "CertificatesShow",
    "CreateVolumeSnapshot",
    "GetOpenApi",
    "MachinesCordon",
    "MachinesCreate",
    "MachinesCreateBatch",
    "MachinesCreateLease",
    "MachinesDelete",
    "MachinesDeleteMetadata",
    "MachinesExec",
    "MachinesList",
    "MachinesListEvents",
    "MachinesListProcesses",
    "MachinesListVersions",
    "MachinesLogs",
    "MachinesPatchMetadata",
    "MachinesPlacement",
    "MachinesReclaimMemory",
    "MachinesReleaseLease",
    "MachinesRestart",
    "MachinesShow",
    "MachinesShowLease",
    "MachinesShowMemory",
    "MachinesShowMetadata",
    "MachinesShowMetadataKey",
    "MachinesSignal",
    "MachinesStart",
    "MachinesStop",
    "MachinesSuspend",
    "MachinesTraffic",
    "MachinesUncordon",
    "MachinesUpdate",
    "MachinesUpdateMemory",
    "MachinesUpdateMetadata",
    "MachinesUpdatePut",
    "MachinesUpsertMetadata",
    "MachinesWait",
    "OrgMachinesList",
    "OrgQuotaSet",
    "OrgQuotaShow",
    "OrgVolumesList",
    "PlatformPlacements",
    "PlatformRegions",
    "VolumesCreate",
    "VolumesDelete",
    "VolumesExtend",
    "VolumesList",
    "VolumesListSnapshots",
    "VolumesShow",
    "VolumesUpdate",
    "VolumesUpdatePost",
];

/// `(method, path, operation)` of every operation of `doc`.
fn operations(doc: &Value) -> Vec<(String, String, &Value)> {
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("path item") {
            out.push((method.clone(), path.clone(), op));
        }
    }
    out
}

#[test]
fn every_ref_resolves_and_the_operation_ids_are_flys() {
    let doc = super::document();
    assert_eq!(doc["openapi"], "3.1.0");
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    let mut stack = vec![&doc];
    let mut refs = 0;
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(o) => {
                if let Some(r) = o.get("$ref").and_then(|r| r.as_str()) {
                    let name = r
                        .strip_prefix("#/components/schemas/")
                        .unwrap_or_else(|| panic!("a $ref outside the schemas: {r}"));
                    assert!(schemas.contains_key(name), "dangling {r}");
                    refs += 1;
                }
                stack.extend(o.values());
            }
            Value::Array(a) => stack.extend(a),
            _ => {}
        }
    }
    assert!(refs > 50, "only {refs} $refs");
    for name in [
        "Machine",
        "MachineConfig",
        "ErrorBody",
        "PlacementRecord",
        "CatalogMachine",
    ] {
        assert!(schemas.contains_key(name), "schema {name} missing");
    }
    let ops = operations(&doc);
    let ids: Vec<&str> = ops
        .iter()
        .map(|(m, p, op)| {
            op["operationId"]
                .as_str()
                .unwrap_or_else(|| panic!("{m} {p} has no operationId"))
        })
        .collect();
    let unique: BTreeSet<&str> = ids.iter().copied().collect();
    assert_eq!(unique.len(), ids.len(), "duplicate operationId: {ids:?}");
    assert_eq!(unique, IDS.iter().copied().collect::<BTreeSet<_>>());
}

#[test]
fn every_operation_has_its_path_parameters_answers_and_errors() {
    let doc = super::document();
    for (m, p, op) in operations(&doc) {
        let names: Vec<&str> = op["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        let in_path: Vec<&str> = p
            .split('/')
            .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
            .collect();
        assert_eq!(&names[..in_path.len()], in_path, "{m} {p}");
        let responses = op["responses"].as_object().unwrap();
        assert!(
            responses.keys().any(|c| c.starts_with('2')),
            "{m} {p}: no success answer"
        );
        if p.starts_with("/v1/") {
            assert_eq!(
                op["responses"]["401"]["content"]["application/json"]["schema"]["$ref"],
                "#/components/schemas/ErrorBody",
                "{m} {p}"
            );
            assert!(op.get("security").is_none(), "{m} {p}");
        } else {
            assert_eq!(op["security"], serde_json::json!([]), "{m} {p}");
        }
    }
    let stop = &doc["paths"]["/v1/apps/{app}/machines/{id}/stop"]["post"];
    let names: Vec<&str> = stop["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["app", "id", "fly-machine-lease-nonce"]);
    assert_eq!(
        stop["requestBody"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/StopRequest"
    );
    let apps = &doc["paths"]["/v1/apps"]["get"];
    assert_eq!(apps["parameters"][0]["name"], "org_slug");
    assert_eq!(
        apps["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/AppList"
    );
    let create = &doc["paths"]["/v1/apps"]["post"];
    assert!(create["responses"]["201"].is_object(), "{create}");
    let lease = &doc["paths"]["/v1/apps/{app}/machines/{id}/lease"]["post"]["responses"];
    assert!(
        lease["200"].is_object() && lease["201"].is_object(),
        "{lease}"
    );
    let logs = &doc["paths"]["/v1/apps/{app}/machines/{id}/logs"]["get"]["responses"];
    assert!(logs["200"]["content"]["application/x-ndjson"].is_object());
    let metadata = &doc["paths"]["/v1/apps/{app}/machines/{id}/metadata"]["put"]["responses"];
    assert!(metadata["204"].is_object(), "{metadata}");
}

/// Every route of the crate is registered through aide's `api_route`, which documents it: a
/// plain axum route (`.route(`, `.nest(`, `route_service`, a plain `Router` merged in) would
/// be served undocumented.
#[test]
fn no_route_is_registered_without_its_documentation() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![src];
    let mut checked = 0;
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") || path.ends_with("openapi/tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for plain in [".route(", ".nest(", ".route_service(", ".nest_service("] {
            assert!(
                !text.contains(plain),
                "{}: `{plain}` registers a route without documenting it; use `api_route`",
                path.display()
            );
        }
        // A plain axum router merged in would bring its routes undocumented.
        assert!(
            text.match_indices("Router::new")
                .all(|(i, _)| text[..i].ends_with("Api")),
            "{}: a plain axum `Router`; build routes with aide's `ApiRouter`",
            path.display()
        );
        checked += 1;
    }
    assert!(checked > 10, "only {checked} files read");
}

/// What the server refuses, the document says (schemathesis finds a "valid" request the
/// server refuses otherwise): a body with required fields is required, app and org names in
/// paths have their pattern, and the org-wide page size its range.
#[test]
fn the_document_is_no_looser_than_the_server() {
    let doc = super::document();
    let body = |path: &str, method: &str| doc["paths"][path][method]["requestBody"].clone();
    assert_eq!(body("/v1/apps/{app}/machines", "post")["required"], true);
    assert_eq!(
        body("/v1/apps", "post")["required"],
        true,
        "app_name or name"
    );
    assert_eq!(
        body("/v1/apps/{app}/certificates", "post")["required"],
        true
    );
    assert_ne!(
        body("/v1/apps/{app}/machines/{id}/stop", "post")["required"],
        true,
        "stop takes no body as {{}}"
    );
    let param = |path: &str, name: &str| {
        doc["paths"][path]["get"]["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{path} has no parameter {name}"))
    };
    let app = param("/v1/apps/{app}/machines", "app");
    assert_eq!(app["schema"]["maxLength"], 63);
    assert!(app["schema"]["pattern"].is_string());
    let org = param("/v1/orgs/{org}/machines", "org");
    assert!(org["schema"]["pattern"].is_string());
    let limit = param("/v1/orgs/{org}/machines", "limit");
    let limit = serde_json::to_string(&limit).unwrap();
    assert!(limit.contains("\"maximum\":500"), "{limit}");
}

/// Every change on the Machines API can be refused to a token without the operation
/// (403), every body can be too large (413), and the document names its server.
#[test]
fn every_change_lists_403_and_every_body_413() {
    let doc = super::document();
    assert_eq!(doc["servers"][0]["url"], "/");
    for (method, path, op) in operations(&doc) {
        let has = |code: &str| op["responses"].get(code).is_some();
        if path.starts_with("/v1/apps") && method != "get" {
            assert!(has("403"), "{method} {path} does not list 403");
        }
        if op.get("requestBody").is_some() {
            assert!(has("413"), "{method} {path} does not list 413");
            assert_eq!(
                op["responses"]["413"]["content"]["application/json"]["schema"]["$ref"],
                "#/components/schemas/ErrorBody",
                "{method} {path}"
            );
        }
    }
}

/// A machine config's schemas are as closed as the server (issue 32 items 4 and 9): no key
/// beyond Fly's and bazaar's, Fly's unused keys default-only, durations, names, guest sizes
/// and integer widths with the ranges the server takes.
#[test]
fn the_machine_config_and_its_parts_are_as_strict_as_the_server() {
    let doc = super::document();
    let schemas = &doc["components"]["schemas"];
    for name in [
        "MachineConfig",
        "Guest",
        "InitConfig",
        "MachineService",
        "MachinePort",
        "CheckConfig",
        "FileConfig",
        "RestartConfig",
        "StopConfig",
        "Concurrency",
        "MetricsConfig",
    ] {
        assert_eq!(schemas[name]["additionalProperties"], false, "{name}");
    }
    let config = &schemas["MachineConfig"]["properties"];
    let default_only = &config["containers"]["anyOf"];
    assert!(
        default_only
            .as_array()
            .is_some_and(|a| a.contains(&serde_json::json!({"const": ""}))),
        "{default_only}"
    );
    assert!(
        !default_only.to_string().contains("\"type\":\"string\""),
        "{default_only}"
    );
    assert!(schemas["InitConfig"]["properties"]["tty"]["anyOf"].is_array());
    assert_eq!(config["rootfs"]["properties"]["size_gb"]["maximum"], 1024);
    assert_eq!(config["mounts"]["items"]["additionalProperties"], false);
    assert!(schemas["GoDuration"]["oneOf"][0]["pattern"].is_string());
    assert!(schemas["Guest"]["anyOf"]
        .as_array()
        .is_some_and(|a| a.len() == 10));
    assert_eq!(schemas["MetricsConfig"]["properties"]["port"]["minimum"], 1);
    assert_eq!(
        schemas["RestartConfig"]["properties"]["max_retries"]["maximum"],
        u32::MAX
    );
    let volume = &schemas["CreateVolumeRequest"];
    assert_eq!(volume["properties"]["name"]["maxLength"], 30);
    assert_eq!(volume["required"], serde_json::json!(["name"]));
    let secret = doc["paths"]["/v1/apps/{app}/secrets/{name}"]["get"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "name")
        .cloned()
        .unwrap();
    assert!(secret["schema"]["pattern"].is_string(), "{secret}");
    assert!(config["standbys"]["items"]["pattern"].is_string());
    assert!(schemas["AddCertificateRequest"]["properties"]["hostname"]["pattern"].is_string());
    assert_eq!(
        schemas["UpdateSecretsRequest"]["properties"]["values"]["minProperties"],
        1
    );
    assert!(schemas["PlacementsRequest"]["properties"]["region"]["pattern"].is_string());
    let cursor = doc["paths"]["/v1/orgs/{org}/machines"]["get"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "cursor")
        .cloned()
        .unwrap();
    assert!(cursor.to_string().contains("pattern"), "{cursor}");
    let extend = &schemas["ExtendVolumeRequest"];
    assert_eq!(extend["required"], serde_json::json!(["size_gb"]));
    assert_eq!(
        extend["properties"]["size_gb"]["type"], "integer",
        "{extend}"
    );
    assert_eq!(extend["properties"]["size_gb"]["maximum"], 500, "{extend}");
}
