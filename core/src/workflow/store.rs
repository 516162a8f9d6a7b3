//! Workflows in the database: enqueued in one transaction, read with their
//! tasks and edges, listed, cancelled.

use super::{
    Link, NewWorkflow, TaskLinks, Workflow, WorkflowStatus, WorkflowSummary, WorkflowTaskState,
};
use crate::db::Schema;
use crate::live::{self, Topics};
use crate::paging::{Cursor, Paged};
use crate::queue::TaskStatus;
use crate::queue::store::TaskError;
use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use std::collections::HashMap;

/// Enqueues `workflow` (checked first: [`NewWorkflow::validate`], refused
/// whole with [`TaskError::BadInput`]): its row, every task (those with
/// parents `waiting`, the others pending) and every edge, in one
/// transaction, the caller's when `conn` is one, so a service can enqueue
/// a workflow together with its own writes. Answers it as stored.
pub async fn enqueue_workflow(
    conn: &mut PgConnection,
    schema: &Schema,
    workflow: &NewWorkflow,
) -> Result<Workflow, TaskError> {
    workflow.validate().map_err(TaskError::BadInput)?;
    crate::db::atomically!(conn, schema, Result<Workflow, TaskError>, async {
        let _announced = live::announce_on_return(Topics::TASKS | Topics::WORK);
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        let (id,): (i64,) = schema
            .query_as("INSERT INTO $schema.workflows (name) VALUES ($1) RETURNING id")
            .bind(&workflow.name)
            .fetch_one(&mut *tx)
            .await?;
        let tasks: Vec<_> = workflow.tasks.iter().map(|t| t.task.clone()).collect();
        let refs: Vec<String> = workflow.tasks.iter().map(|t| t.r#ref.clone()).collect();
        let parents: Vec<i32> = workflow
            .tasks
            .iter()
            .map(|t| i32::try_from(t.depends_on.len()).unwrap_or(i32::MAX))
            .collect();
        let on_failure: Vec<Option<&'static str>> = workflow
            .tasks
            .iter()
            .map(|t| (!t.depends_on.is_empty()).then(|| t.on_parent_failure.as_str()))
            .collect();
        let ids = crate::queue::store::insert_workflow_tasks(
            &mut tx,
            schema,
            id,
            &tasks,
            &refs,
            &parents,
            &on_failure,
        )
        .await
        .map_err(crate::queue::store::queue_cap)?;
        let by_ref: HashMap<&str, i64> = refs.iter().map(String::as_str).zip(ids.iter().copied()).collect();
        let (mut child, mut parent, mut parent_ref) = (Vec::new(), Vec::new(), Vec::new());
        for (t, &task_id) in workflow.tasks.iter().zip(&ids) {
            for p in &t.depends_on {
                child.push(task_id);
                parent.push(by_ref[p.as_str()]);
                parent_ref.push(p.as_str());
            }
        }
        if !child.is_empty() {
            // Decides no ownership: the edges of tasks no one can claim yet
            // (waiting), written before the transaction commits them all.
            schema
                .query(
                    "INSERT INTO $schema.task_parents (task_id, parent_id, parent_ref)
                     SELECT * FROM unnest($1::int8[], $2::int8[], $3::text[])",
                )
                .bind(&child)
                .bind(&parent)
                .bind(&parent_ref)
                .execute(&mut *tx)
                .await?;
        }
        let stored = read(&mut tx, schema, id).await?.expect("the workflow just inserted");
        tx.commit().await?;
        Ok(stored)
    }
    .await)
}

/// Workflow `id` with its tasks (by id) and their parents' refs; `None`
/// when there is none.
pub async fn get(
    conn: &mut PgConnection,
    schema: &Schema,
    id: i64,
) -> Result<Option<Workflow>, sqlx::Error> {
    crate::db::atomically!(
        conn,
        schema,
        Result<Option<Workflow>, sqlx::Error>,
        async { read(conn, schema, id).await }.await
    )
}

async fn read(
    conn: &mut PgConnection,
    schema: &Schema,
    id: i64,
) -> Result<Option<Workflow>, sqlx::Error> {
    let head: Option<(i64, String, DateTime<Utc>)> = schema
        .query_as("SELECT id, name, created_at FROM $schema.workflows WHERE id = $1")
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?;
    let Some((id, name, created_at)) = head else {
        return Ok(None);
    };
    let tasks: Vec<WorkflowTaskState> = schema
        .query_as(
            "SELECT t.workflow_ref AS \"ref\", t.id, t.status, t.kind, t.attempts, t.last_error,
                    coalesce((SELECT array_agg(p.parent_ref ORDER BY p.parent_id)
                                FROM $schema.task_parents p WHERE p.task_id = t.id), '{}')
                      AS depends_on
               FROM $schema.tasks t
              WHERE t.workflow_id = $1
              ORDER BY t.id",
        )
        .bind(id)
        .fetch_all(&mut *conn)
        .await?;
    Ok(Some(Workflow {
        id,
        name,
        status: WorkflowStatus::of(tasks.iter().map(|t| t.status)),
        created_at,
        tasks,
    }))
}

/// A page of workflows, newest first (`cursor`): each with its status and
/// how many of its tasks are processed.
pub async fn list(
    conn: &mut PgConnection,
    schema: &Schema,
    cursor: Cursor,
) -> Result<Paged<WorkflowSummary>, sqlx::Error> {
    crate::db::atomically!(
        conn,
        schema,
        Result<Paged<WorkflowSummary>, sqlx::Error>,
        async {
            // Each workflow's distinct task statuses (six at most), its
            // status derived from them by the one rule, WorkflowStatus::of.
            let rows: Vec<Figures> = schema
                .query_as(
                    "SELECT w.id, w.name, w.created_at, count(t.id) AS tasks,
                        count(t.id) FILTER (WHERE t.status = 'processed') AS processed,
                        coalesce(array_agg(DISTINCT t.status) FILTER (WHERE t.id IS NOT NULL),
                                 '{}') AS statuses
                   FROM (SELECT * FROM $schema.workflows
                          WHERE id < $1
                          ORDER BY id DESC LIMIT $2) w
                   LEFT JOIN $schema.tasks t ON t.workflow_id = w.id
                  GROUP BY w.id, w.name, w.created_at
                  ORDER BY w.id DESC",
                )
                .bind(cursor.bound())
                .bind(cursor.limit)
                .fetch_all(&mut *conn)
                .await?;
            let items = rows
                .into_iter()
                .map(|f| WorkflowSummary {
                    status: WorkflowStatus::of(f.statuses),
                    id: f.id,
                    name: f.name,
                    created_at: f.created_at,
                    tasks: f.tasks,
                    processed: f.processed,
                })
                .collect();
            Ok(Paged::of(items, cursor, |w: &WorkflowSummary| w.id))
        }
        .await
    )
}

/// A workflow's row with its tasks counted, and their distinct statuses.
#[derive(sqlx::FromRow)]
struct Figures {
    id: i64,
    name: String,
    created_at: DateTime<Utc>,
    tasks: i64,
    processed: i64,
    statuses: Vec<TaskStatus>,
}

/// Cancels every unfinished task of workflow `id` (pending, waiting and
/// started ones; a started one's claim ends and its handler hears it, as
/// with an operator's cancel of the task), each with its audit row naming
/// `by`, in one transaction; answers the workflow as it is then, or
/// [`TaskError::NotFound`].
pub async fn cancel(
    conn: &mut PgConnection,
    schema: &Schema,
    id: i64,
    by: &str,
) -> Result<Workflow, TaskError> {
    crate::queue::control::cancel_workflow(&mut *conn, schema, id, by).await?;
    get(conn, schema, id).await?.ok_or(TaskError::NotFound(id))
}

/// The parents and children of task `id` (both empty for a task outside a
/// workflow).
pub async fn links(
    conn: &mut PgConnection,
    schema: &Schema,
    id: i64,
) -> Result<TaskLinks, sqlx::Error> {
    crate::db::atomically!(conn, schema, Result<TaskLinks, sqlx::Error>, async {
        let rows: Vec<(bool, i64, String, Option<TaskStatus>)> = schema
            .query_as(
                "SELECT true, p.parent_id, p.parent_ref, t.status
                   FROM $schema.task_parents p LEFT JOIN $schema.tasks t ON t.id = p.parent_id
                  WHERE p.task_id = $1
                 UNION ALL
                 SELECT false, p.task_id, c.workflow_ref, c.status
                   FROM $schema.task_parents p JOIN $schema.tasks c ON c.id = p.task_id
                  WHERE p.parent_id = $1
                  ORDER BY 1, 2",
            )
            .bind(id)
            .fetch_all(&mut *conn)
            .await?;
        let mut links = TaskLinks::default();
        for (is_parent, id, r#ref, status) in rows {
            let link = Link { id, r#ref, status };
            if is_parent {
                links.parents.push(link);
            } else {
                links.children.push(link);
            }
        }
        Ok(links)
    }
    .await)
}
