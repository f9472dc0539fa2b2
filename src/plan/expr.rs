//! What a tool answers in a plan: its `plan_result`, a Rhai expression over `args`
//! (`#{ refund_id: "planned", amount_cents: args.amount_cents }`), compiled when the tool is
//! declared and evaluated at each planned call.

use std::sync::{Arc, OnceLock};

use rhai::{Dynamic, Engine, Scope, AST};
use serde_json::Value;

/// The most operations one evaluation may take: an expression over a call's arguments needs
/// far fewer, and one that loops is stopped.
const MAX_OPERATIONS: u64 = 100_000;

/// How a tool takes part in a plan.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct PlanSpec {
    /// What a planned call of it answers; `None`: `()`.
    pub result: Option<PlanResult>,
    /// The plan ends at its first call (`plan_incomplete`): what comes after depends on what
    /// it really does.
    pub stop: bool,
}

/// A compiled `plan_result` expression.
#[derive(Clone)]
pub struct PlanResult {
    text: Arc<str>,
    ast: Arc<AST>,
}

impl PartialEq for PlanResult {
    fn eq(&self, other: &PlanResult) -> bool {
        self.text == other.text
    }
}

impl std::fmt::Debug for PlanResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("PlanResult").field(&self.text).finish()
    }
}

/// The engine plan results are compiled and evaluated with: the standard library, no tools, a
/// bound on operations and depth.
fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let mut engine = Engine::new();
        engine.set_max_operations(MAX_OPERATIONS);
        engine.set_max_expr_depths(64, 32);
        engine.set_max_string_size(1 << 20);
        engine.set_max_array_size(10_000);
        engine.set_max_map_size(10_000);
        engine
    })
}

impl PlanResult {
    /// Compiles `text`, an expression over `args`.
    ///
    /// # Errors
    ///
    /// What is wrong with it, when it is not one expression that compiles.
    pub fn compile(text: &str) -> Result<PlanResult, String> {
        let ast = engine().compile_expression(text).map_err(|e| {
            format!("`plan_result` is not a Rhai expression over `args`: {e} (for example `#{{ id: \"planned\", amount: args.amount }}`)")
        })?;
        Ok(PlanResult {
            text: text.into(),
            ast: Arc::new(ast),
        })
    }

    /// The expression's text.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Its value for a call with `args`, as JSON.
    pub(crate) fn eval(&self, args: &Value) -> Result<Value, String> {
        let mut scope = Scope::new();
        let args = rhai::serde::to_dynamic(args).map_err(|e| format!("its arguments: {e}"))?;
        scope.push_dynamic("args", args);
        let value = engine()
            .eval_ast_with_scope::<Dynamic>(&mut scope, &self.ast)
            .map_err(|e| format!("its `plan_result` ({}) failed: {e}", self.text))?;
        rhai::serde::from_dynamic::<Value>(&value)
            .map_err(|e| format!("its `plan_result` ({}) has no JSON form: {e}", self.text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_expression_over_args_is_evaluated_and_a_broken_one_is_refused() {
        let r =
            PlanResult::compile(r#"#{ refund_id: "planned", amount_cents: args.amount_cents }"#)
                .unwrap();
        assert_eq!(
            r.eval(&json!({"amount_cents": 719})).unwrap(),
            json!({"refund_id": "planned", "amount_cents": 719})
        );
        assert!(PlanResult::compile("let x = 1; x").is_err());
        assert!(PlanResult::compile("#{ a: ").is_err());
        let looping = PlanResult::compile("args.items.map(|x| x * 2)").unwrap();
        assert!(looping.eval(&json!({})).is_err());
    }
}
