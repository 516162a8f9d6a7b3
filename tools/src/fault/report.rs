//! What the faults came to: each fault's recovery time, read from
//! `lease_events` and the workers' history after the round; the recoveries
//! over their bound; and the run's report, as JSON and as a table.

use super::inject::{Fault, FaultKind};
use super::{RoundResult, check, proxy, race};
use anyhow::Result;
use chrono::{DateTime, Utc};
use leasekeeper::worker::history::{Op, OpKind, Outcome};
use leasekeeper_core::generator::RESOURCE;
use leasekeeper_core::schedule::RESOURCE as SCHEDULER;
use serde_json::{Value, json};
use sqlx::PgPool;
use std::collections::BTreeSet;

fn at(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

/// Milliseconds from `from_ms` to the first grant (acquired/taken_over) of
/// `resource` after it, from `lease_events`.
async fn next_grant(pool: &PgPool, resource: &str, from_ms: i64) -> Result<Option<f64>> {
    Ok(sqlx::query_scalar(
        "SELECT (EXTRACT(EPOCH FROM (at - $2)) * 1000)::float8 FROM lease_events
          WHERE resource = $1 AND kind IN ('acquired', 'taken_over') AND at > $2
          ORDER BY id LIMIT 1",
    )
    .bind(resource)
    .bind(at(from_ms))
    .fetch_optional(pool)
    .await?)
}

/// The slowest of `took` (`None` if any never happened).
fn slowest(took: impl IntoIterator<Item = Option<f64>>) -> Option<f64> {
    took.into_iter()
        .try_fold(0.0f64, |worst, t| t.map(|t| worst.max(t)))
}

/// Milliseconds from `from_ms` until every task of `tasks` was taken over.
async fn slowest_takeover(pool: &PgPool, tasks: &[i64], from_ms: i64) -> Result<Option<f64>> {
    let mut took = Vec::new();
    for task in tasks {
        took.push(next_grant(pool, &format!("task:{task}"), from_ms).await?);
    }
    Ok(slowest(took))
}

/// The tasks of `tasks` (held when a fault struck at `from_ms`) that were
/// left for someone else to take over: all but those their holder finished
/// in the moment between the harness's look and the fault taking hold (a
/// completion that reached the database just before a cut, its answer
/// held back by the cut). A task processed with no grant since the fault
/// was finished by that holder: nobody else held it. One taken over, or
/// not processed, is left.
async fn left_for_takeover(pool: &PgPool, tasks: &[i64], from_ms: i64) -> Result<Vec<i64>> {
    let mut open = Vec::new();
    for &task in tasks {
        let processed: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM tasks WHERE id = $1 AND status = 'processed')",
        )
        .bind(task)
        .fetch_one(pool)
        .await?;
        let taken_over = next_grant(pool, &format!("task:{task}"), from_ms)
            .await?
            .is_some();
        if !processed || taken_over {
            open.push(task);
        }
    }
    Ok(open)
}

/// Milliseconds from `from_ms` to the generator's first grant or renewal
/// written after it: with an id past `after_id`, and, by a clock
/// `offset_ms` off the real one, later than `from_ms`.
async fn first_generator_write(
    pool: &PgPool,
    from_ms: i64,
    offset_ms: f64,
    after_id: i64,
) -> Result<Option<f64>> {
    Ok(sqlx::query_scalar(
        "SELECT (EXTRACT(EPOCH FROM (at - $2)) * 1000)::float8 - $3 FROM lease_events
          WHERE resource = $1 AND kind IN ('acquired', 'taken_over', 'renewed')
            AND id > $4 AND (EXTRACT(EPOCH FROM (at - $2)) * 1000)::float8 > $3
          ORDER BY id LIMIT 1",
    )
    .bind(RESOURCE)
    .bind(at(from_ms))
    .bind(offset_ms)
    .bind(after_id)
    .fetch_optional(pool)
    .await?)
}

