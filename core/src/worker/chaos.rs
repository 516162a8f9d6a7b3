//! Chaos: the failures a worker inflicts on itself on purpose, so the lease
//! rules can be watched doing their job.
//!
//! - Crash: every [`ChaosSettings::check_every_ticks`] ticks of work, with
//!   `crash_probability`, the worker stops dead: no completion, no release.
//! - Stall (a latency spike): at each heartbeat, with `stall_probability`,
//!   the heartbeat is sent only after a pause of 4-15 s. Work goes on
//!   meanwhile; if the stall outlasts the lease, the local deadline passes
//!   and the worker abandons the task.
//!
//! All randomness comes from one seedable generator, so tests can replay it.
//!
//! The worker loop meets the demo's faults through one seam, `Faults`:
//! the chaos above, an operator's pause ([`Command::Pause`]), trusting
//! claims past their deadline (`--trust-claims`) and a handler's
//! [`SimulatedCrash`]. A production worker has chaos off, is never paused
//! and never trusts a claim: each of the seam's answers is then "nothing".

use super::handler::HandlerError;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::ops::RangeInclusive;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// How much chaos, and of what kind.
#[derive(Clone, Debug, PartialEq)]
pub struct ChaosSettings {
    /// Master switch: off means never crash and never stall.
    pub enabled: bool,
    /// Probability of a crash at each check.
    pub crash_probability: f64,
    /// Ticks of work between crash checks.
    pub check_every_ticks: u32,
    /// Probability of a stall before each heartbeat.
    pub stall_probability: f64,
    /// How long a stall lasts, chosen uniformly.
    pub stall: RangeInclusive<Duration>,
}

impl ChaosSettings {
    /// No chaos at all.
    pub fn off() -> Self {
        ChaosSettings {
            enabled: false,
            crash_probability: 0.0,
            check_every_ticks: 5,
            stall_probability: 0.0,
            stall: Duration::from_secs(4)..=Duration::from_secs(15),
        }
    }
}

/// A source of chaos decisions (and of polling jitter) for one worker.
#[derive(Debug)]
pub struct Chaos {
    settings: ChaosSettings,
    rng: StdRng,
}

impl Chaos {
    /// Decisions replayable from `seed`.
    pub fn seeded(settings: ChaosSettings, seed: u64) -> Self {
        Chaos {
            settings,
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// Decisions seeded from the operating system.
    pub fn from_os(settings: ChaosSettings) -> Self {
        Chaos {
            settings,
            rng: StdRng::from_os_rng(),
        }
    }

    /// The settings in force.
    pub fn settings(&self) -> &ChaosSettings {
        &self.settings
    }

    /// Whether to crash after `tick` ticks of work on the current task
    /// (checked only on every `check_every_ticks`-th tick).
    pub fn crash_at_tick(&mut self, tick: u32) -> bool {
        let every = self.settings.check_every_ticks.max(1);
        self.settings.enabled
            && tick > 0
            && tick.is_multiple_of(every)
            && self
                .rng
                .random_bool(self.settings.crash_probability.clamp(0.0, 1.0))
    }

    /// How long to stall before the next heartbeat, if at all.
    pub fn stall_before_heartbeat(&mut self) -> Option<Duration> {
        if !self.settings.enabled
            || !self
                .rng
                .random_bool(self.settings.stall_probability.clamp(0.0, 1.0))
        {
            return None;
        }
        let (lo, hi) = (*self.settings.stall.start(), *self.settings.stall.end());
        if hi <= lo {
            return Some(lo);
        }
        Some(self.rng.random_range(lo..=hi))
    }

    /// A duration picked uniformly from `range`. Not chaos: it spreads idle
    /// polls so workers do not hit the database in lockstep, and shares the
    /// generator so a seeded run is replayable.
    pub fn jitter(&mut self, range: RangeInclusive<Duration>) -> Duration {
        let (lo, hi) = (*range.start(), *range.end());
        if hi <= lo {
            return lo;
        }
        self.rng.random_range(lo..=hi)
    }
}

/// An order for a running worker (the dashboard's fleet sends it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Freeze for this long (no ticks, no heartbeats), then resume.
    Pause(Duration),
}

/// Fault injection only: a handler that fails with this error makes its
/// worker stop dead, as if its process had crashed mid-task: nothing is
/// completed, failed or released, and the lease runs out. The dashboard's
/// simulated work uses it to show takeovers; a real handler has no reason to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimulatedCrash;

impl std::fmt::Display for SimulatedCrash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("simulated crash")
    }
}

