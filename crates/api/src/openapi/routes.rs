//! The route table: one row per route and method the API serves, with its parameters,
//! bodies and error codes.

use super::*;

const M: &str = "/v1/apps/{app}/machines/{id}";

/// Errors of every call forwarded to a machine's owner.
const FWD: &[u16] = &[401, 404, 503];
/// Errors of a forwarded call that changes a machine.
const FWD_CHANGE: &[u16] = &[400, 401, 404, 409, 412, 503];

/// Every route and method of the Machines API.
pub(super) fn operations() -> Vec<Op> {
    use Content::Json;
    use Param::{Nonce, Query};
    use Ty::{Bool, Int, Str};
    const OK: &[(u16, &str, Content)] = &[(200, "Done.", Json(schema::<wire::OkResponse>))];
    const NO_CONTENT: &[(u16, &str, Content)] = &[(204, "Done.", Content::None)];
    vec![
        Op {
            auth: false,
            ..Op::new(
                "GET",
                "/openapi.json",
                "GetOpenApi",
                "meta",
                "This OpenAPI document (no token needed).",
                &[(200, "The document.", Json(any_object))],
                &[],
            )
        },
        // Apps.
        Op::new(
            "GET",
            "/v1/apps",
            "AppsList",
            "apps",
            "List apps.",
            &[(200, "The apps.", Json(schema::<wire::AppList>))],
            &[401, 503],
        )
        .params(&[Query(
            "org_slug",
            Str,
            "Only apps of this organization.",
        )]),
        Op::new(
            "POST",
            "/v1/apps",
            "AppsCreate",
            "apps",
            "Create an app. The name is unique in the cluster.",
            &[(201, "Created.", Json(schema::<wire::App>))],
            &[400, 401, 422, 503],
        )
        .body(schema::<wire::CreateAppRequest>),
        Op::new(
            "GET",
            "/v1/apps/{app}",
            "AppsShow",
            "apps",
            "Get an app.",
            &[(200, "The app.", Json(schema::<wire::App>))],
            &[401, 404, 503],
        ),
        Op::new(
            "DELETE",
            "/v1/apps/{app}",
            "AppsDelete",
            "apps",
            "Delete an app: destroys its machines at once, then the app. If a machine cannot \
             be destroyed (leased by someone else, host unreachable), the app stays: 409 names it.",
            &[(202, "Accepted.", Json(schema::<wire::StatusResponse>))],
            &[401, 404, 409, 503],
        ),
        // Machines.
        Op::new(
            "GET",
            "/v1/apps/{app}/machines",
            "MachinesList",
            "machines",
            "List an app's machines (from the catalog; each one's full object from its owner \
             unless `summary=true`). Also filters by metadata: `metadata.KEY=VALUE`.",
            &[(200, "The machines.", Json(machine_list))],
            &[401, 404, 503],
        )
        .params(&[
            Query("region", Str, "Only machines in this region."),
            Query(
                "state",
                Str,
                "Only machines in these states (comma-separated).",
            ),
            Query("include_deleted", Bool, "Include destroyed machines."),
            Query(
                "summary",
                Bool,
                "Leave out config, checks, events, host_status and nonce.",
            ),
            Query(
                "include_leases",
                Bool,
                "Show each machine's lease (without its nonce).",
            ),
        ]),
        Op::new(
            "POST",
            "/v1/apps/{app}/machines",
            "MachinesCreate",
            "machines",
            "Create a machine, placed by the market.",
            &[(200, "The new machine.", Json(schema::<Machine>))],
            &[400, 401, 404, 409, 413, 503],
        )
        .body(schema::<wire::CreateMachineRequest>),
        Op::new(
            "POST",
            "/v1/apps/{app}/machines/batch",
            "MachinesCreateBatch",
            "machines",
            "bazaar extension: create `count` machines of one config, placed in one round.",
            &[(
                200,
                "The machines created (maybe fewer than asked).",
                Json(schema::<wire::BatchCreateResponse>),
            )],
            &[400, 401, 404, 409, 413, 503],
        )
        .body(schema::<wire::BatchCreateRequest>),
        Op::new(
            "GET",
            M,
            "MachinesShow",
            "machines",
            "Get a machine (from the catalog, with `host_status: unreachable`, while its host is down).",
            &[(200, "The machine.", Json(schema::<Machine>))],
            FWD,
        )
        .params(&[Query(
            "include_leases",
            Bool,
            "Show the machine's lease (without its nonce).",
        )]),
        Op::new(
            "POST",
            M,
            "MachinesUpdate",
            "machines",
            "Update a machine's config (a new version). `name` renames it, `lease_ttl` takes or \
             refreshes a lease (its nonce is answered), `skip_service_registration` cordons it; \
             `region` must be its own (a machine does not move: 400).",
            &[(200, "The updated machine.", Json(schema::<Machine>))],
            FWD_CHANGE,
        )
        .params(&[Nonce])
        .body(schema::<UpdateRequest>),
        Op::new(
            "PUT",
            M,
            "MachinesUpdatePut",
            "machines",
            "Same as `POST` (update).",
            &[(200, "The updated machine.", Json(schema::<Machine>))],
            FWD_CHANGE,
        )
        .params(&[Nonce])
        .body(schema::<UpdateRequest>),
        Op::new(
            "DELETE",
            M,
            "MachinesDelete",
            "machines",
            "Destroy a machine (it must be stopped unless `force`).",
            OK,
            FWD_CHANGE,
        )
        .params(&[
            Query("force", Bool, "Kill the machine if it runs."),
            Query("kill", Bool, "Same as `force`."),
            Nonce,
        ]),
        Op::new(
            "POST",
            "/v1/apps/{app}/machines/{id}/start",
            "MachinesStart",
            "machines",
            "Start a machine.",
            &[(200, "Started.", Json(schema::<wire::StartResponse>))],
            FWD_CHANGE,
        )
        .params(&[Nonce]),
        Op::new(
            "POST",
            "/v1/apps/{app}/machines/{id}/stop",
            "MachinesStop",
            "machines",
            "Stop a machine: its stop signal, then SIGKILL after the timeout.",
            OK,
            FWD_CHANGE,
        )
        .params(&[Nonce])
        .body(schema::<StopRequest>),
        Op::new(
            "POST",
            "/v1/apps/{app}/machines/{id}/restart",
            "MachinesRestart",
            "machines",
            "Restart a machine (the signal and timeout may also be given in the query).",
            OK,
            FWD_CHANGE,
        )
        .params(&[
            Query(
                "timeout",
                Str,
                "How long to wait before SIGKILL (Go duration or seconds).",
            ),
            Query("signal", Str, "The stop signal (name or number)."),
            Nonce,
        ])
        .body(schema::<StopRequest>),
        Op::new(
            "POST",
            "/v1/apps/{app}/machines/{id}/signal",
            "MachinesSignal",
            "machines",
            "Send a signal to a machine's process.",
            OK,
            FWD_CHANGE,
        )
        .params(&[Nonce])
        .body(schema::<SignalRequest>),
        Op::new(
            "POST",
            "/v1/apps/{app}/machines/{id}/suspend",
            "MachinesSuspend",
            "machines",
            "Suspend a machine (its processes are frozen).",
            OK,
            FWD_CHANGE,
        )
        .params(&[Nonce]),
        Op::new(
            "GET",
            "/v1/apps/{app}/machines/{id}/wait",
            "MachinesWait",
            "machines",
            "Wait until a machine is in one of the given states (default `started`).",
            &[(200, "The machine reached a state asked for.", Json(schema::<WaitResponse>))],
            &[400, 401, 404, 408, 503],
        )
        .params(&[
            Query(
                "state",
                Str,
                "States to wait for: repeated or comma-separated; `settled` means any resting state.",
            ),
            Query(
                "timeout",
                Str,
                "Seconds or a Go duration (default and maximum 60 s).",
            ),
            Query("instance_id", Str, "Wait for this version."),
            Query("version", Str, "Same as `instance_id`."),
            Query(
                "from_event_id",
                Str,
                "Wait for the state to be reached by an event after this one (an event id); \
                 the answer's `event_id` is the event that satisfied the wait.",
            ),
        ]),
        Op::new(
            "GET",
            "/v1/apps/{app}/machines/{id}/lease",
            "MachinesShowLease",
            "leases",
            "Get the lease held on a machine (without its nonce).",
            &[(200, "The lease.", Json(schema::<wire::LeaseInfoResponse>))],
            FWD,
        ),
        Op::new(
            "POST",
            "/v1/apps/{app}/machines/{id}/lease",
            "MachinesCreateLease",
            "leases",
            "Take a lease on a machine, or renew the one whose nonce is given.",
            &[
                (201, "A new lease.", Json(schema::<wire::LeaseResponse>)),
                (200, "The lease, renewed.", Json(schema::<wire::LeaseResponse>)),
            ],
            FWD_CHANGE,
        )
        .params(&[
            Query("ttl", Int, "Seconds (default 30); the body's `ttl` wins."),
            Nonce,
        ])
        .body(schema::<LeaseRequest>),
        Op::new(
            "DELETE",
            "/v1/apps/{app}/machines/{id}/lease",
            "MachinesReleaseLease",
            "leases",
            "Release the lease (its nonce is required).",
            &[(200, "Released.", Json(schema::<wire::StatusResponse>))],
            FWD_CHANGE,
        )
        .params(&[Nonce]),
        Op::new(
            "POST",
            "/v1/apps/{app}/machines/{id}/cordon",
            "MachinesCordon",
            "machines",
            "Take a machine out of its services' rotation.",
            OK,
            FWD_CHANGE,
        )
        .params(&[Nonce]),
        Op::new(
            "POST",
            "/v1/apps/{app}/machines/{id}/uncordon",
            "MachinesUncordon",
            "machines",
            "Put a machine back into its services' rotation.",
            OK,
            FWD_CHANGE,
        )
        .params(&[Nonce]),
        Op::new(
            "GET",
            "/v1/apps/{app}/machines/{id}/metadata",
            "MachinesShowMetadata",
            "metadata",
            "A machine's metadata.",
            &[(200, "The metadata.", Json(schema::<BTreeMap<String, String>>))],
            FWD,
        ),
        Op::new(
            "PUT",
            "/v1/apps/{app}/machines/{id}/metadata",
            "MachinesUpdateMetadata",
            "metadata",
            "Set and remove several metadata keys at once.",
            NO_CONTENT,
            FWD_CHANGE,
        )
        .params(&[Nonce])
        .body(schema::<MetadataUpdate>),
        Op::new(
            "PATCH",
            "/v1/apps/{app}/machines/{id}/metadata",
            "MachinesPatchMetadata",
            "metadata",
            "Same as `PUT`.",
            NO_CONTENT,
            FWD_CHANGE,
        )
        .params(&[Nonce])
        .body(schema::<MetadataUpdate>),
        Op::new(
            "GET",
            "/v1/apps/{app}/machines/{id}/metadata/{key}",
            "MachinesShowMetadataKey",
            "metadata",
            "One metadata value.",
            &[(200, "The value.", Json(schema::<wire::MetadataValue>))],
            FWD,
        ),
        Op::new(
            "POST",
            "/v1/apps/{app}/machines/{id}/metadata/{key}",
            "MachinesUpsertMetadata",
            "metadata",
            "Set one metadata key.",
            NO_CONTENT,
            FWD_CHANGE,
        )
        .params(&[Nonce])
        .body(schema::<wire::MetadataValue>),
        Op::new(
            "DELETE",
            "/v1/apps/{app}/machines/{id}/metadata/{key}",
            "MachinesDeleteMetadata",
            "metadata",
            "Remove one metadata key.",
            NO_CONTENT,
            FWD_CHANGE,
        )
        .params(&[Nonce]),
        Op::new(
            "GET",
            "/v1/apps/{app}/machines/{id}/events",
            "MachinesListEvents",
            "machines",
            "A machine's events, newest first.",
            &[(200, "The events.", Json(schema::<Vec<MachineEvent>>))],
            FWD,
        )
        .params(&[Query("limit", Int, "At most this many (default 20, 1 to 50).")]),
        Op::new(
            "GET",
            "/v1/apps/{app}/machines/{id}/versions",
            "MachinesListVersions",
            "machines",
            "A machine's config versions.",
            &[(200, "The versions.", Json(schema::<Vec<wire::MachineVersion>>))],
            FWD,
        ),
        Op::new(
            "POST",
            "/v1/apps/{app}/machines/{id}/exec",
            "MachinesExec",
            "machines",
            "Run a command in a running machine and wait for it.",
            &[(200, "The command ran.", Json(schema::<ExecResponse>))],
            FWD_CHANGE,
        )
        .body(schema::<ExecRequest>),
        Op::new(
            "GET",
            "/v1/apps/{app}/machines/{id}/ps",
            "MachinesListProcesses",
            "machines",
            "The processes of a started machine (its workload and every descendant), read \
             from `/proc` on its host; 409 when it is not started.",
            &[(200, "The processes.", Json(schema::<Vec<ProcessStat>>))],
            &[400, 401, 404, 409, 503],
        )
        .params(&[
            Query(
                "sort_by",
                Str,
                "pid (default), stime, rtime, cpu, rss or command.",
            ),
            Query("order", Str, "asc (default) or desc."),
        ]),
        Op::new(
            "GET",
            "/v1/apps/{app}/machines/{id}/logs",
            "MachinesLogs",
            "machines",
            "bazaar extension: the machine's output as JSON lines; with `follow=true`, a stream.",
            &[(200, "The log lines.", Content::Ndjson)],
            &[400, 401, 404, 503],
        )
        .params(&[
            Query(
                "max_bytes",
                Int,
                "The last this many bytes (default 64 KiB, at most 8 MiB).",
            ),
            Query("follow", Bool, "Keep streaming new lines."),
        ]),
        Op::new(
            "GET",
            "/v1/apps/{app}/machines/{id}/placement",
            "MachinesPlacement",
            "machines",
            "bazaar extension: how the market placed the machine.",
            &[(200, "The placement record.", Json(schema::<wire::PlacementRecord>))],
            FWD,
        ),
        Op::new(
            "GET",
            "/v1/apps/{app}/machines/{id}/traffic",
            "MachinesTraffic",
            "machines",
            "bazaar extension: the requests and connections the machine is serving right now \
             (counted by its host's proxy, through which every proxy reaches it); deploys wait \
             for a cordoned machine's `in_flight` to reach 0 before stopping it.",
            &[(200, "The machine's traffic.", Json(schema::<wire::MachineTraffic>))],
            FWD,
        ),
        // Volumes.
        Op::new(
            "GET",
            "/v1/apps/{app}/volumes",
            "VolumesList",
            "volumes",
            "List an app's volumes (from the cluster catalog).",
            &[(200, "The volumes.", Json(schema::<Vec<Volume>>))],
            &[401, 404, 503],
        ),
        Op::new(
            "POST",
            "/v1/apps/{app}/volumes",
            "VolumesCreate",
            "volumes",
            "Create a volume: host-local storage placed by the market (disk, \
             `require_unique_zone`, the `compute` hint). With `snapshot_id` it restores a \
             snapshot, with `source_volume_id` it forks a volume (a copy taken now); both are \
             made on the host that holds the source, at least the source's size \
             (`require_unique_zone` defaults to false for them). `encrypted: true` is refused: \
             volumes are not encrypted.",
            &[(200, "The volume.", Json(schema::<Volume>))],
            &[400, 401, 404, 409, 503],
        )
        .body(schema::<CreateVolumeRequest>),
        Op::new(
            "GET",
            "/v1/apps/{app}/volumes/{id}",
            "VolumesShow",
            "volumes",
            "Get a volume (from its host; from the catalog while the host is down).",
            &[(200, "The volume.", Json(schema::<Volume>))],
            &[401, 404, 503],
        ),
        Op::new(
            "PUT",
            "/v1/apps/{app}/volumes/{id}",
            "VolumesUpdate",
            "volumes",
            "Change a volume's snapshot retention or automatic backups.",
            &[(200, "The volume.", Json(schema::<Volume>))],
            &[400, 401, 404, 503],
        )
        .body(schema::<UpdateVolumeRequest>),
        Op::new(
            "POST",
            "/v1/apps/{app}/volumes/{id}",
            "VolumesUpdatePost",
            "volumes",
            "Same as `PUT` (Fly's method).",
            &[(200, "The volume.", Json(schema::<Volume>))],
            &[400, 401, 404, 503],
        )
        .body(schema::<UpdateVolumeRequest>),
        Op::new(
            "GET",
            "/v1/apps/{app}/volumes/{id}/snapshots",
            "VolumesListSnapshots",
            "volumes",
            "A volume's snapshots, oldest first (kept on its host for `snapshot_retention` days).",
            &[(200, "The snapshots.", Json(schema::<Vec<VolumeSnapshot>>))],
            &[401, 404, 503],
        ),
        Op::new(
            "POST",
            "/v1/apps/{app}/volumes/{id}/snapshots",
            "CreateVolumeSnapshot",
            "volumes",
            "Take a snapshot now: a consistent copy of the volume (its file system is frozen \
             while it is copied; writers wait), kept on the volume's host.",
            &[(200, "The snapshot.", Json(schema::<VolumeSnapshot>))],
            &[400, 401, 404, 409, 503],
        ),
        Op::new(
            "PUT",
            "/v1/apps/{app}/volumes/{id}/extend",
            "VolumesExtend",
            "volumes",
            "Grow a volume (online; shrinking is refused).",
            &[(200, "The volume.", Json(schema::<ExtendVolumeResponse>))],
            &[400, 401, 404, 409, 503],
        )
        .body(schema::<ExtendVolumeRequest>),
        Op::new(
            "DELETE",
            "/v1/apps/{app}/volumes/{id}",
            "VolumesDelete",
            "volumes",
            "Delete a volume and its data; refused (412) while a machine mounts it.",
            &[(200, "The deleted volume.", Json(schema::<Volume>))],
            &[401, 404, 409, 412, 503],
        ),
        // Audit.
        Op::new(
            "GET",
            "/v1/apps/{app}/audit",
            "AppsAudit",
            "apps",
            "bazaar extension: every change made to the app through the Machines API (who: \
             the token's id; what; when; from where; the answer's status), gathered from the \
             audit record of every host. Org tokens and tokens of this app.",
            &[(200, "The record.", Json(schema::<wire::AuditList>))],
            &[400, 401, 404, 503],
        ),
        // Secrets.
        Op::new(
            "GET",
            "/v1/apps/{app}/secrets",
            "AppSecretsList",
            "secrets",
            "The app's secrets: names, digests and times, never values.",
            &[(200, "The secrets.", Json(schema::<wire::AppSecrets>))],
            &[401, 404, 503],
        ),
        Op::new(
            "POST",
            "/v1/apps/{app}/secrets",
            "AppSecretsUpdate",
            "secrets",
            "Set (a string) and unset (null) secrets, all or nothing. Sealed with the cluster's \
             key and given to the app's machines as environment variables at their next start \
             (a secret wins over `config.env`); `bazaar secrets set` restarts them. Names: \
             environment variable syntax, not FLY_* or BAZAAR_*; values: at most 64 KiB. \
             Needs the `secrets` operation on the app.",
            &[(200, "The app's secrets.", Json(schema::<wire::AppSecrets>))],
            &[400, 401, 403, 404, 503],
        )
        .body(schema::<wire::UpdateAppSecretsRequest>),
        Op::new(
            "GET",
            "/v1/apps/{app}/secrets/{name}",
            "AppSecretShow",
            "secrets",
            "One secret: its name, digest and times, never its value.",
            &[(200, "The secret.", Json(schema::<wire::AppSecret>))],
            &[401, 404, 503],
        ),
        Op::new(
            "POST",
            "/v1/apps/{app}/secrets/{name}",
            "AppSecretSet",
            "secrets",
            "Set one secret.",
            &[(201, "The secret.", Json(schema::<wire::AppSecret>))],
            &[400, 401, 403, 404, 503],
        )
        .body(schema::<wire::SetAppSecretRequest>),
        Op::new(
            "DELETE",
            "/v1/apps/{app}/secrets/{name}",
            "AppSecretDelete",
            "secrets",
            "Unset a secret (machines lose it at their next start).",
            &[(200, "Done.", Json(schema::<wire::EmptyResponse>))],
            &[400, 401, 403, 404, 503],
        ),
        // Certificates.
        Op::new(
            "GET",
            "/v1/apps/{app}/certificates",
            "CertificatesList",
            "certificates",
            "bazaar extension: the TLS certificates of the app's hostnames, served by every \
             host's proxy (SNI) and routed to the app.",
            &[(200, "The certificates.", Json(schema::<Vec<wire::Certificate>>))],
            &[400, 401, 404, 503],
        ),
        Op::new(
            "POST",
            "/v1/apps/{app}/certificates",
            "CertificatesAdd",
            "certificates",
            "bazaar extension: attach a hostname to the app. Without `cert`/`key` its \
             certificate is issued by ACME (HTTP-01, answered by every proxy) in the \
             background: `pending`, then `issued` or `failed` with the ACME error. With them \
             (PEM) it is checked (the key matches, the certificate names the hostname) and \
             served at once. The host that handles the call owns and renews it.",
            &[(201, "Attached.", Json(schema::<wire::Certificate>))],
            &[400, 401, 404, 409, 503],
        )
        .body(schema::<wire::AddCertificateRequest>),
        Op::new(
            "GET",
            "/v1/apps/{app}/certificates/{hostname}",
            "CertificatesShow",
            "certificates",
            "bazaar extension: one hostname's certificate and its status.",
            &[(200, "The certificate.", Json(schema::<wire::Certificate>))],
            &[400, 401, 404, 503],
        ),
        Op::new(
            "DELETE",
            "/v1/apps/{app}/certificates/{hostname}",
            "CertificatesRemove",
            "certificates",
            "bazaar extension: detach a hostname; every proxy stops serving it.",
            OK,
            &[400, 401, 404, 503],
        ),
        // Platform.
        Op::new(
            "GET",
            "/v1/platform/regions",
            "PlatformRegions",
            "platform",
            "The regions of the cluster's hosts.",
            &[(200, "The regions.", Json(schema::<wire::RegionList>))],
            &[401, 503],
        ),
        Op::new(
            "POST",
            "/v1/platform/placements",
            "PlatformPlacements",
            "platform",
            "Where machines of a size would go: the market is asked for real and every \
             reservation released.",
            &[(200, "The dry run's outcome.", Json(schema::<wire::PlacementsResponse>))],
            &[400, 401, 409, 503],
        )
        .body(schema::<wire::PlacementsRequest>),
        // Catalog.
        Op::new(
            "GET",
            "/v1/catalog/hosts",
            "CatalogHosts",
            "catalog",
            "bazaar extension: the hosts this node's catalog knows. Cluster secret only (operators, other nodes).",
            &[(200, "The hosts.", Json(schema::<Vec<wire::CatalogHost>>))],
            &[401, 403, 500],
        ),
        Op::new(
            "GET",
            "/v1/catalog/machines",
            "CatalogMachines",
            "catalog",
            "bazaar extension: the machines this node's catalog knows. Cluster secret only (operators, other nodes).",
            &[(200, "The machines.", Json(schema::<Vec<wire::CatalogMachine>>))],
            &[401, 403, 500],
        )
        .params(&[
            Query("app", Str, "Only machines of this app."),
            Query("region", Str, "Only machines in this region."),
            Query("state", Str, "Only machines in these states (comma-separated)."),
            Query("include_deleted", Bool, "Include tombstones."),
        ]),
        Op::new(
            "GET",
            "/v1/catalog/digest",
            "CatalogDigest",
            "catalog",
            "bazaar extension: a digest of this node's catalog (equal digests, same rows). Cluster secret only (operators, other nodes).",
            &[(200, "The digest.", Json(schema::<wire::CatalogDigest>))],
            &[401, 403, 500],
        ),
    ]
}
