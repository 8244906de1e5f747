//! Stripe's OpenAPI description (the copy in `app/tests/stripe-openapi/`, see its SOURCE.md),
//! turned into JSON Schemas that check both directions.
//!
//! The copy is OpenAPI 3.0 of 2023-08-16 with an overlay of the 2026 top-level objects. It is
//! read as Stripe's SDK specs read it:
//!
//! - **An object carries every property of its schema**: the public spec's `required` lists only
//!   the properties that are never null, but Stripe sends every nullable one too (as `null` when
//!   empty). So a nullable property is required here, except `charge.refunds` (sent only when
//!   expanded). Properties neither required nor nullable (`refund.failure_reason`, an error's
//!   `decline_code`, …) are sent only when they have a value: never as `null`.
//! - **Nothing else**: an object schema that lists its properties admits no others
//!   (`additionalProperties: false`), in requests (an unknown parameter) and answers alike. Schemas
//!   without a property list (`data.object`, `use_stripe_sdk`) stay open.
//! - `nullable` becomes a `null` alternative; `anyOf` alternatives of distinct JSON types become
//!   an if/then chain on the type, so that an object that fails says which property is wrong.
//! - A request is a Stripe form (`a[b][0]=c`), decoded into JSON guided by the schema (`"12"` is
//!   an integer where an integer is expected) and then validated like an answer.

use std::collections::{BTreeMap, HashMap};
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use axum::http::Method;
use jsonschema::Validator;
use jsonschema::error::ValidationErrorKind;
use serde_json::{Map, Value, json};

/// The copy of Stripe's description, in the repository.
const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/stripe-openapi");

/// Nullable properties Stripe leaves out unless asked for: (schema, property).
const SENT_ONLY_EXPANDED: &[(&str, &str)] = &[("charge", "refunds")];

/// One operation of the description.
struct Operation {
    /// Its `operationId`, under which its schemas are in the root.
    id: String,
    method: Method,
    /// `/v1/payment_intents/{intent}`, split at `/`.
    segments: Vec<String>,
    template: String,
    /// The request's schema as written (form bodies, or the query parameters as one object).
    request: Value,
}

/// The description, compiled.
pub struct Spec {
    /// The schemas as written, after the overlay (for decoding forms).
    raw: Map<String, Value>,
    /// `{"components": {"schemas": …}, "requests": …, "answers": …}` in JSON Schema 2020-12: the
    /// document every validator resolves its `$ref` in.
    root: Value,
    operations: Vec<Operation>,
    /// What the description is: its versions and where they come from.
    pub provenance: String,
    validators: Mutex<HashMap<String, Arc<Validator>>>,
}

impl Spec {
    pub fn load() -> Self {
        let read = |name: &str| -> Value {
            let text = std::fs::read_to_string(format!("{DIR}/{name}")).unwrap_or_else(|err| panic!("{name}: {err}"));
            serde_json::from_str(&text).unwrap_or_else(|err| panic!("{name}: {err}"))
        };
        let subset = read("spec3.subset.json");
        let overlays: Vec<String> = std::fs::read_dir(DIR)
            .expect("the spec directory")
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .filter(|name| name.starts_with("overlay-") && name.ends_with(".json"))
            .collect();
        let [overlay_name] = overlays.as_slice() else { panic!("exactly one overlay-*.json in {DIR}: {overlays:?}") };
        let overlay = read(overlay_name);
        let mut raw = subset["components"]["schemas"].as_object().expect("schemas").clone();
        apply_overlay(&mut raw, &overlay);

        let components = Converter { schemas: &raw, complete: true };
        let schemas: Map<String, Value> =
            raw.iter().map(|(name, schema)| (name.clone(), components.convert(schema, Some(name)))).collect();
        // Requests and the envelopes around objects (lists, search results) are read as written.
        let converter = Converter { schemas: &raw, complete: false };
        let mut operations = Vec::new();
        let (mut requests, mut answers) = (Map::new(), Map::new());
        for (template, item) in subset["paths"].as_object().expect("paths") {
            for (method, operation) in item.as_object().expect("an operation map") {
                let id = operation["operationId"].as_str().expect("an operationId").to_owned();
                let request = match operation["requestBody"]["content"]["application/x-www-form-urlencoded"]["schema"] {
                    ref body if method == "post" => body.clone(),
                    _ => query_schema(operation),
                };
                requests.insert(id.clone(), converter.convert(&request, None));
                let answer = &operation["responses"]["200"]["content"]["application/json"]["schema"];
                answers.insert(id.clone(), converter.convert(answer, None));
                operations.push(Operation {
                    id: id.clone(),
                    method: Method::from_str(&method.to_uppercase()).expect("a method"),
                    segments: template.split('/').map(str::to_owned).collect(),
                    template: template.clone(),
                    request,
                });
            }
        }
        let root = json!({"components": {"schemas": schemas}, "requests": requests, "answers": answers});
        let provenance = format!(
            "Stripe's OpenAPI spec {} (spec3.subset.json) with the {} objects of {} (commit {})",
            subset["info"]["version"].as_str().unwrap_or("?"),
            overlay["source"]["api_version"].as_str().unwrap_or("?"),
            overlay["source"]["path"].as_str().unwrap_or("?"),
            overlay["source"]["commit"].as_str().unwrap_or("?"),
        );
        Self { raw, root, operations, provenance, validators: Mutex::default() }
    }

