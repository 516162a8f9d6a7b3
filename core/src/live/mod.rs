//! Live updates: every change to leases, tasks, workers, instances, the
//! generator and schedules is announced on a PostgreSQL channel; one `LISTEN` connection
//! per instance fans the announcements out to the browsers over server-sent
//! events (`GET /api/events`), so a browser on instance B sees a change made
//! through instance A.
//!
//! The channel is `<schema>_changes` (`leasekeeper_changes` by default), one
//! per [`crate::db::Schema`]: two leasekeeper schemas in one database do not
//! wake each other. The SQL function `changes_channel()` of the schema names
//! it, for the triggers, the [`Announcer`] and the listener alike, so the
//! name is derived in one place, from the pool's `search_path`.
//!
//! Where the announcement is made, and why:
//!
//! - Rare changes (generator state, instance registration and heartbeat,
//!   operator actions) are announced by triggers, in the same transaction as
//!   the change (migration `..._live.sql`).
//! - Hot paths (claims, heartbeats, completions, lease renewals, worker
//!   reports) are announced by the process that made them, right after its
//!   commit, batched: [`announce`] is a non-blocking call, and each instance's
//!   [`Announcer`] sends at most one `NOTIFY` per [`BATCH_WINDOW`]. A
//!   `NOTIFY` inside the write transaction would make PostgreSQL serialise
//!   the commits of every notifying transaction (it holds a cluster-wide
//!   lock across the commit's WAL flush): measured here with pgbench, 16
//!   clients, one-row UPDATE: 4,175 tps alone, 1,020 tps with `pg_notify`
//!   in the transaction, 3,386 tps with `pg_notify` as its own statement
//!   after the commit. The batched notify commits with `synchronous_commit`
//!   off (a notification is not data), so it never waits for a WAL flush
//!   while holding that lock, and adds no fsync to a busy server's load.
//! - New work ([`Topics::WORK`], an enqueue) is announced the same way but
//!   without the batch window: idle workers `LISTEN` through the same hub
//!   ([`crate::queue::wake::WorkSignal`]) and claim within a few
//!   milliseconds instead of at their next poll. Back-to-back enqueues still
//!   share NOTIFYs: the announcer sends one at a time and folds everything
//!   that arrived meanwhile into the next.
//! - A started task's claim ended by an operator ([`Topics::CANCELS`]: a
//!   cancel, or a force-release of its lease) is announced the same way, at
//!   once: every busy worker hearing it heartbeats now instead of at its
//!   next interval, and the one whose heartbeat is refused stops its
//!   handler ([`crate::queue::wake::CancelSignal`]). The announcement names
//!   no task: the database stays the one judge of whose claim ended.
//!
//! A change made by hand in SQL on a hot table is not announced; browsers
//! still see it on the next announced change, or by the slow fallback poll.

#[cfg(feature = "postgres")]
mod hub;
#[cfg(feature = "postgres")]
pub use hub::{AnnounceOnReturn, Announcer, BATCH_WINDOW, LiveHub, announce, announce_on_return};

use serde::{Deserialize, Serialize};

/// What changed, as a set of topics (a bit each).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topics(u8);

impl Topics {
    /// Leases and their history (`leases`, `lease_events`).
    pub const LEASES: Topics = Topics(1);
    /// The task queue.
    pub const TASKS: Topics = Topics(2);
    /// Workers.
    pub const WORKERS: Topics = Topics(4);
    /// Instances.
    pub const INSTANCES: Topics = Topics(8);
    /// The generator's desired state.
    pub const GENERATOR: Topics = Topics(16);
    /// New claimable work (an enqueue): idle workers wake up and claim.
    /// Sent at once, not batched (see [`Announcer`]).
    pub const WORK: Topics = Topics(32);
    /// Schedules and their ticks.
    pub const SCHEDULES: Topics = Topics(64);
    /// An operator ended a started task's claim (a cancel, one or in bulk,
    /// or a force-release of its lease): every busy worker heartbeats at
    /// once, and the one whose heartbeat is refused tells its handler
    /// ([`crate::queue::wake::CancelSignal`]). Sent at once, not batched.
    pub const CANCELS: Topics = Topics(128);
    /// Nothing.
    pub const NONE: Topics = Topics(0);
    /// Everything (after a reconnect, when changes may have been missed).
    pub const ALL: Topics = Topics(255);

    /// Topics the [`Announcer`] sends at once, without its batch window:
    /// someone waits on them (idle workers on work, busy ones on cancels).
    pub const URGENT: Topics = Topics(32 | 128);

    const NAMES: [(Topics, &'static str); 8] = [
        (Topics::LEASES, "leases"),
        (Topics::TASKS, "tasks"),
        (Topics::WORKERS, "workers"),
        (Topics::INSTANCES, "instances"),
        (Topics::GENERATOR, "generator"),
        (Topics::WORK, "work"),
        (Topics::SCHEDULES, "schedules"),
        (Topics::CANCELS, "cancels"),
    ];

    /// Whether no topic is set.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether every topic of `other` is set here.
    pub fn contains(self, other: Topics) -> bool {
        self.0 & other.0 == other.0
    }

    /// The topics as a comma-separated list of names (`leases,tasks`), the
    /// form sent on the channel and to browsers.
    pub fn to_names(self) -> String {
        Topics::NAMES
            .iter()
            .filter(|(t, _)| self.contains(*t))
            .map(|(_, name)| *name)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Parses a comma-separated list of names; unknown names are ignored
    /// (a newer instance may announce topics an older one does not know).
    pub fn from_names(names: &str) -> Topics {
        names
            .split(',')
            .map(str::trim)
            .filter_map(|n| Topics::NAMES.iter().find(|(_, name)| *name == n))
            .fold(Topics::NONE, |acc, (t, _)| acc | *t)
    }
}

impl std::ops::BitOr for Topics {
    type Output = Topics;
    fn bitor(self, rhs: Topics) -> Topics {
        Topics(self.0 | rhs.0)
    }
}

impl std::ops::BitAnd for Topics {
    type Output = Topics;
    fn bitand(self, rhs: Topics) -> Topics {
        Topics(self.0 & rhs.0)
    }
}

impl std::ops::BitOrAssign for Topics {
    fn bitor_assign(&mut self, rhs: Topics) {
        self.0 |= rhs.0;
    }
}

#[cfg(test)]
mod tests {
    use super::Topics;

    #[test]
    fn names_round_trip() {
        for bits in 0..=255u8 {
            let t = Topics(bits);
            assert_eq!(Topics::from_names(&t.to_names()), t, "{bits}");
        }
        assert_eq!(
            Topics::ALL.to_names(),
            "leases,tasks,workers,instances,generator,work,schedules,cancels"
        );
    }

    #[test]
    fn unknown_names_are_ignored() {
        assert_eq!(
            Topics::from_names("tasks, nonsense,,leases"),
            Topics::TASKS | Topics::LEASES
        );
        assert!(Topics::from_names("").is_empty());
    }

    #[test]
    fn set_operations() {
        let t = Topics::TASKS | Topics::LEASES;
        assert!(t.contains(Topics::TASKS));
        assert!(!t.contains(Topics::TASKS | Topics::WORKERS));
        assert!(!(t & (Topics::TASKS | Topics::WORKERS)).is_empty());
        assert!((t & Topics::GENERATOR).is_empty());
        assert_eq!(t & (Topics::TASKS | Topics::WORKERS), Topics::TASKS);
    }
}
