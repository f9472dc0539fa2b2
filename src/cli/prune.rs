//! `toolscript prune`: removes old runs from the store (by default completed and failed ones
//! only), with their journals and the artifacts no kept run refers to, and gives the space back.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use toolscript::PruneRule;

use super::open_store;
use super::runs::StatusArg;

/// The flags of `prune` (its help is in `main.rs`, on the subcommand).
#[derive(clap::Args)]
pub(crate) struct Prune {
    /// Only runs whose record last changed longer ago than this: a whole number and a unit,
    /// s, m, h, d or w (`30d`, `12h`). Without it, runs of any age.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    older_than: Option<Duration>,
    /// The statuses removed, instead of completed and failed; repeat, or separate with commas.
    #[arg(long, value_enum, value_delimiter = ',', value_name = "STATUS")]
    status: Vec<StatusArg>,
    /// Say what would be removed, and remove nothing.
    #[arg(long)]
    dry_run: bool,
    /// Leave the freed pages in the file for later runs (no VACUUM).
    #[arg(long)]
    no_vacuum: bool,
    /// Print what was removed as JSON.
    #[arg(long)]
    json: bool,
    /// The store of runs (a SQLite file, or a postgres:// URL). Default: $TOOLSCRIPT_STORE, else
    /// toolscript/store.sqlite3 in the user's data directory (~/.local/share on Linux).
    #[arg(long, value_name = "PATH")]
    store: Option<PathBuf>,
}

impl Prune {
    pub(crate) async fn apply(self) -> Result<ExitCode, String> {
        let store = open_store(self.store)?;
        let mut rule = PruneRule::default();
        if !self.status.is_empty() {
            rule = rule.statuses(self.status.iter().map(|s| s.status()));
        }
        if let Some(age) = self.older_than {
            rule = rule.older_than(age);
        }
        rule.vacuum = !self.no_vacuum;
        rule.dry_run = self.dry_run;
        let statuses: Vec<&str> = rule.statuses.iter().map(|s| s.as_str()).collect();
        let pruned = toolscript::prune(&*store, rule)
            .await
            .map_err(|e| e.report())?;
        if self.json {
            let json = serde_json::to_string(&pruned).map_err(|e| e.to_string())?;
            println!("{json}");
            return Ok(ExitCode::SUCCESS);
        }
        let verb = if self.dry_run {
            "would remove"
        } else {
            "removed"
        };
        println!(
            "{verb} {} {} run{} and {} artifact{} from {}",
            pruned.runs,
            statuses.join("/"),
            if pruned.runs == 1 { "" } else { "s" },
            pruned.artifacts,
            if pruned.artifacts == 1 { "" } else { "s" },
            store.location()
        );
        if pruned.kept_alive > 0 {
            println!(
                "kept {} running run{}: {} under a live lease",
                pruned.kept_alive,
                if pruned.kept_alive == 1 { "" } else { "s" },
                if pruned.kept_alive == 1 {
                    "it is"
                } else {
                    "they are"
                }
            );
        }
        if let (Some(before), Some(after), false) =
            (pruned.bytes_before, pruned.bytes_after, self.dry_run)
        {
            println!("the store's file: {before} bytes before, {after} after");
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// A duration as `--older-than` takes it: a whole number and a unit (`30d`, `12h`).
fn parse_duration(text: &str) -> Result<Duration, String> {
    let how = "give a whole number and a unit, s, m, h, d or w (`30d`, `12h`)";
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("`{text}` has no unit: {how}"))?;
    let (number, unit) = text.split_at(split);
    let seconds: u64 = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => return Err(format!("`{text}` is not a duration: {how}")),
    };
    let number: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration: {how}"))?;
    number
        .checked_mul(seconds)
        .filter(|s| *s <= 100 * 366 * 86_400)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("`{text}` is longer than a century"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_and_bad_ones_say_why() {
        assert_eq!(parse_duration("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(parse_duration("12h"), Ok(Duration::from_secs(12 * 3600)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("2w"), Ok(Duration::from_secs(14 * 86_400)));
        for (bad, says) in [
            ("30", "no unit"),
            ("d", "not a duration"),
            ("30x", "not a duration"),
            ("-3d", "not a duration"),
            ("1.5h", "not a duration"),
            ("3 d", "not a duration"),
            ("99999999999999999999d", "not a duration"),
            ("999999999w", "century"),
            ("", "no unit"),
        ] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.contains(says) && e.contains(bad), "{bad}: {e}");
        }
    }
}
