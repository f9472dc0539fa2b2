//! Step 3: the repeat guard. A non-read call runs at most once per run with the same arguments,
//! unless its tool allows repeats.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use crate::error::{ErrorKind, ToolError};
use crate::sync::lock;
use crate::tool::{Effect, ToolSpec};

/// The non-read calls one run has made, by tool and canonical arguments.
#[derive(Debug, Default)]
pub(crate) struct RepeatGuard {
    /// By tool, then arguments: looked up without copying either.
    made: Mutex<HashMap<String, HashSet<String>>>,
}

impl RepeatGuard {
    /// Refuses a non-read call identical to one already made in this run.
    pub(crate) fn check(&self, spec: &ToolSpec, args_key: &str) -> Result<(), ToolError> {
        if !guarded(spec) {
            return Ok(());
        }
        let made = lock(&self.made);
        if made
            .get(&spec.name)
            .is_some_and(|args| args.contains(args_key))
        {
            return Err(ToolError::new(
                ErrorKind::RepeatedCall,
                format!(
                    "`{}` ({}) was already called with these arguments in this run; it is not repeated",
                    spec.name, spec.effect
                ),
            ));
        }
        Ok(())
    }

    /// Records a non-read call whose body is about to run. Calls refused before their body runs
    /// (invalid input, an open breaker) are not recorded, so a corrected retry is allowed.
    pub(crate) fn record(&self, spec: &ToolSpec, args_key: &str) {
        if guarded(spec) {
            let mut made = lock(&self.made);
            match made.get_mut(&spec.name) {
                Some(args) => {
                    args.insert(args_key.to_string());
                }
                None => {
                    made.insert(spec.name.clone(), HashSet::from([args_key.to_string()]));
                }
            }
        }
    }
}

fn guarded(spec: &ToolSpec) -> bool {
    spec.effect != Effect::Read && !spec.allow_repeat
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_a_repeated_write_only() {
        let g = RepeatGuard::default();
        let write = ToolSpec::new("w", Effect::Write);
        g.check(&write, "{}").unwrap();
        g.record(&write, "{}");
        assert_eq!(
            g.check(&write, "{}").unwrap_err().kind,
            ErrorKind::RepeatedCall
        );
        assert!(
            g.check(&write, r#"{"a":1}"#).is_ok(),
            "other arguments are another call"
        );

        let read = ToolSpec::new("r", Effect::Read);
        g.record(&read, "{}");
        assert!(g.check(&read, "{}").is_ok());

        let mut poll = ToolSpec::new("p", Effect::Idempotent);
        poll.allow_repeat = true;
        g.record(&poll, "{}");
        assert!(g.check(&poll, "{}").is_ok());
    }
}
