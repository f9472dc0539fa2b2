//! The MCP client: start a server over stdio, list its tools, and make each a toolscript tool.

use super::McpServerSpec;
use crate::error::Error;
use crate::tool::Tool;

/// Starts the server, initialises it, lists its tools (all pages) and returns them as tools.
pub(crate) async fn connect(spec: &McpServerSpec) -> Result<Vec<Tool>, Error> {
    Err(Error::Mcp {
        server: spec.name.clone(),
        message: "not implemented yet".to_string(),
    })
}
