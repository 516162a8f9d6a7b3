//! Lease operations: acquire and renew latency, and renewals per second,
//! from [`LEASE_CLIENTS`] clients.

use super::{LEASE_CLIENTS, Plan, Samples, TTL};
use anyhow::Result;
use leasekeeper_core::lease::store as leases;
use leasekeeper_core::lease::{Holder, Resource};
use sqlx::{Connection, PgPool};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

pub(super) struct LeaseFigures {
    pub(super) acquire: Samples,
    pub(super) renew: Samples,
    pub(super) renews_per_s: f64,
}

/// [`LEASE_CLIENTS`] clients: each acquires fresh resources for a third of
/// the run, then renews a lease of its own in a loop for the whole run.
pub(super) async fn lease_ops(pool: &PgPool, plan: &Plan) -> Result<LeaseFigures> {
    sqlx::query("TRUNCATE leases, lease_events")
        .execute(pool)
        .await?;
    sqlx::query("CHECKPOINT").execute(pool).await?;
    let phase = |d: Duration| {
        let stop = CancellationToken::new();
        let timer = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(d).await;
            timer.cancel();
        });
        stop
    };
    let acquiring = phase(plan.warmup + plan.run / 3);
    let mut handles = Vec::new();
    for c in 0..LEASE_CLIENTS {
        let mut conn = pool.acquire().await?.detach();
        let stop = acquiring.clone();
        let warmup = plan.warmup;
        let schema = leasekeeper_core::db::Schema::of(pool);
        handles.push(tokio::spawn(async move {
            let me = Holder::parse(format!("bench-c{c}"))?;
            let begun = Instant::now();
            let mut samples = Vec::new();
            let mut k = 0u64;
            while !stop.is_cancelled() {
                let resource = Resource::parse(format!("bench:c{c}-{k}"))?;
                k += 1;
                let t = Instant::now();
                leases::acquire(&mut conn, &schema, &resource, &me, TTL).await?;
                if begun.elapsed() >= warmup {
                    samples.push(t.elapsed().as_secs_f64() * 1000.0);
                }
            }
            conn.close().await?;
            anyhow::Ok(samples)
        }));
    }
    let mut acquire = Vec::new();
    for h in handles {
        acquire.extend(h.await??);
    }

    let renewed = Arc::new(AtomicU64::new(0));
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = CancellationToken::new();
    let mut handles = Vec::new();
    for c in 0..LEASE_CLIENTS {
        let mut conn = pool.acquire().await?.detach();
        let (stop, renewed, measuring) = (stop.clone(), renewed.clone(), measuring.clone());
        let schema = leasekeeper_core::db::Schema::of(pool);
        handles.push(tokio::spawn(async move {
            let me = Holder::parse(format!("bench-c{c}"))?;
            let resource = Resource::parse(format!("bench:hold-{c}"))?;
            leases::acquire(&mut conn, &schema, &resource, &me, TTL).await?;
            let mut samples = Vec::new();
            while !stop.is_cancelled() {
                let t = Instant::now();
                leases::renew(&mut conn, &schema, &resource, &me, None, None).await?;
                if measuring.load(Ordering::Relaxed) {
                    samples.push(t.elapsed().as_secs_f64() * 1000.0);
                    renewed.fetch_add(1, Ordering::Relaxed);
                }
            }
            conn.close().await?;
            anyhow::Ok(samples)
        }));
    }
    tokio::time::sleep(plan.warmup).await;
    let t0 = Instant::now();
    measuring.store(true, Ordering::Relaxed);
    tokio::time::sleep(plan.run).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = t0.elapsed();
    stop.cancel();
    let mut renew = Vec::new();
    for h in handles {
        renew.extend(h.await??);
    }
    Ok(LeaseFigures {
        acquire: Samples(acquire),
        renew: Samples(renew),
        renews_per_s: renewed.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64(),
    })
}