/// Fills in each fault's recovery time from `lease_events` and the history.
pub(super) async fn measure(
    pool: &PgPool,
    mut faults: Vec<Fault>,
    history: &[Op],
) -> Result<Vec<Fault>> {
    for fault in &mut faults {
        match fault.kind {
            // Until the task it held was taken over (the slowest, if several).
            // A frozen claim: from its late commit.
            FaultKind::KillWorker | FaultKind::PauseWorker | FaultKind::FreezeMidClaim
                if !fault.tasks.is_empty() =>
            {
                let open = left_for_takeover(pool, &fault.tasks, fault.db_at_ms()).await?;
                fault.recovery_ms = slowest_takeover(pool, &open, fault.db_at_ms()).await?;
            }
            // Until another term of the generator began.
            FaultKind::KillGeneratorHolder => {
                fault.recovery_ms = next_grant(pool, RESOURCE, fault.db_at_ms()).await?;
            }
            // Until another term of the scheduler began (its ticks' lateness
            // is the schedule check's).
            FaultKind::KillSchedulerHolder | FaultKind::PauseSchedulerHolder => {
                fault.recovery_ms = next_grant(pool, SCHEDULER, fault.db_at_ms()).await?;
            }
            FaultKind::PgFailover | FaultKind::ClockSkew => {
                // The first claim granted, and the generator's first grant
                // or renewal by the new primary (an id past the last one
                // before the primary died: the old primary's later writes
                // never reached the standby). lease_events tells time by
                // the new primary's clock: a skewed one is corrected by its
                // measured offset.
                let first_claim = history
                    .iter()
                    .filter(|op| {
                        op.op == OpKind::Claim
                            && op.outcome == Outcome::Ok
                            && op.task.is_some()
                            && op.sent_ms >= fault.at_ms
                    })
                    .map(|op| (op.returned_ms - fault.at_ms) as f64)
                    .reduce(f64::min);
                fault.recoveries.insert("first claim".into(), first_claim);
                let generator = first_generator_write(
                    pool,
                    fault.at_ms,
                    fault.skew_measured_ms.unwrap_or(0.0),
                    fault.events_before.unwrap_or(0),
                )
                .await?;
                fault.recoveries.insert("generator".into(), generator);
                fault.recovery_ms = slowest(fault.recoveries.values().copied());
            }
            // Until the tasks its holders held were taken over, and the
            // generator's next term began when it held that.
            FaultKind::CutLiveness => {
                let open = left_for_takeover(pool, &fault.tasks, fault.db_at_ms()).await?;
                let tasks = slowest_takeover(pool, &open, fault.db_at_ms()).await?;
                // The generator only when the instance held it: a cut
                // instance without it leaves the generator nothing to
                // recover (not a recovery that never came).
                fault.recovery_ms = match fault.holder {
                    Some(_) => {
                        let generator = next_grant(pool, RESOURCE, fault.db_at_ms()).await?;
                        fault.taken_over_ms = generator;
                        slowest([tasks, generator])
                    }
                    None => tasks,
                };
            }
            FaultKind::Partition => {
                let open = left_for_takeover(pool, &fault.tasks, fault.db_at_ms()).await?;
                let mut worst = slowest_takeover(pool, &open, fault.db_at_ms()).await?;
                if let Some(holder) = &fault.holder {
                    fault.taken_over_ms = next_grant(pool, RESOURCE, fault.db_at_ms()).await?;
                    worst = slowest([worst, fault.taken_over_ms]);
                    fault.late_writes_refused = Some(
                        sqlx::query_scalar(
                            "SELECT count(*) FROM lease_events
                              WHERE resource = $1 AND holder = $2
                                AND kind = 'stale_write_refused' AND at > $3",
                        )
                        .bind(RESOURCE)
                        .bind(holder)
                        .bind(at(fault.db_at_ms()))
                        .fetch_one(pool)
                        .await?,
                    );
                }
                fault.recovery_ms = worst;
            }
            FaultKind::RestartPostgres => {
                // Each worker's first accepted call sent after PostgreSQL
                // was back, and the generator's first renewal or grant.
                let workers: BTreeSet<&str> = history
                    .iter()
                    .filter(|op| op.sent_ms < fault.at_ms)
                    .map(|op| op.worker.as_str())
                    .collect();
                for worker in workers {
                    let first = history
                        .iter()
                        .filter(|op| {
                            op.worker == worker
                                && op.outcome == Outcome::Ok
                                && op.sent_ms >= fault.at_ms
                        })
                        .map(|op| (op.returned_ms - fault.at_ms) as f64)
                        .next();
                    // A worker killed by a later fault before it got going
                    // again proves nothing either way.
                    let later = history
                        .iter()
                        .any(|op| op.worker == worker && op.sent_ms >= fault.at_ms);
                    if later {
                        fault.recoveries.insert(worker.to_string(), first);
                    }
                }
                let generator = first_generator_write(pool, fault.at_ms, 0.0, 0).await?;
                fault.recoveries.insert("generator".into(), generator);
                fault.recovery_ms = slowest(fault.recoveries.values().copied());
            }
            // A lost claim: until the task was taken over. A lost
            // completion: it stood (the task is processed), nothing to recover.
            FaultKind::LoseAnswer => {
                if fault.lost == Some(proxy::Target::Claim) {
                    if let Some(task) = fault.tasks.first() {
                        fault.recovery_ms =
                            next_grant(pool, &format!("task:{task}"), fault.db_at_ms()).await?;
                    }
                } else {
                    fault.recovery_ms = Some(0.0);
                }
            }
            _ => {}
        }
    }
    Ok(faults)
}

