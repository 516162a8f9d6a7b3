//! The heartbeater: the loop that renews the claims of every worker
//! whose heartbeat is due at that moment in one statement
//! ([`store::heartbeat_each`]). (Claims waiting in local queues are
//! renewed by the producer, see [`super::prefetch`].)

use super::held::{Held, drain};
use super::{Answer, Setup};
use crate::lease::Holder;
use crate::queue::store::{self, MAX_BATCH};
use crate::worker::transport::{TransportError, ms};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// A heartbeat of one claim.
pub(super) struct Beat {
    pub(super) worker: Holder,
    pub(super) task_id: i64,
    pub(super) token: i64,
    pub(super) reply: Answer<Option<Duration>>,
}

/// The heartbeater: one statement for every heartbeat due at the moment.
pub(super) async fn heartbeat(setup: Arc<Setup>, mut rx: mpsc::UnboundedReceiver<Beat>) {
    let mut held = Held::default();
    while let Some(first) = held.next(&mut rx).await {
        let mut beats = vec![first];
        drain(&mut rx, &mut beats, setup.batching.max.clamp(1, MAX_BATCH));
        // A worker killed while its heartbeat waited must not extend its
        // lease afterwards: its claim should run out.
        beats.retain(|b| !b.reply.is_closed());
        if beats.is_empty() {
            continue;
        }
        let claims: Vec<(i64, i64, Holder)> = beats
            .iter()
            .map(|b| (b.task_id, b.token, b.worker.clone()))
            .collect();
        let outcomes = async {
            let conn = held.conn(&setup).await?;
            Ok::<_, TransportError>(
                store::heartbeat_each(conn, &setup.schema, &claims, setup.ttl).await?,
            )
        }
        .await;
        if let Err(e) = &outcomes {
            held.failed(e);
        }
        match outcomes {
            Ok(outcomes) => {
                for (beat, outcome) in beats.into_iter().zip(outcomes) {
                    let answer = outcome
                        .map(|task| ms(task.heartbeat_in_ms))
                        .map_err(TransportError::from);
                    let _ = beat.reply.send(answer);
                }
            }
            Err(e) => {
                for beat in beats {
                    let _ = beat.reply.send(Err(e.clone()));
                }
            }
        }
    }
}
