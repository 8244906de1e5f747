//! The `payonce` binary: everything lives in the library; see `payonce::cli`.

fn main() -> std::process::ExitCode {
    payonce::cli::main()
}
