//! The workflows pages: the list of workflows, newest first, with their
//! status and how many of their tasks are processed; and one workflow: its
//! tasks drawn as a graph (a task below its parents, each edge from parent
//! to child), the same tasks as a table, and the operator's cancel.

use super::live::refresh_tick;
use super::tasks::{status_badge, status_node};
use super::time::{Age, LocalTime};
use super::widgets::{ActionOutcome, ConfirmBox, ConfirmButton, DataTable, Notice, Pager};
use crate::error::{AppError, parse_id};
use leasekeeper_core::paging::Paged;
use leasekeeper_core::queue::TaskStatus;
use leasekeeper_core::workflow::{Workflow, WorkflowStatus, WorkflowSummary, WorkflowTaskState};
use leptos::either::{Either, EitherOf3};
use leptos::prelude::*;
use leptos_router::hooks::{use_params_map, use_query_map};
use std::collections::HashMap;

/// A page of workflows, newest first, below `before`.
#[server(prefix = "/sfn")]
pub async fn get_workflows(before: Option<i64>) -> Result<Paged<WorkflowSummary>, AppError> {
    use leasekeeper_core::workflow::store;
    let state = super::context::state()?;
    let cursor = leasekeeper_core::paging::Cursor::new(before, None);
    crate::reads::read!(state, |conn| store::list(conn, state.schema(), cursor)
        .await)
    .map_err(super::context::refused)
}

/// Workflow `id` with its tasks; `None` when there is none.
#[server(prefix = "/sfn")]
pub async fn get_workflow(id: i64) -> Result<Option<Workflow>, AppError> {
    use leasekeeper_core::workflow::store;
    crate::error::check_id(id)?;
    let state = super::context::state()?;
    crate::reads::read!(state, |conn| store::get(conn, state.schema(), id).await)
        .map_err(super::context::refused)
}

/// Cancels every unfinished task of workflow `id`: an operator action,
/// each task's cancel audited in the same transaction.
#[server(prefix = "/sfn")]
pub async fn cancel_workflow(id: i64) -> Result<String, AppError> {
    use leasekeeper_core::queue::store::TaskError;
    use leasekeeper_core::workflow::store;
    crate::error::check_id(id)?;
    let state = super::context::operator_state().await?;
    let mut conn = state.pool.acquire().await?;
    let flow = match store::cancel(&mut conn, state.schema(), id, &state.instance_id).await {
        Ok(flow) => flow,
        Err(TaskError::NotFound(_)) => {
            return Err(super::context::refused(AppError::NotFound(format!(
                "no workflow with id {id}"
            ))));
        }
        Err(e) => return Err(super::context::refused(e.into())),
    };
    let cancelled = flow
        .tasks
        .iter()
        .filter(|t| t.status == TaskStatus::Cancelled)
        .count();
    Ok(format!(
        "workflow {id} is {}: {cancelled} of its {} tasks cancelled",
        flow.status.as_str(),
        flow.tasks.len()
    ))
}

/// The colours of a workflow's status pill (the task badges' hues).
fn workflow_badge(status: WorkflowStatus) -> &'static str {
    match status {
        WorkflowStatus::Running => "bg-sky-100 text-sky-800",
        WorkflowStatus::Completed => "bg-emerald-100 text-emerald-800",
        WorkflowStatus::Failed => "bg-red-100 text-red-800",
        WorkflowStatus::Cancelled => "bg-amber-100 text-amber-800",
    }
}

#[component]
fn WorkflowStatusPill(status: WorkflowStatus, testid: &'static str) -> impl IntoView {
    view! {
        <span class=format!("rounded px-2 py-0.5 text-xs font-medium {}", workflow_badge(status)) data-testid=testid>
            {status.as_str()}
        </span>
    }
}

