//! The integration tests, in one binary (crates.io's habit: one link step).
//! Each test gets a fresh database cloned from a migrated template; see
//! `common` for where the PostgreSQL server comes from.

mod abandoned;
mod api;
mod audit;
mod bad_input;
mod big_ids;
mod bounded;
mod common;
mod credentials;
mod generator;
mod health;
mod length_checks;
mod live;
mod metrics;
mod openapi;
mod operator;
mod overview;
mod paging;
mod perimeter;
mod rest_leases;
mod rest_origin;
mod rest_queues;
mod rest_schedules;
mod rest_search;
mod rest_tasks;
mod rest_workers;
mod rest_workflows;
mod runtime;
mod schema;
mod sfn_bad_input;
mod stopwatch;
mod task_control;
mod terms;
mod worker_session;
mod worker_token;
mod workers;
