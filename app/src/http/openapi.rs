//! The API's OpenAPI 3.1 description, served at `GET /openapi.json`.
//!
//! It is generated, not written: utoipa reads each handler's `#[utoipa::path]` annotation and
//! the types it takes and answers with (`CreatePayment`, `PaymentView`, …, each deriving
//! `utoipa::ToSchema`), and utoipa-axum's `routes!` registers a handler with the router and the
//! description in the same call, so a route cannot be served undocumented by accident. What an
//! annotation cannot say is added by [`finish`]: every problem type of [`problem::TYPES`] as a
//! schema, and the problem responses' content and headers.
//!
//! # Adding a route
//!
//! 1. Annotate its handler with `#[utoipa::path(...)]`: method, path, `tag`, `security` (the
//!    [`API_KEY`] scheme for customers' routes), `params`, `request_body`, its success responses
//!    (with their `headers(...)`), and its problems as a type declared with [`problems!`], which
//!    lists the problem types the handler can answer with (the edge's refusals are added to every
//!    operation: see [`EDGE`]). An idempotent operation does not describe its `Idempotency-Key`
//!    nor the `Idempotent-Replayed` header of its answers: [`finish`] adds both to every operation
//!    of the registry (`crate::operations::Op`), so they are said once, and the same everywhere.
//! 2. Register it in its module's `router()` with `.routes(routes!(handler))` (utoipa-axum's
//!    [`OpenApiRouter`]), and merge that router in [`crate::http::api`]: the one list of the
//!    API's routers. Registering it there is what routes it *and* documents it.
//!
//! Types in the answer derive `utoipa::ToSchema`; a documented header is taken to be sent on
//! every response of its status, unless it is listed in [`SOMETIMES`]. The conformance test
//! (`app/tests/api/openapi.rs`) drives real responses and checks each against this description,
//! so a handler whose answer drifts from its annotation fails it.
//!
//! What is not described: the HTML pages (`/`, `/shop/…`, `/admin/…`, `/assets/…`), which a
//! person reads, the benchmark-only `POST /bench/payments`, and the claim-strategy lab's
//! `POST /lab/{strategy}/v1/payments` (`http::lab`): it is served only in lab mode
//! (`PAYONCE_LAB=1`), never to real clients, and its contract is `POST /v1/payments`'s. The
//! conformance test's server is not in lab mode, so "every route served is described" holds
//! without it; `lock-service-unavailable`, which the lab's redis strategy answers, is described on
//! `POST /v1/payments`, which runs under that strategy when `PAYONCE_CLAIM_STRATEGY=redis`. `GET /metrics`, `GET /healthz` and
//! `GET /readyz` are: they are served on the API's port to anyone, so a client (or a fuzzer) can
//! reach them, and what they answer is part of the contract an orchestrator relies on.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Extension;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use utoipa::openapi::RefOr;
use utoipa::openapi::response::{Response as ApiResponse, ResponseBuilder};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi, PartialSchema};
use utoipa_axum::router::OpenApiRouter;

use crate::idempotency::Busy;
use crate::operations::Op;
use crate::problem::FieldError;
use crate::problem::{self, ProblemType};
use crate::state::AppState;

/// The name of the security scheme of customers' routes: `Authorization: Bearer po_…`.
pub const API_KEY: &str = "api_key";

/// What every route may answer before (or around) its handler: a NUL in the URL (400,
/// `http::edge::refuse`), a body declared over 1 MiB (413), a `Content-Encoding` (415), a panic
/// (500). [`problems!`] adds them to every operation.
pub const EDGE: [ProblemType; 4] =
    [problem::INVALID_REQUEST, problem::PAYLOAD_TOO_LARGE, problem::UNSUPPORTED_CONTENT_ENCODING, problem::INTERNAL];

/// Documented response headers that are not on every response of their status.
pub const SOMETIMES: [&str; 1] = [REPLAYED];

const REPLAYED: &str = "Idempotent-Replayed";

/// Exactly what the parser (`idempotency::key`) accepts: an sf-string, or a bare token without
/// space, `"`, `,`, `;` or `\`; 1 to 255 characters once decoded; spaces around are not part of
/// the value.
const KEY_PATTERN: &str = r#"^[ \t]*(?:[!#-+\x2D-:<-\[\]-~]{1,255}|"(?:[ !#-\[\]-~]|\\["\\]){1,255}")[ \t]*$"#;

