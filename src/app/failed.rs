//! The dead letters on the tasks page: the failed tasks grouped by kind,
//! queue and error (core's `queue::failed`), the largest groups first,
//! each with its count, its oldest and newest failure, and an operator's
//! "Retry these" that puts exactly that group back to pending after a
//! confirmation.

use super::live::refresh_tick;
use super::time::{Age, LocalTime};
use super::widgets::{ActionOutcome, ConfirmBox, ConfirmButton, DataTable, Notice, controls_class};
use crate::error::AppError;
use leasekeeper_core::queue::TaskSearch;
use leasekeeper_core::queue::failed::{FailedGroup, MAX_GROUPS};
use leptos::either::Either;
use leptos::prelude::*;

/// The failed tasks grouped by kind, queue and error group, the largest
/// groups first (at most [`MAX_GROUPS`]).
#[server(prefix = "/sfn")]
pub async fn get_failed_groups() -> Result<Vec<FailedGroup>, AppError> {
    let state = super::context::state()?;
    crate::reads::read!(state, |conn| leasekeeper_core::queue::failed::summary(
        conn,
        state.schema()
    )
    .await)
    .map_err(super::context::refused)
}

/// Retries every failed task of kind `kind` in queue `queue` whose error
/// reads as `error_group` (a group of [`get_failed_groups`]): an operator
/// action, each task's retry audited in the same transaction.
#[server(prefix = "/sfn")]
pub async fn retry_failed_group(
    kind: String,
    queue: String,
    error_group: String,
) -> Result<String, AppError> {
    use leasekeeper_core::queue::control::{self, TaskFilter};
    use leasekeeper_core::queue::{TaskName, TaskStatus};
    let state = super::context::operator_state().await?;
    // Both names are required: a blank one would widen the retry to every
    // kind or queue, past the group the operator confirmed.
    let kind = TaskName::parse("kind", kind)
        .map_err(|e| super::context::refused(AppError::BadRequest(e)))?;
    let queue = TaskName::parse("queue", queue)
        .map_err(|e| super::context::refused(AppError::BadRequest(e)))?;
    let filter = TaskFilter {
        status: TaskStatus::Failed,
        kind: Some(kind.as_str().to_string()),
        queue: Some(queue.as_str().to_string()),
        data: None,
        error_group: Some(error_group),
    };
    let count = control::retry_matching(&state.pool, state.schema(), &filter, &state.instance_id)
        .await
        .map_err(|e| super::context::refused(e.into()))?;
    Ok(format!(
        "{count} tasks retried (kind {kind}, queue {queue}, error {:?})",
        filter.error_group.unwrap_or_default()
    ))
}

/// A group's key in the URL (`?confirm=group-<key>`): the same for the
/// same kind, queue and error group on the server and in the browser, and
/// short, so the confirmation link needs no encoding and survives a
/// reload. FNV-1a over the three, NUL-separated (no name or group holds a
/// NUL).
fn group_key(group: &FailedGroup) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in [&group.kind, &group.queue, &group.error_group] {
        for byte in part.bytes().chain([0]) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("{hash:016x}")
}

/// A group in words, for its confirmation.
fn group_words(group: &FailedGroup) -> String {
    format!(
        "{} failed task{} of kind {:?} in queue {:?} whose error reads {:?}",
        group.count,
        if group.count == 1 { "" } else { "s" },
        group.kind,
        group.queue,
        group.error_group
    )
}

/// The dead letters panel: the failed tasks' groups (narrowed to the
/// search's kind and queue, when it has them), each with "Retry these…",
/// a link to `here&confirm=group-<key>` (works before hydration) that
/// shows the confirmation above the table. `here` is the tasks page's
/// URL with its search.
#[component]
pub fn DeadLetters(
    search: Signal<TaskSearch>,
    here: Signal<String>,
    confirm: Signal<Option<String>>,
    retry: ServerAction<RetryFailedGroup>,
) -> impl IntoView {
    let tick = refresh_tick();
    // Keyed on the search too: its kind and queue narrow the groups.
    let groups = Resource::new(
        move || (search.get(), tick.get(), retry.version().get()),
        |(search, ..)| async move {
            let all = get_failed_groups().await?;
            let capped = all.len() >= MAX_GROUPS as usize;
            let shown: Vec<FailedGroup> = all
                .into_iter()
                .filter(|g| search.kind.as_ref().is_none_or(|k| *k == g.kind))
                .filter(|g| search.queue.as_ref().is_none_or(|q| *q == g.queue))
                .collect();
            Ok::<_, AppError>((shown, capped))
        },
    );
    view! {
        <section class="mt-4 rounded border border-red-200 bg-white p-3" data-testid="dead-letters" aria-labelledby="dead-letters-title">
            <h2 id="dead-letters-title" class="text-lg font-semibold">"Dead letters"</h2>
            <p class="text-sm text-slate-600">
                "Failed tasks grouped by kind, queue and error (numbers, UUIDs and hex read alike), the largest groups first. Retry puts a whole group back to pending with its attempts reset."
            </p>
            <ActionOutcome last=retry.value() prefix="dead-letters"/>
            <Transition fallback=|| view! { <p class="mt-2 text-sm text-slate-500">"Loading dead letters…"</p> }>
                {move || Suspend::new(async move {
                    match groups.await {
                        Ok((shown, capped)) => {
                            if shown.is_empty() {
                                return Either::Left(view! {
                                    <Notice kind="empty" testid="dead-letters-empty" text="No failed tasks".to_string()/>
                                });
                            }
                            Either::Right(Either::Left(view! {
                                <GroupConfirm groups=shown.clone() here confirm retry/>
                                <GroupTable groups=shown here/>
                                {capped.then(|| view! {
                                    <p class="mt-1 text-xs text-slate-500" data-testid="dead-letters-capped">
                                        {format!("The largest {MAX_GROUPS} groups only.")}
                                    </p>
                                })}
                            }))
                        }
                        Err(e) => Either::Right(Either::Right(view! {
                            <Notice kind="error" testid="dead-letters-error" text=format!("Cannot load the dead letters: {e}. The page retries on the next change, and every few seconds.")/>
                        })),
                    }
                })}
            </Transition>
        </section>
    }
}

