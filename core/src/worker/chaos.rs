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

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::ops::RangeInclusive;
use std::time::Duration;

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
