//! `GET /api/events`: the live-update stream to browsers (server-sent
//! events), fed by this instance's [`leasekeeper_core::live::LiveHub`].

use crate::state::AppState;
use axum::Router;
use axum::extract::{Query, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::routing::get;
use leasekeeper_core::live::Topics;
use serde::Deserialize;
use std::convert::Infallible;
use std::time::Duration;
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

/// The shortest gap between two events sent to one browser: a page refetches
/// what it shows on each event, so under a storm of changes it refetches at
/// most this often (and at once after a quiet spell).
const BROWSER_MIN_GAP: Duration = Duration::from_millis(100);

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct EventsQuery {
    /// Comma-separated topic names (`leases`, `tasks`, `workers`,
    /// `instances`, `generator`); all when absent.
    topics: Option<String>,
}

/// One event of the stream, as the OpenAPI document describes it (the
/// stream itself is written by axum's `Sse`).
#[derive(utoipa::ToSchema)]
#[expect(dead_code, reason = "a schema for the document, never built")]
pub struct StreamEvent {
    /// `ready` first, then `change`.
    #[schema(pattern = "^(ready|change)$")]
    event: String,
    /// The topics followed (`ready`) or changed (`change`), comma-separated.
    data: String,
}

/// `GET /api/events`: a server-sent events stream with one `change` event
/// (data: the changed topics, comma-separated) per batch of changes, at most
/// one per [`BROWSER_MIN_GAP`]; `ready` first, so a client knows it is
/// connected and can refetch what it might have missed.
#[utoipa::path(
    get,
    path = "/api/events",
    tag = "events",
    summary = "Live updates (server-sent events)",
    description = "`ready` on (re)connection (data: the topics followed), then `change` events whose data lists the changed topics, comma-separated, at most one per 100 ms; a keep-alive comment every 15 s.",
    params(EventsQuery),
    responses((status = 200, description = "An endless `text/event-stream`", content_type = "text/event-stream", body = StreamEvent))
)]
async fn events(
    State(state): State<AppState>,
    Query(query): Query<EventsQuery>,
) -> Sse<impl futures::Stream<Item = Result<Event, Infallible>>> {
    let wanted = query
        .topics
        .as_deref()
        .map(Topics::from_names)
        .filter(|t| !t.is_empty())
        .unwrap_or(Topics::ALL);
    let hub = state.live.clone();
    let rx = hub.subscribe();
    let ready = Event::default().event("ready").data(wanted.to_names());
    let changes = futures::stream::unfold(
        (rx, hub.stopped(), Instant::now() - BROWSER_MIN_GAP),
        move |(mut rx, stop, last_sent)| async move {
            loop {
                let first = tokio::select! {
                    _ = stop.cancelled() => return None,
                    got = rx.recv() => got,
                };
                let mut topics = match first {
                    Ok(t) => t,
                    Err(RecvError::Lagged(_)) => Topics::ALL,
                    Err(RecvError::Closed) => return None,
                };
                // Gather until the gap since the last event has passed.
                let until = last_sent + BROWSER_MIN_GAP;
                loop {
                    match tokio::time::timeout_at(until, rx.recv()).await {
                        Ok(Ok(t)) => topics |= t,
                        Ok(Err(RecvError::Lagged(_))) => topics = Topics::ALL,
                        Ok(Err(RecvError::Closed)) | Err(_) => break,
                    }
                }
                let relevant = topics & wanted;
                if relevant.is_empty() {
                    continue;
                }
                let event = Event::default().event("change").data(relevant.to_names());
                return Some((Ok(event), (rx, stop, Instant::now())));
            }
        },
    );
    let stream =
        futures::StreamExt::chain(futures::stream::once(async move { Ok(ready) }), changes);
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

/// The route of the event stream.
pub fn route() -> Router<AppState> {
    Router::new().route("/api/events", get(events))
}
