//! Stripe's search query language (<https://docs.stripe.com/search#search-query-language>) over
//! PaymentIntents, with the fields Stripe lists for them
//! (<https://docs.stripe.com/search#query-fields-for-payment-intents>):
//!
//! | field | type | operators |
//! |---|---|---|
//! | `amount`, `created` | numeric | `:` `>` `<` `>=` `<=` (value quoted or not) |
//! | `currency`, `customer` | string | `:` (exact, case-insensitive), `~` (substring, 3 characters or more) |
//! | `status`, `metadata['key']` | token | `:` (exact) |
//!
//! A clause is `field`, operator, value; string values are quoted (`'` or `"`, `\` escapes
//! a quote); `null` (unquoted) matches a field that is absent (`customer:null`,
//! `metadata['k']:null`); `-` negates a clause. Up to 10 clauses, joined by `AND` or by `OR`
//! (either case; not both in one query, and no parentheses), or by spaces (`AND`). Anything else
//! is a 400 on `param: "query"`, as on Stripe.

use crate::simulator::error::ApiError;
use crate::simulator::objects::PaymentIntent;

/// Stripe's limit on clauses in one query.
const MAX_CLAUSES: usize = 10;

/// Where Stripe documents the fields.
const FIELDS_DOC: &str = "https://docs.stripe.com/search#query-fields-for-payment-intents";

#[derive(Clone, Debug, PartialEq, Eq)]
enum Field {
    Amount,
    Created,
    Currency,
    Customer,
    Status,
    Metadata(String),
}

/// How a field may be searched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Numeric,
    String,
    Token,
}

