//! The pairs with a penalty in force ([`crate::store::Store::penalised`]):
//! one pass over the states, one shard locked at a time (as the sweep and
//! the forecasts' top list), keeping the `max` ending last. A call waits at
//! most for one shard's share of the pass, never for the whole table.

use super::MemoryStore;
use crate::store::sharded::lock;
use crate::store::Penalised;

impl MemoryStore {
    /// At most `max` pairs whose penalty ends after now, ending last first.
    pub fn penalised_now(&self, max: usize) -> Vec<Penalised> {
        let now = self.now();
        let mut found: Vec<Penalised> = Vec::new();
        for shard in self.shards.iter() {
            let shard = lock(shard);
            for ((account, state), (s, _)) in &shard.states {
                let until = s.penalty.until;
                if until <= now || (found.len() == max && found.last().is_none_or(|last| last.until >= until)) {
                    continue;
                }
                let at = found.partition_point(|p| p.until >= until);
                found.insert(at, Penalised { account: account.clone(), state: state.clone(), until });
                found.truncate(max);
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use crate::config::Config;
    use crate::limit::Key;
    use crate::store::memory::MemoryStore;
    use crate::store::pair_op::SetPenalty;
    use crate::time::ManualClock;

    /// Penalties of many pairs among many more without one: the `max`
    /// ending last, in that order; none that ended.
    #[test]
    fn the_penalties_ending_last_are_listed_first_and_ended_ones_never() {
        let rules = "[[rule]]\nname = \"send\"\nmatch = [\"/cgi-bin/message/send\"]\nlimits = [{ count = 100, per = \"day\" }]\n";
        let config = Config::parse(rules, Path::new("t.toml")).expect("the rule");
        let rule = config.rule_for("/cgi-bin/message/send").expect("the rule matches").clone();
        let clock = ManualClock::new(1_795_924_800_000_000);
        let store = MemoryStore::new(Arc::new(clock.clone()));
        let accounts: Vec<String> = (0..2000).map(|i| format!("wx{i:04}")).collect();
        for (i, account) in accounts.iter().enumerate() {
            let key = Key { account, rule: &rule, offset_us: 0 };
            // Every 100th pair penalised, for i / 100 + 1 minutes; one
            // penalty already ended.
            let len_us = if i % 100 == 0 { (i as i64 / 100 + 1) * 60_000_000 } else { 0 };
            store.apply_now(key, &SetPenalty { len_us }).expect("set");
        }
        clock.advance(std::time::Duration::from_secs(61));
        let listed: Vec<(String, i64)> =
            store.penalised_now(5).into_iter().map(|p| (p.account, (p.until - store.now()) / 1_000_000)).collect();
        let expected: Vec<(String, i64)> =
            [19, 18, 17, 16, 15].iter().map(|&n| (format!("wx{:04}", n * 100), (n + 1) * 60 - 61)).collect();
        assert_eq!(listed, expected);
        assert_eq!(store.penalised_now(100).len(), 19, "wx0000's minute is over");
        assert!(store.penalised_now(0).is_empty());
    }
}
