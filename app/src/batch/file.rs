//! The batch file: a CSV with a header, read and validated whole before anything is sent.
//!
//! Columns, in any order: `row_id`, `amount`, `currency`, `payment_method`, and an optional
//! `description`. Every cell is trimmed of surrounding whitespace; an empty `description` is no
//! description. Each row is checked with the server's own validation
//! ([`CreatePayment::validate`]), so a file that passes here is not refused row by row later,
//! plus what only a file can get wrong: a missing or unknown column, a duplicate `row_id`, an
//! amount that is not a positive whole number. Every problem is reported with its line number,
//! all at once, so the file is fixed in one go.

use std::collections::BTreeMap;
use std::collections::HashMap;

use crate::money::MAX_AMOUNT;
use crate::payments::{CreatePayment, NewPayment};
use crate::problem::FieldError;

use super::key::{BatchId, RowId};

/// The required columns.
const REQUIRED: [&str; 4] = ["row_id", "amount", "currency", "payment_method"];
/// The optional ones.
const OPTIONAL: [&str; 1] = ["description"];
/// Metadata every payment of a batch carries, so that the PaymentIntent at the gateway says which
/// batch and row it came from (the server adds its own `payonce_…` members).
pub const METADATA_BATCH: &str = "batch_id";
pub const METADATA_ROW: &str = "batch_row_id";

/// One valid row.
#[derive(Debug, Clone)]
pub struct Row {
    /// Its line in the file (the header is line 1).
    pub line: u64,
    pub row_id: RowId,
    /// The request body, in the server's canonical form (with the batch's metadata).
    pub payment: NewPayment,
}

/// One problem in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The line it is on (1: the header).
    pub line: u64,
    /// What is wrong, naming the column.
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

/// Reads every row of `bytes` for the batch `batch`, or reports every problem found.
pub fn parse(bytes: &[u8], batch: &BatchId) -> Result<Vec<Row>, Vec<Problem>> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        // Rows of the wrong length are reported below with their line, not as a reader error
        // that would stop at the first one.
        .flexible(true)
        .trim(csv::Trim::All)
        .from_reader(bytes);
    // A header with a problem still names the columns it can: every line below it is checked
    // for what can be checked, so that one run reports the whole file.
    let (columns, mut problems) = match reader.byte_headers() {
        Ok(header) => Columns::find(header),
        Err(err) => return Err(vec![Problem { line: 1, message: format!("the header cannot be read: {err}") }]),
    };

    let mut rows = Vec::new();
    let mut lines_of: HashMap<RowId, u64> = HashMap::new();
    let mut record = csv::ByteRecord::new();
    loop {
        let line = reader.position().line();
        match reader.read_byte_record(&mut record) {
            Ok(false) => break,
            Ok(true) => {}
            Err(err) => {
                let line = err.position().map_or(line, |p| p.line());
                problems.push(Problem { line, message: format!("cannot be read as CSV: {err}") });
                continue;
            }
        }
        let line = record.position().map_or(line, |p| p.line());
        match columns.row(line, &record, batch) {
            Ok(row) => {
                if let Some(first) = lines_of.get(&row.row_id) {
                    problems.push(Problem {
                        line,
                        message: format!("row_id {:?} is already used on line {first}", row.row_id.as_str()),
                    });
                } else {
                    lines_of.insert(row.row_id.clone(), line);
                    rows.push(row);
                }
            }
            Err(mut found) => problems.append(&mut found),
        }
    }
    if problems.is_empty() && rows.is_empty() {
        problems.push(Problem { line: 1, message: "the file has a header but no rows".to_owned() });
    }
    if problems.is_empty() { Ok(rows) } else { Err(problems) }
}

/// Where each column is in the file (`None`: the header lacks it, and said so).
struct Columns {
    width: usize,
    row_id: Option<usize>,
    amount: Option<usize>,
    currency: Option<usize>,
    payment_method: Option<usize>,
    description: Option<usize>,
}

impl Columns {
    /// The columns the header names, and what is wrong with it.
    fn find(header: &csv::ByteRecord) -> (Self, Vec<Problem>) {
        let problem = |message: String| Problem { line: 1, message };
        let mut at: BTreeMap<&str, usize> = BTreeMap::new();
        let mut problems = Vec::new();
        for (i, name) in header.iter().enumerate() {
            let Ok(name) = std::str::from_utf8(name) else {
                problems.push(problem(format!("column {} of the header is not valid UTF-8", i + 1)));
                continue;
            };
            let known = REQUIRED.iter().chain(&OPTIONAL).find(|known| known.eq_ignore_ascii_case(name));
            match known {
                None => problems.push(problem(format!(
                    "unknown column {name:?}: the columns are {} and optionally {}",
                    REQUIRED.join(", "),
                    OPTIONAL.join(", ")
                ))),
                Some(known) if at.contains_key(known) => {
                    problems.push(problem(format!("column {known} appears twice")))
                }
                Some(known) => {
                    at.insert(known, i);
                }
            }
        }
        for required in REQUIRED {
            if !at.contains_key(required) {
                problems.push(problem(format!("the header has no {required} column")));
            }
        }
        let columns = Self {
            width: header.len(),
            row_id: at.get("row_id").copied(),
            amount: at.get("amount").copied(),
            currency: at.get("currency").copied(),
            payment_method: at.get("payment_method").copied(),
            description: at.get("description").copied(),
        };
        (columns, problems)
    }

