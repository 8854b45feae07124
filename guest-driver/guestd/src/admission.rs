//! Whether a user may have one more channel at an endpoint: the rules of [`super::policy`]
//! applied to what the agent holds now. Usage is counted from the agent's own records (memory
//! passed to applications, memory the engine knows of) rather than kept in counters, so it
//! cannot drift: a channel stops counting exactly when its memory is freed.

use std::collections::BTreeMap;

use log::debug;

use super::policy::UidUsage;
use super::records::Charged;
use super::server::Agent;
use svnic_client::vm::protocol::AgentFailure;

impl Agent {
    /// Every channel memory the agent holds, passed to an application or known to the engine.
    fn charged(&self) -> impl Iterator<Item = &Charged> {
        let prepared = self.prepared.values().map(|p| &p.charged);
        prepared.chain(self.regions.values().map(|h| &h.charged))
    }

    /// What every uid holding channel memory holds.
    pub(super) fn usage_by_uid(&self) -> BTreeMap<u32, UidUsage> {
        let mut usage: BTreeMap<u32, UidUsage> = BTreeMap::new();
        for c in self.charged() {
            let u = usage.entry(c.uid).or_default();
            u.channels += 1;
            u.memory = u.memory.saturating_add(c.len());
        }
        usage
    }

    fn usage_of(&self, uid: u32) -> UidUsage {
        self.usage_by_uid().remove(&uid).unwrap_or_default()
    }

    /// Another uid for which the agent holds memory at `endpoint`, if any.
    fn endpoint_holder(&self, uid: u32, endpoint: u32) -> Option<u32> {
        self.charged()
            .find(|c| c.endpoint == endpoint && c.uid != uid)
            .map(|c| c.uid)
    }

    /// Checks endpoint ownership, then the uid's quotas, for one more channel of `uid` at
    /// `endpoint`. A refusal is counted and logged at debug level only: its frequency is the
    /// client's to choose.
    pub(super) fn admit(&mut self, uid: u32, endpoint: u32) -> Result<(), (AgentFailure, String)> {
        let policy = &self.cfg.users;
        let holder = self.endpoint_holder(uid, endpoint);
        if let Some(why) = policy.endpoint_refusal(uid, endpoint, holder) {
            self.counters.refused.endpoint += 1;
            debug!("uid {uid}: {why}");
            return Err((AgentFailure::EndpointOwned, why));
        }
        let usage = self.usage_of(uid);
        let refusal = policy.quota_refusal(uid, usage, self.memory.region_len());
        if let Some((reason, why)) = refusal {
            self.counters.refused.quota += 1;
            debug!("{why}");
            return Err((reason, why));
        }
        Ok(())
    }
}
