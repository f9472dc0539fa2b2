//! `toolscript verify RECEIPTS`: check every hash and the chain of a receipts file.

use std::path::PathBuf;
use std::process::ExitCode;

use toolscript::receipts::{verify_receipts, verify_receipts_to};
use toolscript::Error;

#[derive(clap::Args)]
pub(crate) struct Verify {
    /// The receipts file (JSON Lines).
    receipts: PathBuf,
    /// The hash the chain must end at (`receipts.head` of `run --json`): a file whose
    /// last receipts were cut off fails.
    #[arg(long)]
    head: Option<String>,
}

impl Verify {
    /// Exit status 1 for a file that fails verification; 2 for one that cannot be read.
    pub(crate) fn apply(self) -> Result<ExitCode, String> {
        let verified = match &self.head {
            Some(head) => verify_receipts_to(&self.receipts, head),
            None => verify_receipts(&self.receipts),
        };
        match verified {
            Ok(n) => {
                println!("ok: {n} receipts, every hash and the chain check out");
                Ok(ExitCode::SUCCESS)
            }
            Err(e @ Error::Receipt { .. }) => {
                eprintln!("toolscript: verification failed: {}", e.report());
                Ok(ExitCode::from(1))
            }
            Err(e) => Err(e.report()),
        }
    }
}