/// The workflows page.
#[component]
pub fn WorkflowsPage() -> impl IntoView {
    let tick = refresh_tick();
    let before = super::widgets::before_param();
    let flows = Resource::new(
        move || (before.get(), tick.get()),
        |(before, _)| get_workflows(before),
    );
    view! {
        <h1 class="text-2xl font-semibold">"Workflows"</h1>
        <p class="text-sm text-slate-600">
            "Tasks enqueued together, some waiting for others: a task runs once each of its parents ended, and gets their outputs. Newest first. Enqueue one with POST /api/workflows."
        </p>
        <Transition fallback=|| view! { <p class="mt-4 text-sm text-slate-500">"Loading workflows…"</p> }>
            {move || Suspend::new(async move {
                match flows.await {
                    Ok(page) if page.items.is_empty() => Either::Left(view! {
                        <Notice kind="empty" testid="workflows-empty" text="No workflow yet. Enqueue one: POST /api/workflows {\"name\": \"photo\", \"tasks\": [{\"ref\": \"fetch\", \"kind\": \"fetch\", \"task_data\": {}}, {\"ref\": \"resize\", \"kind\": \"resize\", \"task_data\": {}, \"depends_on\": [\"fetch\"]}]}.".to_string()/>
                    }),
                    Ok(page) => {
                        let next = page.next;
                        Either::Right(Either::Left(view! {
                            <WorkflowTable flows=page.items/>
                            <Pager base="/workflows".to_string() before=before.get_untracked() next testid="workflows-pager"/>
                        }))
                    }
                    Err(e) => Either::Right(Either::Right(view! {
                        <Notice kind="error" testid="workflows-error" text=format!("Cannot load workflows: {e}. The page retries on the next change, and every few seconds.")/>
                    })),
                }
            })}
        </Transition>
    }
}

#[component]
fn WorkflowTable(flows: Vec<WorkflowSummary>) -> impl IntoView {
    view! {
        <DataTable testid="workflows-table" headers=vec!["workflow", "id", "status", "processed", "enqueued"]>
            {flows
                .into_iter()
                .map(|w| view! {
                    <tr class="border-t border-slate-100" data-testid="workflow-row" data-workflow-id=w.id data-status=w.status.as_str()>
                        <td class="max-w-xs break-words px-3 py-2">
                            <a class="text-indigo-700 underline" href=format!("/workflows/{}", w.id) data-testid="workflow-link">{w.name.clone()}</a>
                        </td>
                        <td class="px-3 py-2 font-mono tabular-nums">{w.id}</td>
                        <td class="px-3 py-2"><WorkflowStatusPill status=w.status testid="workflow-status"/></td>
                        <td class="px-3 py-2 tabular-nums" data-testid="workflow-processed">{format!("{}/{}", w.processed, w.tasks)}</td>
                        <td class="px-3 py-2 tabular-nums">
                            <LocalTime at=w.created_at/>
                            <div class="text-xs text-slate-500"><Age at=w.created_at/></div>
                        </td>
                    </tr>
                })
                .collect_view()}
        </DataTable>
    }
}

/// One workflow's page (`/workflows/{id}`).
#[component]
pub fn WorkflowPage() -> impl IntoView {
    let params = use_params_map();
    let query = use_query_map();
    let raw_id = Memo::new(move |_| params.read().get("id").unwrap_or_default());
    // `?confirm=cancel`: asks before the cancel.
    let confirming = Memo::new(move |_| query.read().get("confirm").as_deref() == Some("cancel"));
    let tick = refresh_tick();
    let cancel = ServerAction::<CancelWorkflow>::new();
    let flow = Resource::new(
        move || (raw_id.get(), tick.get(), cancel.version().get()),
        |(raw, _, _)| async move {
            let id = parse_id(&raw)?;
            get_workflow(id).await.map(|w| w.ok_or(id))
        },
    );
    view! {
        <p class="text-sm"><a class="text-indigo-700 underline" href="/workflows" data-testid="workflows-back">"← Workflows"</a></p>
        <ActionOutcome last=cancel.value() prefix="workflow"/>
        <Transition fallback=|| view! { <p class="mt-4 text-sm text-slate-500">"Loading workflow…"</p> }>
            {move || Suspend::new(async move {
                match flow.await {
                    Ok(Ok(flow)) => EitherOf3::A(view! {
                        <WorkflowView flow confirming=Signal::derive(move || confirming.get()) cancel/>
                    }),
                    Ok(Err(id)) => EitherOf3::B(view! {
                        <Notice kind="warn" testid="workflow-missing" text=format!("No workflow with id {id}.")/>
                    }),
                    Err(e) => EitherOf3::C(view! {
                        <Notice kind="error" testid="workflow-error" text=format!("Cannot load the workflow: {e}. The page retries on the next change, and every few seconds.")/>
                    }),
                }
            })}
        </Transition>
    }
}