impl std::error::Error for SimulatedCrash {}

/// The faults a worker may be made to commit, as its loop asks about them:
/// stalls before heartbeats, pauses ordered from outside, trusting a claim
/// past what the lease rules allow, crashing on a handler's
/// [`SimulatedCrash`]. Without chaos, pauses or trusted claims (a
/// production worker), every answer leaves the loop to the lease rules.
#[derive(Debug)]
pub(crate) struct Faults {
    chaos: Chaos,
    trust_claims: bool,
    commands: mpsc::UnboundedReceiver<Command>,
}

impl Faults {
    /// `chaos`, trusting claims when `trust_claims`, paused by `commands`.
    pub(crate) fn new(
        chaos: Chaos,
        trust_claims: bool,
        commands: mpsc::UnboundedReceiver<Command>,
    ) -> Self {
        Faults {
            chaos,
            trust_claims,
            commands,
        }
    }

    /// When the worker gives a claim up whose local deadline is `deadline`:
    /// then, or never for a worker that trusts its claims (it works on and
    /// sends its completion with the old token, as a process paused just
    /// after its last deadline check would; only the queue's fencing stands
    /// between that write and a task done twice).
    pub(crate) fn gives_up_at(&self, deadline: Instant) -> Option<Instant> {
        (!self.trust_claims).then_some(deadline)
    }

    /// Whether the worker works on after the queue refused its heartbeat
    /// (it trusts its claims), rather than losing the claim.
    pub(crate) fn works_on_when_refused(&self) -> bool {
        self.trust_claims
    }

    /// The next pause ordered; never ready when none is (or none can come).
    pub(crate) async fn pause_ordered(&mut self) -> Duration {
        match self.commands.recv().await {
            Some(Command::Pause(duration)) => duration,
            None => std::future::pending().await,
        }
    }

    /// How long to stall before the next heartbeat, if at all.
    pub(crate) fn stall_before_heartbeat(&mut self) -> Option<Duration> {
        self.chaos.stall_before_heartbeat()
    }

    /// How long an idle worker waits before its next claim, picked from
    /// `poll` (see [`Chaos::jitter`]: the generator is shared so a seeded
    /// run replays).
    pub(crate) fn poll_wait(&mut self, poll: RangeInclusive<Duration>) -> Duration {
        self.chaos.jitter(poll)
    }

    /// Whether a handler's `error` is a simulated crash: the worker then
    /// stops dead.
    pub(crate) fn crashes_on(error: &HandlerError) -> bool {
        error.is::<SimulatedCrash>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(crash: f64, stall: f64) -> ChaosSettings {
        ChaosSettings {
            enabled: true,
            crash_probability: crash,
            stall_probability: stall,
            ..ChaosSettings::off()
        }
    }

    #[test]
    fn off_never_crashes_or_stalls_even_at_probability_one() {
        let mut chaos = Chaos::seeded(
            ChaosSettings {
                enabled: false,
                ..on(1.0, 1.0)
            },
            7,
        );
        for tick in 0..100 {
            assert!(!chaos.crash_at_tick(tick));
            assert_eq!(chaos.stall_before_heartbeat(), None);
        }
    }

    #[test]
    fn crashes_are_checked_only_every_fifth_tick() {
        let mut chaos = Chaos::seeded(on(1.0, 0.0), 7);
        let crashes: Vec<u32> = (0..=20).filter(|&t| chaos.crash_at_tick(t)).collect();
        assert_eq!(crashes, vec![5, 10, 15, 20]);
    }

    #[test]
    fn stalls_last_four_to_fifteen_seconds() {
        let mut chaos = Chaos::seeded(on(0.0, 1.0), 7);
        for _ in 0..200 {
            let stall = chaos.stall_before_heartbeat().expect("probability 1");
            assert!(
                (Duration::from_secs(4)..=Duration::from_secs(15)).contains(&stall),
                "{stall:?}"
            );
        }
    }

    #[test]
    fn the_same_seed_replays_the_same_decisions() {
        let decisions = |seed| {
            let mut chaos = Chaos::seeded(on(0.5, 0.5), seed);
            (0..200)
                .map(|t| (chaos.crash_at_tick(t), chaos.stall_before_heartbeat()))
                .collect::<Vec<_>>()
        };
        assert_eq!(decisions(42), decisions(42));
        assert_ne!(decisions(42), decisions(43));
        let crashes = decisions(42).iter().filter(|(c, _)| *c).count();
        assert!(
            (5..=35).contains(&crashes),
            "about half of 40 checks: {crashes}"
        );
    }
}