/// The description's fixed parts; the paths come from the routers (see [`crate::http::api`]).
#[derive(OpenApi)]
#[openapi(
    info(
        title = "payonce",
        description = "A payments API that charges each payment exactly once: send `POST /v1/payments` with an \
                       `Idempotency-Key`, retry it as often as needed, and every retry gets the first answer. \
                       Errors are RFC 9457 problem documents (`application/problem+json`) with a stable `type`; \
                       docs/errors.md lists each with what to do about it.",
        license(name = "MIT OR Apache-2.0"),
    ),
    tags(
        (name = "payments", description = "Payments, created once per Idempotency-Key."),
        (name = "refunds", description = "Refunds of succeeded payments, created once per Idempotency-Key."),
        (name = "webhooks", description = "Stripe's events in, verified by their signature."),
        (name = "operations", description = "Probes, metrics and this description."),
    ),
    modifiers(&Security),
)]
pub struct ApiDoc;

struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let mut bearer = Http::new(HttpAuthScheme::Bearer);
        bearer.description = Some(
            "A customer's API key, `po_<16 hex digits>_<64 hex digits>`, created with `payonce customers create NAME` \
             and shown once: `Authorization: Bearer po_…`."
                .into(),
        );
        components.add_security_scheme(API_KEY, SecurityScheme::Http(bearer));
    }
}

/// The router the API's routers are merged into: it starts the description with [`ApiDoc`].
pub fn base() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
}

/// The finished description, as served.
#[derive(Clone)]
pub struct Spec(pub Arc<Value>);

impl Spec {
    /// Finishes what the routers collected (see [`finish`]).
    pub fn new(openapi: utoipa::openapi::OpenApi) -> Self {
        let mut doc = serde_json::to_value(openapi).expect("an OpenAPI description always serialises");
        finish(&mut doc);
        Self(Arc::new(doc))
    }
}

