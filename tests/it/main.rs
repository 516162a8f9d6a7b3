//! The integration tests, in one binary (crates.io's habit: one link step).
//! Each test gets a fresh database cloned from a migrated template; see
//! `common` for where the PostgreSQL server comes from.

mod abandoned;
mod api;
mod audit;
mod bad_input;
mod batch;
mod common;
mod fault_check;
mod fenced;
mod generator;
mod health;
mod instances;
mod lease_client;
mod lease_race;
mod lease_store;
mod length_checks;
mod live;
mod metrics;
mod openapi;
mod operator;
mod overview;
mod paging;
mod rest_leases;
mod rest_origin;
mod rest_tasks;
mod rest_workers;
mod retention;
mod runtime;
mod schema;
mod sfn_bad_input;
mod singleton;
mod stopwatch;
mod task_control;
mod task_race;
mod task_store;
mod terms;
mod workers;