/// The confirmation of the group `?confirm=group-<key>` names, if it is
/// still listed: what will be retried, "Retry them" and "Keep them".
#[component]
fn GroupConfirm(
    groups: Vec<FailedGroup>,
    here: Signal<String>,
    confirm: Signal<Option<String>>,
    retry: ServerAction<RetryFailedGroup>,
) -> impl IntoView {
    move || {
        let wanted = confirm.get()?;
        let group = groups
            .iter()
            .find(|g| wanted.strip_prefix("group-") == Some(group_key(g).as_str()))?
            .clone();
        let words = group_words(&group);
        Some(view! {
            <ConfirmBox prefix="dead-letter" question=format!("Retry the {words}, as many as there are when you confirm?")
                consequence="They go back to pending with their attempts reset to 0, and workers claim them again. Other groups stay failed."
                keep=here.get()>
                <ActionForm action=retry>
                    <input type="hidden" name="kind" value=group.kind.clone()/>
                    <input type="hidden" name="queue" value=group.queue.clone()/>
                    <input type="hidden" name="error_group" value=group.error_group.clone()/>
                    <ConfirmButton prefix="dead-letter" text="Retry them"/>
                </ActionForm>
            </ConfirmBox>
        })
    }
}

#[component]
fn GroupTable(groups: Vec<FailedGroup>, here: Signal<String>) -> impl IntoView {
    view! {
        <DataTable testid="dead-letters-table" headers=vec!["kind", "queue", "error", "count", "oldest", "newest", "controls"]>
            {groups
                .into_iter()
                .map(|g| {
                    let key = group_key(&g);
                    let example = g.example.clone().unwrap_or_default();
                    view! {
                        <tr class="border-t border-slate-100" data-testid="dead-letter-row" data-kind=g.kind.clone()
                            data-queue=g.queue.clone() data-error-group=g.error_group.clone() data-count=g.count>
                            <td class="px-3 py-2 font-mono text-xs" data-testid="dead-letter-kind">{g.kind.clone()}</td>
                            <td class="px-3 py-2 font-mono text-xs" data-testid="dead-letter-queue">{g.queue.clone()}</td>
                            // break-words: an error is a long run that would
                            // widen the page past a phone's screen.
                            <td class="min-w-48 max-w-md break-words px-3 py-2 text-xs" title=example.clone()>
                                <div class="font-mono" data-testid="dead-letter-error">
                                    {if g.error_group.is_empty() { "(no error recorded)".to_string() } else { g.error_group.clone() }}
                                </div>
                                <div class="mt-0.5 text-slate-500" data-testid="dead-letter-example">{format!("e.g. {example}")}</div>
                            </td>
                            <td class="px-3 py-2 tabular-nums font-semibold" data-testid="dead-letter-count">{g.count}</td>
                            <td class="px-3 py-2 text-xs tabular-nums">
                                <LocalTime at=g.oldest/>
                                <div class="text-slate-500"><Age at=g.oldest/></div>
                            </td>
                            <td class="px-3 py-2 text-xs tabular-nums">
                                <LocalTime at=g.newest/>
                                <div class="text-slate-500"><Age at=g.newest/></div>
                            </td>
                            <td class=controls_class("controls", "px-3 py-2 bg-white")>
                                <a href=move || format!("{}&confirm=group-{key}", here.get())
                                    class="whitespace-nowrap rounded bg-white px-2 py-0.5 text-xs font-medium ring-1 ring-slate-300 hover:bg-slate-100"
                                    title="Back to pending, attempts reset: every failed task of this group"
                                    data-testid="dead-letter-retry">"Retry these…"</a>
                            </td>
                        </tr>
                    }
                })
                .collect_view()}
        </DataTable>
    }
}

#[cfg(test)]
mod tests {
    use super::{FailedGroup, group_key};

    fn group(kind: &str, queue: &str, error_group: &str) -> FailedGroup {
        FailedGroup {
            kind: kind.into(),
            queue: queue.into(),
            error_group: error_group.into(),
            example: None,
            count: 1,
            oldest: chrono::DateTime::UNIX_EPOCH,
            newest: chrono::DateTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn a_groups_key_is_fixed_and_tells_kind_queue_and_error_apart() {
        let key = group_key(&group("email", "mail", "timeout after <n> ms"));
        assert_eq!(key.len(), 16);
        assert_eq!(
            key,
            group_key(&group("email", "mail", "timeout after <n> ms"))
        );
        // Where one part ends matters, not only the letters.
        for other in [
            group("emai", "lmail", "timeout after <n> ms"),
            group("email", "mail", "card declined"),
            group("email", "default", "timeout after <n> ms"),
            group("email", "mail", ""),
        ] {
            assert_ne!(group_key(&other), key, "{other:?}");
        }
    }
}