/// Recoveries over their bound, partitioned generator holders that had
/// not stepped down when another instance took over, and failovers after
/// which two instances ran the generator at once, described.
pub(super) fn late(faults: &[Fault], timing: &super::Timing) -> Vec<String> {
    let mut out = Vec::new();
    for f in faults {
        if let Some(two) = &f.two_generators {
            out.push(format!("{} ({}): {two}", f.kind.describe(), f.target));
        }
        if f.kind == FaultKind::Partition && f.holder.is_some() {
            match (f.stepped_down_ms, f.taken_over_ms) {
                (Some(down), Some(over)) if down < over => {}
                (down, over) => out.push(format!(
                    "{} ({}): the cut-off holder stepped down at {} but another term began at {} (ms after the cut)",
                    f.kind.describe(),
                    f.target,
                    down.map_or("never".into(), |ms| format!("{ms:.0}")),
                    over.map_or("never".into(), |ms| format!("{ms:.0}")),
                )),
            }
        }
        let Some(bound) = f.bound(timing) else {
            continue;
        };
        match f.recovery_ms {
            Some(ms) if ms <= bound.as_secs_f64() * 1000.0 => {}
            other => out.push(format!(
                "{} ({}, tasks {:?}): recovered after {} (bound {} s){}",
                f.kind.describe(),
                f.target,
                f.tasks,
                other.map_or("never".to_string(), |ms| format!("{:.0} ms", ms)),
                bound.as_secs(),
                if f.recoveries.is_empty() {
                    String::new()
                } else {
                    format!("; per process: {:?}", f.recoveries)
                }
            )),
        }
    }
    out
}

