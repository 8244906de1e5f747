//! `--out results.csv`: one line per row of the batch file, in its order.
//!
//! Columns: `row_id,key,http_status,payment_id,payment_status,replayed,outcome,detail`. The file
//! is written beside its final name and renamed into place once complete, so it is always one
//! whole run's record: a run killed before its end leaves the previous file as it was (the
//! server's keys, not this file, are the record a re-run trusts).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::answer::RowResult;
use super::file::Row;
use super::key::BatchId;

/// The header line.
pub const COLUMNS: [&str; 8] =
    ["row_id", "key", "http_status", "payment_id", "payment_status", "replayed", "outcome", "detail"];

/// A results file being prepared: created before the first request, so that an unwritable path
/// is found before anything is charged.
pub struct ResultsFile {
    path: PathBuf,
    partial: PathBuf,
    file: File,
}

impl ResultsFile {
    /// Opens `<path>.partial` for writing.
    pub fn create(path: &Path) -> std::io::Result<Self> {
        let mut partial = path.as_os_str().to_owned();
        partial.push(".partial");
        let partial = PathBuf::from(partial);
        let file = File::create(&partial)?;
        Ok(Self { path: path.to_owned(), partial, file })
    }

    /// Writes every row's result and renames the file into place.
    pub fn write(self, batch: &BatchId, rows: &[Row], results: &[RowResult]) -> std::io::Result<()> {
        let mut out = csv::Writer::from_writer(BufWriter::new(&self.file));
        out.write_record(COLUMNS)?;
        for (row, result) in rows.iter().zip(results) {
            let status = result.status.map(|s| s.to_string()).unwrap_or_default();
            out.write_record([
                row.row_id.as_str(),
                batch.row_key(&row.row_id).as_str(),
                &status,
                result.payment_id.as_deref().unwrap_or(""),
                result.payment_status.as_deref().unwrap_or(""),
                if result.replayed { "true" } else { "false" },
                result.outcome.as_str(),
                &result.detail,
            ])?;
        }
        out.into_inner().map_err(|err| err.into_error())?.flush()?;
        self.file.sync_all()?;
        std::fs::rename(&self.partial, &self.path)
    }

    /// Removes the partial file (the run wrote nothing worth keeping).
    pub fn discard(self) {
        let _ = std::fs::remove_file(&self.partial);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::answer::Outcome;
    use crate::batch::file;

    #[test]
    fn one_line_per_row_in_file_order() {
        let batch = BatchId::parse("b1").unwrap();
        let rows =
            file::parse(b"row_id,amount,currency,payment_method\nx,1,usd,pm_a\n\"y,2\",2,usd,pm_b\n", &batch).unwrap();
        let results = [
            RowResult {
                outcome: Outcome::Charged,
                status: Some(201),
                payment_id: Some("pay_1".into()),
                payment_status: Some("succeeded".into()),
                replayed: false,
                detail: String::new(),
            },
            RowResult::not_sent("interrupted"),
        ];
        let dir = std::env::temp_dir().join(format!("payonce-results-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("out.csv");
        let file = ResultsFile::create(&path).unwrap();
        assert!(!path.exists(), "nothing at the final name before the run ends");
        file.write(&batch, &rows, &results).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            text,
            "row_id,key,http_status,payment_id,payment_status,replayed,outcome,detail\n\
             x,batch:b1:x,201,pay_1,succeeded,false,charged,\n\
             \"y,2\",\"batch:b1:y,2\",,,,false,not_sent,interrupted\n"
        );
        assert!(!dir.join("out.csv.partial").exists());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
