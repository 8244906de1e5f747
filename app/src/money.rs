//! Amounts of money as Stripe counts them: in each currency's minor unit *as Stripe defines it*.
//! The one place that knows how many decimals an `amount` has, which amounts Stripe refuses for
//! a currency, and how an amount is written for a person and read back from one. The API's
//! validation (payments, refunds), the dashboard's refund form, the batch file, every page and
//! the simulator all ask here.
//!
//! The minor unit is ISO 4217's (the `iso_currency` crate's table), except where Stripe's
//! "Supported currencies" page (<https://docs.stripe.com/currencies>) says otherwise:
//!
//! - "Currencies are two-decimal currencies unless otherwise specified": a currency Stripe
//!   supports that ISO 4217 has withdrawn (ANG, STD, …) is two-decimal.
//! - Zero-decimal currencies (BIF, CLP, DJF, GNF, JPY, KMF, KRW, MGA, PYG, RWF, UGX, VND, VUV,
//!   XAF, XOF, XPF): "the charge and the amount are the same, without requiring
//!   multiplication". ISO 4217 agrees, except for **MGA** (ISO: two decimals; Stripe: none) and
//!   UGX (below).
//! - Three-decimal currencies (BHD, JOD, KWD, OMR, TND): the API takes them "for the standard
//!   payment flows, including Payment Intents, Refunds, and Disputes", but "require[s] the
//!   least-significant (last) digit to be 0 … 5.124 KWD must be rounded to 5120 or 5130". ISO
//!   4217 agrees on the three decimals; the last digit is Stripe's rule.
//! - Special cases:
//!   - **ISK**: "ISK transitioned to a zero-decimal currency, but backward compatibility requires
//!     you to represent it as a two-decimal value, where the decimal amount is always `00`. For
//!     example, to charge 5 ISK, provide an `amount` value of `500`. You can't charge fractions
//!     of ISK." (ISO: no decimals.) Stripe answers any other amount, charge or refund, with
//!     `400 invalid_charge_amount_no_decimal_compatible: Invalid amount. Currency ISK has become
//!     effectively zero-decimal and charged amounts must be evenly divisible by 100`
//!     (<https://support.stripe.com/questions/deprecation-of-fractional-isk-charges-and-refunds>).
//!   - **UGX**: the same words as ISK, word for word, although the zero-decimal list names UGX
//!     too. The special case is the specific statement, and it is what the API does: Stripe's
//!     answer to `amount=5` in UGX is "Currency UGX has become effectively zero-decimal and
//!     charged amounts must be evenly divisible by 100" (quoted from a merchant's log in
//!     woocommerce/woocommerce-gateway-stripe#2674, which then stopped treating UGX as
//!     zero-decimal). So UGX is two-decimal, whole shillings only, like ISK.
//!   - **HUF** and **TWD**: "Stripe treats HUF [TWD] as a zero-decimal currency for payouts, even
//!     though you can charge two-decimal amounts." The rule is about payouts, which payonce
//!     does not make: charges and refunds take any two-decimal amount (`1045` is HUF 10.45), as
//!     ISO 4217 says. Tested, so that nobody "fixes" them into zero-decimal currencies.
//!
//! Which currencies Stripe supports at all is async-stripe's list (`stripe_types::Currency`),
//! plus the five three-decimal currencies that list lacks.

use std::str::FromStr;

/// The largest amount accepted, in minor units: Stripe's limit for most currencies (eight digits).
/// Payments, refunds, captures and the batch file refuse more.
pub const MAX_AMOUNT: i64 = 99_999_999;

/// Why `amount` is no amount payonce takes (at least one minor unit, at most [`MAX_AMOUNT`]), or
/// `None`: one rule and one wording for a payment's, a refund's and a capture's amount.
pub fn out_of_range(amount: i64) -> Option<String> {
    if amount <= 0 {
        Some("must be a positive integer (minor units, e.g. cents)".into())
    } else if amount > MAX_AMOUNT {
        Some(format!("must be at most {MAX_AMOUNT}"))
    } else {
        None
    }
}

/// Stripe's three-decimal currencies (docs.stripe.com/currencies, "Three-decimal currencies"),
/// which async-stripe's list of currencies does not name.
const THREE_DECIMAL: [&str; 5] = ["BHD", "JOD", "KWD", "OMR", "TND"];

/// Where Stripe's `amount` is not in ISO 4217's minor unit: the code, the decimals Stripe's
/// amounts have, and the amounts it takes (see the module's documentation for each source).
const EXCEPTIONS: [(&str, u32, Step); 3] =
    [("MGA", 0, Step::Any), ("ISK", 2, Step::WholeUnits), ("UGX", 2, Step::WholeUnits)];

