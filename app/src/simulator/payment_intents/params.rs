//! The parameters of `POST /v1/payment_intents`, validated as Stripe does before executing.

use std::collections::BTreeMap;

use crate::simulator::error::ApiError;
use crate::simulator::form::{
    Form, apply_metadata, check_amount, invalid_enum, is_list_index, non_empty, parse_amount, parse_bool,
    parse_currency,
};
use crate::simulator::objects::{AutomaticPaymentMethods, CaptureMethod, Draft};

/// What `parameter_unknown` lists as supported.
const SUPPORTED: &str = "amount, currency, payment_method, confirm, description, metadata, capture_method, \
                         automatic_payment_methods, payment_method_types (or allowed_payment_method_types), return_url, \
                         mandate_data and expand";

/// Stripe's answer to a confirmation that might redirect but has nowhere to return to (API
/// versions since 2023-08-16, where automatic payment methods are on by default).
const RETURN_URL_REQUIRED: &str = "A `return_url` must be specified because this Payment Intent is configured \
     to automatically accept the payment methods enabled in the Dashboard, some of which may require a full \
     page redirect to succeed. If you do not want to accept redirect-based payment methods, set \
     `automatic_payment_methods[enabled]` to `true` and `automatic_payment_methods[allow_redirects]` to \
     `never` when creating Setup Intents and Payment Intents.";

/// The payment method types automatic payment methods offer in the simulator (its "Dashboard").
pub(super) const AUTOMATIC_TYPES: &[&str] = &["card", "us_bank_account"];

/// The payment method types that can be authorized now and captured later: Stripe supports
/// manual capture for cards, not for ACH debits, so automatic payment methods with
/// `capture_method=manual` offer cards only.
const MANUAL_CAPTURE_TYPES: &[&str] = &["card"];

/// The validated parameters of a create call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CreateParams {
    /// Smallest currency unit, at least 1.
    pub amount: i64,
    /// Lowercase, one Stripe supports.
    pub currency: String,
    /// A test payment method id; whether it exists is checked during execution, as on Stripe.
    pub payment_method: Option<String>,
    /// Confirm (charge) immediately.
    pub confirm: bool,
    pub description: Option<String>,
    pub metadata: BTreeMap<String, String>,
    /// `automatic_async` unless `automatic` or `manual` (authorize now, capture later) was asked for.
    pub capture_method: CaptureMethod,
    /// As rendered on the PaymentIntent: as sent, or Stripe's default (enabled, redirects
    /// allowed) when neither it nor `payment_method_types` was sent.
    pub automatic_payment_methods: Option<AutomaticPaymentMethods>,
    /// As rendered on the PaymentIntent: as sent, or what automatic payment methods offer, or
    /// `["card"]`.
    pub payment_method_types: Vec<String>,
    /// They were sent under their newer name, `allowed_payment_method_types`.
    pub allowed_name: bool,
    /// Where a redirect-based confirmation (3-D Secure) sends the customer back to.
    pub return_url: Option<String>,
    /// `expand[]=latest_charge`: render the charge object instead of its id.
    pub expand_latest_charge: bool,
}

