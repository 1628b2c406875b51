//! `GET /api/v1/openapi.json`: the API described as an OpenAPI 3.1 document, generated from
//! the handlers' annotations and the types they read and answer ([`super::routes::ApiDoc`]).
//!
//! What every route shares is added here rather than on each handler: the bearer scheme,
//! required everywhere but `/healthz`, and the 401 its middleware answers.

use std::borrow::Cow;
use std::sync::LazyLock;

use axum::Json;
use serde_json::Value;
use utoipa::openapi::path::{Operation, PathItem};
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{Content, OpenApi, Ref, RefOr, ResponseBuilder};
use utoipa::{PartialSchema, ToSchema};

use super::answers::ErrorBody;
use super::routes::{API_ROUTES, ApiDoc};
use crate::OperatorAction;

/// The name of the bearer scheme in the document.
const BEARER: &str = "bearer";

/// The document, generated once, with what the annotations cannot say added
/// ([`super::exact::exact`]).
static DOCUMENT: LazyLock<Value> = LazyLock::new(|| {
    let mut doc = serde_json::to_value(<ApiDoc as utoipa::OpenApi>::openapi())
        .unwrap_or_else(|e| unreachable!("an OpenAPI document is JSON: {e}"));
    super::exact::exact(&mut doc);
    doc
});

/// The OpenAPI document of this API
///
/// This document: every route of the API with its parameters, bodies, answers and errors
/// (OpenAPI 3.1, JSON Schema 2020-12). Any token may read it.
#[utoipa::path(
    get,
    path = "/api/v1/openapi.json",
    tag = "document",
    operation_id = "openapi",
    responses((status = 200, description = "The OpenAPI document", body = Object)),
)]
pub(super) async fn openapi_json() -> Json<&'static Value> {
    Json(&DOCUMENT)
}

/// Adds the bearer scheme and, on every route behind the token middleware ([`API_ROUTES`]),
/// requires it and documents the 401 the middleware answers. `/healthz` needs no token.
#[derive(Debug)]
pub(super) struct Security;

impl utoipa::Modify for Security {
    fn modify(&self, doc: &mut OpenApi) {
        doc.components
            .get_or_insert_with(Default::default)
            .add_security_scheme(
                BEARER,
                SecurityScheme::Http(
                    HttpBuilder::new()
                        .scheme(HttpAuthScheme::Bearer)
                        .description(Some(
                            "A token of the API's configuration (`Authorization: Bearer …`). A \
                             read-only token reads; starting runs, acting on runs and alerts \
                             and changing resource limits needs an operator token (403 \
                             `forbidden` otherwise).",
                        ))
                        .build(),
                ),
            );
        let unauthorized = ResponseBuilder::new()
            .description("`unauthorized`: no token, or not one of the configured tokens")
            .content(
                "application/json",
                Content::new(Some(Ref::from_schema_name(ErrorBody::name()))),
            )
            .build();
        for (method, path) in API_ROUTES {
            let Some(op) = doc
                .paths
                .paths
                .get_mut(*path)
                .and_then(|item| operation(item, method))
            else {
                // Undocumented: the document's test names it.
                continue;
            };
            op.security = Some(vec![SecurityRequirement::new(BEARER, Vec::<String>::new())]);
            op.responses
                .responses
                .insert("401".to_owned(), RefOr::T(unauthorized.clone()));
        }
    }
}

/// The operation of `item` for `method` (the methods the API uses).
fn operation<'a>(item: &'a mut PathItem, method: &str) -> Option<&'a mut Operation> {
    match method {
        "get" => item.get.as_mut(),
        "post" => item.post.as_mut(),
        "put" => item.put.as_mut(),
        "patch" => item.patch.as_mut(),
        "delete" => item.delete.as_mut(),
        _ => None,
    }
}

/// The schema of an operator action in paths and answers, named `Action` in the document:
/// its names, generated from [`OperatorAction::ALL`], exactly what the path accepts.
pub(super) struct ActionSchema;

impl PartialSchema for ActionSchema {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(format!(
                "An operator action. {} act on one step, named in the body (`step`).",
                OperatorAction::ALL
                    .iter()
                    .filter(|a| a.needs_step())
                    .map(|a| format!("`{a}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )))
            .enum_values(Some(OperatorAction::ALL.iter().map(|a| a.as_str())))
            .into()
    }
}

impl ToSchema for ActionSchema {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("Action")
    }
}