/// Which amounts Stripe takes in a currency, besides their being whole minor units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Any whole number of minor units.
    Any,
    /// Three-decimal currencies: the last digit is 0 (a multiple of 10).
    LastDigitZero,
    /// ISK and UGX: written with two decimals that are always `00` (a multiple of 100).
    WholeUnits,
}

/// A currency Stripe supports, and the minor unit of its API amounts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Currency {
    /// The ISO 4217 code, upper case.
    code: [u8; 3],
    /// How many decimals an amount has: 0 (JPY), 2 (USD, ISK), 3 (KWD).
    decimals: u32,
    /// Which amounts Stripe takes.
    step: Step,
}

/// Why an amount typed by a person is not one ([`Currency::parse`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AmountError {
    /// Not digits with at most one decimal point, or zero.
    NotAnAmount,
    /// More decimals than the currency has.
    TooManyDecimals,
    /// An amount Stripe refuses for the currency ([`Step`]).
    Refused,
}

impl Currency {
    /// The currency of a code (any case) that Stripe supports; `None` for any other text.
    pub fn of(code: &str) -> Option<Self> {
        let upper = code.to_ascii_uppercase();
        let bytes: [u8; 3] = upper.as_bytes().try_into().ok()?;
        if !bytes.iter().all(u8::is_ascii_uppercase) {
            return None;
        }
        let three_decimal = THREE_DECIMAL.contains(&upper.as_str());
        let known = matches!(stripe_types::Currency::from_str(&code.to_ascii_lowercase()), Ok(c) if !matches!(c, stripe_types::Currency::Unknown(_)));
        if !(three_decimal || known) {
            return None;
        }
        let iso = iso_currency::Currency::from_code(&upper).and_then(|c| c.exponent());
        let (decimals, step) = match EXCEPTIONS.iter().find(|(c, ..)| *c == upper) {
            Some(&(_, decimals, step)) => (decimals, step),
            // Stripe: "two-decimal currencies unless otherwise specified".
            None => match u32::from(iso.unwrap_or(2)) {
                3 => (3, Step::LastDigitZero),
                decimals => (decimals, Step::Any),
            },
        };
        Some(Self { code: bytes, decimals, step })
    }

    /// The ISO 4217 code, upper case: `JPY`.
    pub fn code(&self) -> &str {
        std::str::from_utf8(&self.code).unwrap_or("???")
    }

    /// How many decimals Stripe's amounts have: `1` is one yen, one cent, one fils.
    pub fn decimals(&self) -> u32 {
        self.decimals
    }

    /// Which amounts Stripe takes.
    pub fn step(&self) -> Step {
        self.step
    }

    /// Minor units in one major unit.
    fn scale(&self) -> i64 {
        10_i64.pow(self.decimals)
    }

    /// Whether a person writes this amount without decimals: always for a zero-decimal currency,
    /// and for ISK and UGX, whose `00` is only Stripe's way of writing them (unless an amount
    /// from before the rule has a fraction, which is then shown).
    fn whole(&self, amount: i64) -> bool {
        self.decimals == 0 || (self.step == Step::WholeUnits && amount % self.scale() == 0)
    }

    /// Whether Stripe takes this amount in this currency: `Err` says why not, in the API's
    /// terms (minor units), for a `400` naming the field.
    pub fn check(&self, amount: i64) -> Result<(), String> {
        let code = self.code();
        match self.step {
            Step::LastDigitZero if amount % 10 != 0 => Err(format!(
                "must be a multiple of 10 for {code}: Stripe takes three-decimal amounts only with a last digit of 0 \
                 (e.g. 12340 for 12.340 {code})"
            )),
            Step::WholeUnits if amount % 100 != 0 => Err(format!(
                "must be a multiple of 100 for {code}: Stripe takes whole {code} only, written with two decimals of \
                 00 (e.g. 500 for 5 {code})"
            )),
            _ => Ok(()),
        }
    }

    /// An amount for people, with its code: `100,000 JPY`, `12.340 KWD`, `5 ISK`, `1,234.50 USD`.
    pub fn format(&self, amount: i64) -> String {
        format!("{} {}", self.written(amount, true), self.code())
    }

    /// An amount as the refund form writes it and [`Currency::parse`] reads it: `100000`,
    /// `12.340`, `5`, `1234.50` (no thousands separators, no code).
    pub fn major(&self, amount: i64) -> String {
        self.written(amount, false)
    }

