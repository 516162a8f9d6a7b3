//! Workflows (issue 40): tasks enqueued together, some waiting for others.
//! "Run B and C after A, then D after both, and give D what they
//! produced" is one [`NewWorkflow`], enqueued in one transaction
//! ([`store::enqueue_workflow`], REST `POST /api/workflows`).
//!
//! What holds:
//! - **Order**: a task with parents (`depends_on`) is `waiting`, never
//!   claimable, until every parent ended; the statement that ends its last
//!   parent makes it pending (the tasks trigger `tasks_parents_ended`, the
//!   race of two parents ending at once named there). The claim rule takes
//!   pending tasks only, so no claim path (prefetch, batch, takeover, REST)
//!   starts a child early.
//! - **Outputs**: each parent's completion writes its output into its
//!   children's `parent_outputs` under the parent's ref; a child's claim
//!   and its handler's [`Job`](crate::worker::handler::Job) carry them.
//! - **Failure**: a parent that fails for good or is cancelled cancels its
//!   waiting children (their `last_error` names it), and theirs in turn;
//!   a child enqueued with [`OnParentFailure::Run`] runs anyway once every
//!   parent ended (cleanup), with the outputs of those that were processed.
//! - **Status**: a workflow is running while a task of it is unfinished,
//!   then completed (every task processed), failed (one failed) or
//!   cancelled ([`WorkflowStatus`]).
//!
//! ```
//! use leasekeeper_core::queue::NewTask;
//! use leasekeeper_core::workflow::{NewWorkflow, WorkflowTask};
//! use serde_json::json;
//!
//! // A diamond: fetch, then resize and scan, then publish after both.
//! let flow = NewWorkflow::new("publish photo")
//!     .task(WorkflowTask::new("fetch", NewTask::new("fetch", json!({"url": "…"}))))
//!     .task(WorkflowTask::new("resize", NewTask::new("resize", json!({}))).after(["fetch"]))
//!     .task(WorkflowTask::new("scan", NewTask::new("scan", json!({}))).after(["fetch"]))
//!     .task(WorkflowTask::new("publish", NewTask::new("publish", json!({})))
//!         .after(["resize", "scan"]))
//!     .task(WorkflowTask::new("tidy", NewTask::new("tidy", json!({})))
//!         .after(["publish"])
//!         .run_on_parent_failure());
//! assert!(flow.validate().is_ok());
//! ```

#[cfg(feature = "postgres")]
pub mod store;

use crate::queue::{EnqueueBody, NewTask, TaskName, TaskStatus};
use crate::text::text_enum;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// The most tasks one workflow holds.
pub const MAX_WORKFLOW_TASKS: usize = 1000;

/// The most edges (a task's parent, counted once per child) one workflow
/// holds.
pub const MAX_WORKFLOW_EDGES: usize = 10_000;

/// The longest workflow name and task ref, in characters.
pub const MAX_REF_CHARS: usize = 128;

text_enum! {
    stored;
    /// What a parent's failure (attempts used) or cancel does to a child.
    pub enum OnParentFailure {
        /// The child is cancelled, its `last_error` naming the parent, and
        /// so are its own children that would be (the default).
        Cancel = "cancel",
        /// The child runs anyway once every parent ended (cleanup); its
        /// `parent_outputs` hold the outputs of the parents processed.
        Run = "run",
    }
}

text_enum! {
    stored;
    /// A workflow's state, derived from its tasks.
    pub enum WorkflowStatus {
        /// A task of it is pending, waiting or started.
        Running = "running",
        /// Every task was processed.
        Completed = "completed",
        /// Every task ended, and one failed.
        Failed = "failed",
        /// Every task ended, none failed, and one was cancelled.
        Cancelled = "cancelled",
    }
}

impl WorkflowStatus {
    /// The status of a workflow whose tasks are in `statuses`.
    pub fn of(statuses: impl IntoIterator<Item = TaskStatus>) -> WorkflowStatus {
        let (mut unfinished, mut failed, mut cancelled) = (false, false, false);
        for s in statuses {
            match s {
                TaskStatus::Pending | TaskStatus::Started | TaskStatus::Waiting => {
                    unfinished = true
                }
                TaskStatus::Failed => failed = true,
                TaskStatus::Cancelled => cancelled = true,
                TaskStatus::Processed => {}
            }
        }
        if unfinished {
            WorkflowStatus::Running
        } else if failed {
            WorkflowStatus::Failed
        } else if cancelled {
            WorkflowStatus::Cancelled
        } else {
            WorkflowStatus::Completed
        }
    }
}

