//! The MCP server: `toolscript serve` offers `run_script` and `describe_tools` over stdio.

use crate::error::Error;
use crate::runtime::Runtime;

/// Serves `runtime` over stdio until the client disconnects.
///
/// # Errors
///
/// [`Error::Mcp`] when the transport fails.
pub async fn serve_stdio(runtime: Runtime) -> Result<(), Error> {
    let _ = runtime;
    Err(Error::Mcp {
        server: "toolscript".to_string(),
        message: "not implemented yet".to_string(),
    })
}