    fn written(&self, amount: i64, grouped: bool) -> String {
        let sign = if amount < 0 { "-" } else { "" };
        let scale = self.scale().unsigned_abs();
        let (whole, fraction) = (amount.unsigned_abs() / scale, amount.unsigned_abs() % scale);
        let whole = if grouped { thousands(whole) } else { whole.to_string() };
        if self.whole(amount) {
            format!("{sign}{whole}")
        } else {
            format!("{sign}{whole}.{fraction:0width$}", width = self.decimals as usize)
        }
    }

    /// An amount typed by a person in the currency's major unit (`500` yen, `12.5` or `12.50`
    /// dollars, `1.25` dinars), in minor units; refuses anything else, zero, more decimals than
    /// the currency has, and amounts Stripe refuses for it. Thousands separators are refused
    /// too: `1,250` is a thousand and more in one country and one and a quarter in another.
    pub fn parse(&self, text: &str) -> Result<i64, AmountError> {
        let text = text.trim();
        let (whole, fraction) = match text.split_once('.') {
            Some((whole, fraction)) => (whole, Some(fraction)),
            None => (text, None),
        };
        let digits = |part: &str| !part.is_empty() && part.len() <= 15 && part.bytes().all(|b| b.is_ascii_digit());
        if !digits(whole) || fraction.is_some_and(|fraction| !digits(fraction)) {
            return Err(AmountError::NotAnAmount);
        }
        let fraction = fraction.unwrap_or_default();
        if fraction.len() > self.decimals as usize {
            return Err(AmountError::TooManyDecimals);
        }
        let padded = format!("{fraction:0<width$}", width = self.decimals as usize);
        let amount = whole
            .parse::<i64>()
            .ok()
            .and_then(|whole| whole.checked_mul(self.scale()))
            .and_then(|minor| minor.checked_add(padded.parse().unwrap_or(0)))
            .filter(|amount| *amount > 0)
            .ok_or(AmountError::NotAnAmount)?;
        self.check(amount).map_err(|_| AmountError::Refused)?;
        Ok(amount)
    }

    /// What [`Currency::parse`]'s error means to the person who typed the text, after "“12.345”":
    /// `is not an amount in USD: write it like 12.50`.
    pub fn explain(&self, error: &AmountError) -> String {
        let (code, example) = (self.code(), self.example());
        match (error, self.step) {
            (AmountError::NotAnAmount, _) => format!("is not an amount in {code}: write it like {example}"),
            (AmountError::TooManyDecimals, _) if self.decimals == 0 => {
                format!("is not an amount in {code}, which has no decimals: write it like {example}")
            }
            (AmountError::TooManyDecimals, _) => format!(
                "is not an amount in {code}, which has {} decimals at most: write it like {example}",
                self.decimals
            ),
            (AmountError::Refused, Step::WholeUnits) => {
                format!(
                    "is not an amount Stripe takes: it charges and refunds whole {code} only (write it like {example})"
                )
            }
            (AmountError::Refused, _) => format!(
                "is not an amount Stripe takes: its {code} amounts end in 0 (write two decimals, like 1.25, or a third \
                 of 0, like 1.250)"
            ),
        }
    }

    /// A typical amount as a person writes it: `12.50`, `12.500`, or `1250` without decimals.
    fn example(&self) -> String {
        if self.whole(0) { "1250".to_owned() } else { self.major(12 * self.scale() + self.scale() / 2) }
    }

    /// The HTML `pattern` of a field holding such an amount (what [`Currency::parse`] reads, up
    /// to Stripe's refusals, which the server explains).
    pub fn input_pattern(&self) -> String {
        match self.decimals {
            0 => "[0-9]+".to_owned(),
            decimals => format!("[0-9]+(\\.[0-9]{{1,{decimals}}})?"),
        }
    }
}

/// An amount in minor units of `currency` for people: `12.50 USD`, `100,000 JPY`. A code Stripe
/// does not support (never stored: validation refuses it) is written with two decimals, Stripe's
/// default.
pub fn format(amount: i64, currency: &str) -> String {
    let fallback = Currency { code: *b"???", decimals: 2, step: Step::Any };
    match Currency::of(currency) {
        Some(currency) => currency.format(amount),
        None => format!("{} {}", fallback.written(amount, true), currency.to_ascii_uppercase()),
    }
}