/// One task of a workflow: its `ref` (unique in the workflow), the task,
/// the refs it waits for, and what their failure does to it.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkflowTask {
    /// Its name in the workflow, 1 to [`MAX_REF_CHARS`] characters.
    pub r#ref: String,
    /// The task (no unique key: a workflow's tasks are its own).
    pub task: NewTask,
    /// The refs of its parents: it waits until each has ended.
    pub depends_on: Vec<String>,
    /// What a parent's failure or cancel does to it.
    pub on_parent_failure: OnParentFailure,
}

impl WorkflowTask {
    /// `task` under `r#ref`, with no parents.
    pub fn new(r#ref: impl Into<String>, task: NewTask) -> Self {
        WorkflowTask {
            r#ref: r#ref.into(),
            task,
            depends_on: Vec::new(),
            on_parent_failure: OnParentFailure::Cancel,
        }
    }

    /// Waits for the tasks of these refs (added to any named before).
    pub fn after<I, S>(mut self, parents: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.depends_on.extend(parents.into_iter().map(Into::into));
        self
    }

    /// Runs even when a parent failed or was cancelled ([`OnParentFailure::Run`]).
    pub fn run_on_parent_failure(mut self) -> Self {
        self.on_parent_failure = OnParentFailure::Run;
        self
    }
}

/// A workflow to enqueue: a name and its tasks, in any order.
#[derive(Clone, Debug, PartialEq)]
pub struct NewWorkflow {
    /// What it is, 1 to [`MAX_REF_CHARS`] characters (need not be unique).
    pub name: String,
    /// Its tasks (1 to [`MAX_WORKFLOW_TASKS`]).
    pub tasks: Vec<WorkflowTask>,
}

impl NewWorkflow {
    /// An empty workflow named `name`.
    pub fn new(name: impl Into<String>) -> Self {
        NewWorkflow {
            name: name.into(),
            tasks: Vec::new(),
        }
    }

    /// Adds `task`.
    pub fn task(mut self, task: WorkflowTask) -> Self {
        self.tasks.push(task);
        self
    }