impl CreateParams {
    /// Validates a create request's form. Repeated scalar keys keep the last value, as Stripe's
    /// (Rack's) parser does. `legacy_version`: the request's `Stripe-Version` predates automatic
    /// payment methods by default.
    pub fn from_form(form: &Form, legacy_version: bool) -> Result<Self, ApiError> {
        let mut amount = None;
        let mut currency = None;
        let mut params = Self {
            amount: 0,
            currency: String::new(),
            payment_method: None,
            confirm: false,
            description: None,
            metadata: BTreeMap::new(),
            capture_method: CaptureMethod::AutomaticAsync,
            automatic_payment_methods: None,
            payment_method_types: Vec::new(),
            allowed_name: false,
            return_url: None,
            expand_latest_charge: false,
        };
        let mut automatic_enabled = None;
        let mut allow_redirects = None;

        for param in form.params()? {
            let (key, value) = (param.key, param.value);
            match (param.name, param.inner) {
                ("amount", None) => amount = Some(parse_amount("amount", value)?),
                ("currency", None) => currency = Some(parse_currency(value)?),
                ("payment_method", None) => params.payment_method = non_empty(value),
                ("confirm", None) => params.confirm = parse_bool(key, value)?.unwrap_or(false),
                ("description", None) => params.description = non_empty(value),
                ("capture_method", None) => params.capture_method = parse_capture_method(value)?,
                ("return_url", None) => params.return_url = non_empty(value),
                ("metadata", inner) => apply_metadata(&mut params.metadata, inner, value)?,
                // `allowed_payment_method_types` is the newer API versions' name for the same list.
                ("payment_method_types" | "allowed_payment_method_types", inner) if is_list_index(inner) => {
                    params.allowed_name |= param.name == "allowed_payment_method_types";
                    if !value.is_empty() {
                        params.payment_method_types.push(value.to_owned());
                    }
                }
                // Expansion only changes how related objects are rendered; every other id the
                // simulator returns is valid unexpanded, and async-stripe accepts either form.
                ("expand", inner) if is_list_index(inner) => {
                    params.expand_latest_charge |= value == "latest_charge";
                }
                // A mandate records the customer's consent to a bank debit; the simulator keeps
                // none, so the details are accepted and not checked.
                ("mandate_data", Some(_)) => {}
                ("automatic_payment_methods", Some("enabled")) => automatic_enabled = parse_bool(key, value)?,
                ("automatic_payment_methods", Some("allow_redirects")) => {
                    allow_redirects = match value {
                        "" => None,
                        "always" => Some("always"),
                        "never" => Some("never"),
                        _ => return Err(invalid_enum(key, value, "always, never")),
                    };
                }
                _ => return Err(ApiError::parameter_unknown(key, SUPPORTED)),
            }
        }

        params.amount = amount.ok_or_else(|| ApiError::parameter_missing("amount"))?;
        params.currency = currency.ok_or_else(|| ApiError::parameter_missing("currency"))?;
        check_amount("amount", params.amount, &params.currency)?;
        let sent_types = !params.payment_method_types.is_empty();
        params.automatic_payment_methods = match (automatic_enabled, allow_redirects) {
            (Some(_), _) if sent_types => {
                return Err(ApiError::invalid_request(
                    "You may only specify one of these parameters: automatic_payment_methods, \
                     payment_method_types.",
                )
                .param("automatic_payment_methods"));
            }
            (Some(enabled), allow_redirects) => Some(AutomaticPaymentMethods {
                enabled,
                allow_redirects: enabled.then_some(allow_redirects.unwrap_or("always")),
            }),
            (None, Some(_)) => return Err(ApiError::parameter_missing("automatic_payment_methods[enabled]")),
            (None, None) if sent_types || legacy_version => None,
            (None, None) => Some(AutomaticPaymentMethods { enabled: true, allow_redirects: Some("always") }),
        };
        let automatic = params.automatic_payment_methods.as_ref().filter(|automatic| automatic.enabled);
        let manual = params.capture_method == CaptureMethod::Manual;
        if !sent_types {
            let types = match automatic {
                Some(_) if manual => MANUAL_CAPTURE_TYPES,
                Some(_) => AUTOMATIC_TYPES,
                None => &["card"],
            };
            params.payment_method_types = types.iter().map(|&kind| kind.to_owned()).collect();
        }
        let uncapturable =
            params.payment_method_types.iter().find(|kind| !MANUAL_CAPTURE_TYPES.contains(&kind.as_str()));
        if let Some(kind) = uncapturable.filter(|_| manual) {
            return Err(ApiError::invalid_request(format!(
                "The payment method type {kind} cannot be authorized for a later capture: \
                 capture_method=manual is available for card payments only."
            ))
            .param("capture_method"));
        }
        if params.confirm && params.payment_method.is_none() {
            return Err(ApiError::invalid_request(
                "You cannot confirm this PaymentIntent because it's missing a payment method. \
                 Pass `payment_method` (for example `pm_card_visa`) along with `confirm=true`.",
            )
            .code("payment_intent_unexpected_state"));
        }
        let may_redirect = automatic.is_some_and(|automatic| automatic.allow_redirects != Some("never"));
        if params.confirm && may_redirect && params.return_url.is_none() {
            return Err(ApiError::invalid_request(RETURN_URL_REQUIRED).param("return_url"));
        }
        Ok(params)
    }
}

impl CreateParams {
    /// The PaymentIntent these parameters make, for a create call with `idempotency_key`.
    pub fn draft(&self, idempotency_key: Option<String>) -> Draft {
        Draft {
            amount: self.amount,
            currency: self.currency.clone(),
            description: self.description.clone(),
            metadata: self.metadata.clone(),
            payment_method: self.payment_method.clone(),
            capture_method: self.capture_method,
            automatic_payment_methods: self.automatic_payment_methods.clone(),
            payment_method_types: self.payment_method_types.clone(),
            allowed_payment_method_types: self.allowed_name,
            created_with_key: idempotency_key,
        }
    }
}