/// A whole number with a comma between groups of three digits: `97,500`.
fn thousands(number: u64) -> String {
    let digits = number.to_string();
    let groups: Vec<&str> =
        digits.as_bytes().rchunks(3).rev().map(|group| std::str::from_utf8(group).unwrap_or_default()).collect();
    groups.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(code: &str) -> Currency {
        Currency::of(code).unwrap_or_else(|| panic!("{code} is supported"))
    }

    /// Stripe's zero-decimal currencies, as its page lists them (with UGX, see below).
    const STRIPE_ZERO_DECIMAL: [&str; 16] = [
        "BIF", "CLP", "DJF", "GNF", "JPY", "KMF", "KRW", "MGA", "PYG", "RWF", "UGX", "VND", "VUV", "XAF", "XOF", "XPF",
    ];

    /// Every currency async-stripe knows, and the three-decimal ones: ISO 4217's minor unit plus
    /// Stripe's exceptions give exactly Stripe's published lists: its zero-decimal currencies
    /// (all but UGX, a special case), its three-decimal ones, and two decimals for every other.
    #[test]
    fn iso_plus_the_exceptions_is_stripes_lists() {
        let codes = "byn mmk aed afn all amd ang aoa ars aud awg azn bam bbd bdt bgn bif bmd bnd bob brl bsd bwp bzd \
                     cad cdf chf clp cny cop crc cve czk djf dkk dop dzd eek egp etb eur fjd fkp gbp gel gip gmd gnf \
                     gtq gyd hkd hnl hrk htg huf idr ils inr isk jmd jpy kes kgs khr kmf krw kyd kzt lak lbp lkr lrd \
                     lsl ltl lvl mad mdl mga mkd mnt mop mro mur mvr mwk mxn myr mzn nad ngn nio nok npr nzd pab pen \
                     pgk php pkr pln pyg qar ron rsd rub rwf sar sbd scr sek sgd shp sll sos srd std svc szl thb tjs \
                     top try ttd twd tzs uah ugx usd uyu uzs vef vnd vuv wst xaf xcd xof xpf yer zar zmw bhd jod kwd \
                     omr tnd";
        let mut zero = Vec::new();
        let mut three = Vec::new();
        for code in codes.split_whitespace() {
            let currency = of(code);
            match currency.decimals() {
                0 => zero.push(currency.code().to_owned()),
                3 => three.push(currency.code().to_owned()),
                decimals => assert_eq!(decimals, 2, "{code}"),
            }
        }
        let stripe_zero: Vec<&str> = STRIPE_ZERO_DECIMAL.into_iter().filter(|c| *c != "UGX").collect();
        assert_eq!(zero, stripe_zero);
        assert_eq!(three, THREE_DECIMAL);
    }

    /// Zero-decimal: `amount` is whole yen; any amount is taken; no decimals are read.
    #[test]
    fn yen() {
        let jpy = of("jpy");
        assert_eq!((jpy.decimals(), jpy.step()), (0, Step::Any));
        assert_eq!(jpy.format(100_000), "100,000 JPY");
        assert_eq!(jpy.major(97_500), "97500");
        assert_eq!(jpy.parse(" 500 "), Ok(500));
        assert_eq!(jpy.parse("500.5"), Err(AmountError::TooManyDecimals));
        assert_eq!(jpy.parse("500."), Err(AmountError::NotAnAmount));
        assert!(jpy.check(1).is_ok());
        assert_eq!(jpy.input_pattern(), "[0-9]+");
        assert_eq!(format(1, "krw"), "1 KRW");
        assert_eq!(format(5, "clp"), "5 CLP");
    }

    /// MGA: ISO 4217 gives the ariary two decimals; Stripe lists it as zero-decimal.
    #[test]
    fn exception_mga_is_zero_decimal_at_stripe() {
        assert_eq!(iso_currency::Currency::MGA.exponent(), Some(2));
        let mga = of("MGA");
        assert_eq!((mga.decimals(), mga.step()), (0, Step::Any));
        assert_eq!(mga.format(2500), "2,500 MGA");
    }

    /// ISK: ISO 4217 says no decimals; Stripe writes it with two that are always `00`, and
    /// refuses anything else (charges and refunds).
    #[test]
    fn exception_isk_is_two_decimal_whole_kronur() {
        assert_eq!(iso_currency::Currency::ISK.exponent(), Some(0));
        let isk = of("isk");
        assert_eq!((isk.decimals(), isk.step()), (2, Step::WholeUnits));
        assert_eq!(isk.format(50_000), "500 ISK");
        assert_eq!(isk.major(500), "5");
        assert_eq!(isk.format(550), "5.50 ISK", "an amount from before the rule keeps its fraction");
        assert_eq!(isk.parse("5"), Ok(500));
        assert_eq!(isk.parse("5.00"), Ok(500));
        assert_eq!(isk.parse("5.5"), Err(AmountError::Refused));
        assert!(isk.check(500).is_ok());
        let refused = isk.check(550).unwrap_err();
        assert!(refused.starts_with("must be a multiple of 100 for ISK"), "{refused}");
    }

    /// UGX: listed as zero-decimal, but its special case (and Stripe's answers) make it
    /// two-decimal with whole shillings only, like ISK.
    #[test]
    fn exception_ugx_is_two_decimal_whole_shillings() {
        assert!(STRIPE_ZERO_DECIMAL.contains(&"UGX"));
        assert_eq!(iso_currency::Currency::UGX.exponent(), Some(0));
        let ugx = of("UGX");
        assert_eq!((ugx.decimals(), ugx.step()), (2, Step::WholeUnits));
        assert_eq!(ugx.format(370_000), "3,700 UGX");
        assert_eq!(ugx.parse("3700"), Ok(370_000));
        assert_eq!(ugx.parse("3700.50"), Err(AmountError::Refused));
        assert!(ugx.check(150).unwrap_err().contains("multiple of 100 for UGX"));
    }

    /// HUF and TWD: "zero-decimal for payouts" only; charges and refunds take two decimals.
    #[test]
    fn exception_huf_and_twd_are_two_decimal_for_charges() {
        for code in ["HUF", "TWD"] {
            let currency = of(code);
            assert_eq!((currency.decimals(), currency.step()), (2, Step::Any), "{code}");
            assert!(currency.check(1045).is_ok(), "{code} 10.45 is a charge Stripe takes");
            assert_eq!(currency.parse("10.45"), Ok(1045));
        }
        assert_eq!(format(80_045, "twd"), "800.45 TWD");
    }

    /// Three-decimal: `amount` is in thousandths, and Stripe takes only those ending in 0.
    #[test]
    fn three_decimal_amounts_end_in_zero() {
        for code in THREE_DECIMAL {
            let currency = of(code);
            assert_eq!((currency.decimals(), currency.step()), (3, Step::LastDigitZero), "{code}");
            assert!(currency.check(5120).is_ok() && currency.check(5130).is_ok(), "{code}");
            assert!(currency.check(5124).unwrap_err().starts_with(&format!("must be a multiple of 10 for {code}")));
        }
        let kwd = of("kwd");
        assert_eq!(kwd.format(12_340), "12.340 KWD");
        assert_eq!(kwd.format(1_234_560), "1,234.560 KWD");
        assert_eq!(kwd.major(12_340), "12.340");
        assert_eq!(kwd.parse("1.25"), Ok(1250));
        assert_eq!(kwd.parse("1.250"), Ok(1250));
        assert_eq!(kwd.parse("1.255"), Err(AmountError::Refused));
        assert_eq!(kwd.parse("1.2555"), Err(AmountError::TooManyDecimals));
        assert_eq!(kwd.input_pattern(), "[0-9]+(\\.[0-9]{1,3})?");
    }

    /// Two-decimal, the default: withdrawn ISO codes Stripe still lists too.
    #[test]
    fn two_decimal_by_default() {
        let usd = of("usd");
        assert_eq!(usd.format(123_450), "1,234.50 USD");
        assert_eq!(usd.format(5), "0.05 USD");
        assert_eq!(usd.format(-150), "-1.50 USD");
        assert_eq!(usd.major(1250), "12.50");
        assert_eq!(usd.parse("12.5"), Ok(1250));
        assert_eq!(usd.parse("0.05"), Ok(5));
        for refused in ["", "0", "0.00", "12.", ".5", "-1", "1e3", "12,50", "1 000", "1,000", "+5", "9999999999999999"]
        {
            assert_eq!(usd.parse(refused), Err(AmountError::NotAnAmount), "{refused:?}");
        }
        assert_eq!(usd.parse("12.505"), Err(AmountError::TooManyDecimals));
        assert!(usd.explain(&AmountError::TooManyDecimals).starts_with("is not an amount in USD"));
        for withdrawn in ["std", "ang"] {
            assert!(iso_currency::Currency::from_code(&withdrawn.to_ascii_uppercase()).is_none(), "{withdrawn}");
            assert_eq!(of(withdrawn).decimals(), 2, "{withdrawn}");
        }
    }

    /// Only currencies Stripe supports are currencies; text that is not one formats plainly.
    #[test]
    fn unsupported_codes() {
        for code in ["xyz", "", "us", "usdx", "IQD", "XAU", "ü12"] {
            assert!(Currency::of(code).is_none(), "{code:?}");
        }
        assert_eq!(format(1250, "xyz"), "12.50 XYZ");
    }
}