    /// Checks the workflow: its name; 1 to [`MAX_WORKFLOW_TASKS`] tasks,
    /// each valid ([`NewTask::validate`]) and without a unique key; at most
    /// [`MAX_WORKFLOW_EDGES`] dependencies in all; refs
    /// well formed and unique; every parent a ref of the workflow, named
    /// once, not the task itself; no cycle. The error names the field as
    /// the REST body does (`tasks[2].depends_on: …`).
    pub fn validate(&self) -> Result<(), String> {
        TaskName::check("name", &self.name)?;
        if self.tasks.is_empty() {
            return Err("tasks: a workflow has at least one task".into());
        }
        if self.tasks.len() > MAX_WORKFLOW_TASKS {
            return Err(format!(
                "tasks: a workflow has at most {MAX_WORKFLOW_TASKS} tasks, not {}",
                self.tasks.len()
            ));
        }
        let mut index: HashMap<&str, usize> = HashMap::with_capacity(self.tasks.len());
        for (i, t) in self.tasks.iter().enumerate() {
            TaskName::check("ref", &t.r#ref).map_err(|e| format!("tasks[{i}].{e}"))?;
            if index.insert(t.r#ref.as_str(), i).is_some() {
                return Err(format!("tasks[{i}].ref: {:?} is used twice", t.r#ref));
            }
            t.task.validate().map_err(|e| format!("tasks[{i}].{e}"))?;
            if t.task.unique.is_some() {
                return Err(format!(
                    "tasks[{i}].unique_key: a workflow's tasks take no unique key"
                ));
            }
        }
        let edges: usize = self.tasks.iter().map(|t| t.depends_on.len()).sum();
        if edges > MAX_WORKFLOW_EDGES {
            return Err(format!(
                "tasks: a workflow has at most {MAX_WORKFLOW_EDGES} dependencies in all, not {edges}"
            ));
        }
        for (i, t) in self.tasks.iter().enumerate() {
            let mut seen = std::collections::HashSet::new();
            for p in &t.depends_on {
                if !index.contains_key(p.as_str()) {
                    return Err(format!("tasks[{i}].depends_on: no task has ref {p:?}"));
                }
                if p == &t.r#ref {
                    return Err(format!(
                        "tasks[{i}].depends_on: a task cannot wait for itself"
                    ));
                }
                if !seen.insert(p.as_str()) {
                    return Err(format!("tasks[{i}].depends_on: {p:?} is named twice"));
                }
            }
        }
        if let Some(r) = self.cycle() {
            return Err(format!(
                "tasks: the dependencies form a cycle through {r:?}"
            ));
        }
        Ok(())
    }

    /// A ref on a cycle of dependencies, if there is one (Kahn's order:
    /// what never reaches zero parents left is on or behind a cycle).
    fn cycle(&self) -> Option<&str> {
        let index: HashMap<&str, usize> = self
            .tasks
            .iter()
            .enumerate()
            .map(|(i, t)| (t.r#ref.as_str(), i))
            .collect();
        let mut left: Vec<usize> = self.tasks.iter().map(|t| t.depends_on.len()).collect();
        let mut children: Vec<Vec<usize>> = vec![Vec::new(); self.tasks.len()];
        for (i, t) in self.tasks.iter().enumerate() {
            for p in &t.depends_on {
                children[index[p.as_str()]].push(i);
            }
        }
        let mut ready: Vec<usize> = (0..left.len()).filter(|&i| left[i] == 0).collect();
        let mut done = 0;
        while let Some(i) = ready.pop() {
            done += 1;
            for &c in &children[i] {
                left[c] -= 1;
                if left[c] == 0 {
                    ready.push(c);
                }
            }
        }
        (done < self.tasks.len())
            .then(|| {
                left.iter()
                    .position(|&n| n > 0)
                    .map(|i| self.tasks[i].r#ref.as_str())
            })
            .flatten()
    }
}

/// The body of `POST /api/workflows`: a name and the tasks, each an
/// enqueue's body ([`EnqueueBody`]) with its `ref`, its parents and what
/// their failure does. [`WorkflowBody::workflow`] reads it, checked.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkflowBody {
    /// What it is (1 to 128 characters).
    #[cfg_attr(feature = "openapi", schema(value_type = TaskName))]
    pub name: String,
    /// Its tasks (1 to 1,000), in any order.
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 1000))]
    pub tasks: Vec<WorkflowTaskBody>,
}

/// One task of [`WorkflowBody`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkflowTaskBody {
    /// Its name in the workflow, unique there (1 to 128 characters).
    #[cfg_attr(feature = "openapi", schema(value_type = TaskName))]
    pub r#ref: String,
    /// The refs of the tasks it waits for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<String>,
    /// `cancel` (the default: a parent that fails for good or is cancelled
    /// cancels it) or `run` (it runs anyway once every parent ended).
    #[cfg_attr(feature = "openapi", schema(pattern = "^(cancel|run)$"))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_parent_failure: Option<String>,
    /// The task, as `POST /api/tasks` takes it (no `unique_key`).
    #[serde(flatten)]
    pub task: EnqueueBody,
}

impl WorkflowBody {
    /// The workflow this body asks for, checked ([`NewWorkflow::validate`]),
    /// with `default_kind` and `default_max_attempts` where a task names
    /// none; else what is wrong, naming the task (`tasks[2].…`).
    pub fn workflow(
        self,
        default_kind: &str,
        default_max_attempts: i32,
    ) -> Result<NewWorkflow, String> {
        if self.tasks.len() > MAX_WORKFLOW_TASKS {
            return Err(format!(
                "tasks: a workflow has at most {MAX_WORKFLOW_TASKS} tasks, not {}",
                self.tasks.len()
            ));
        }
        let mut flow = NewWorkflow::new(self.name);
        for (i, t) in self.tasks.into_iter().enumerate() {
            let on_parent_failure = match t.on_parent_failure.as_deref() {
                None => OnParentFailure::Cancel,
                Some(name) => OnParentFailure::parse(name).ok_or_else(|| {
                    format!("tasks[{i}].on_parent_failure must be cancel or run, not {name:?}")
                })?,
            };
            let task = t
                .task
                .task(default_kind, default_max_attempts)
                .map_err(|e| format!("tasks[{i}].{e}"))?;
            flow.tasks.push(WorkflowTask {
                r#ref: t.r#ref,
                task,
                depends_on: t.depends_on,
                on_parent_failure,
            });
        }
        flow.validate()?;
        Ok(flow)
    }
}