/// The whole run's report as JSON: per fault kind, the totals, the races,
/// and every violation.
pub(super) fn report(
    seed: u64,
    rounds: usize,
    seconds: u64,
    setup: &super::Setup,
    replication: Option<super::Replication>,
    results: &[RoundResult],
    races: &Result<race::RaceReport>,
) -> Value {
    let (kinds, timing) = (&setup.kinds, &setup.timing);
    let mut per_kind = serde_json::Map::new();
    for &kind in kinds {
        let faults: Vec<(&RoundResult, &Fault)> = results
            .iter()
            .flat_map(|r| {
                r.faults
                    .iter()
                    .filter(|f| f.kind == kind)
                    .map(move |f| (r, f))
            })
            .collect();
        let (mut affected, mut processed, mut duplicates, mut lost, mut refused) = (0, 0, 0, 0, 0);
        let mut recoveries = crate::bench::Samples(Vec::new());
        let mut unrecovered = 0;
        for (r, f) in &faults {
            for task in &f.tasks {
                affected += 1;
                if r.checks.duplicates.contains(task) {
                    duplicates += 1;
                }
                if r.checks.lost.contains(task) {
                    lost += 1;
                } else {
                    processed += 1;
                }
            }
            refused += r
                .history
                .iter()
                .filter(|op| {
                    op.outcome == Outcome::Refused
                        && op.sent_ms >= f.at_ms
                        && op.task.is_some_and(|t| f.tasks.contains(&t))
                })
                .count();
            match f.recovery_ms {
                Some(ms) => recoveries.0.push(ms),
                None if f.bound(timing).is_some() => unrecovered += 1,
                None => {}
            }
        }
        let stale_completions = if kind == FaultKind::PauseWorker {
            // The paused holders' own completions after SIGCONT, refused.
            json!(
                faults
                    .iter()
                    .map(|(r, f)| {
                        let worker = f.worker.as_deref().unwrap_or_default();
                        r.history
                            .iter()
                            .filter(|op| {
                                op.worker == worker
                                    && op.op == OpKind::Complete
                                    && op.outcome == Outcome::Refused
                                    && op.task.is_some_and(|t| f.tasks.contains(&t))
                            })
                            .count()
                    })
                    .sum::<usize>()
            )
        } else {
            Value::Null
        };
        per_kind.insert(
            kind.key(),
            json!({
                "name": kind.describe(),
                "faults": faults.len(),
                "tasks_caught": affected,
                "tasks_finished": processed,
                "duplicates": duplicates,
                "lost": lost,
                "stale_writes_refused": refused,
                "paused_holders_completions_refused": stale_completions,
                "recovery_ms_p50": recoveries.percentile(50.0),
                "recovery_ms_max": recoveries.percentile(100.0),
                "not_recovered": unrecovered,
                "scheduler_holder_hit": faults.iter().filter(|(_, f)| f.scheduler_holder.is_some()).count(),
            }),
        );
    }
    let sum = |f: &dyn Fn(&check::Checks) -> usize| -> usize {
        results.iter().map(|r| f(&r.checks)).sum()
    };
    let mut violations: Vec<String> = Vec::new();
    for (i, r) in results.iter().enumerate() {
        for v in r
            .checks
            .violations()
            .into_iter()
            .chain(r.late.iter().cloned())
        {
            violations.push(format!("round {}: {v}", i + 1));
        }
    }
    let races = match races {
        Ok(r) => {
            if r.old_won == 0 || r.new_won == 0 {
                violations.push(format!(
                    "barrier races: only one outcome ever happened ({r:?}): the race was not real"
                ));
            }
            json!({
                "rounds": r.rounds, "old_holder_won": r.old_won, "takeover_won": r.new_won,
                "neither": r.neither, "both": 0,
                "takeovers_recorded": r.takeovers_recorded,
                "refusals_recorded": r.refusals_recorded, "refusals_expected": r.refusals_expected,
            })
        }
        Err(e) => {
            violations.push(format!("barrier races: {e:#}"));
            json!({ "error": format!("{e:#}") })
        }
    };
    // The every-second schedule, beside the other totals.
    let schedule = json!({
        "schedule_ticks": sum(&|c| c.schedule.ticks),
        "schedule_ticks_missing": sum(&|c| c.schedule.missing.len()),
        "schedule_ticks_doubled": sum(&|c| c.schedule.doubled.len()),
        "schedule_tokens_backwards": sum(&|c| c.schedule.tokens_backwards.len()),
        "schedule_task_mismatches": sum(&|c| c.schedule.task_mismatches.len()),
        "schedule_ticks_unexpected": sum(&|c| c.schedule.unexpected.len()),
        "schedule_ticks_late": sum(&|c| c.schedule.late.len()),
        "schedule_worst_lateness_ms": results.iter().filter_map(|r| r.checks.schedule.worst_lateness_ms).max(),
        "schedule_worst_lateness_outside_db_outages_ms": results.iter().filter_map(|r| r.checks.schedule.worst_lateness_outside_outages_ms).max(),
        "schedule_lateness_bound_ms": timing.schedule_bound.as_millis() as u64,
        "schedule_holder_hits": results.iter().flat_map(|r| &r.faults).filter(|f| f.scheduler_holder.is_some()).count(),
    });
    // The limited queue: its limits, what the fleet came to under them,
    // and how close it came to each.
    let most = |f: &dyn Fn(&check::limits::LimitChecks) -> usize| {
        results.iter().map(|r| f(&r.checks.limits)).max()
    };
    let tightest = results
        .iter()
        .filter_map(|r| r.checks.limits.tightest_window.as_ref())
        .max_by(|a, b| (a.claims as f64 - a.allowed).total_cmp(&(b.claims as f64 - b.allowed)));
    let limits = json!({
        "limits_queue": results.first().map(|r| r.checks.limits.queue.clone()),
        "limits_set": results.first().map(|r| &r.checks.limits.limits),
        "limits_claims": sum(&|c| c.limits.claims),
        "limits_takeovers": sum(&|c| c.limits.takeovers),
        "limits_keyed_tasks": sum(&|c| c.limits.keyed_tasks),
        "limits_most_started": most(&|l| l.most_started),
        "limits_most_started_per_key": most(&|l| l.most_started_per_key),
        "limits_claim_instants_at_max_started": sum(&|c| c.limits.instants_at_max_started),
        "limits_claim_instants_at_max_per_key": sum(&|c| c.limits.instants_at_max_per_key),
        "limits_busiest_second_claims": most(&|l| l.busiest_second),
        "limits_tightest_bucket_window": tightest.map(|w| json!({
            "claims": w.claims,
            "ms": (w.to - w.from).num_milliseconds(),
            "allowed": (w.allowed * 1000.0).round() / 1000.0,
        })),
        "limits_claim_instants_at_bucket_edge": sum(&|c| c.limits.instants_at_bucket_edge),
        "limits_over_max_started": sum(&|c| c.limits.over_max_started.len()),
        "limits_over_max_per_key": sum(&|c| c.limits.over_max_per_key.len()),
        "limits_over_bucket": sum(&|c| c.limits.over_bucket.len()),
    });
    // The workflows and durable waits (issue 40).
    let workflows = json!({
        "workflows": sum(&|c| c.workflows.workflows),
        "workflow_edges": sum(&|c| c.workflows.edges),
        "workflow_children_cascaded": sum(&|c| c.workflows.cascaded),
        "workflow_children_claimed_early": sum(&|c| c.workflows.early.len()),
        "workflow_children_not_cascaded": sum(&|c| c.workflows.not_cascaded.len()),
        "workflow_edges_miscounted": sum(&|c| c.workflows.miscounted.len()),
        "workflow_parents_retried": sum(&|c| c.workflows.retried),
        "workflow_children_revived": sum(&|c| c.workflows.revived),
        "workflow_children_not_revived": sum(&|c| c.workflows.not_revived.len()),
        "waits": sum(&|c| c.workflows.waited),
        "waits_signalled": sum(&|c| c.workflows.signalled),
        "waits_signals_wrong": sum(&|c| c.workflows.signals_wrong.len()),
    });
    let mut report = json!({
        "seed": seed,
        "rounds": rounds,
        "seconds_per_round": seconds,
        "lease_ttl_ms": timing.ttl.as_millis() as u64,
        "fault_kinds": kinds,
        "database": match replication {
            Some(r) => json!({ "kind": "highly_available", "replication": r }),
            None => json!({ "kind": "single_server" }),
        },
        "per_fault": per_kind,
        "totals": {
            "tasks": sum(&|c| c.tasks),
            "enqueued_confirmed": results.iter().map(|r| r.enqueued).sum::<usize>(),
            "generated": sum(&|c| c.generated_tasks),
            "processed": sum(&|c| c.processed),
            "failed_after_max_attempts": sum(&|c| c.failed_after_max),
            "processed_confirmed_by_db_and_history": sum(&|c| c.confirmed_by_both),
            "processed_confirmed_by_db_only": sum(&|c| c.confirmed_by_database_only),
            "duplicates": sum(&|c| c.duplicates.len()),
            "lost": sum(&|c| c.lost.len()),
            "stale_writes_accepted": sum(&|c| c.stale_accepted.len()),
            "refused_heartbeats": sum(&|c| c.refused_heartbeats),
            "refused_completions": sum(&|c| c.refused_completions),
            "refused_failures": sum(&|c| c.refused_failures),
            "refusals_in_lease_events": sum(&|c| c.refusals_recorded),
            "refusals_missing_from_lease_events": sum(&|c| c.refusals_unrecorded),
            "claims_missing_from_lease_events": sum(&|c| c.claims_unrecorded),
            "takeovers": sum(&|c| c.takeovers),
            "takeovers_misrecorded": sum(&|c| c.takeovers_misrecorded),
            "unknown_outcomes": sum(&|c| c.unknown_outcomes),
            "credential_refused_with_token": sum(&|c| c.credential_refused),
            "intruders_refused": sum(&|c| c.intruders_refused),
            "intruders_let_in": sum(&|c| c.intrusions.len()),
            "token_order_violations": sum(&|c| c.token_order.len()),
            "two_live_holders": sum(&|c| c.overlaps.len()),
            "two_believing_holders": sum(&|c| c.believed_overlaps.len()),
            "generator_terms": sum(&|c| c.generator_terms),
            "generated_outside_term": sum(&|c| c.generated_outside_term.len()),
            "history_ops": results.iter().map(|r| r.history.len()).sum::<usize>(),
            "torn_history_lines": sum(&|c| c.torn_history_lines),
        },
        "barrier_races": races,
        "faults": results.iter().flat_map(|r| r.faults.iter()).collect::<Vec<_>>(),
        "violations": violations,
    });
    if let (Some(totals), Value::Object(schedule), Value::Object(limits)) =
        (report["totals"].as_object_mut(), schedule, limits)
    {
        totals.extend(schedule);
        totals.extend(limits);
        if let Value::Object(workflows) = workflows {
            totals.extend(workflows);
        }
    }
    report
}