    /// One record as a row, or everything wrong with it.
    fn row(&self, line: u64, record: &csv::ByteRecord, batch: &BatchId) -> Result<Row, Vec<Problem>> {
        let problem = |message: String| Problem { line, message };
        if record.len() != self.width {
            return Err(vec![problem(format!("has {} fields; the header has {}", record.len(), self.width))]);
        }
        let mut problems = Vec::new();
        let mut text = |index: Option<usize>, column: &str| match std::str::from_utf8(&record[index?]) {
            Ok(text) => Some(text.to_owned()),
            Err(_) => {
                problems.push(problem(format!("{column} is not valid UTF-8")));
                None
            }
        };
        let (row_id, amount, currency, payment_method) = (
            text(self.row_id, "row_id"),
            text(self.amount, "amount"),
            text(self.currency, "currency"),
            text(self.payment_method, "payment_method"),
        );
        let description = text(self.description, "description").filter(|d| !d.is_empty());

        let row_id =
            row_id.and_then(|id| RowId::parse(&id).map_err(|why| problems.push(problem(format!("row_id {why}")))).ok());
        let amount = amount.and_then(|amount| {
            parse_amount(&amount).map_err(|why| problems.push(problem(format!("amount {amount:?} {why}")))).ok()
        });
        let (Some(row_id), Some(amount), Some(currency), Some(payment_method)) =
            (row_id, amount, currency, payment_method)
        else {
            return Err(problems);
        };
        let metadata = BTreeMap::from([
            (METADATA_BATCH.to_owned(), batch.to_string()),
            (METADATA_ROW.to_owned(), row_id.to_string()),
        ]);
        let request =
            CreatePayment { amount, currency, payment_method, description, metadata: Some(metadata), capture: None };
        match request.validate() {
            Ok(payment) if problems.is_empty() => Ok(Row { line, row_id, payment }),
            Ok(_) => Err(problems),
            Err(invalid) => {
                problems.extend(
                    invalid.into_iter().map(|FieldError { field, detail }| problem(format!("{field} {detail}"))),
                );
                Err(problems)
            }
        }
    }
}