#[component]
fn WorkflowView(
    flow: Workflow,
    confirming: Signal<bool>,
    cancel: ServerAction<CancelWorkflow>,
) -> impl IntoView {
    let here = format!("/workflows/{}", flow.id);
    let running = flow.status == WorkflowStatus::Running;
    let unfinished = flow
        .tasks
        .iter()
        .filter(|t| {
            matches!(
                t.status,
                TaskStatus::Pending | TaskStatus::Waiting | TaskStatus::Started
            )
        })
        .count();
    let control = running.then(|| {
        view! {
            <a href=format!("{here}?confirm=cancel")
                class="rounded bg-white px-2 py-0.5 text-xs font-medium ring-1 ring-slate-300 hover:bg-slate-100"
                data-testid="workflow-cancel">"Cancel workflow…"</a>
        }
    });
    let id = flow.id;
    let keep = here.clone();
    let confirm = move || {
        (running && confirming.get()).then(|| {
            view! {
                <ConfirmBox prefix="workflow-cancel" question=format!("Cancel the {unfinished} unfinished tasks of this workflow?")
                    consequence="Pending and waiting tasks will never run; a started one's claim ends, and its worker has its next heartbeat and completion refused. Finished tasks stay as they are."
                    keep=keep.clone()>
                    <ActionForm action=cancel>
                        <input type="hidden" name="id" value=id/>
                        <ConfirmButton prefix="workflow-cancel" text="Cancel them"/>
                    </ActionForm>
                </ConfirmBox>
            }
        })
    };
    let processed = flow
        .tasks
        .iter()
        .filter(|t| t.status == TaskStatus::Processed)
        .count();
    view! {
        <section class="mt-2" data-testid="workflow-detail" data-workflow-id=flow.id data-status=flow.status.as_str()>
            <div class="flex flex-wrap items-baseline gap-x-6 gap-y-1">
                <h1 class="min-w-0 break-words text-2xl font-semibold" data-testid="workflow-name">{flow.name.clone()}</h1>
                <span class="font-mono text-sm text-slate-600">{format!("workflow {}", flow.id)}</span>
                <WorkflowStatusPill status=flow.status testid="workflow-detail-status"/>
                <span class="text-sm tabular-nums" data-testid="workflow-detail-processed">{format!("{processed}/{} processed", flow.tasks.len())}</span>
                <span class="text-sm text-slate-600">"enqueued " <LocalTime at=flow.created_at/></span>
                {control}
            </div>
            {confirm}
            <h2 class="mt-4 text-lg font-semibold">"Graph"</h2>
            <p class="text-xs text-slate-500">"Each task below its parents; an arrow runs from a parent to the task that waits for it. A node opens its task."</p>
            <DagView dag=Dag::of(&flow.tasks)/>
            <h2 class="mt-6 text-lg font-semibold">"Tasks"</h2>
            <DataTable testid="workflow-tasks" headers=vec!["ref", "task", "kind", "status", "parents", "attempts", "last error"]>
                {flow.tasks.into_iter().map(|t| view! {
                    <tr class="border-t border-slate-100" data-testid="workflow-task-row" data-ref=t.r#ref.clone() data-task-id=t.id data-status=t.status.as_str()>
                        <td class="max-w-[12rem] break-words px-3 py-2 font-mono">{t.r#ref.clone()}</td>
                        <td class="px-3 py-2"><a class="text-indigo-700 underline" href=format!("/tasks?id={}", t.id) data-testid="workflow-task-link">{t.id}</a></td>
                        <td class="px-3 py-2 font-mono text-xs">{t.kind.clone()}</td>
                        <td class="px-3 py-2">
                            <span class=format!("rounded px-2 py-0.5 text-xs font-medium {}", status_badge(t.status)) data-testid="workflow-task-status">{t.status.as_str()}</span>
                        </td>
                        <td class="px-3 py-2 font-mono text-xs" data-testid="workflow-task-parents">{t.depends_on.join(", ")}</td>
                        <td class="px-3 py-2 tabular-nums">{t.attempts}</td>
                        <td class="min-w-0 max-w-md break-words px-3 py-2 text-xs">{t.last_error.clone().unwrap_or_default()}</td>
                    </tr>
                }).collect_view()}
            </DataTable>
        </section>
    }
}

/// A node's size and the gaps between them, in SVG units.
const NODE_W: i32 = 156;
const NODE_H: i32 = 56;
const GAP_X: i32 = 24;
const GAP_Y: i32 = 44;
const PAD: i32 = 8;
/// The most characters of a ref or kind a node shows (the whole in its
/// tooltip and in the table).
const NODE_CHARS: usize = 20;

/// A workflow's tasks placed for drawing: rows by depth (a task's layer is
/// one more than its deepest parent's; tasks without parents on top), each
/// row centred, and an edge from each parent to each child.
#[derive(Clone, Debug, PartialEq)]
pub struct Dag {
    /// The tasks with their places.
    pub nodes: Vec<Node>,
    /// Parent → child.
    pub edges: Vec<Edge>,
    /// The drawing's size.
    pub width: i32,
    /// The drawing's height.
    pub height: i32,
}

/// One task in the drawing: its top-left corner and its layer.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// The task.
    pub task: WorkflowTaskState,
    /// Its depth: 0 without parents, else 1 + its deepest parent's.
    pub layer: usize,
    /// Left edge.
    pub x: i32,
    /// Top edge.
    pub y: i32,
}