/// `GET /openapi.json`.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "operations",
    responses(
        (status = 200, description = "This description (OpenAPI 3.1).", body = Object, content_type = "application/json"),
        NoProblems,
    )
)]
pub async fn serve(Extension(spec): Extension<Spec>) -> Response {
    let mut response = axum::Json(spec.0.as_ref()).into_response();
    // The description changes only with a new build.
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// The problem responses of an operation: the given problem types, and the [`EDGE`]'s, grouped
/// by status. [`finish`] turns each group into its `application/problem+json` content.
pub fn problem_responses(types: &[ProblemType]) -> BTreeMap<String, RefOr<ApiResponse>> {
    let mut by_status: BTreeMap<u16, Vec<ProblemType>> = BTreeMap::new();
    for problem in types.iter().chain(EDGE.iter()) {
        let group = by_status.entry(problem.status.as_u16()).or_default();
        if !group.contains(problem) {
            group.push(*problem);
        }
    }
    by_status
        .into_iter()
        .map(|(status, group)| {
            let description =
                group.iter().map(|p| format!("`{}`: {}", p.slug, p.when)).collect::<Vec<_>>().join("\n\n");
            let mut response = ResponseBuilder::new().description(description).build();
            let slugs: Vec<Value> = group.iter().map(|p| Value::from(p.slug)).collect();
            response.extensions = Some([(PROBLEMS_MARK, Value::from(slugs))].into_iter().collect());
            (status.to_string(), RefOr::T(response))
        })
        .collect()
}

/// What every idempotent operation can answer besides its own problems: the API key, the
/// `Idempotency-Key` and its state (in flight, reused), the body's media type and time, the
/// gateway's and the database's unavailability. `problems!(…: idempotent, …)` adds them.
pub const IDEMPOTENT: [ProblemType; 10] = [
    problem::UNAUTHORIZED,
    problem::IDEMPOTENCY_KEY_MISSING,
    problem::IDEMPOTENCY_KEY_INVALID,
    problem::UNSUPPORTED_MEDIA_TYPE,
    problem::REQUEST_TIMEOUT,
    problem::IDEMPOTENCY_KEY_IN_USE,
    problem::IDEMPOTENCY_KEY_REUSED,
    problem::GATEWAY_UNAVAILABLE,
    problem::GATEWAY_REFUSED,
    problem::SERVICE_UNAVAILABLE,
];

/// Declares the problems an operation answers with, for its `responses(...)`:
/// `problems!(ReadProblems: UNAUTHORIZED, NOT_FOUND, …)` names constants of [`problem`];
/// `problems!(CreateProblems: idempotent, CARD_DECLINED, …)` adds the [`IDEMPOTENT`] ones; the
/// [`EDGE`]'s are added to all.
macro_rules! problems {
    ($(#[$doc:meta])* $name:ident: idempotent $(, $ty:ident)* $(,)?) => {
        $crate::http::openapi::problems!(@declare $(#[$doc])* $name,
            [&$crate::http::openapi::IDEMPOTENT[..], &[$($crate::problem::$ty),*]].concat());
    };
    ($(#[$doc:meta])* $name:ident $(: $($ty:ident),+)? $(,)?) => {
        $crate::http::openapi::problems!(@declare $(#[$doc])* $name, [$($($crate::problem::$ty),+)?]);
    };
    (@declare $(#[$doc:meta])* $name:ident, $types:expr) => {
        $(#[$doc])*
        pub struct $name;

        impl utoipa::IntoResponses for $name {
            fn responses() -> std::collections::BTreeMap<String, utoipa::openapi::RefOr<utoipa::openapi::response::Response>> {
                $crate::http::openapi::problem_responses(&$types)
            }
        }
    };
}
pub(crate) use problems;

problems!(
    /// An operation that answers only the edge's problems.
    NoProblems
);

/// Marks a response [`problem_responses`] made; [`finish`] replaces it by the content.
const PROBLEMS_MARK: &str = "x-payonce-problems";

/// What annotations cannot say, added to the serialised description:
/// - on every operation of the registry ([`Op`]), the `Idempotency-Key` it takes and the
///   `Idempotent-Replayed` header of its answers ([`describe_keys`]): said once, for all of them;
/// - a schema per problem type (`CardDeclinedProblem`, …) on a common `Problem`, each with the
///   extension members it carries and no others;
/// - each problem response's content (`application/problem+json`, one of its types' schemas)
///   and headers (`Retry-After`, `WWW-Authenticate`, …), required when every type of the status
///   sends them;
/// - `required: true` on every other documented response header not in [`SOMETIMES`] (utoipa's
///   header object has no `required`; OpenAPI's does).
pub fn finish(doc: &mut Value) {
    let schemas =
        doc.pointer_mut("/components/schemas").and_then(Value::as_object_mut).map(std::mem::take).unwrap_or_default();
    let mut schemas = schemas;
    schemas.insert("Problem".into(), problem_schema());
    for problem in problem::TYPES {
        schemas.insert(schema_name(problem), type_schema(problem));
    }
    doc["components"]["schemas"] = Value::Object(schemas);

    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else { return };
    describe_keys(paths);
    for operation in paths.values_mut().filter_map(Value::as_object_mut).flat_map(|item| item.values_mut()) {
        let Some(responses) = operation.get_mut("responses").and_then(Value::as_object_mut) else { continue };
        for response in responses.values_mut().filter_map(Value::as_object_mut) {
            if let Some(Value::Array(slugs)) = response.remove(PROBLEMS_MARK) {
                let group: Vec<&ProblemType> =
                    slugs.iter().filter_map(Value::as_str).filter_map(ProblemType::of).collect();
                problem_content(response, &group);
            }
            if let Some(headers) = response.get_mut("headers").and_then(Value::as_object_mut) {
                for (name, header) in headers.iter_mut() {
                    if let Some(header) = header.as_object_mut() {
                        header.entry("required").or_insert(Value::Bool(!SOMETIMES.contains(&name.as_str())));
                    }
                }
            }
        }
    }
}

/// Adds to each registered operation the `Idempotency-Key` parameter and, on its success
/// responses, the `Idempotent-Replayed` header. A registered operation that is not routed is a
/// defect the first description built finds (every test server builds one).
fn describe_keys(paths: &mut Map<String, Value>) {
    for op in Op::ALL {
        let method = op.method().to_ascii_lowercase();
        let operation = paths
            .get_mut(op.route())
            .and_then(|item| item.get_mut(&method))
            .unwrap_or_else(|| panic!("{} {} is registered but not described", op.method(), op.route()));
        let key = json!({
            "name": "Idempotency-Key",
            "in": "header",
            "required": true,
            "schema": {"type": "string", "pattern": KEY_PATTERN},
            "description": format!(
                "One key per {} (a UUID is ideal), sent unchanged with every retry of it. A Structured Field \
                 String (`\"…\"`, RFC 8941) as the IETF draft defines the field, or a bare token as Stripe's clients \
                 send it; 1 to 255 printable ASCII characters once decoded. Keys expire after 24 hours \
                 (`PAYONCE_KEY_TTL_SECS`; docs/expiry.md).",
                op.name()
            ),
        });
        match operation["parameters"].as_array_mut() {
            Some(parameters) => parameters.push(key),
            None => operation["parameters"] = json!([key]),
        }
        let successes = operation["responses"].as_object_mut().into_iter().flatten();
        let (name, _, schema, description) = replayed();
        for (_, response) in successes.filter(|(status, _)| status.starts_with('2')) {
            // Not `required`: SOMETIMES says so when `finish` goes through every header.
            response["headers"][name] = json!({"schema": schema, "description": description});
        }
    }
}

fn schema_name(problem: &ProblemType) -> String {
    let camel: String = problem
        .slug
        .split('-')
        .map(|word| {
            let mut chars = word.chars();
            chars.next().map(|c| c.to_ascii_uppercase().to_string() + chars.as_str()).unwrap_or_default()
        })
        .collect();
    format!("{camel}Problem")
}

fn schema_ref(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

/// RFC 9457's members, common to every problem.
fn problem_schema() -> Value {
    json!({
        "type": "object",
        "description": "An RFC 9457 problem document. Branch on `type`, never on `title` or `detail`.",
        "required": ["type", "title", "status", "detail"],
        "properties": {
            "type": {"type": "string", "description": "A stable URI naming the kind of problem."},
            "title": {"type": "string", "description": "The same for every occurrence of the type."},
            "status": {"type": "integer", "minimum": 400, "maximum": 599, "description": "The HTTP status, repeated."},
            "detail": {"type": "string", "description": "What went wrong this time, and what to do about it."},
        },
    })
}

/// One problem type: its `type`, `title` and `status` fixed, and exactly its extension members.
fn type_schema(problem: &ProblemType) -> Value {
    let retry_after = json!({"type": "integer", "minimum": 0, "description": "Seconds, as in `Retry-After`."});
    let payment = json!({"type": "string", "pattern": "^pay_[0-9a-f]{32}$"});
    let refund = json!({"type": "string", "pattern": "^re_[0-9a-f]{32}$"});
    let nullable = json!({"type": ["string", "null"]});
    let (members, required): (Value, &[&str]) = match problem.slug {
        "invalid-request" => {
            let field_error = serde_json::to_value(FieldError::schema()).unwrap_or_default();
            (json!({"errors": {"type": "array", "items": field_error, "minItems": 1}}), &[])
        }
        "idempotency-key-in-use" => {
            let reasons = [Busy::InFlight, Busy::Backoff, Busy::Reconciling].map(Busy::as_str);
            (json!({"retry_after": retry_after, "reason": {"enum": reasons}}), &["retry_after", "reason"])
        }
        "gateway-unavailable" | "gateway-refused" | "service-unavailable" | "lock-service-unavailable" => {
            (json!({"retry_after": retry_after}), &["retry_after"])
        }
        "payment-not-refundable" | "payment-not-capturable" => {
            (json!({"payment": payment, "payment_status": {"type": "string"}}), &["payment", "payment_status"])
        }
        "refund-exceeds-payment" => (
            json!({"payment": payment, "amount": {"type": "integer", "minimum": 1}, "remaining": {"type": "integer", "minimum": 0}}),
            &["payment", "amount", "remaining"],
        ),
        "refund-rejected" => {
            (json!({"refund": refund, "payment": payment, "code": {"type": "string"}}), &["refund", "payment", "code"])
        }
        "refund-abandoned" => (json!({"refund": refund, "payment": payment}), &["refund", "payment"]),
        "card-declined" | "payment-rejected" => (
            json!({"payment": payment, "payment_intent": nullable, "code": {"type": "string"}, "decline_code": nullable}),
            &["payment", "payment_intent", "code", "decline_code"],
        ),
        "payment-abandoned" | "settlement-abandoned" => (json!({"payment": payment}), &[]),
        _ => (json!({}), &[]),
    };
    let mut properties = Map::new();
    properties.insert("type".into(), json!({"const": problem.uri()}));
    properties.insert("title".into(), json!({"const": problem.title}));
    properties.insert("status".into(), json!({"const": problem.status.as_u16()}));
    properties.extend(members.as_object().cloned().unwrap_or_default());
    json!({
        "description": problem.when,
        "allOf": [schema_ref("Problem")],
        "properties": properties,
        "required": required,
        // Extension members beyond these are a drift from this description.
        "unevaluatedProperties": false,
    })
}

/// `Idempotent-Replayed`, as a stored answer carries it (a problem's or a success's): (name,
/// always sent, schema, description), as [`problem_headers`] lists headers.
fn replayed() -> (&'static str, bool, Value, &'static str) {
    (
        REPLAYED,
        false,
        json!({"const": "true"}),
        "`true` when this is the stored answer of an earlier request with the same key.",
    )
}

/// The headers a problem type's responses carry: (name, always sent, schema, description).
fn problem_headers(problem: &ProblemType) -> Vec<(&'static str, bool, Value, &'static str)> {
    let retry_after = || {
        (
            "Retry-After",
            true,
            json!({"type": "string", "pattern": "^[0-9]+$"}),
            "Seconds to wait before retrying the same request (with the same Idempotency-Key).",
        )
    };
    let location = |always| {
        (
            "Location",
            always,
            json!({"type": "string", "pattern": "^/v1/payments/pay_[0-9a-f]{32}$"}),
            "The payment this answer is about.",
        )
    };
    let refund_location = || {
        (
            "Location",
            true,
            json!({"type": "string", "pattern": "^/v1/refunds/re_[0-9a-f]{32}$"}),
            "The refund this answer is about.",
        )
    };
    match problem.slug {
        "unauthorized" => {
            vec![("WWW-Authenticate", true, json!({"const": "Bearer"}), "The authentication scheme expected.")]
        }
        "idempotency-key-in-use"
        | "gateway-unavailable"
        | "gateway-refused"
        | "service-unavailable"
        | "lock-service-unavailable" => vec![retry_after()],
        "refund-rejected" | "refund-abandoned" => vec![refund_location(), replayed()],
        "card-declined" | "payment-rejected" => vec![location(true), replayed()],
        "payment-abandoned" => vec![location(false), replayed()],
        // A capture's final answers (an authorization that expired, a settlement never made).
        "payment-not-capturable" | "settlement-abandoned" => vec![replayed()],
        "unsupported-content-encoding" => {
            vec![("Accept-Encoding", true, json!({"const": "identity"}), "The only content coding accepted.")]
        }
        _ => vec![],
    }
}

/// Fills a problem response: its content, and its headers (required when every type sends them).
fn problem_content(response: &mut Map<String, Value>, group: &[&ProblemType]) {
    let refs: Vec<Value> = group.iter().map(|p| schema_ref(&schema_name(p))).collect();
    let schema = if refs.len() == 1 { refs[0].clone() } else { json!({"oneOf": refs}) };
    response.insert("content".into(), json!({problem::CONTENT_TYPE: {"schema": schema}}));
    let mut headers = Map::new();
    for problem in group {
        for (name, _, schema, description) in problem_headers(problem) {
            let everywhere =
                group.iter().all(|p| problem_headers(p).iter().any(|(n, always, ..)| *n == name && *always));
            headers
                .entry(name)
                .or_insert_with(|| json!({"schema": schema, "description": description, "required": everywhere}));
        }
    }
    if !headers.is_empty() {
        response.insert("headers".into(), Value::Object(headers));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refs(value: &Value, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(target)) = map.get("$ref") {
                    out.push(target.clone());
                }
                map.values().for_each(|v| refs(v, out));
            }
            Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }

    /// The served description is OpenAPI 3.1, every reference in it resolves, no marker is
    /// left, and every problem type has its schema.
    #[test]
    fn description_is_whole() {
        let (_, openapi) = crate::http::api().split_for_parts();
        let spec = Spec::new(openapi);
        let doc = spec.0.as_ref();
        assert_eq!(doc["openapi"], "3.1.0");
        let mut found = Vec::new();
        refs(doc, &mut found);
        assert!(!found.is_empty());
        for target in found {
            let pointer = target.strip_prefix('#').expect("only local references");
            assert!(doc.pointer(pointer).is_some(), "{target} does not resolve");
        }
        assert!(!doc.to_string().contains(PROBLEMS_MARK));
        for problem in problem::TYPES {
            assert!(doc["components"]["schemas"][schema_name(problem)].is_object(), "{}", problem.slug);
        }
        assert_eq!(schema_name(&problem::IDEMPOTENCY_KEY_IN_USE), "IdempotencyKeyInUseProblem");
    }

    /// A header is required on a problem response only when every type of its status sends it.
    #[test]
    fn problem_headers_required_when_all_send_them() {
        let mut response = Map::new();
        problem_content(&mut response, &[&problem::GATEWAY_UNAVAILABLE, &problem::SERVICE_UNAVAILABLE]);
        assert_eq!(response["headers"]["Retry-After"]["required"], true);
        let mut response = Map::new();
        problem_content(&mut response, &[&problem::GATEWAY_UNAVAILABLE, &problem::WEBHOOKS_NOT_CONFIGURED]);
        assert_eq!(response["headers"]["Retry-After"]["required"], false);
        assert_eq!(response["content"][problem::CONTENT_TYPE]["schema"]["oneOf"].as_array().map(Vec::len), Some(2));
    }
}
