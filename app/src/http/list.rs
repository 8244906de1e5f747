//! What the API's list endpoints share: the `object: "list"` marker, the page size, and the ids
//! a list takes as its cursor (`starting_after`) or as a filter.

use serde::Serialize;

use super::error::ApiError;

/// The `object` member of a list: always `list`.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ListObject {
    List,
}

/// The page size asked for (`limit`, 1 to 100), 10 when none was.
pub fn limit(limit: Option<u32>) -> Result<u32, ApiError> {
    let limit = limit.unwrap_or(10);
    if !(1..=100).contains(&limit) {
        return Err(ApiError::invalid("limit must be between 1 and 100"));
    }
    Ok(limit)
}

/// The id a query parameter gives, if any, parsed by `parse`; one it cannot parse is a 400
/// saying `expected` (e.g. "starting_after must be a payment id (pay_…)").
pub fn id<T>(value: Option<&str>, parse: impl Fn(&str) -> Option<T>, expected: &str) -> Result<Option<T>, ApiError> {
    value.map(|id| parse(id).ok_or_else(|| ApiError::invalid(expected))).transpose()
}
