//! The tools' database tests, in one binary: the fault harness's checker
//! and its barrier race, each on a fresh database (see `common`).

mod common;
mod fault_check;
mod task_race;
