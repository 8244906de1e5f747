//! The `payonce` command line.

use std::process::ExitCode;

/// Entry point of the `payonce` binary.
pub fn main() -> ExitCode {
    ExitCode::SUCCESS
}