    /// The operation a request is.
    fn operation(&self, method: &Method, path: &str) -> Option<&Operation> {
        let segments: Vec<&str> = path.split('/').collect();
        let matches = |operation: &&Operation| {
            operation.method == method
                && operation.segments.len() == segments.len()
                && operation.segments.iter().zip(&segments).all(|(want, got)| want.starts_with('{') || want == got)
        };
        // A literal segment beats a parameter: `/search` is not a PaymentIntent's id.
        self.operations
            .iter()
            .filter(matches)
            .max_by_key(|operation| operation.segments.iter().filter(|s| !s.starts_with('{')).count())
    }

    /// The path template of a request (`GET /v1/payment_intents/{intent}`), if the description has it.
    pub fn template(&self, method: &Method, path: &str) -> Option<String> {
        self.operation(method, path).map(|operation| format!("{method} {}", operation.template))
    }

    /// What is wrong with a request: unknown parameters, missing ones, wrong types or values.
    pub fn check_request(&self, method: &Method, path: &str, query: Option<&str>, body: &[u8]) -> Vec<String> {
        let Some(operation) = self.operation(method, path) else {
            return vec![format!("{method} {path} is not an operation of the description")];
        };
        let form = if *method == Method::POST { body } else { query.unwrap_or_default().as_bytes() };
        let instance = decode(form, &operation.request, &self.raw);
        self.validate(&format!("/requests/{}", operation.id), &instance)
            .into_iter()
            .filter(|(path, value, _)| !version_skew(path, value))
            .map(|(_, _, message)| message)
            .collect()
    }

    /// What is wrong with an answer's body, read as the operation's object (2xx) or Stripe's
    /// error (anything else). Events are also checked for their `data.object`.
    pub fn check_answer(&self, method: &Method, path: &str, status: u16, body: &[u8]) -> Vec<String> {
        let Some(operation) = self.operation(method, path) else {
            return vec![format!("{method} {path} is not an operation of the description")];
        };
        let Ok(value) = serde_json::from_slice::<Value>(body) else {
            return vec!["the body is not JSON".to_owned()];
        };
        let pointer = if (200..300).contains(&status) {
            format!("/answers/{}", operation.id)
        } else {
            "/components/schemas/error".into()
        };
        let mut problems: Vec<String> = self.validate(&pointer, &value).into_iter().map(|(_, _, m)| m).collect();
        if (200..300).contains(&status) && path.starts_with("/v1/events") {
            let events = if value["object"] == "list" {
                value["data"].as_array().cloned().unwrap_or_default()
            } else {
                vec![value]
            };
            for (i, event) in events.iter().enumerate() {
                problems
                    .extend(self.check_event_object(event).into_iter().map(|problem| format!("event {i}: {problem}")));
            }
        }
        problems
    }

    /// What is wrong with an event (a webhook delivery's body).
    pub fn check_event(&self, body: &[u8]) -> Vec<String> {
        let Ok(event) = serde_json::from_slice::<Value>(body) else {
            return vec!["the body is not JSON".to_owned()];
        };
        let mut problems: Vec<String> =
            self.validate("/components/schemas/event", &event).into_iter().map(|(_, _, m)| m).collect();
        problems.extend(self.check_event_object(&event));
        problems
    }