pub(super) fn print_report(report: &Value) {
    println!(
        "\n{:<28} {:>6} {:>7} {:>8} {:>5} {:>4} {:>8} {:>9} {:>9}",
        "fault", "faults", "caught", "finished", "dups", "lost", "refused", "rec p50", "rec max"
    );
    let ms = |v: &Value| v.as_f64().map_or("-".to_string(), |v| format!("{v:.0} ms"));
    for kind in FaultKind::ALL {
        let row = &report["per_fault"][kind.key()];
        if row.is_null() {
            continue;
        }
        let n = |key: &str| row[key].to_string();
        println!(
            "{:<28} {:>6} {:>7} {:>8} {:>5} {:>4} {:>8} {:>9} {:>9}",
            kind.describe(),
            n("faults"),
            n("tasks_caught"),
            n("tasks_finished"),
            n("duplicates"),
            n("lost"),
            n("stale_writes_refused"),
            ms(&row["recovery_ms_p50"]),
            ms(&row["recovery_ms_max"]),
        );
    }
    let faults = report["faults"].as_array().cloned().unwrap_or_default();
    let of = |kinds: &[&str]| -> Vec<&Value> {
        faults
            .iter()
            .filter(|f| kinds.contains(&f["kind"].as_str().unwrap_or_default()))
            .collect()
    };
    let failovers = of(&["pg_failover", "clock_skew"]);
    if !failovers.is_empty() {
        println!(
            "\nfailovers (ms from the primary's death): {:>9} {:>10} {:>10} {:>10} {:>8}",
            "promoted", "instances", "1st claim", "generator", "skew"
        );
        for f in failovers {
            let instances = f["recoveries"]
                .as_object()
                .map(|r| {
                    r.iter()
                        .filter(|(k, _)| k.starts_with("instance"))
                        .map(|(_, v)| v.as_f64().unwrap_or(f64::INFINITY))
                        .fold(0.0f64, f64::max)
                })
                .unwrap_or(f64::NAN);
            println!(
                "  {:<39} {:>9} {:>10} {:>10} {:>10} {:>8}",
                f["target"]
                    .as_str()
                    .unwrap_or_default()
                    .split(',')
                    .next()
                    .unwrap_or_default(),
                ms(&f["promoted_ms"]),
                ms(&json!(instances)),
                ms(&f["recoveries"]["first claim"]),
                ms(&f["recoveries"]["generator"]),
                ms(&f["skew_measured_ms"]),
            );
        }
    }
    let partitions = of(&["partition"]);
    if !partitions.is_empty() {
        println!(
            "\npartitions (ms from the cut):            {:>12} {:>12} {:>11}",
            "stepped down", "taken over", "late writes"
        );
        for f in partitions {
            println!(
                "  {:<39} {:>12} {:>12} {:>11}",
                f["target"].as_str().unwrap_or_default(),
                ms(&f["stepped_down_ms"]),
                ms(&f["taken_over_ms"]),
                f["late_writes_refused"]
                    .as_i64()
                    .map_or("-".to_string(), |n| format!("{n} refused")),
            );
        }
    }
    println!("\ntotals:");
    if let Some(totals) = report["totals"].as_object() {
        for (k, v) in totals {
            println!("  {k:<40} {v}");
        }
    }
    println!("barrier races: {}", report["barrier_races"]);
    match report["violations"].as_array() {
        Some(v) if !v.is_empty() => {
            println!("\nVIOLATIONS:");
            for line in v {
                println!("  {}", line.as_str().unwrap_or_default());
            }
        }
        _ => println!("\nall invariants hold"),
    }
}