fn parse_capture_method(value: &str) -> Result<CaptureMethod, ApiError> {
    match value {
        "" => Ok(CaptureMethod::AutomaticAsync),
        value => CaptureMethod::parse(value)
            .ok_or_else(|| invalid_enum("capture_method", value, "automatic, automatic_async, manual")),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use stripe::StripeRequest;
    use stripe_core::payment_intent::{
        CreatePaymentIntent, CreatePaymentIntentAutomaticPaymentMethods,
        CreatePaymentIntentAutomaticPaymentMethodsAllowRedirects,
    };
    use stripe_types::Currency;

    use super::*;

    fn params(body: &str) -> Result<CreateParams, ApiError> {
        CreateParams::from_form(&Form::parse(body.as_bytes()), false)
    }

    fn error_code(body: &str) -> (Option<&'static str>, Option<String>) {
        let error = params(body).expect_err("the request is invalid").error;
        (error.code, error.param)
    }

    /// The body async-stripe builds (via serde_qs: `+` for space, `%2B` for plus, raw brackets,
    /// indexed arrays, percent-encoded brackets inside keys) decodes to what was set.
    #[test]
    fn decodes_what_async_stripe_encodes() {
        let metadata =
            HashMap::from([("order id".to_owned(), "a+b&c=d é [x]".to_owned()), ("k[1]".to_owned(), "v".to_owned())]);
        let mut automatic = CreatePaymentIntentAutomaticPaymentMethods::new(true);
        automatic.allow_redirects = Some(CreatePaymentIntentAutomaticPaymentMethodsAllowRedirects::Never);
        let request = CreatePaymentIntent::new(1234, Currency::EUR)
            .confirm(true)
            .payment_method("pm_card_visa")
            .description("two words+1")
            .metadata(metadata)
            .expand(vec!["latest_charge".to_owned(), "customer".to_owned()])
            .automatic_payment_methods(automatic);
        let body = request.build().body.expect("a create call has a form body");

        let parsed = params(&body).expect("async-stripe's encoding is valid");

        assert_eq!(parsed.amount, 1234);
        assert_eq!(parsed.currency, "eur");
        assert!(parsed.confirm && parsed.expand_latest_charge);
        assert_eq!(parsed.payment_method.as_deref(), Some("pm_card_visa"));
        assert_eq!(parsed.description.as_deref(), Some("two words+1"));
        assert_eq!(parsed.metadata["order id"], "a+b&c=d é [x]");
        assert_eq!(parsed.metadata["k[1]"], "v");
        assert_eq!(
            parsed.automatic_payment_methods,
            Some(AutomaticPaymentMethods { enabled: true, allow_redirects: Some("never") })
        );
        assert_eq!(parsed.payment_method_types, AUTOMATIC_TYPES);
    }

    /// The forms curl and other clients send: `expand[]`, `payment_method_types[]`, an
    /// upper-case currency, `false`.
    #[test]
    fn accepts_other_client_spellings() {
        let parsed = params("amount=50&currency=USD&confirm=false&expand[]=latest_charge&payment_method_types[]=card")
            .expect("valid request");
        assert_eq!(parsed.currency, "usd");
        assert!(!parsed.confirm);
        assert_eq!(parsed.capture_method, CaptureMethod::AutomaticAsync);
        assert_eq!((parsed.automatic_payment_methods, parsed.payment_method_types), (None, vec!["card".to_owned()]));
    }

    /// `capture_method=manual` (async-stripe's encoding) authorizes for a later capture: automatic
    /// payment methods then offer cards only, and a bank debit asked for by name is refused.
    #[test]
    fn manual_capture_is_for_cards() {
        let mut automatic = CreatePaymentIntentAutomaticPaymentMethods::new(true);
        automatic.allow_redirects = Some(CreatePaymentIntentAutomaticPaymentMethodsAllowRedirects::Never);
        let request = CreatePaymentIntent::new(1234, Currency::EUR)
            .capture_method(stripe_core::PaymentIntentCaptureMethod::Manual)
            .automatic_payment_methods(automatic);
        let parsed = params(&request.build().body.expect("a form body")).expect("manual capture is valid");
        assert_eq!(
            (parsed.capture_method, parsed.payment_method_types),
            (CaptureMethod::Manual, vec!["card".to_owned()])
        );
        let automatic = params("amount=1&currency=usd&capture_method=automatic").expect("valid");
        assert_eq!(automatic.capture_method, CaptureMethod::Automatic);
        let bank = "amount=1&currency=usd&capture_method=manual&payment_method_types[0]=us_bank_account";
        assert_eq!(error_code(bank), (None, Some("capture_method".to_owned())));
        assert_eq!(error_code("amount=1&currency=usd&capture_method=later"), (None, Some("capture_method".to_owned())));
    }

    /// A confirmation that might redirect needs a `return_url`, unless redirects are off, the
    /// types are explicit, or the API version predates automatic payment methods.
    #[test]
    fn return_url_rule() {
        let confirm = "amount=1&currency=usd&confirm=true&payment_method=pm_card_visa";
        assert_eq!(error_code(confirm), (None, Some("return_url".to_owned())));
        let always = format!("{confirm}&automatic_payment_methods[enabled]=true");
        assert_eq!(error_code(&always), (None, Some("return_url".to_owned())));
        for fixed in [
            format!("{confirm}&return_url=https://shop.example/back"),
            format!(
                "{confirm}&automatic_payment_methods[enabled]=true&automatic_payment_methods[allow_redirects]=never"
            ),
            format!("{confirm}&payment_method_types[0]=card"),
            format!("{confirm}&automatic_payment_methods[enabled]=false"),
        ] {
            assert!(params(&fixed).is_ok(), "{fixed}");
        }
        assert!(CreateParams::from_form(&Form::parse(confirm.as_bytes()), true).is_ok(), "a 2022 API version");
        let unconfirmed = params("amount=1&currency=usd&payment_method=pm_card_visa").expect("no confirmation");
        assert_eq!(
            unconfirmed.automatic_payment_methods,
            Some(AutomaticPaymentMethods { enabled: true, allow_redirects: Some("always") }),
            "Stripe's default"
        );
    }

    /// Each kind of bad input gets Stripe's code and names the parameter.
    #[test]
    fn rejects_bad_parameters_like_stripe() {
        let missing = (Some("parameter_missing"), Some("amount".to_owned()));
        assert_eq!(error_code("currency=usd"), missing);
        let missing = (Some("parameter_missing"), Some("currency".to_owned()));
        assert_eq!(error_code("amount=100"), missing);
        let not_integer = (Some("parameter_invalid_integer"), Some("amount".to_owned()));
        assert_eq!(error_code("amount=12.5&currency=usd"), not_integer);
        assert_eq!(error_code("amount=0&currency=usd"), not_integer);
        let empty = (Some("parameter_invalid_empty"), Some("amount".to_owned()));
        assert_eq!(error_code("amount=&currency=usd"), empty);
        let unknown = (Some("parameter_unknown"), Some("customer".to_owned()));
        assert_eq!(error_code("amount=1&currency=usd&customer=cus_1"), unknown);
        let unknown = (Some("parameter_unknown"), Some("automatic_payment_methods[x]".to_owned()));
        assert_eq!(error_code("amount=1&currency=usd&automatic_payment_methods[x]=1"), unknown);
        assert_eq!(error_code("amount=1&currency=xyz"), (None, Some("currency".to_owned())));
        assert_eq!(error_code("amount=1&currency=usd&confirm=yes"), (None, Some("confirm".to_owned())));
        assert_eq!(error_code("amount=1&currency=usd&a]=1"), (None, Some("a]".to_owned())));
        let both = "amount=1&currency=usd&allowed_payment_method_types[0]=card&automatic_payment_methods[enabled]=true";
        assert_eq!(error_code(both), (None, Some("automatic_payment_methods".to_owned())));
        let amount = Some("amount".to_owned());
        assert_eq!(error_code("amount=12345&currency=kwd"), (None, amount.clone()), "three decimals end in 0");
        assert_eq!(
            error_code("amount=550&currency=isk"),
            (Some("invalid_charge_amount_no_decimal_compatible"), amount)
        );
        assert!(params("amount=12340&currency=kwd").is_ok() && params("amount=500&currency=ISK").is_ok());
        assert!(params("amount=1045&currency=huf").is_ok(), "HUF's rule is about payouts");
        let no_pm = (Some("payment_intent_unexpected_state"), None);
        assert_eq!(error_code("amount=1&currency=usd&confirm=true"), no_pm);
    }
}