    /// An event's `data.object`, read as the object its `object` names.
    fn check_event_object(&self, event: &Value) -> Vec<String> {
        let object = &event["data"]["object"];
        let Some(kind) = object["object"].as_str() else {
            return vec!["data.object has no `object`".to_owned()];
        };
        if !self.raw.contains_key(kind) {
            return vec![format!("data.object is a {kind}, which the description does not have")];
        }
        let problems = self.validate(&format!("/components/schemas/{kind}"), object);
        problems.into_iter().map(|(_, _, message)| format!("data.object: {message}")).collect()
    }

    /// (instance path, offending value, message) of every error of `instance` against the
    /// schema at `pointer` in the root.
    fn validate(&self, pointer: &str, instance: &Value) -> Vec<(String, Value, String)> {
        let validator = self.validator(pointer);
        validator
            .iter_errors(instance)
            .map(|error| {
                let path = error.instance_path().to_string();
                let value = match error.kind() {
                    ValidationErrorKind::Enum { .. } => error.instance().clone().into_owned(),
                    _ => Value::Null,
                };
                let at = if path.is_empty() { "(top)".to_owned() } else { path.clone() };
                (path, value, format!("{at}: {error}"))
            })
            .collect()
    }

    fn validator(&self, pointer: &str) -> Arc<Validator> {
        let mut validators = self.validators.lock().expect("validators");
        validators
            .entry(pointer.to_owned())
            .or_insert_with(|| {
                let mut root = self.root.clone();
                root["$ref"] = Value::from(format!("#{pointer}"));
                let validator = jsonschema::draft202012::options()
                    .build(&root)
                    .unwrap_or_else(|err| panic!("the schema at {pointer} does not compile: {err}"));
                Arc::new(validator)
            })
            .clone()
    }
}

/// Applies the overlay of newer top-level objects (see SOURCE.md) over the subset's schemas.
fn apply_overlay(schemas: &mut Map<String, Value>, overlay: &Value) {
    for (name, schema) in overlay["new_schemas"].as_object().into_iter().flatten() {
        schemas.insert(name.clone(), schema.clone());
    }
    for (name, newer) in overlay["schemas"].as_object().expect("overlay schemas") {
        let base = schemas.get_mut(name).unwrap_or_else(|| panic!("the overlay's {name} is not in the subset"));
        if let Some(properties) = newer["properties"].as_object() {
            let old = base["properties"].as_object().cloned().unwrap_or_default();
            let merged: Map<String, Value> = properties
                .iter()
                .map(|(property, definition)| {
                    let definition = match definition.as_str() {
                        Some("@base") => old
                            .get(property)
                            .unwrap_or_else(|| panic!("overlay: {name}.{property} is '@base' but the subset lacks it"))
                            .clone(),
                        _ => definition.clone(),
                    };
                    (property.clone(), definition)
                })
                .collect();
            base["properties"] = Value::Object(merged);
            base["required"] = newer["required"].clone();
        }
        for (property, definition) in newer["properties_add"].as_object().into_iter().flatten() {
            base["properties"][property] = definition.clone();
        }
    }
}

/// A GET or DELETE's query parameters, as one object schema.
fn query_schema(operation: &Value) -> Value {
    let mut properties = Map::new();
    let mut required = Vec::new();
    for parameter in operation["parameters"].as_array().into_iter().flatten().filter(|p| p["in"] == "query") {
        let name = parameter["name"].as_str().expect("a parameter name");
        properties.insert(name.to_owned(), parameter["schema"].clone());
        if parameter["required"] == true {
            required.push(Value::from(name));
        }
    }
    json!({"type": "object", "properties": properties, "required": required})
}

/// A value newer than the description that async-stripe's API version (what payonce sends in
/// `Stripe-Version`) knows: skew between the 2023 request schemas and the pinned version, not an
/// error (SOURCE.md).
fn version_skew(path: &str, value: &Value) -> bool {
    let Some(value) = value.as_str() else { return false };
    if path == "/api_version" {
        return value == stripe_shared::version::VERSION.as_str();
    }
    path.starts_with("/enabled_events/")
        && !matches!(
            stripe_shared::event::EventType::from_str(value),
            Ok(stripe_shared::event::EventType::Unknown(_)) | Err(_)
        )
}

