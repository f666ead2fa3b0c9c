//! The `delayq` binary: parses arguments and runs [`delayq::cli::run`] (which sets up
//! logging: `serve` from its configuration).

use clap::Parser;
use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    delayq::cli::run(delayq::cli::Cli::parse()).await
}
