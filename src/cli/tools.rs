//! `toolscript tools`: the tools' API, as a model reads it.

use std::process::ExitCode;

use toolscript::{Format, Runtime};

use super::{registry, ToolsArg};

#[derive(clap::Args)]
pub(crate) struct Tools {
    #[command(flatten)]
    tools: ToolsArg,
    /// Output format.
    #[arg(long, value_enum, default_value_t = FormatArg::Text)]
    format: FormatArg,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum FormatArg {
    Text,
    Json,
    Rhai,
}

impl Tools {
    pub(crate) async fn apply(self) -> Result<ExitCode, String> {
        let registry = registry(&self.tools).await?;
        let format = match self.format {
            FormatArg::Text => Format::Text,
            FormatArg::Json => Format::Json,
            FormatArg::Rhai => Format::Rhai,
        };
        print!("{}", Runtime::new(registry).describe(format));
        Ok(ExitCode::SUCCESS)
    }
}
