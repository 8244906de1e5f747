//! Stripe's search query language (<https://docs.stripe.com/search#search-query-language>), the
//! subset the simulator answers: clauses `field:'value'` joined by `AND`, on `status`,
//! `currency` and `metadata['key']` (exact, case-sensitive match; double quotes work too).
//! Anything else (`OR`, `-` negation, `~` substring, `>`/`<`, `NULL`, other fields) is refused
//! with a 400 naming the problem, rather than answered wrongly.

use crate::simulator::error::ApiError;
use crate::simulator::objects::PaymentIntent;

/// One `field:value` clause.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Clause {
    Status(String),
    Currency(String),
    Metadata { key: String, value: String },
}

/// A parsed query: every clause must match.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Query {
    clauses: Vec<Clause>,
}

const FIELDS: &str = "status, currency and metadata['key']";

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::invalid_request(message).param("query")
}

impl Query {
    pub fn parse(query: &str) -> Result<Self, ApiError> {
        let mut parser = Parser { rest: query.trim() };
        if parser.rest.is_empty() {
            return Err(ApiError::parameter_empty("query"));
        }
        let mut clauses = vec![parser.clause()?];
        loop {
            parser.skip_spaces();
            if parser.rest.is_empty() {
                break;
            }
            let word: String = parser.rest.chars().take_while(|c| !c.is_whitespace()).collect();
            match word.as_str() {
                "AND" => {
                    parser.rest = &parser.rest[word.len()..];
                    if !parser.rest.starts_with(char::is_whitespace) {
                        return Err(invalid("We were unable to parse your search query: expected a clause after AND."));
                    }
                    parser.skip_spaces();
                    clauses.push(parser.clause()?);
                }
                "OR" => {
                    return Err(invalid(
                        "The payonce Stripe simulator supports only AND between search clauses, not OR.",
                    ));
                }
                _ => {
                    return Err(invalid(format!(
                        "We were unable to parse your search query near '{word}': clauses must be joined \
                         with AND."
                    )));
                }
            }
        }
        Ok(Self { clauses })
    }

    pub fn matches(&self, intent: &PaymentIntent) -> bool {
        self.clauses.iter().all(|clause| match clause {
            Clause::Status(status) => intent.status.as_str() == status,
            Clause::Currency(currency) => intent.currency.eq_ignore_ascii_case(currency),
            Clause::Metadata { key, value } => intent.metadata.get(key) == Some(value),
        })
    }
}

struct Parser<'a> {
    rest: &'a str,
}

impl Parser<'_> {
    fn skip_spaces(&mut self) {
        self.rest = self.rest.trim_start();
    }

    fn clause(&mut self) -> Result<Clause, ApiError> {
        if self.rest.starts_with('-') {
            return Err(invalid("The payonce Stripe simulator does not support negated (-) search clauses."));
        }
        // A metadata key may itself hold an operator character: look after its bracket.
        let search_from = match self.rest.starts_with("metadata[") {
            true => self.rest.find(']').unwrap_or(0),
            false => 0,
        };
        let field_end = self.rest[search_from..].find([':', '~', '>', '<', '=']).map(|at| at + search_from);
        let field_end = field_end.ok_or_else(|| {
            invalid(format!("We were unable to parse your search query near '{}': expected field:'value'.", self.rest))
        })?;
        let field = self.rest[..field_end].trim();
        let operator = &self.rest[field_end..];
        if !operator.starts_with(':') || operator.starts_with(":>") || operator.starts_with(":<") {
            return Err(invalid(
                "The payonce Stripe simulator supports only exact matches (field:'value') in searches, \
                 not ~, >, < or =.",
            ));
        }
        self.rest = &operator[1..];
        let value = self.quoted()?;
        match field {
            "status" => Ok(Clause::Status(value)),
            "currency" => Ok(Clause::Currency(value)),
            _ => match metadata_key(field) {
                Some(key) => Ok(Clause::Metadata { key, value }),
                None => Err(invalid(format!(
                    "Field '{field}' is an unsupported search field for resource payment_intents in the \
                     payonce Stripe simulator, which supports {FIELDS}. See \
                     https://docs.stripe.com/search#query-fields-for-payment-intents."
                ))),
            },
        }
    }

    /// A value in single or double quotes, with `\'`/`\"` escapes.
    fn quoted(&mut self) -> Result<String, ApiError> {
        let mut chars = self.rest.char_indices();
        let quote = match chars.next() {
            Some((_, quote @ ('\'' | '"'))) => quote,
            _ => return Err(invalid("Search values must be quoted: field:'value'.")),
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
                    return Ok(value);
                }
                _ => value.push(c),
            }
        }
        Err(invalid("We were unable to parse your search query: a quoted value is not closed."))
    }
}

/// `metadata['key']` or `metadata["key"]` → `key`.
fn metadata_key(field: &str) -> Option<String> {
    let inner = field.strip_prefix("metadata[")?.strip_suffix(']')?;
    let quote = inner.chars().next().filter(|c| *c == '\'' || *c == '"')?;
    let key = inner.strip_prefix(quote)?.strip_suffix(quote)?;
    (!key.is_empty()).then(|| key.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clauses(query: &str) -> Vec<Clause> {
        Query::parse(query).expect("a supported query").clauses
    }

    fn refusal(query: &str) -> String {
        let error = Query::parse(query).expect_err("refused").error;
        assert_eq!(error.param.as_deref(), Some("query"), "{query}");
        error.message
    }

    /// Metadata and status clauses, either quote, joined by AND.
    #[test]
    fn parses_the_supported_subset() {
        let metadata = |key: &str, value: &str| Clause::Metadata { key: key.into(), value: value.into() };
        assert_eq!(clauses("metadata['payonce_payment']:'pay_1'"), [metadata("payonce_payment", "pay_1")]);
        assert_eq!(
            clauses(r#"status:"succeeded"  AND metadata["order"]:'it\'s'"#),
            [Clause::Status("succeeded".into()), metadata("order", "it's")]
        );
        assert_eq!(clauses("currency:'usd' AND status:'processing'").len(), 2);
        assert_eq!(clauses("metadata['a:b']:'c'"), [metadata("a:b", "c")]);
    }

    /// Other syntax is refused with a message saying what is not supported.
    #[test]
    fn refuses_other_syntax() {
        assert!(refusal("status:'a' OR status:'b'").contains("OR"));
        assert!(refusal("-status:'succeeded'").contains("negated"));
        assert!(refusal("metadata['k']~'v'").contains("exact"));
        assert!(refusal("amount>100").contains("exact"));
        assert!(refusal("customer:'cus_1'").contains("unsupported search field"));
        assert!(refusal("status:succeeded").contains("quoted"));
        assert!(refusal("status:'succeeded").contains("not closed"));
        assert!(refusal("status:'a' status:'b'").contains("AND"));
        assert!(refusal("metadata[k]:'v'").contains("unsupported"));
    }
}