/// OpenAPI 3.0 schemas to JSON Schema 2020-12, with the rules of the module docs.
struct Converter<'a> {
    /// The schemas as written, to learn what a `$ref` points at.
    schemas: &'a Map<String, Value>,
    /// Objects carry every property (answers' objects); off for requests, where Stripe's
    /// `nullable` means "may be unset", and for the envelopes as written.
    complete: bool,
}

impl Converter<'_> {
    /// `owner`: the component this is the top of (for [`SENT_ONLY_EXPANDED`]).
    fn convert(&self, node: &Value, owner: Option<&str>) -> Value {
        let Some(object) = node.as_object() else { return node.clone() };
        let nullable = object.get("nullable") == Some(&Value::Bool(true));
        if let Some(alternatives) = object.get("anyOf").and_then(Value::as_array) {
            let mut branches: Vec<(Option<String>, Value)> = alternatives
                .iter()
                .filter(|alternative| self.resolvable(alternative))
                .map(|alternative| (self.kind(alternative), self.convert(alternative, None)))
                .collect();
            if nullable {
                branches.push((Some("null".into()), json!({"type": "null"})));
            }
            return dispatch(branches);
        }
        let mut out = Map::new();
        for (key, value) in object {
            match key.as_str() {
                "nullable" | "format" | "description" | "title" => {}
                key if key.starts_with("x-") => {}
                "properties" => {
                    let properties = value.as_object().expect("properties").iter();
                    out.insert(key.into(), properties.map(|(name, s)| (name.clone(), self.convert(s, None))).collect());
                }
                "items" | "additionalProperties" if value.is_object() => {
                    out.insert(key.into(), self.convert(value, None));
                }
                _ => {
                    out.insert(key.clone(), value.clone());
                }
            }
        }
        if let Some(properties) = object.get("properties").and_then(Value::as_object) {
            out.entry("additionalProperties").or_insert(Value::Bool(false));
            out.entry("type").or_insert(Value::from("object"));
            if self.complete {
                let required = out.entry("required").or_insert(Value::Array(Vec::new()));
                let required = required.as_array_mut().expect("required is a list");
                for (property, definition) in properties {
                    let expanded_only =
                        owner.is_some_and(|owner| SENT_ONLY_EXPANDED.contains(&(owner, property.as_str())));
                    if definition["nullable"] == true
                        && !expanded_only
                        && !required.contains(&Value::from(property.as_str()))
                    {
                        required.push(Value::from(property.as_str()));
                    }
                }
            }
        }
        let out = Value::Object(out);
        if !nullable {
            return out;
        }
        let kind = self.kind(node).unwrap_or_else(|| "object".into());
        dispatch(vec![(Some(kind), out), (Some("null".into()), json!({"type": "null"}))])
    }

    /// Whether a `$ref` points at a schema the subset has (an expandable alternative it cut,
    /// such as a refund's `customer` object, does not).
    fn resolvable(&self, node: &Value) -> bool {
        node["$ref"].as_str().is_none_or(|reference| self.schemas.contains_key(schema_name(reference)))
    }

    /// The JSON type a schema describes, if one.
    fn kind(&self, node: &Value) -> Option<String> {
        if let Some(reference) = node["$ref"].as_str() {
            return self.kind(self.schemas.get(schema_name(reference))?);
        }
        match &node["type"] {
            Value::String(kind) => Some(kind.clone()),
            _ if node.get("properties").is_some() => Some("object".into()),
            _ => None,
        }
    }
}

fn schema_name(reference: &str) -> &str {
    reference.rsplit('/').next().unwrap_or(reference)
}

/// Alternatives as an if/then chain on the JSON type when their types differ (errors then come
/// from the branch that applies), else a plain `anyOf`.
fn dispatch(branches: Vec<(Option<String>, Value)>) -> Value {
    let kinds: Vec<&str> = branches.iter().filter_map(|(kind, _)| kind.as_deref()).collect();
    let mut distinct = kinds.clone();
    distinct.sort_unstable();
    distinct.dedup();
    if kinds.len() != branches.len() || distinct.len() != kinds.len() {
        return json!({"anyOf": branches.into_iter().map(|(_, schema)| schema).collect::<Vec<_>>()});
    }
    let types: Vec<Value> = kinds.iter().map(|kind| Value::from(*kind)).collect();
    let mut chain = json!({"type": types});
    for (kind, schema) in branches.into_iter().rev() {
        chain = json!({"if": {"type": kind}, "then": schema, "else": chain});
    }
    chain
}

