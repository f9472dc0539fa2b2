//! How a composite's body reaches its nested tools: back through [`dispatch`], with the
//! composite's call as parent and its declared tools as the only ones allowed.

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::{dispatch, Call, Caller, RunContext, Speculation};
use crate::error::ToolError;
use crate::tool::{NestedCaller, Registry, ToolSpec};

/// The nested calls of one composite call.
pub(super) struct NestedCalls {
    ctx: Arc<RunContext>,
    parent: u64,
    allowed: Arc<[String]>,
    speculation: Option<Arc<Speculation>>,
    /// The composite call's node of the cancellation tree.
    cancel: Arc<CancellationToken>,
    /// The composite's idempotency key, from which its nested non-read calls get theirs.
    key: Option<String>,
    /// Nested non-read calls made so far.
    effectful: std::sync::atomic::AtomicU64,
}

impl NestedCalls {
    /// The handle a composite call's body gets in its [`crate::tool::ToolContext`].
    pub(super) fn handle(
        ctx: &Arc<RunContext>,
        spec: &ToolSpec,
        parent: u64,
        speculation: Option<&Arc<Speculation>>,
        key: Option<&str>,
        cancel: Arc<CancellationToken>,
    ) -> Arc<dyn NestedCaller> {
        Arc::new(NestedCalls {
            ctx: Arc::clone(ctx),
            parent,
            allowed: Arc::from(spec.nested.clone()),
            speculation: speculation.cloned(),
            cancel,
            key: key.map(str::to_string),
            effectful: Default::default(),
        })
    }
}

impl NestedCaller for NestedCalls {
    fn registry(&self) -> &Registry {
        &self.ctx.registry
    }

    fn call(&self, tool: &str, args: Value) -> BoxFuture<'static, Result<Value, ToolError>> {
        let mut call = Call::new(
            tool,
            args,
            Caller::Composite {
                parent: self.parent,
                allowed: Arc::clone(&self.allowed),
                speculation: self.speculation.clone(),
                cancel: self.cancel.clone(),
            },
        );
        // A composite's body is deterministic, so its `n`th non-read call is the same call
        // every time the composite is made: it keeps its key across a retry after a crash.
        let effectful = self
            .ctx
            .registry
            .get(tool)
            .is_some_and(|t| t.spec.effect != crate::tool::Effect::Read);
        if let (Some(key), true) = (&self.key, effectful) {
            let n = self
                .effectful
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            call.idempotency_key = Some(format!("{key}.{n}"));
        }
        let ctx = Arc::clone(&self.ctx);
        async move {
            dispatch(&ctx, call).await.map_err(|e| {
                let message = match &e.tool {
                    Some(nested) => format!("nested call `{nested}` failed: {}", e.message),
                    None => e.message.clone(),
                };
                ToolError {
                    message,
                    tool: None,
                    ..e
                }
            })
        }
        .boxed()
    }
}