/// One edge, from the bottom of the parent to the top of the child.
#[derive(Clone, Debug, PartialEq)]
pub struct Edge {
    /// The parent's ref.
    pub from: String,
    /// The child's ref.
    pub to: String,
    /// The SVG path.
    pub path: String,
}

impl Dag {
    /// Lays out `tasks` (refs unique, parents named by ref; a parent not
    /// among them is left out, and a cycle, which a stored workflow cannot
    /// have, is cut rather than followed).
    pub fn of(tasks: &[WorkflowTaskState]) -> Dag {
        let index: HashMap<&str, usize> = tasks
            .iter()
            .enumerate()
            .map(|(i, t)| (t.r#ref.as_str(), i))
            .collect();
        let parents: Vec<Vec<usize>> = tasks
            .iter()
            .map(|t| {
                t.depends_on
                    .iter()
                    .filter_map(|p| index.get(p.as_str()).copied())
                    .collect()
            })
            .collect();
        let mut layer: Vec<Option<usize>> = vec![None; tasks.len()];
        let mut open = vec![false; tasks.len()];
        for i in 0..tasks.len() {
            depth(i, &parents, &mut layer, &mut open);
        }
        let layer: Vec<usize> = layer.into_iter().map(Option::unwrap_or_default).collect();
        let rows = layer.iter().max().map_or(0, |m| m + 1);
        // Each row in the order of the mean place of its tasks' parents in
        // the row above (fewer crossings), ties by id order.
        let mut place = vec![0.0_f64; tasks.len()];
        let by_row: Vec<Vec<usize>> = (0..rows)
            .map(|row| {
                let mut members: Vec<(f64, usize)> = (0..tasks.len())
                    .filter(|&i| layer[i] == row)
                    .map(|i| {
                        let ps = &parents[i];
                        let mean = if ps.is_empty() {
                            i as f64
                        } else {
                            ps.iter().map(|&p| place[p]).sum::<f64>() / ps.len() as f64
                        };
                        (mean, i)
                    })
                    .collect();
                members.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                for (k, &(_, i)) in members.iter().enumerate() {
                    place[i] = k as f64;
                }
                members.into_iter().map(|(_, i)| i).collect()
            })
            .collect();
        let widest = by_row.iter().map(Vec::len).max().unwrap_or(0) as i32;
        let span = |n: i32| (n * (NODE_W + GAP_X) - GAP_X).max(0);
        let width = span(widest) + 2 * PAD;
        let height = (rows as i32 * (NODE_H + GAP_Y) - GAP_Y).max(0) + 2 * PAD;
        let mut at = vec![(0, 0); tasks.len()];
        for (row, members) in by_row.iter().enumerate() {
            let left = PAD + (span(widest) - span(members.len() as i32)) / 2;
            for (k, &i) in members.iter().enumerate() {
                at[i] = (
                    left + k as i32 * (NODE_W + GAP_X),
                    PAD + row as i32 * (NODE_H + GAP_Y),
                );
            }
        }
        let mut edges = Vec::new();
        for (child, ps) in parents.iter().enumerate() {
            for &p in ps {
                let (x1, y1) = (at[p].0 + NODE_W / 2, at[p].1 + NODE_H);
                let (x2, y2) = (at[child].0 + NODE_W / 2, at[child].1);
                let bend = (y2 - y1).abs() / 2;
                edges.push(Edge {
                    from: tasks[p].r#ref.clone(),
                    to: tasks[child].r#ref.clone(),
                    path: format!(
                        "M {x1} {y1} C {x1} {} {x2} {} {x2} {y2}",
                        y1 + bend,
                        y2 - bend
                    ),
                });
            }
        }
        let nodes = tasks
            .iter()
            .enumerate()
            .map(|(i, t)| Node {
                task: t.clone(),
                layer: layer[i],
                x: at[i].0,
                y: at[i].1,
            })
            .collect();
        Dag {
            nodes,
            edges,
            width,
            height,
        }
    }
}

/// Task `i`'s layer, memoised in `layer`; `open` marks the tasks on the
/// current path, so a cycle ends the walk instead of recursing forever.
fn depth(
    i: usize,
    parents: &[Vec<usize>],
    layer: &mut [Option<usize>],
    open: &mut [bool],
) -> usize {
    if let Some(l) = layer[i] {
        return l;
    }
    if open[i] {
        return 0;
    }
    open[i] = true;
    let l = parents[i]
        .iter()
        .map(|&p| depth(p, parents, layer, open) + 1)
        .max()
        .unwrap_or(0);
    open[i] = false;
    layer[i] = Some(l);
    l
}

/// `text` cut to [`NODE_CHARS`] characters, with an ellipsis when cut.
fn clipped(text: &str) -> String {
    if text.chars().count() <= NODE_CHARS {
        text.to_string()
    } else {
        let mut cut: String = text.chars().take(NODE_CHARS - 1).collect();
        cut.push('…');
        cut
    }
}

/// The drawing: inline SVG, scrolling inside its own box when wider than
/// the screen.
#[component]
fn DagView(dag: Dag) -> impl IntoView {
    let (width, height) = (dag.width, dag.height);
    let edges = dag
        .edges
        .into_iter()
        .map(|e| {
            view! {
                <path d=e.path class="fill-none stroke-slate-400" stroke-width="1.5" marker-end="url(#dag-arrow)"
                    data-testid="dag-edge" data-from=e.from data-to=e.to/>
            }
        })
        .collect_view();
    let nodes = dag
        .nodes
        .into_iter()
        .map(|n| {
            let t = n.task;
            let (shape, ink) = status_node(t.status);
            let tip = format!("{} ({}): {}", t.r#ref, t.kind, t.status.as_str());
            view! {
                <g data-testid="dag-node" data-ref=t.r#ref.clone() data-task-id=t.id data-status=t.status.as_str() data-layer=n.layer
                    transform=format!("translate({} {})", n.x, n.y)>
                    <a href=format!("/tasks?id={}", t.id) data-testid="dag-node-link" aria-label=tip.clone()>
                        <title>{tip.clone()}</title>
                        <rect width=NODE_W height=NODE_H rx="6" class=shape stroke-width="1.5"/>
                        <text x="10" y="18" class="fill-slate-900 font-mono text-xs font-semibold">{clipped(&t.r#ref)}</text>
                        <text x="10" y="33" class="fill-slate-500 font-mono text-xs">{clipped(&t.kind)}</text>
                        <text x="10" y="48" class=format!("text-xs font-medium {ink}") data-testid="dag-node-status">{t.status.as_str()}</text>
                    </a>
                </g>
            }
        })
        .collect_view();
    view! {
        <div class="mt-2 overflow-x-auto rounded border border-slate-200 bg-white p-2">
            <svg xmlns="http://www.w3.org/2000/svg" width=width height=height viewBox=format!("0 0 {width} {height}")
                role="img" aria-label="The workflow's tasks and what each waits for" data-testid="workflow-dag">
                <defs>
                    <marker id="dag-arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="8" markerHeight="8" orient="auto">
                        <path d="M 0 0 L 8 4 L 0 8 z" class="fill-slate-400"/>
                    </marker>
                </defs>
                <g>{edges}</g>
                <g>{nodes}</g>
            </svg>
        </div>
    }
}

#[cfg(test)]
mod tests {
    use super::{Dag, GAP_Y, NODE_H, NODE_W, clipped};
    use leasekeeper_core::queue::TaskStatus;
    use leasekeeper_core::workflow::WorkflowTaskState;

    fn t(r: &str, id: i64, parents: &[&str]) -> WorkflowTaskState {
        WorkflowTaskState {
            r#ref: r.to_string(),
            id,
            status: TaskStatus::Waiting,
            kind: "k".to_string(),
            depends_on: parents.iter().map(|p| p.to_string()).collect(),
            attempts: 0,
            last_error: None,
        }
    }

    #[test]
    fn a_diamond_has_three_layers_four_edges_and_its_parents_above_their_children() {
        let dag = Dag::of(&[
            t("d", 4, &["b", "c"]),
            t("a", 1, &[]),
            t("b", 2, &["a"]),
            t("c", 3, &["a"]),
        ]);
        let node = |r: &str| dag.nodes.iter().find(|n| n.task.r#ref == r).unwrap();
        assert_eq!(["a", "b", "c", "d"].map(|r| node(r).layer), [0, 1, 1, 2]);
        assert_eq!(dag.edges.len(), 4);
        for e in &dag.edges {
            assert!(node(&e.from).y + NODE_H < node(&e.to).y, "{e:?}");
        }
        // Two side by side in the middle row, not overlapping; the others centred.
        assert!(node("b").x + NODE_W <= node("c").x);
        assert_eq!(node("a").x, node("d").x);
        assert_eq!(node("a").x * 2 + NODE_W, node("b").x + node("c").x + NODE_W);
        assert_eq!(dag.height, 3 * NODE_H + 2 * GAP_Y + 16);
    }

    #[test]
    fn a_task_sits_below_its_deepest_parent_and_a_cycle_or_unknown_parent_ends_the_walk() {
        // c waits for a (layer 0) and b (layer 1): layer 2.
        let dag = Dag::of(&[t("a", 1, &[]), t("b", 2, &["a"]), t("c", 3, &["a", "b"])]);
        assert_eq!(
            dag.nodes.iter().map(|n| n.layer).collect::<Vec<_>>(),
            [0, 1, 2]
        );
        let odd = Dag::of(&[t("x", 1, &["y"]), t("y", 2, &["x"]), t("z", 3, &["gone"])]);
        assert_eq!(odd.nodes.len(), 3);
        assert_eq!(odd.edges.len(), 2);
        assert!(Dag::of(&[]).nodes.is_empty());
    }

    #[test]
    fn long_names_are_cut_with_an_ellipsis() {
        assert_eq!(clipped("short"), "short");
        let cut = clipped(&"r".repeat(40));
        assert_eq!(cut.chars().count(), 20);
        assert!(cut.ends_with('…'));
    }
}