/// One level of a decoded form: a value (repeated keys keep every value) or nested keys.
#[derive(Debug)]
enum Node {
    Leaf(Vec<String>),
    Map(BTreeMap<String, Node>),
}

/// A Stripe form (`a[b][0]=c`, `a[]=c`) as JSON, guided by `schema`: integers and booleans where
/// the schema expects them, arrays where it expects arrays. What does not fit stays a string or
/// an object, for the validation to report.
fn decode(form: &[u8], schema: &Value, schemas: &Map<String, Value>) -> Value {
    let mut root = BTreeMap::new();
    for (key, value) in form_urlencoded::parse(form) {
        let (name, rest) = key.split_once('[').map_or((key.as_ref(), ""), |(name, rest)| (name, rest));
        let mut path = vec![name.to_owned()];
        if let Some(inner) = rest.strip_suffix(']') {
            path.extend(inner.split("][").map(str::to_owned));
        }
        insert(&mut root, &path, value.into_owned());
    }
    coerce(&Node::Map(root), schema, schemas)
}

fn insert(map: &mut BTreeMap<String, Node>, path: &[String], value: String) {
    let (first, rest) = path.split_first().expect("a key");
    if rest.is_empty() {
        match map.entry(first.clone()).or_insert_with(|| Node::Leaf(Vec::new())) {
            Node::Leaf(values) => values.push(value),
            Node::Map(_) => {}
        }
        return;
    }
    let child = map.entry(first.clone()).or_insert_with(|| Node::Map(BTreeMap::new()));
    if let Node::Leaf(_) = child {
        *child = Node::Map(BTreeMap::new());
    }
    if let Node::Map(child) = child {
        insert(child, rest, value);
    }
}

fn coerce(node: &Node, schema: &Value, schemas: &Map<String, Value>) -> Value {
    let schema = match schema["$ref"].as_str() {
        Some(reference) => schemas.get(schema_name(reference)).unwrap_or(&Value::Null),
        None => schema,
    };
    if let Some(alternatives) = schema["anyOf"].as_array() {
        let fits = |alternative: &&Value| {
            let container = matches!(alternative["type"].as_str(), Some("object" | "array"))
                || alternative.get("properties").is_some();
            matches!(node, Node::Map(_)) == container
        };
        let chosen = alternatives.iter().find(fits).or(alternatives.first()).unwrap_or(&Value::Null);
        return coerce(node, chosen, schemas);
    }
    match node {
        Node::Leaf(values) => {
            let value = values.last().cloned().unwrap_or_default();
            match schema["type"].as_str() {
                Some("integer") => value.parse::<i64>().map_or(Value::String(value), Value::from),
                Some("number") => value
                    .parse::<f64>()
                    .ok()
                    .and_then(serde_json::Number::from_f64)
                    .map_or(Value::String(value.clone()), Value::Number),
                Some("boolean") => match value.as_str() {
                    "true" => Value::Bool(true),
                    "false" => Value::Bool(false),
                    _ => Value::String(value),
                },
                _ => Value::String(value),
            }
        }
        Node::Map(children) if schema["type"] == "array" => {
            let mut items: Vec<(usize, Value)> = Vec::new();
            for (index, child) in children {
                match (index.as_str(), child) {
                    ("", Node::Leaf(values)) => items.extend(
                        values
                            .iter()
                            .map(|v| (usize::MAX, coerce(&Node::Leaf(vec![v.clone()]), &schema["items"], schemas))),
                    ),
                    (index, child) if let Ok(index) = index.parse::<usize>() => {
                        items.push((index, coerce(child, &schema["items"], schemas)))
                    }
                    // Not an index: shown as an object, which the validation refuses.
                    _ => return coerce(node, &json!({"type": "object"}), schemas),
                }
            }
            // `a[2]=x&a[10]=y` in index order; `a[]=x&a[]=y` in the order sent (a stable sort).
            items.sort_by_key(|(index, _)| *index);
            Value::Array(items.into_iter().map(|(_, item)| item).collect())
        }
        Node::Map(children) => children
            .iter()
            .map(|(key, child)| {
                let property = schema["properties"]
                    .get(key)
                    .or_else(|| schema.get("additionalProperties").filter(|s| s.is_object()));
                (key.clone(), coerce(child, property.unwrap_or(&Value::Null), schemas))
            })
            .collect::<Map<String, Value>>()
            .into(),
    }
}