/// A workflow as stored: its tasks with their states and edges.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Workflow {
    /// Its id.
    pub id: i64,
    /// Its name.
    pub name: String,
    /// Derived from its tasks.
    pub status: WorkflowStatus,
    /// When it was enqueued.
    pub created_at: DateTime<Utc>,
    /// Its tasks, by id.
    pub tasks: Vec<WorkflowTaskState>,
}

/// One task of a stored workflow.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "postgres", derive(sqlx::FromRow))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkflowTaskState {
    /// Its ref in the workflow.
    #[cfg_attr(feature = "postgres", sqlx(rename = "ref"))]
    pub r#ref: String,
    /// The task's id.
    pub id: i64,
    /// Its status now.
    pub status: TaskStatus,
    /// Its kind.
    pub kind: String,
    /// The refs of its parents.
    pub depends_on: Vec<String>,
    /// Its attempts so far.
    pub attempts: i32,
    /// Why its last attempt failed, or why it was cancelled.
    pub last_error: Option<String>,
}

/// A workflow in a list: its figures without its tasks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkflowSummary {
    /// Its id.
    pub id: i64,
    /// Its name.
    pub name: String,
    /// Derived from its tasks.
    pub status: WorkflowStatus,
    /// When it was enqueued.
    pub created_at: DateTime<Utc>,
    /// Its tasks.
    pub tasks: i64,
    /// Of them, processed.
    pub processed: i64,
}

/// A task's place in its workflow, for its page: its parents (with how
/// each ended, if it did) and its children (with their status).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TaskLinks {
    /// The tasks it waits for.
    pub parents: Vec<Link>,
    /// The tasks waiting for it.
    pub children: Vec<Link>,
}

/// One neighbour of a task in its workflow.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Link {
    /// Its id.
    pub id: i64,
    /// Its ref in the workflow.
    pub r#ref: String,
    /// Its status now (null when retention deleted it).
    pub status: Option<TaskStatus>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn t(r: &str) -> WorkflowTask {
        WorkflowTask::new(r, NewTask::new("k", json!({})))
    }

    #[test]
    fn a_diamond_passes_and_each_mistake_is_named() {
        let ok = NewWorkflow::new("d")
            .task(t("a"))
            .task(t("b").after(["a"]))
            .task(t("c").after(["a"]))
            .task(t("d").after(["b", "c"]));
        assert_eq!(ok.validate(), Ok(()));
        let err = |w: NewWorkflow| w.validate().unwrap_err();
        assert!(err(NewWorkflow::new("e")).contains("at least one task"));
        assert!(err(NewWorkflow::new("e").task(t("a")).task(t("a"))).contains("tasks[1].ref"));
        assert!(
            err(NewWorkflow::new("e").task(t("a").after(["x"]))).contains("no task has ref \"x\"")
        );
        assert!(err(NewWorkflow::new("e").task(t("a").after(["a"]))).contains("itself"));
        assert!(
            err(NewWorkflow::new("e")
                .task(t("a"))
                .task(t("b").after(["a", "a"])))
            .contains("named twice")
        );
        let cyc = NewWorkflow::new("e")
            .task(t("a").after(["c"]))
            .task(t("b").after(["a"]))
            .task(t("c").after(["b"]))
            .task(t("z"));
        assert!(err(cyc).contains("cycle"));
        assert!(err(NewWorkflow::new("")).contains("name"));
        let mut big = NewWorkflow::new("big");
        for i in 0..=MAX_WORKFLOW_TASKS {
            big = big.task(t(&format!("t{i}")));
        }
        assert!(err(big).contains("at most 1000"));
    }

    #[test]
    fn the_status_is_derived_from_the_tasks() {
        use TaskStatus::*;
        assert_eq!(
            WorkflowStatus::of([Processed, Waiting]),
            WorkflowStatus::Running
        );
        assert_eq!(
            WorkflowStatus::of([Processed, Processed]),
            WorkflowStatus::Completed
        );
        assert_eq!(
            WorkflowStatus::of([Failed, Cancelled]),
            WorkflowStatus::Failed
        );
        assert_eq!(
            WorkflowStatus::of([Processed, Cancelled]),
            WorkflowStatus::Cancelled
        );
    }
}