/// An amount cell: a positive whole number of the currency's minor unit, in digits only.
fn parse_amount(cell: &str) -> Result<i64, String> {
    if cell.is_empty() {
        return Err("is empty".to_owned());
    }
    if !cell.bytes().all(|b| b.is_ascii_digit()) {
        return Err(
            "must be a positive whole number of the currency's minor unit (e.g. 1999 for 19.99 USD, 1999 for 1,999 JPY), digits only"
                .to_owned(),
        );
    }
    match cell.parse::<i64>() {
        Ok(0) => Err("must be positive".to_owned()),
        Ok(amount) if amount <= MAX_AMOUNT => Ok(amount),
        _ => Err(format!("must be at most {MAX_AMOUNT}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch() -> BatchId {
        BatchId::parse("t").unwrap()
    }

    fn problems(csv: &str) -> Vec<String> {
        parse(csv.as_bytes(), &batch()).unwrap_err().iter().map(ToString::to_string).collect()
    }

    /// Columns in any order, an optional description, whitespace trimmed, the batch's metadata.
    #[test]
    fn reads_a_valid_file() {
        let csv = "payment_method, amount ,row_id,currency,description\n\
                   pm_card_visa,1999,r1,USD,  March invoice \n\
                   pm_card_visa, 5 ,r2,eur,\n";
        let rows = parse(csv.as_bytes(), &batch()).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].line, rows[0].row_id.as_str(), rows[0].payment.amount), (2, "r1", 1999));
        assert_eq!(rows[0].payment.currency, "usd", "the server's canonical form");
        assert_eq!(rows[0].payment.description.as_deref(), Some("March invoice"));
        assert_eq!(rows[1].payment.description, None, "an empty description is none");
        assert_eq!(rows[1].payment.metadata[METADATA_BATCH], "t");
        assert_eq!(rows[1].payment.metadata[METADATA_ROW], "r2");
        // No description column at all, a UTF-8 byte order mark, CRLF line endings.
        let rows = parse("\u{feff}row_id,amount,currency,payment_method\r\na,1,usd,pm_x\r\n".as_bytes(), &batch());
        assert_eq!(rows.unwrap()[0].row_id.as_str(), "a");
    }

    /// Every problem of every row, each with its line number.
    #[test]
    fn reports_every_problem_with_its_line() {
        let csv = "row_id,amount,currency,payment_method\n\
                   a,100,usd,pm_card_visa\n\
                   b,12.50,usd,pm_card_visa\n\
                   c,-3,usd,pm_card_visa\n\
                   d,0,usd,pm_card_visa\n\
                   a,100,usd,pm_card_visa\n\
                   e,100,usdx,card\n\
                   f,100,usd\n\
                   ,100,usd,pm_card_visa\n\
                   g,100000000,usd,pm_card_visa\n";
        let found = problems(csv);
        assert_eq!(
            found,
            [
                "line 3: amount \"12.50\" must be a positive whole number of the currency's minor unit (e.g. 1999 for 19.99 USD, 1999 for 1,999 JPY), digits only",
                "line 4: amount \"-3\" must be a positive whole number of the currency's minor unit (e.g. 1999 for 19.99 USD, 1999 for 1,999 JPY), digits only",
                "line 5: amount \"0\" must be positive",
                "line 6: row_id \"a\" is already used on line 2",
                "line 7: currency must be a three-letter ISO 4217 code that Stripe supports, e.g. \"usd\"",
                "line 7: payment_method must be a PaymentMethod id such as \"pm_card_visa\"",
                "line 8: has 3 fields; the header has 4",
                "line 9: row_id is empty",
                "line 10: amount \"100000000\" must be at most 99999999",
            ]
        );
    }

    /// An amount Stripe would refuse for its row's currency is a problem of its line, in the
    /// API's words: three-decimal amounts end in 0, króna are whole (two decimals of 00).
    #[test]
    fn refuses_amounts_stripe_refuses_for_the_currency() {
        let csv = "row_id,amount,currency,payment_method\n\
                   a,100000,jpy,pm_card_visa\n\
                   b,12345,kwd,pm_card_visa\n\
                   c,550,isk,pm_card_visa\n\
                   d,12340,kwd,pm_card_visa\n";
        let found = problems(csv);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].starts_with("line 3: amount must be a multiple of 10 for KWD"), "{found:?}");
        assert!(found[1].starts_with("line 4: amount must be a multiple of 100 for ISK"), "{found:?}");
    }

    /// A header without a required column, with an unknown or a repeated one.
    #[test]
    fn checks_the_header() {
        assert_eq!(problems("row_id,amount,currency\na,1,usd\n"), ["line 1: the header has no payment_method column"]);
        let found = problems("row_id,amount,currency,payment_method,descripton,amount\n");
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].starts_with("line 1: unknown column \"descripton\""), "{found:?}");
        assert_eq!(found[1], "line 1: column amount appears twice");
        assert_eq!(problems("row_id,amount,currency,payment_method\n"), ["line 1: the file has a header but no rows"]);
        assert_eq!(problems("row_id,amount,currency\n"), ["line 1: the header has no payment_method column"]);
        assert_eq!(
            problems(""),
            [
                "line 1: the header has no row_id column",
                "line 1: the header has no amount column",
                "line 1: the header has no currency column",
                "line 1: the header has no payment_method column"
            ]
        );
    }

    /// A bad header does not hide the bad lines below it: each is checked for what the header
    /// names, so one run reports the whole file.
    #[test]
    fn a_bad_header_does_not_hide_the_lines_below_it() {
        let csv = "row_id,amount,currenc,payment_method\n\
                   a,100,usd,pm_card_visa\n\
                   b,-1,usd,pm_card_visa\n\
                   c,100,usd\n\
                   a,100,usd,pm_card_visa\n";
        let found = problems(csv);
        assert!(found[0].starts_with("line 1: unknown column \"currenc\""), "{found:?}");
        assert_eq!(
            found[1..],
            [
                "line 1: the header has no currency column",
                "line 3: amount \"-1\" must be a positive whole number of the currency's minor unit (e.g. 1999 for 19.99 USD, 1999 for 1,999 JPY), digits only",
                "line 4: has 3 fields; the header has 4",
            ]
        );
    }

    /// Quoted cells, lines inside quotes, and bytes that are not UTF-8.
    #[test]
    fn reads_quoted_cells_and_refuses_bad_bytes() {
        let csv = "row_id,amount,currency,payment_method,description\n\
                   \"x,1\",100,usd,pm_card_visa,\"two\nlines\"\n\
                   y,100,usd,pm_card_visa,ok\n";
        let rows = parse(csv.as_bytes(), &batch()).unwrap();
        assert_eq!(rows[0].row_id.as_str(), "x,1");
        assert_eq!(rows[1].line, 4, "the line a row starts on, counting the line inside quotes");
        let mut bad = b"row_id,amount,currency,payment_method\nz,100,usd,pm_card_visa,\n".to_vec();
        bad.extend_from_slice(b"w\xff,100,usd,pm_card_visa\n");
        let found: Vec<String> = parse(&bad, &batch()).unwrap_err().iter().map(ToString::to_string).collect();
        assert_eq!(found, ["line 2: has 5 fields; the header has 4", "line 3: row_id is not valid UTF-8"]);
    }
}