impl Field {
    fn kind(&self) -> Kind {
        match self {
            Self::Amount | Self::Created => Kind::Numeric,
            Self::Currency | Self::Customer => Kind::String,
            Self::Status | Self::Metadata(_) => Kind::Token,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Operator {
    Exact,
    Substring,
    Greater,
    GreaterOrEqual,
    Less,
    LessOrEqual,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Value {
    Null,
    Text(String),
    Number(i64),
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Clause {
    negated: bool,
    field: Field,
    operator: Operator,
    value: Value,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Join {
    And,
    Or,
}

/// A parsed query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Query {
    clauses: Vec<Clause>,
    join: Join,
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::invalid_request(message).param("query")
}

/// Stripe's answer to a query it cannot read.
fn unparsable(near: &str) -> ApiError {
    let near = if near.is_empty() { String::new() } else { format!(" (near `{near}`)") };
    invalid(format!(
        "We were unable to parse your search query{near}. Try using the format `metadata[\"key\"]:\"value\"` to \
         query for metadata or `key:\"value\"` to query for other fields."
    ))
}

impl Query {
    pub fn parse(query: &str) -> Result<Self, ApiError> {
        let mut parser = Parser { rest: query.trim() };
        if parser.rest.is_empty() {
            return Err(ApiError::parameter_empty("query"));
        }
        let mut clauses = vec![parser.clause()?];
        let mut join = None;
        while !parser.rest.is_empty() {
            let this = parser.join()?;
            if join.is_some_and(|join| join != this) {
                return Err(invalid(
                    "Search queries cannot combine AND and OR: use one of them between all the clauses (there \
                     are no parentheses).",
                ));
            }
            join = Some(this);
            clauses.push(parser.clause()?);
            if clauses.len() > MAX_CLAUSES {
                return Err(invalid(format!("A search query can have at most {MAX_CLAUSES} clauses.")));
            }
        }
        Ok(Self { clauses, join: join.unwrap_or(Join::And) })
    }

    pub fn matches(&self, intent: &PaymentIntent) -> bool {
        let mut results = self.clauses.iter().map(|clause| clause.matches(intent) != clause.negated);
        match self.join {
            Join::And => results.all(|matched| matched),
            Join::Or => results.any(|matched| matched),
        }
    }
}

impl Clause {
    fn matches(&self, intent: &PaymentIntent) -> bool {
        match (&self.field, &self.value) {
            (Field::Amount, value) => compare(Some(intent.amount), self.operator, value),
            (Field::Created, value) => compare(Some(intent.created), self.operator, value),
            (Field::Currency, value) => text(Some(&intent.currency), self.operator, value, false),
            // The simulator has no customers: every PaymentIntent's is null.
            (Field::Customer, value) => text(None, self.operator, value, false),
            (Field::Status, value) => text(Some(intent.status.as_str()), self.operator, value, true),
            (Field::Metadata(key), value) => {
                text(intent.metadata.get(key).map(String::as_str), self.operator, value, true)
            }
        }
    }
}

fn compare(actual: Option<i64>, operator: Operator, value: &Value) -> bool {
    let (Some(actual), Value::Number(wanted)) = (actual, value) else {
        return actual.is_none() && *value == Value::Null;
    };
    match operator {
        Operator::Exact => actual == *wanted,
        Operator::Greater => actual > *wanted,
        Operator::GreaterOrEqual => actual >= *wanted,
        Operator::Less => actual < *wanted,
        Operator::LessOrEqual => actual <= *wanted,
        Operator::Substring => false,
    }
}

/// `case_sensitive`: a token field (an exact value) rather than a string field (text).
fn text(actual: Option<&str>, operator: Operator, value: &Value, case_sensitive: bool) -> bool {
    let (Some(actual), Value::Text(wanted)) = (actual, value) else {
        return actual.is_none() && *value == Value::Null;
    };
    match (operator, case_sensitive) {
        (Operator::Exact, true) => actual == wanted,
        (Operator::Exact, false) => actual.eq_ignore_ascii_case(wanted),
        (Operator::Substring, _) => actual.to_lowercase().contains(&wanted.to_lowercase()),
        _ => false,
    }
}

struct Parser<'a> {
    rest: &'a str,
}

impl Parser<'_> {
    /// What joins the next clause: `AND`, `OR` (either case, between spaces) or spaces alone.
    fn join(&mut self) -> Result<Join, ApiError> {
        let after_spaces = self.rest.trim_start();
        if after_spaces.len() == self.rest.len() {
            return Err(unparsable(self.rest));
        }
        self.rest = after_spaces;
        let word: String = self.rest.chars().take_while(|c| !c.is_whitespace()).collect();
        let join = match word.to_ascii_uppercase().as_str() {
            "AND" => Join::And,
            "OR" => Join::Or,
            _ => return Ok(Join::And),
        };
        let after_word = &self.rest[word.len()..];
        if !after_word.starts_with(char::is_whitespace) {
            return Err(unparsable(self.rest));
        }
        self.rest = after_word.trim_start();
        Ok(join)
    }

    fn clause(&mut self) -> Result<Clause, ApiError> {
        let start = self.rest;
        let negated = self.rest.starts_with('-');
        if negated {
            self.rest = &self.rest[1..];
        }
        let field = self.field()?;
        let operator = self.operator().ok_or_else(|| unparsable(start))?;
        let value = self.value(&field, start)?;
        let kind = field.kind();
        let allowed = match (kind, operator) {
            (_, Operator::Exact) => true,
            (_, _) if value == Value::Null => false,
            (Kind::String, Operator::Substring) => true,
            (Kind::Numeric, Operator::Substring) | (Kind::String | Kind::Token, _) => false,
            (Kind::Numeric, _) => true,
        };
        if !allowed {
            let what = match kind {
                Kind::Numeric => "a numeric field: use :, >, <, >= or <=",
                Kind::String => "a string field: use : or ~",
                Kind::Token => "a token field: only exact matches (:)",
            };
            return Err(invalid(format!(
                "The operator in `{}` cannot be used here: {what}.",
                clause_text(start, self.rest)
            )));
        }
        if let (Operator::Substring, Value::Text(text)) = (operator, &value)
            && text.chars().count() < 3
        {
            return Err(invalid("Substring searches (~) need a value of at least 3 characters."));
        }
        Ok(Clause { negated, field, operator, value })
    }

    fn field(&mut self) -> Result<Field, ApiError> {
        if let Some(rest) = self.rest.strip_prefix("metadata[") {
            self.rest = rest;
            let key = self.quoted().ok_or_else(|| unparsable("metadata["))??;
            self.rest = self.rest.strip_prefix(']').ok_or_else(|| unparsable(self.rest))?;
            if key.is_empty() {
                return Err(unparsable("metadata[]"));
            }
            return Ok(Field::Metadata(key));
        }
        let name: String =
            self.rest.chars().take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.')).collect();
        self.rest = &self.rest[name.len()..];
        match name.as_str() {
            "" => Err(unparsable(self.rest)),
            "amount" => Ok(Field::Amount),
            "created" => Ok(Field::Created),
            "currency" => Ok(Field::Currency),
            "customer" => Ok(Field::Customer),
            "status" => Ok(Field::Status),
            other => Err(invalid(format!(
                "Field '{other}' is an unsupported search field for resource payment_intents. See {FIELDS_DOC} for a \
                 list of supported fields."
            ))),
        }
    }

    fn operator(&mut self) -> Option<Operator> {
        let (operator, length) = match self.rest.as_bytes() {
            [b'>', b'=', ..] => (Operator::GreaterOrEqual, 2),
            [b'<', b'=', ..] => (Operator::LessOrEqual, 2),
            [b'>', ..] => (Operator::Greater, 1),
            [b'<', ..] => (Operator::Less, 1),
            [b':', ..] => (Operator::Exact, 1),
            [b'~', ..] => (Operator::Substring, 1),
            _ => return None,
        };
        self.rest = &self.rest[length..];
        Some(operator)
    }

    /// A quoted value, `null`, or (for a numeric field) a bare number.
    fn value(&mut self, field: &Field, clause: &str) -> Result<Value, ApiError> {
        let text = match self.quoted() {
            Some(quoted) => quoted?,
            None => {
                let bare: String = self.rest.chars().take_while(|c| !c.is_whitespace()).collect();
                self.rest = &self.rest[bare.len()..];
                if bare.eq_ignore_ascii_case("null") {
                    return Ok(Value::Null);
                }
                if field.kind() != Kind::Numeric {
                    return Err(invalid(format!(
                        "The value in `{}` must be quoted: field:'value' (or null).",
                        clause_text(clause, self.rest)
                    )));
                }
                bare
            }
        };
        match field.kind() {
            Kind::Numeric => text.parse().map(Value::Number).map_err(|_| {
                invalid(format!(
                    "`{}` compares a numeric field with something that is not a whole number.",
                    clause_text(clause, self.rest)
                ))
            }),
            Kind::String | Kind::Token => Ok(Value::Text(text)),
        }
    }

    /// A value in single or double quotes, with `\` escapes; `None` if the next character is no
    /// quote.
    fn quoted(&mut self) -> Option<Result<String, ApiError>> {
        let mut chars = self.rest.char_indices();
        let quote = match chars.next() {
            Some((_, quote @ ('\'' | '"'))) => quote,
            _ => return None,
        };
        let mut value = String::new();
        let mut escaped = false;
        for (at, c) in chars {
            match c {
                _ if escaped => {
                    value.push(c);
                    escaped = false;
                }
                '\\' => escaped = true,
                _ if c == quote => {
                    self.rest = &self.rest[at + c.len_utf8()..];
                    return Some(Ok(value));
                }
                _ => value.push(c),
            }
        }
        Some(Err(invalid("We were unable to parse your search query: a quoted value is not closed.")))
    }
}

/// The text of the clause that began at `start` and ends where `rest` begins.
fn clause_text<'a>(start: &'a str, rest: &str) -> &'a str {
    &start[..start.len() - rest.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clauses(query: &str) -> Vec<Clause> {
        Query::parse(query).expect("a valid query").clauses
    }

    fn refusal(query: &str) -> String {
        let error = Query::parse(query).expect_err("refused").error;
        assert_eq!(error.param.as_deref(), Some("query"), "{query}");
        error.message
    }

    fn clause(field: Field, operator: Operator, value: Value) -> Clause {
        Clause { negated: false, field, operator, value }
    }

    /// Every field, operator and value form of the documented language.
    #[test]
    fn parses_the_documented_language() {
        let metadata = |key: &str| Field::Metadata(key.into());
        let text = |value: &str| Value::Text(value.into());
        assert_eq!(
            clauses("metadata['payonce_payment']:'pay_1'"),
            [clause(metadata("payonce_payment"), Operator::Exact, text("pay_1"))]
        );
        assert_eq!(
            clauses(r#"status:"succeeded"  AND metadata["order"]:'it\'s'"#),
            [
                clause(Field::Status, Operator::Exact, text("succeeded")),
                clause(metadata("order"), Operator::Exact, text("it's"))
            ]
        );
        assert_eq!(clauses("metadata['a:b']:'c'"), [clause(metadata("a:b"), Operator::Exact, text("c"))]);
        assert_eq!(clauses("amount>1000"), [clause(Field::Amount, Operator::Greater, Value::Number(1000))]);
        assert_eq!(clauses("amount>=\"10\""), [clause(Field::Amount, Operator::GreaterOrEqual, Value::Number(10))]);
        assert_eq!(
            clauses("created<=1700000000"),
            [clause(Field::Created, Operator::LessOrEqual, Value::Number(1_700_000_000))]
        );
        assert_eq!(clauses("customer:null"), [clause(Field::Customer, Operator::Exact, Value::Null)]);
        assert_eq!(clauses("currency~'usd'"), [clause(Field::Currency, Operator::Substring, text("usd"))]);
        let negated = &clauses("-status:'succeeded'")[0];
        assert!(negated.negated);
        let or = Query::parse("status:'a' or status:'b' OR status:'c'").unwrap();
        assert_eq!((or.join, or.clauses.len()), (Join::Or, 3));
        let spaces = Query::parse("status:'a' currency:'usd' and amount:5").unwrap();
        assert_eq!((spaces.join, spaces.clauses.len()), (Join::And, 3));
    }

    /// What the language does not allow is refused with a message saying why.
    #[test]
    fn refuses_what_stripe_refuses() {
        assert!(refusal("status:'a' AND currency:'usd' OR amount>1").contains("cannot combine AND and OR"));
        assert!(refusal("(status:'a' OR status:'b')").contains("unable to parse"));
        assert!(refusal("nope:'x'").contains("unsupported search field"));
        assert!(refusal("status:succeeded").contains("must be quoted"));
        assert!(refusal("status:'succeeded").contains("not closed"));
        assert!(refusal("status~'succ'").contains("token field"));
        assert!(refusal("currency>'usd'").contains("string field"));
        assert!(refusal("amount~'10'").contains("numeric field"));
        assert!(refusal("amount>ten").contains("whole number"));
        assert!(refusal("amount>null").contains("numeric field"));
        assert!(refusal("currency~'us'").contains("at least 3"));
        assert!(refusal("metadata[k]:'v'").contains("unable to parse"));
        assert!(refusal("status:'a'AND status:'b'").contains("unable to parse"));
        let eleven = ["amount>1"; 11].join(" AND ");
        assert!(refusal(&eleven).contains("at most 10"));
        assert!(Query::parse(&["amount>1"; 10].join(" AND ")).is_ok());
    }
}
